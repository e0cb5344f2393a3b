"""FedGraph's FedGCN and ours on the same client subgraphs: run FedGraph, then tabulate both.

``run`` drives an unmodified ``fedgraph`` (0.2.5) through its public ``run_NC`` on CPU with
the clients of this project's partition cache: it reads the cache's ``client_<i>.pt``
files (own nodes with their global ids, and the halo), rebuilds the whole graph from them,
and hands FedGraph the graph, the features, the labels, the global train and test nodes and
each trainer's nodes. FedGraph then computes its trainers' halos itself
(``get_in_comm_indexes``), so that step is checked, not copied: ``run`` asserts that its
halo equals the cache's. FedGraph's own settings: AggreGCN of width 16, plain SGD lr 0.5,
weight decay 5e-4, 3 local steps, 100 rounds, the unweighted mean, ``num_hops`` 1; it
seeds torch with 42 and each trainer with its rank, so it has no seed to vary. Its score
is the accuracy over every test node of the global model after each round. Run it in a
virtual environment of its own (docs/results/baselines.md, "FedGCN beside FedGraph"):

    PYTHONPATH=<torch_sparse shim> python benchmarks/fedgraph_side_by_side.py run \\
        <data-root>/partitions/Cora-metis-10-s1234-p1234-rawfeatures runs/fedgraph-fedgcn.json

``compare`` reads those JSON files and this project's ``results.json`` of the same
partition (``fedgraph-experiments run configs/paper/openfgl-methods-cora-10.yaml``, its
FedGCN rows) and scores both alike: per round, the test accuracy pooled over every
client's test nodes, of the global model (ours is scored before local training,
``fedgcn-evaluate=before-train``, so our round r + 1 shows the model FedGraph scores after
round r); the last round's and the mean of the last 10.

    python benchmarks/fedgraph_side_by_side.py compare --fedgraph runs \\
        --ours outputs/experiments/openfgl-methods-cora-10
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROUND_LINE = re.compile(r"Round (\d+): Global Test Accuracy = ([0-9.]+)")
TIME_LINE = re.compile(r"Round (\d+): Training Time = ([0-9.]+)s, Communication Time = ([0-9.]+)s")


class Tee(io.TextIOBase):
    """Write to the real stdout and keep a copy (FedGraph reports by printing)."""

    def __init__(self, out):
        self.out, self.kept = out, io.StringIO()

    def write(self, text):
        self.kept.write(text)
        return self.out.write(text)

    def flush(self):
        self.out.flush()


def read_cache(folder: Path):
    """The whole graph and the clients' node sets from a partition cache's client files."""
    import torch

    clients = [torch.load(p, weights_only=True) for p in
               sorted(folder.glob("client_*.pt"), key=lambda p: int(p.stem.split("_")[1]))]
    num_nodes = 1 + max(int(c["global_id"].max()) for c in clients)
    x = torch.zeros(num_nodes, clients[0]["x"].size(1))
    y = torch.zeros(num_nodes, dtype=torch.long)
    train, test = (torch.zeros(num_nodes, dtype=torch.bool) for _ in range(2))
    edges = []
    for c in clients:
        gid = c["global_id"]
        x[gid], y[gid], train[gid], test[gid] = c["x"], c["y"], c["train_mask"], c["test_mask"]
        comm = torch.cat((gid, c["halo_global_id"]))
        edges += [gid[c["edge_index"]], comm[c["halo_edge_index"]]]
    edge_index = torch.unique(torch.cat(edges, dim=1), dim=1)  # sorted, as from_dense().coo()
    return clients, x, y, train.nonzero().view(-1), test.nonzero().view(-1), edge_index


def run_fedgraph(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fedgraph_side_by_side.py run")
    parser.add_argument("partition", type=Path, help="a partition cache folder (client_<i>.pt)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--num-hops", type=int, default=1, choices=(0, 1))
    args = parser.parse_args(argv)

    import ray
    import torch
    from attridict import AttriDict
    from fedgraph.federated_methods import run_NC
    from fedgraph.utils_nc import get_in_comm_indexes

    torch.set_num_threads(1)
    clients, x, y, idx_train, idx_test, edge_index = read_cache(args.partition)
    split = [c["global_id"].clone() for c in clients]
    comm, train_local, test_local, client_edges = get_in_comm_indexes(
        edge_index, split, len(split), args.num_hops, idx_train, idx_test)
    if args.num_hops == 1:  # FedGraph's halo is the cache's
        for c, nodes in zip(clients, comm):
            ours = torch.cat((c["global_id"], c["halo_global_id"])).sort().values
            assert torch.equal(ours, nodes.sort().values), "FedGraph's halo differs from the cache's"
    data = (edge_index, x, y, idx_train, idx_test, int(y.max()) + 1, split, comm, train_local,
            test_local, client_edges)
    config = AttriDict({
        "fedgraph_task": "NC", "dataset": "cora", "method": "FedGCN", "global_rounds": args.rounds,
        "local_step": 3, "learning_rate": 0.5, "n_trainer": len(split), "num_layers": 2,
        "num_hops": args.num_hops, "batch_size": -1, "iid_beta": 10000, "gpu": False,
        "num_cpus_per_trainer": 0.1, "num_gpus_per_trainer": 0, "use_encryption": False,
        "use_huggingface": False, "saveto_huggingface": False, "use_cluster": False,
        "distribution_type": "average", "use_lowrank": False})
    tee = Tee(sys.stdout)
    t0 = time.perf_counter()
    sys.stdout = tee
    try:
        run_NC(config, data)
    finally:
        sys.stdout = tee.out
        ray.shutdown()
    wall = time.perf_counter() - t0
    printed = tee.kept.getvalue()
    accuracy = [float(a) for _, a in sorted((int(r), a) for r, a in ROUND_LINE.findall(printed))]
    # FedGraph's own round times: the trainers' steps plus the averaging and broadcast
    round_s = [float(t) + float(c) for _, t, c in sorted(
        (int(r), t, c) for r, t, c in TIME_LINE.findall(printed))]
    if len(accuracy) != args.rounds:
        print(f"expected {args.rounds} rounds in FedGraph's output, found {len(accuracy)}")
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"library": "fedgraph", "num_hops": args.num_hops,
                                    "partition": args.partition.name, "wall_s": wall,
                                    "round_s": round_s, "test_accuracy": accuracy}))
    print(f"FedGraph FedGCN (num_hops {args.num_hops}): last round {100 * accuracy[-1]:.2f}, "
          f"{wall:.1f} s")
    return 0


def ours_curve(results: dict) -> list[float]:
    """Per round, the test accuracy pooled over the clients' test nodes."""
    tests = {cid: int(info["num-test"]) for cid, info in results["clients"].items()}
    curve = []
    for rnd in results["rounds"]:
        clients = rnd.get("clients") or {}
        total = sum(tests[c] for c in clients)
        curve.append(sum(m["test_metric"] * tests[c] for c, m in clients.items()) / total)
    return curve


