"""Why FedSpray's minority accuracy is low on row-normalised features: the teacher, round by round.

    python benchmarks/fedspray_mechanism.py RESULTS.json [RESULTS.json ...] --out FIGURE.png

For each FedSpray run (``results.json`` of a run made with this version, whose clients
report ``teacher_test_acc`` and ``majority_pred_share``) it plots, per round, pooled over
clients (weighted by each client's test nodes): the teacher's test accuracy (the
predictions the GNN is distilled towards), the GNN's test accuracy, the share of test
nodes the GNN predicts as its client's majority training class, and the pooled
validation loss whose minimum picks the reported round (FedSpray's protocol). It prints,
per run, the round picked and the three figures at it, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from fedspray_selection_rules import pooled_rounds  # this script's folder is on sys.path


def pooled_series(results: dict) -> dict[str, np.ndarray]:
    """Per-round pooled figures (%; val loss as is) of one run."""
    rounds = pooled_rounds(results, test_weighted=("teacher_test_acc", "majority_pred_share"))
    return {key: np.array([r[key] for r in rounds])
            for key in ("round", "teacher_test_acc", "test", "majority_pred_share", "val_loss")}


def label(results: dict) -> str:
    cfg = results["config"]
    switches = "official switches" if cfg.get("fedspray-kd-threshold", 0) > 0 else "paper switches"
    return (f"{cfg['dataset']}, {cfg['fedspray-gnn'].upper()}, {switches}, "
            f"{cfg.get('features', 'normalized')} features"
            + ("" if cfg.get("lcc", True) else ", all components"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(p.read_text()) for p in args.results]
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 3.6 * len(runs)), squeeze=False)
    rows = []
    for (left, right), results in zip(axes, runs):
        s = pooled_series(results)
        rounds = s["round"]
        picked = int(results["final"]["pooled_best_round"])
        left.plot(rounds, s["teacher_test_acc"], label="teacher: test accuracy")
        left.plot(rounds, s["test"], label="GNN: test accuracy", linestyle="--")
        left.plot(rounds, s["majority_pred_share"], label="GNN: test nodes predicted as the majority class",
                  linestyle=":")
        right.plot(rounds, s["val_loss"], color="tab:red", label="GNN: pooled validation loss")
        for ax in (left, right):
            ax.axvline(picked, color="grey", linewidth=0.8)
            ax.set_xlabel("round")
            ax.legend(fontsize=8, loc="best")
        left.set_ylabel("% of test nodes (pooled)")
        left.set_ylim(0, 100)
        left.set_title(f"{label(results)}: round {picked} picked", fontsize=9)
        right.set_title("the round picked = lowest pooled validation loss", fontsize=9)
        at = picked - 1
        rows.append({"run": label(results), "picked_round": picked,
                     "teacher_test_acc": round(float(s["teacher_test_acc"][at]), 2),
                     "majority_pred_share": round(float(s["majority_pred_share"][at]), 2),
                     "test": round(float(results["final"]["pooled_test_at_best_val_loss"]), 2),
                     "minority": round(float(results["final"]["pooled_minority_at_best_val_loss"]), 2),
                     "teacher_test_acc_last": round(float(s["teacher_test_acc"][-1]), 2)})
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    for r in rows:
        print(f"{r['run']}: round {r['picked_round']} picked; there the teacher's test accuracy "
              f"{r['teacher_test_acc']}%, majority-class predictions {r['majority_pred_share']}% "
              f"of test nodes, test {r['test']}%, minority {r['minority']}%; teacher at the last "
              f"round {r['teacher_test_acc_last']}%")
    print(json.dumps({"benchmark": "fedspray_mechanism", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
