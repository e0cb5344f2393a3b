"""Flower's overhead per round: the same federation in a Flower simulation and in one process.

    python benchmarks/flower_overhead.py --data-root DIR [--algorithm fedaux] [--rounds 6]
        [--set config-file=configs/fediih/cora-disjoint-10.yaml partition=files ...]

Both runs execute identical client and server code (fedgraph_flwr.engine); the
ratio of their per-round wall times (round 1 excluded: Ray start-up and caches)
is what the messaging costs. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def per_round(results: dict) -> float:
    times = [r["times"]["round"] for r in results["rounds"][1:]]
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", required=True)
    # None: the config-file's value, else the run-config default (fedaux, Cora, 10 clients);
    # an explicit value would override a --set config-file=... (explicit beats YAML).
    parser.add_argument("--algorithm", default=None)
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--num-clients", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more run-config overrides (config-file=..., partition=files, ...)")
    args = parser.parse_args()

    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.client_app import make_client_app
    from fedgraph_flwr.engine.loop import run_federation
    from fedgraph_flwr.engine.server_app import make_server_app
    from fedgraph_flwr.engine.simulation import simulate

    out = Path(tempfile.mkdtemp(prefix="flower-overhead-"))
    given = {"algorithm": args.algorithm, "dataset": args.dataset, "num-clients": args.num_clients}
    cfg = {**{k: v for k, v in given.items() if v is not None},
           "rounds": args.rounds, "data-root": args.data_root, "output-dir": str(out),
           **dict(kv.split("=", 1) for kv in args.set)}
    resolved = resolve_config(None, cfg)
    t0 = time.perf_counter()
    inproc = run_federation(dict(cfg, **{"run-name": "inprocess"}))
    t_inproc = time.perf_counter() - t0
    t0 = time.perf_counter()
    simulate(make_server_app(dict(cfg, **{"run-name": "flower"})), make_client_app(),
             num_supernodes=resolved.num_clients,
             backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                             "init_args": {"include_dashboard": False}})
    t_flower = time.perf_counter() - t0
    flower = json.loads((out / "flower" / "results.json").read_text())
    a, b = per_round(inproc), per_round(flower)
    name = f"{resolved.algorithm} on {resolved.dataset}-{resolved.num_clients}"
    print(f"{name}, {args.rounds} rounds (median of rounds 2..)")
    print(f"{'engine':<12} {'s/round':>8} {'total s':>8}")
    print(f"{'in-process':<12} {a:>8.3f} {t_inproc:>8.1f}")
    print(f"{'flower sim':<12} {b:>8.3f} {t_flower:>8.1f}")
    print(f"flower / in-process = {b / a:.2f}x")
    print(json.dumps({"benchmark": "flower_overhead", "algorithm": resolved.algorithm,
                      "dataset": resolved.dataset, "clients": resolved.num_clients,
                      "rounds": args.rounds,
                      "inprocess_s_per_round": a, "flower_s_per_round": b, "ratio": b / a}))


if __name__ == "__main__":
    main()