def compare(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fedgraph_side_by_side.py compare")
    parser.add_argument("--fedgraph", type=Path, required=True, help="folder of `run` JSON files")
    parser.add_argument("--ours", type=Path, required=True, help="the grid's output folder")
    args = parser.parse_args(argv)
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for path in sorted(args.fedgraph.glob("*.json")):
        run = json.loads(path.read_text())
        if run.get("library") != "fedgraph":
            continue
        acc = run["test_accuracy"]
        rows.setdefault(f"FedGraph, num_hops {run['num_hops']}", []).append(
            (acc[-1], statistics.mean(acc[-10:]), statistics.median(run["round_s"])))
    for path in sorted(args.ours.glob("fedgcn-*/results.json")):
        results = json.loads(path.read_text())
        config = results["config"]
        if config.get("hidden") != 16 or config.get("features") != "raw":
            continue  # the grid's other FedGCN row (the comparison's settings)
        curve = ours_curve(results)[1:]  # round r + 1 scores the model after round r
        times = [r["times"]["round"] for r in results["rounds"]]
        rows.setdefault(f"ours, fedgcn-hops {config['fedgcn-hops']}", []).append(
            (curve[-1], statistics.mean(curve[-10:]), statistics.median(times)))

    def cell(values: list[float], scale: float = 100.0) -> str:
        values = [scale * v for v in values]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.2f} ± {sd:.2f}"

    print("| run | runs | test, last round (%) | test, mean of the last 10 rounds (%) "
          "| s/round (median; FedGraph: its printed training + communication times) |")
    print("|---|---|---|---|---|")
    for name, runs in sorted(rows.items()):
        print(f"| {name} | {len(runs)} | {cell([r[0] for r in runs])} | {cell([r[1] for r in runs])} "
              f"| {statistics.median(r[2] for r in runs):.3f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "compare"):
        print(__doc__.splitlines()[0] + "\nusage: fedgraph_side_by_side.py {run,compare} ...")
        return 2
    return run_fedgraph(argv[1:]) if argv[0] == "run" else compare(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
