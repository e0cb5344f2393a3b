"""How much a FedSpray-protocol table depends on the round it reads: three selection rules.

    python benchmarks/fedspray_selection_rules.py GRID_OUTPUT_FOLDER [--dataset CiteSeer]

For every cell of a finished grid folder (e.g. ``outputs/experiments/fedspray-official``)
with five or more seeds, it prints pooled (micro, over clients) overall and minority test
accuracy at the round picked by: the lowest pooled validation loss (FedSpray's protocol,
what the tables report), the highest pooled validation accuracy (earliest on ties, by
``protocols.best_val_index``), and the last round. Reads each run's ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from fedgraph_flwr.engine.protocols import best_val_index

RULES = ("lowest val loss", "highest val accuracy", "last round")


def pooled_rounds(results: dict, test_weighted: tuple[str, ...] = ()) -> list[dict[str, float]]:
    """Per evaluated round: pooled val loss and accuracy, test and minority accuracy (%),
    and each client metric named in ``test_weighted`` averaged over test nodes (%)."""
    out = []
    for record in results["rounds"]:
        clients = [c for c in record["clients"].values() if "test_count" in c]
        if not clients:
            continue
        val_n = sum(c["val_count"] for c in clients)
        test_n = sum(c["test_count"] for c in clients)
        out.append({
            "round": record["round"],
            "val_loss": sum(c["val_loss_sum"] for c in clients) / val_n,
            "val_acc": sum(c["val_metric"] * c["val_count"] for c in clients) / val_n,
            "test": 100 * sum(c["test_correct"] for c in clients) / test_n,
            "minority": 100 * sum(c["minority_correct"] for c in clients)
            / sum(c["minority_count"] for c in clients),
            **{key: 100 * sum(c[key] * c["test_count"] for c in clients) / test_n
               for key in test_weighted},
        })
    return out


def picks(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """The round each rule reads."""
    return {
        "lowest val loss": rounds[best_val_index([-r["val_loss"] for r in rounds])],
        "highest val accuracy": rounds[best_val_index([r["val_acc"] for r in rounds])],
        "last round": rounds[-1],
    }


def cell_name(config: dict) -> str:
    if config["algorithm"] != "fedspray":
        return f"{config['algorithm']} {config['gnn']}"
    switches = "official code's" if float(config.get("fedspray-kd-threshold", 0)) > 0 else "paper"
    one_draw = switches != "paper" and not config.get("fedspray-per-client-init", False)
    return f"fedspray {config['fedspray-gnn']} ({switches}{', one GNN draw' if one_draw else ''})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--dataset", default=None, help="only this dataset's runs")
    args = ap.parse_args()
    cells: dict[str, list[dict[str, dict[str, float]]]] = defaultdict(list)
    for path in sorted(args.folder.glob("*/results.json")):
        results = json.loads(path.read_text())
        config = results["config"]
        if args.dataset and config["dataset"] != args.dataset:
            continue
        rounds = pooled_rounds(results)
        if rounds:
            cells[f"{config['dataset']} {cell_name(config)}"].append(picks(rounds))
    print("| cell | seeds | " + " | ".join(f"{rule}: overall / minority (rounds)" for rule in RULES) + " |")
    print("|---|---|" + "---|" * len(RULES))
    for name in sorted(cells):
        runs = cells[name]
        if len(runs) < 5:
            continue
        row = []
        for rule in RULES:
            overall = [run[rule]["test"] for run in runs]
            minority = [run[rule]["minority"] for run in runs]
            picked = [run[rule]["round"] for run in runs]
            row.append(f"{statistics.mean(overall):.2f} ± {statistics.stdev(overall):.2f} / "
                       f"{statistics.mean(minority):.2f} ± {statistics.stdev(minority):.2f} "
                       f"({min(picked)}–{max(picked)})")
        print(f"| {name} | {len(runs)} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
