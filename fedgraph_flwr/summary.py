"""The final summary table printed at the end of a run."""

from __future__ import annotations

from itertools import groupby
from typing import Any


def clients_per_round(rounds: list[dict[str, Any]]) -> str:
    """How many of each round's sampled clients replied, consecutive rounds alike
    grouped, e.g. ``rounds 1-2: 3/3 clients; rounds 3-5: 2/3 (without 1); rounds 6-8:
    3/3``; ``3/3 clients in each of the 8 rounds`` when all are alike. ``rounds`` are
    results.json's entries (``clients`` replied, ``sampled`` asked)."""
    def shape(r: dict[str, Any]) -> tuple[int, int, tuple[int, ...]]:
        replied = {int(c) for c in r["clients"]}
        return len(replied), len(r["sampled"]), tuple(sorted(set(r["sampled"]) - replied))

    groups = [(key, [r["round"] for r in members])
              for key, members in groupby(rounds, key=shape)]
    parts = []
    for (got, asked, missing), numbers in groups:
        span = f"round {numbers[0]}" if len(numbers) == 1 else f"rounds {numbers[0]}-{numbers[-1]}"
        without = f" (without {', '.join(map(str, missing))})" if missing else ""
        parts.append(f"{span}: {got}/{asked} clients{without}")
    if len(groups) == 1:
        (got, asked, missing), numbers = groups[0]
        without = f" (without {', '.join(map(str, missing))})" if missing else ""
        return f"{got}/{asked} clients{without} in each of the {len(numbers)} rounds"
    return "; ".join(parts)


def format_summary(results: dict[str, Any]) -> str:
    """A plain-text table: each client's best-val round and test, then the headline."""
    final = results["final"]
    cfg = results["config"]
    metric = final.get("metric", "accuracy")
    lines = [
        f"{cfg['algorithm']} on {cfg['dataset']} ({cfg['partition']}, {cfg['num-clients']} clients, "
        f"{len(results['rounds'])} rounds, seed {cfg['seed']}), metric {metric}",
        f"{'client':>6} {'nodes':>7} {'train':>6} {'best rnd':>8} {'val %':>7} {'test %':>7}",
    ]
    for cid, facts in results["clients"].items():
        pc = final.get("per_client", {}).get(cid)
        nodes, train = facts.get("num-nodes", "-"), facts.get("num-train", "-")  # dp=client: withheld
        if pc is None:
            lines.append(f"{cid:>6} {nodes:>7} {train:>6} {'-':>8}")
            continue
        lines.append(f"{cid:>6} {nodes:>7} {train:>6} "
                     f"{pc['best_round']:>8} {pc['val']:>7.2f} {pc['test']:>7.2f}")
    evaluated, total = final.get("clients_evaluated"), final.get("clients")
    over = (f" over the {evaluated} of {total} clients ever sampled"
            if evaluated is not None and total is not None and evaluated < total else "")
    lines.append(
        f"test at best mean-val round ({final.get('best_round')}){over}: "
        f"{final['test_at_best_val']:.2f}%  | mean of per-client best-val test: "
        f"{final.get('per_client_best_val_test', float('nan')):.2f}%"
    )
    lines.append(
        f"wall time {results['wall_time_s']:.1f}s, sent {final.get('total_bytes_sent', 0) / 1e6:.2f} MB, "
        f"received {final.get('total_bytes_received', 0) / 1e6:.2f} MB, "
        f"failures {final.get('failures', 0)}, void rounds {final.get('void_rounds', 0)}"
    )
    if any(len(r["clients"]) < len(r["sampled"]) for r in results["rounds"]):
        lines.append(f"clients per round: {clients_per_round(results['rounds'])}")
    if "total_time_train_s" in final:
        lines.append(
            f"time: local training {final['total_time_train_s']:.2f}s (sum over clients), "
            f"server wait for replies {final['total_time_wait_s']:.2f}s, "
            f"aggregation {final['total_time_aggregate_s']:.3f}s"
        )
    return "\n".join(lines)
