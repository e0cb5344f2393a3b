"""The final summary table printed at the end of a run."""

from __future__ import annotations

from typing import Any


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
    if "total_time_train_s" in final:
        lines.append(
            f"time: local training {final['total_time_train_s']:.2f}s (sum over clients), "
            f"server wait for replies {final['total_time_wait_s']:.2f}s, "
            f"aggregation {final['total_time_aggregate_s']:.3f}s"
        )
    return "\n".join(lines)
