"""FedAux and FedIIH at ogbn-arxiv size as Flower simulations: wall time, memory, accuracy.

    OMP_NUM_THREADS=1 python benchmarks/arxiv_scale.py --data-root DIR \\
        [--runs fedaux:5 fediih:5 fedaux:10 ...] [--rounds 100] [--out DIR] [--plot PNG]

Each run is ``configs/scale/<algorithm>-synthetic-arxiv.yaml`` (the offline graph
``Synthetic-arxiv``: 169,343 nodes, ~1.17M undirected edges, 128 features, 40 classes;
``--set dataset=ogbn-arxiv`` runs the real one where ogb can download it) with K METIS
clients, as a Flower simulation (``experiments.run_flower_cell``: Flower's
``run_simulation``, the Ray backend, one CPU per ClientApp, ``--cpus`` in all) with
``client-state=file``. Each run is a fresh
subprocess, so its memory figures are its own:

- wall time: the whole simulation, METIS partitioning and Ray start-up included;
- peak RSS of the ServerApp process (the driver and Flower's simulation engine) and the
  largest peak RSS any ClientApp actor reported (``mem-peak-rss-mib``, ru_maxrss);
- the accuracy curve (mean test accuracy over clients per round) and the test accuracy at
  the best mean-validation round.

Prints a table and one JSON line per run (``{"benchmark": "arxiv_scale", ...}``), appended
to ``<out>/arxiv_scale.jsonl``; ``--plot`` draws the curves, ``--replot JSONL`` draws them
again from such a file without running anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "configs" / "scale"


def one_run(algorithm: str, clients: int, rounds: int, data_root: str, out: Path, cpus: int,
            extra: list[str]) -> dict:
    """One simulation in this process; returns the summary dict."""
    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.experiments import run_flower_cell

    name = f"{algorithm}-arxiv-{clients}"
    cfg = {"config-file": str(CONFIGS / f"{algorithm}-synthetic-arxiv.yaml"),
           "num-clients": clients, "rounds": rounds, "data-root": data_root,
           "output-dir": str(out), "run-name": name, "client-state": "file",
           **dict(kv.split("=", 1) for kv in extra)}
    resolved = resolve_config(None, cfg)
    t0 = time.perf_counter()
    run_flower_cell(cfg, num_cpus=cpus)
    wall = time.perf_counter() - t0
    res = json.loads((out / name / "results.json").read_text())
    client_rss = [m.get("mem-peak-rss-mib", float("nan"))
                  for r in res["rounds"] for m in r["clients"].values()]
    sizes = [f["num-nodes"] for f in res["clients"].values()]
    return {
        "benchmark": "arxiv_scale", "algorithm": algorithm, "dataset": resolved.dataset,
        "clients": clients, "rounds": rounds, "wall_s": wall,
        "s_per_round_median": statistics.median(r["times"]["round"] for r in res["rounds"][1:]),
        "server_peak_rss_mib": res["server_peak_rss_mib"],
        "client_peak_rss_mib": max(client_rss),
        "client_nodes": [min(sizes), max(sizes)],
        "final_test": res["final"].get("test_at_best_val"),
        "best_round": res["final"].get("best_round"),
        "curve": [100 * r["held_mean_test"] for r in res["rounds"]],
        "kernel": resolved.get("fedaux-kernel") if algorithm == "fedaux" else None,
        "cpus": cpus,
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for row in rows:
        ax.plot(range(1, len(row["curve"]) + 1), row["curve"],
                label=f"{row['algorithm']}, {row['clients']} clients")
    ax.set_xlabel("round")
    ax.set_ylabel("mean test accuracy over clients (%)")
    cpus = sorted({row.get("cpus", 2) for row in rows})
    ax.set_title(f"{rows[0]['dataset']}: Flower simulation, "
                 f"{'/'.join(map(str, cpus))} one-CPU actors")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", default="", help="writable: the partition cache goes here")
    ap.add_argument("--runs", nargs="+", default=["fedaux:5", "fediih:5"],
                    metavar="ALGORITHM:CLIENTS")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--cpus", type=int, default=2,
                    help="Ray CPUs, one per ClientApp actor (more than the cores overlaps "
                         "a last wave of few large clients; docs/performance.md)")
    ap.add_argument("--out", default="outputs/arxiv-scale")
    ap.add_argument("--plot", default="", help="PNG path for the accuracy curves")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--replot", default="", metavar="JSONL", help="only plot these rows")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # internal: one run, JSON out
    args = ap.parse_args()
    out = Path(args.out).resolve()
    if args.replot:
        plot([json.loads(line) for line in Path(args.replot).read_text().splitlines() if line],
             Path(args.plot or "arxiv-scale.png"))
        return
    if not args.data_root:
        ap.error("--data-root is required to run")

    if args.one:
        algorithm, clients = args.one.split(":")
        row = one_run(algorithm, int(clients), args.rounds, args.data_root, out, args.cpus, args.set)
        print("ROW " + json.dumps(row), flush=True)
        return

    rows = []
    for spec in args.runs:
        cmd = [sys.executable, __file__, "--one", spec, "--rounds", str(args.rounds),
               "--data-root", args.data_root, "--out", str(out), "--cpus", str(args.cpus),
               "--set", *args.set]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = [ln[4:] for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
        if proc.returncode != 0 or not found:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            print(f"{spec}: failed (exit {proc.returncode}): " + " | ".join(tail), flush=True)
            continue
        row = json.loads(found[0])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
    if not rows:
        sys.exit(1)
    print(f"\n{'run':<14} {'clients':>7} {'wall s':>8} {'s/round':>8} {'server MiB':>10} "
          f"{'client MiB':>10} {'test %':>7}")
    for r in rows:
        print(f"{r['algorithm']:<14} {r['clients']:>7} {r['wall_s']:>8.0f} "
              f"{r['s_per_round_median']:>8.2f} {r['server_peak_rss_mib']:>10.0f} "
              f"{r['client_peak_rss_mib']:>10.0f} {r['final_test']:>7.2f}")
    with open(out / "arxiv_scale.jsonl", "a") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    if args.plot:
        plot(rows, Path(args.plot))


if __name__ == "__main__":
    main()
