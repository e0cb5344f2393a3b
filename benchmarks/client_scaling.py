"""Per-round time and peak memory against the number of clients on one 100k-node graph.

    python benchmarks/client_scaling.py [--nodes 100000 --clients 10 50 100 200
                                         --algorithms fedavg fedaux --rounds 3]

Builds a seeded SBM-like graph (the generator of ``benchmarks/partition_scale.py``:
128 float features, labels = block mod 10, a global 20/40/40 split), METIS-partitions
it into K clients, writes the client files (``partition=files``, as a deployment
would), and runs the in-process federation (the same client and server code as the
Flower apps) for a few rounds. Each (algorithm, K) runs in a fresh subprocess, so
peak RSS is that run's. Seconds per round: median of rounds 2.. (round 1 builds
caches). FedAux uses ``fedaux-kernel=chebyshev`` here (K = 10 gives 10k-node clients,
where the exact chunked kernel alone takes minutes per round; see apv_kernel.py).

``--simulation`` runs each federation as a Flower simulation instead (Ray backend, one
CPU per ClientApp, ``--cpus`` in all, ``client-state=file``), with ``--fraction`` of the
clients sampled per round, e.g. a thousand simulated clients (issue #29):

    OMP_NUM_THREADS=1 python benchmarks/client_scaling.py --simulation --clients 1000 \
        --fraction 0.1 --rounds 20

It then reports the ServerApp process's peak RSS and the largest peak RSS a ClientApp
actor reported (``mem-peak-rss-mib``), and the failures on record (an out-of-memory kill
would show as one).

Prints a table and one JSON line per run (``{"benchmark": "client_scaling", ...}``).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

EXTRA = {"fedaux": {"fedaux-kernel": "chebyshev"}}


def make_files(nodes: int, clients: int, out: Path, seed: int) -> float:
    """Partition the graph into ``clients`` files under ``out``; returns seconds."""
    import torch

    from fedgraph_flwr.data.files import export_partitions
    from fedgraph_flwr.data.partition import partition_graph
    from fedgraph_flwr.data.splits import random_split

    from partition_scale import build_graph

    t0 = time.perf_counter()
    graph = build_graph(nodes, 5 * nodes, max(clients, 100), 0.85, 128, 10, seed)
    blocks = max(clients, 100)
    graph.y = (torch.arange(nodes) * blocks // nodes) % 10  # labels follow the blocks
    graph.train_mask, graph.val_mask, graph.test_mask = random_split(nodes, seed=1234)
    export_partitions(partition_graph(graph, clients, "metis", seed=1234, split="global"), out)
    return time.perf_counter() - t0


def run_one(algorithm: str, clients: int, folder: str, rounds: int) -> dict:
    """One federation in this process; returns its timings."""
    from fedgraph_flwr.engine.loop import run_federation

    config = {"algorithm": algorithm, "partition": "files", "partition-dir": folder,
              "num-clients": clients, "rounds": rounds, "output-dir": tempfile.mkdtemp(),
              **EXTRA.get(algorithm, {})}
    t0 = time.perf_counter()
    results = run_federation(config, write=False)
    total = time.perf_counter() - t0
    per_round = [r["times"]["round"] for r in results["rounds"]]
    train = [sum(t.get("train", 0.0) for t in r["client_times"].values())
             for r in results["rounds"]]
    return {"benchmark": "client_scaling", "algorithm": algorithm, "clients": clients,
            "rounds": rounds, "s_per_round": statistics.median(per_round[1:] or per_round),
            "train_s_per_round": statistics.median(train[1:] or train),
            "aggregate_s_per_round": statistics.median(
                [r["times"]["aggregate"] for r in results["rounds"]]),
            "total_s_incl_loading": total,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def run_one_simulated(algorithm: str, clients: int, folder: str, rounds: int,
                      fraction: float, cpus: int) -> dict:
    """One federation as a Flower simulation in this process; returns its figures."""
    from fedgraph_flwr.experiments import run_flower_cell

    out = Path(tempfile.mkdtemp(prefix="client-scaling-sim-"))
    config = {"algorithm": algorithm, "partition": "files", "partition-dir": folder,
              "num-clients": clients, "rounds": rounds, "fraction": fraction,
              "output-dir": str(out), "run-name": "sim", "client-state": "file",
              "data-root": str(out), **EXTRA.get(algorithm, {})}
    t0 = time.perf_counter()
    run_flower_cell(config, num_cpus=cpus)
    total = time.perf_counter() - t0
    results = json.loads((out / "sim" / "results.json").read_text())
    per_round = [r["times"]["round"] for r in results["rounds"]]
    return {"benchmark": "client_scaling", "engine": "flower-simulation", "algorithm": algorithm,
            "clients": clients, "fraction": fraction, "rounds": len(results["rounds"]),
            "s_per_round": statistics.median(per_round[1:] or per_round),
            "aggregate_s_per_round": statistics.median(
                [r["times"]["aggregate"] for r in results["rounds"]]),
            "total_s_incl_loading": total,
            "server_peak_rss_mb": results["server_peak_rss_mib"],
            "client_peak_rss_mb": max(m.get("mem-peak-rss-mib", 0.0) for r in results["rounds"]
                                      for m in r["clients"].values()),
            "failures": results["final"]["failures"],
            # a round's sampled clients only: with fraction < 1 some clients never ran
            "last_round_mean_test": 100 * statistics.mean(
                m["test_metric"] for m in results["rounds"][-1]["clients"].values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100, 200])
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "fedaux"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--simulation", action="store_true", help="run as Flower simulations")
    ap.add_argument("--fraction", type=float, default=1.0, help="clients sampled per round")
    ap.add_argument("--cpus", type=int, default=2, help="Ray CPUs in a simulation")
    ap.add_argument("--one", nargs=3, metavar=("ALGORITHM", "CLIENTS", "FOLDER"),
                    help=argparse.SUPPRESS)  # internal: one run in a fresh process
    args = ap.parse_args()
    if args.one:
        if args.simulation:
            row = run_one_simulated(args.one[0], int(args.one[1]), args.one[2], args.rounds,
                                    args.fraction, args.cpus)
        else:
            row = run_one(args.one[0], int(args.one[1]), args.one[2], args.rounds)
        print(json.dumps(row))
        return
    rows = []
    root = Path(tempfile.mkdtemp(prefix="client-scaling-"))
    for k in args.clients:
        folder = root / f"k{k}"
        seconds = make_files(args.nodes, k, folder, args.seed)
        print(f"partitioned {args.nodes} nodes into {k} client files in {seconds:.1f} s", flush=True)
        for algorithm in args.algorithms:
            out = subprocess.run(
                [sys.executable, __file__, "--rounds", str(args.rounds),
                 "--one", algorithm, str(k), str(folder),
                 *(["--simulation", "--fraction", str(args.fraction), "--cpus", str(args.cpus)]
                   if args.simulation else [])],
                check=True, capture_output=True, text=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            rows[-1]["nodes"] = args.nodes
            print(json.dumps(rows[-1]), flush=True)
    if args.simulation:
        print(f"{'algorithm':<9} {'clients':>7} {'s/round':>8} {'aggr s':>7} {'server MB':>9} "
              f"{'client MB':>9} {'failures':>8}")
        for r in rows:
            print(f"{r['algorithm']:<9} {r['clients']:>7} {r['s_per_round']:>8.2f} "
                  f"{r['aggregate_s_per_round']:>7.3f} {r['server_peak_rss_mb']:>9.0f} "
                  f"{r['client_peak_rss_mb']:>9.0f} {r['failures']:>8}")
        return
    print(f"{'algorithm':<9} {'clients':>7} {'s/round':>8} {'train s':>8} {'aggr s':>7} {'peak MB':>8}")
    for r in rows:
        print(f"{r['algorithm']:<9} {r['clients']:>7} {r['s_per_round']:>8.2f} "
              f"{r['train_s_per_round']:>8.2f} {r['aggregate_s_per_round']:>7.3f} {r['peak_rss_mb']:>8.0f}")


if __name__ == "__main__":
    main()
