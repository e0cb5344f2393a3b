"""The evaluation protocols, and the metric contract that feeds them.

Every client reports, in each train-phase reply, the metrics of :data:`REQUIRED_METRICS`;
the engine rejects a reply that lacks one (:func:`missing_metrics`), so each protocol
below is reported for every algorithm:

- ``held``: the papers' headline (FedAux, FedIIH, FED-PUB): mean test metric over all
  clients' held models at the round of best mean validation metric, and each client's
  test metric at its own best-validation round.
- ``pooled``: FedSpray's (docs/reading/fedspray.md §7): the round of lowest pooled validation loss,
  and there the pooled (micro) overall, minority and majority test accuracy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..config import resolve_metric
from .recorder import TEST, VAL, RoundLog

POOLED_COUNTS = ("val_loss_sum", "val_count", "test_correct", "test_count",
                 "minority_correct", "minority_count")

#: Per protocol, the client metrics it reads.
REQUIRED_METRICS: dict[str, tuple[str, ...]] = {
    "held": ("train_loss", "val_loss", VAL, TEST, "num-train"),
    "pooled": (*POOLED_COUNTS, "minority_metric"),
}


def missing_metrics(metrics: dict[str, float]) -> list[str]:
    """The contract's keys a train reply lacks (empty when it is complete)."""
    return [k for keys in REQUIRED_METRICS.values() for k in keys if k not in metrics]


def held_metrics(rounds: list[RoundLog], client_ids: list[int]
                 ) -> dict[int, dict[int, dict[str, float]] | None]:
    """Per round: every client's metrics of the model it holds after that round.

    A client that did not train in a round (not sampled, or failed) still holds
    the model of its last round, whose metrics it reported then; they carry over.
    None until every client has reported once.
    """
    latest: dict[int, dict[str, float]] = {}
    out: dict[int, dict[int, dict[str, float]] | None] = {}
    for r in rounds:
        for cid, m in r.clients.items():
            if not math.isnan(m.get(VAL, float("nan"))):
                latest[cid] = m
        out[r.round] = dict(latest) if len(latest) == len(client_ids) else None
    return out


def held_means(rounds: list[RoundLog], client_ids: list[int]) -> dict[int, tuple[float, float]]:
    """Per round: mean (val, test) over *all* clients' held models (NaN before all
    have reported). With full participation this is each round's mean over its
    replies; with ``fraction`` < 1 it avoids picking the "best" round by the luck
    of which few clients were sampled."""
    out: dict[int, tuple[float, float]] = {}
    for rnd, held in held_metrics(rounds, client_ids).items():
        out[rnd] = ((float(np.mean([m[VAL] for m in held.values()])),
                     float(np.mean([m[TEST] for m in held.values()])))
                    if held else (float("nan"), float("nan")))
    return out


def pooled_at_best_val_loss(rounds: list[RoundLog], client_ids: list[int]) -> dict[str, Any]:
    """FedSpray's protocol (docs/reading/fedspray.md §7): the round of lowest pooled validation
    loss Σ_k CE_k·|val_k| / Σ_k |val_k|, and there the pooled (micro) overall,
    minority and majority test accuracy, plus the macro figures (unweighted means
    over clients of their own overall and minority accuracy). Empty if no round has
    every client's counts (results written before the metric contract)."""
    best: tuple[float, int, dict[str, float]] | None = None
    held_by_round = held_metrics(rounds, client_ids)
    for r in rounds:
        held = held_by_round[r.round]
        if r.void or not held or not all(k in m for m in held.values() for k in POOLED_COUNTS):
            continue
        total = {k: float(sum(m[k] for m in held.values())) for k in POOLED_COUNTS}
        if total["val_count"] == 0:
            continue
        loss = total["val_loss_sum"] / total["val_count"]
        if best is None or loss < best[0]:
            best = (loss, r.round, total)
    if best is None:
        return {}
    loss, rnd, t = best
    majority_count = t["test_count"] - t["minority_count"]
    held = held_by_round[rnd]
    assert held is not None  # best is a round in which every client held metrics
    minority = [m["minority_metric"] for m in held.values()
                if not math.isnan(m.get("minority_metric", float("nan")))]
    return {
        "macro_test_at_best_val_loss": 100 * float(np.mean([m[TEST] for m in held.values()])),
        "macro_minority_at_best_val_loss":
            100 * float(np.mean(minority)) if minority else float("nan"),
        "pooled_best_round": rnd,
        "pooled_val_loss": loss,
        "pooled_test_at_best_val_loss": 100 * t["test_correct"] / t["test_count"],
        "pooled_minority_at_best_val_loss":
            100 * t["minority_correct"] / t["minority_count"] if t["minority_count"] else float("nan"),
        "pooled_majority_at_best_val_loss":
            100 * (t["test_correct"] - t["minority_correct"]) / majority_count
            if majority_count else float("nan"),
    }


