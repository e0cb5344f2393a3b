"""What ``trackers`` costs a run: the same Cora-10 run (in process, same config and seed)
without trackers and with all three (TensorBoard, wandb offline, MLflow's local store).

    python benchmarks/tracker_cost.py --data-root DIR [--algorithm fedaux] [--rounds 20] [--out DIR]

Prints, per run, the wall time and the mean round time (results.json's ``times.round``,
which the trackers are not inside), and for the tracked run each tracker's own seconds:
starting, per round (its calls after each round), finishing. ``--data-root`` must be
writable (the partition is cached there): copy ``Cora/raw`` into a folder first.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.engine.driver import RoundDriver
from fedgraph_flwr.engine.loop import InProcessTransport


def one_run(overrides: dict) -> tuple[dict, dict, float]:
    """(results, tracker seconds, wall seconds of the whole driver run)."""
    driver = RoundDriver(resolve_config(None, overrides), InProcessTransport())
    t0 = time.perf_counter()
    results = driver.run().results()
    wall = time.perf_counter() - t0
    return results, (driver.trackers.seconds if driver.trackers else {}), wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--algorithm", default="fedaux")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="tracker-cost-"))
    base = {"algorithm": args.algorithm, "dataset": "Cora", "num-clients": 10,
            "rounds": args.rounds, "data-root": args.data_root, "output-dir": str(out), "seed": 0}
    report = {}
    for label, trackers in (("none", ""), ("all three", "tensorboard,wandb,mlflow")):
        results, seconds, wall = one_run({**base, "trackers": trackers,
                                          "run-name": f"{args.algorithm}-{label.replace(' ', '-')}"})
        rounds = [r["times"]["round"] for r in results["rounds"]]
        report[label] = {"wall_s": wall, "mean_round_s": sum(rounds) / len(rounds),
                         "test_at_best_val": results["final"]["test_at_best_val"],
                         "trackers": {n: {"start_s": s["start"], "per_round_s": s["rounds"] / len(rounds),
                                          "finish_s": s["finish"]} for n, s in seconds.items()}}
    print(json.dumps(report, indent=1))
    none, on = report["none"], report["all three"]
    print(f"\n{args.algorithm}, Cora, 10 clients, {args.rounds} rounds, in process")
    print(f"{'':>12} {'wall s':>8} {'round s':>8} {'test %':>7}")
    for label, r in report.items():
        print(f"{label:>12} {r['wall_s']:8.2f} {r['mean_round_s']:8.3f} {r['test_at_best_val']:7.2f}")
    print(f"\n{'tracker':>12} {'start s':>8} {'per round s':>12} {'finish s':>9}")
    for name, t in on["trackers"].items():
        print(f"{name:>12} {t['start_s']:8.3f} {t['per_round_s']:12.4f} {t['finish_s']:9.3f}")
    per_round = sum(t["per_round_s"] for t in on["trackers"].values())
    extra = on["wall_s"] - none["wall_s"]
    print(f"\nall three: {per_round:.4f} s per round in the trackers' calls; wall {extra:+.2f} s "
          f"over the run ({extra / args.rounds:+.3f} s per round, start and finish included)")


if __name__ == "__main__":
    main()