def best_val_index(vals: list[float]) -> int:
    """The position of the highest validation value, the earliest on ties: every
    protocol's best-round rule (also applied to other libraries' curves, e.g.
    ``benchmarks/openfgl_side_by_side.py``)."""
    return max(range(len(vals)), key=lambda i: (vals[i], -i))


def best_held_round(rounds: list[RoundLog], held: dict[int, tuple[float, float]]
                    ) -> RoundLog | None:
    """The scored round (not void, every client held) of best mean validation metric."""
    scored = [r for r in rounds if not r.void and not math.isnan(held[r.round][0])]
    return scored[best_val_index([held[r.round][0] for r in scored])] if scored else None


def evaluated_clients(rounds: list[RoundLog], client_ids: list[int]) -> list[int]:
    """The clients that reported a validation metric at least once (with ``fraction`` < 1
    a short run may never sample some)."""
    return [c for c in client_ids
            if any(c in r.clients and not math.isnan(r.clients[c].get(VAL, float("nan")))
                   for r in rounds)]


def held_at_best_val(rounds: list[RoundLog], client_ids: list[int], metric: str,
                     num_classes: int) -> dict[str, Any]:
    """The papers' protocol: mean test at the best mean-val round, and per-client
    best-val test. "Mean" is over all clients' held models (:func:`held_means`)."""
    per_client: dict[str, dict[str, float]] = {}
    for cid in client_ids:
        seen = [r for r in rounds if cid in r.clients and not math.isnan(r.clients[cid][VAL])]
        if seen:
            r = seen[best_val_index([r.clients[cid][VAL] for r in seen])]
            per_client[str(cid)] = {"best_round": r.round, "val": 100 * r.clients[cid][VAL],
                                    "test": 100 * r.clients[cid][TEST]}
    per_client_mean = (float(np.mean([v["test"] for v in per_client.values()]))
                       if per_client else float("nan"))
    held = held_means(rounds, client_ids)
    best = best_held_round(rounds, held)
    if best is None:
        return {"test_at_best_val": float("nan"), "best_round": None,
                "per_client_best_val_test": per_client_mean, "per_client": per_client}
    return {
        "metric": resolve_metric(metric, num_classes),
        "test_at_best_val": 100 * held[best.round][1],
        "val_at_best_val": 100 * held[best.round][0],
        "best_round": best.round,
        "per_client_best_val_test": per_client_mean,
        "per_client": per_client,
    }


def costs(rounds: list[RoundLog]) -> dict[str, Any]:
    """Bytes, failures and seconds summed over rounds: clients' local training (summed
    over clients), the server's wait for replies, aggregation, and whole rounds."""
    def total(values) -> float:
        return float(sum(v for v in values if not math.isnan(v)))

    failures: dict[str, int] = {}
    for r in rounds:
        for cid in r.failures:
            failures[str(cid)] = failures.get(str(cid), 0) + 1
    return {
        "total_bytes_sent": int(sum(sum(r.bytes_sent.values()) for r in rounds)),
        "total_bytes_received": int(sum(sum(r.bytes_received.values()) for r in rounds)),
        "failures": int(sum(len(r.failures) for r in rounds)),
        "failures_by_client": dict(sorted(failures.items(), key=lambda kv: int(kv[0]))),
        "void_rounds": int(sum(r.void for r in rounds)),
        "total_time_train_s": total(t.get("train", float("nan")) for r in rounds
                                    for t in r.client_times.values()),
        "total_time_wait_s": total(r.times.get("wait", float("nan")) for r in rounds),
        "total_time_aggregate_s": total(r.times.get("aggregate", float("nan")) for r in rounds),
        "total_time_round_s": total(r.times.get("round", float("nan")) for r in rounds),
    }


def final(rounds: list[RoundLog], client_ids: list[int], metric: str,
          num_classes: int) -> dict[str, Any]:
    """results.json's ``final``: every protocol, then the run's costs.

    The protocols average over every client; a client never sampled (``fraction`` < 1,
    a short run) has no model to score, so they then average over the clients that
    were (``clients_evaluated`` of ``clients``) rather than give no figure at all."""
    evaluated = evaluated_clients(rounds, client_ids)
    scored = evaluated or client_ids
    return {**held_at_best_val(rounds, scored, metric, num_classes),
            "clients_evaluated": len(evaluated), "clients": len(client_ids),
            **pooled_at_best_val_loss(rounds, scored), **costs(rounds)}
