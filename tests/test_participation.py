"""Partial participation through the engine: sampled clients only, the rest keep their model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_privacy_and_replies import NUM_CLASSES, NUM_FEATURES, _graph

from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.phases import TRAIN_PHASE
from fedgraph_flwr.engine import client_runtime as rt
from fedgraph_flwr.engine.federation import Federation
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.engine.transport import ClientReply

from helpers import round_metrics


# A deliberate pair, not the registry: the papers' methods whose server mixes each
# client's model from the sampled clients' signatures.
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedaux", "fediih"])
def test_unsampled_clients_keep_their_model_and_mixing_uses_the_sampled_only(tmp_path, algorithm):
    cfg = resolve_config(None, {"algorithm": algorithm, "num-clients": 4, "hidden": 8,
                                "dataset": "SBM", "fraction": 0.5, "output-dir": str(tmp_path)})
    graphs = {c: _graph(60, seed=c) for c in range(4)}
    roster = {c: {"num-features": NUM_FEATURES, "num-classes": NUM_CLASSES,
                  "num-train": int(graphs[c].train_mask.sum()), "num-nodes": 60}
              for c in range(4)}
    fed = Federation(cfg, roster, log=lambda msg: None)
    states: dict[int, bytes] = {}
    seen_before: set[int] = set()
    for server_round in range(1, 5):
        sampled = fed.sample(server_round)
        assert len(sampled) == 2
        before = {c: {k: v.copy() for k, v in fed.payload_for(c).items()} for c in range(4)}
        replies = {}
        for c in sampled:
            out = rt.phase_round(graphs[c], NUM_CLASSES, fed.client_config(server_round),
                                 TRAIN_PHASE, fed.payload_for(c), states.get(c), server_round, c,
                                 torch.device("cpu"))
            states[c] = out.state
            replies[c] = ClientReply(out.upload, out.signature, {**out.metrics, "partition-id": c})
        record = fed.complete_round(server_round, sampled, replies, {}, {})
        assert sorted(record.clients) == sampled, record.failures
        for c in set(range(4)) - set(sampled):  # not sampled: exactly the payload it had
            after = fed.payload_for(c)
            assert all(np.array_equal(after[k], before[c][k]) for k in after)
            if c not in seen_before:  # never sampled yet: still the global initial model
                assert all(np.array_equal(after[k], fed.initial[k]) for k in after)
        for c in sampled:  # sampled: a new personalized payload
            assert any(not np.array_equal(fed.payload_for(c)[k], before[c][k])
                       for k in fed.payload_for(c) if np.issubdtype(before[c][k].dtype, np.floating))
        seen_before |= set(sampled)
        # Similarities exist among the sampled clients only (NaN elsewhere).
        name = next(n for n in fed.diagnostics if n.startswith("similarity"))
        matrix = fed.diagnostics[name][server_round - 1]
        idx = np.array(sampled)
        assert np.isfinite(matrix[np.ix_(idx, idx)]).all()
        others = np.array(sorted(set(range(4)) - set(sampled)))
        assert np.isnan(matrix[others]).all() and np.isnan(matrix[:, others]).all()


@pytest.mark.slow
def test_fraction_one_is_full_participation(tmp_path):
    base = {"algorithm": "fedaux", "dataset": "SBM", "num-clients": 3, "rounds": 3, "hidden": 8,
            "output-dir": str(tmp_path)}
    full = run_federation(dict(base, **{"run-name": "default"}), write=False)
    one = run_federation(dict(base, fraction=1.0, **{"run-name": "one"}), write=False)
    assert [r["sampled"] for r in one["rounds"]] == [[0, 1, 2]] * 3
    assert round_metrics(one) == round_metrics(full)
    assert one["final"]["test_at_best_val"] == full["final"]["test_at_best_val"]
    half = run_federation(dict(base, fraction=0.5, **{"run-name": "half"}), write=False)
    assert all(len(r["sampled"]) == 2 for r in half["rounds"])
    assert round_metrics(half) != round_metrics(full)


def test_sampling_follows_the_fediih_reference_rule(tmp_path):
    """np.random.seed(seed + r); choice(M, round(M * frac), replace=False) (docs/reading/fediih.md §10.6)."""
    cfg = resolve_config(None, {"num-clients": 20, "fraction": 0.3, "seed": 7,
                                "output-dir": str(tmp_path)})
    roster = {c: {"num-features": NUM_FEATURES, "num-classes": NUM_CLASSES, "num-train": 10}
              for c in range(20)}
    fed = Federation(cfg, roster, log=lambda msg: None)
    for server_round in (1, 2, 50):
        np.random.seed(7 + server_round)
        expected = sorted(np.random.choice(20, round(20 * 0.3), replace=False).tolist())
        assert fed.sample(server_round) == expected


@pytest.mark.slow
def test_headline_uses_every_clients_held_model_not_the_sampled_few(tmp_path):
    """With fraction < 1 a round's mean over its few replies is noisy; the best round is
    picked by the mean over all clients, each at the metrics of the model it holds (its
    last reply), and only once every client has replied."""
    run = run_federation({"algorithm": "fedaux", "dataset": "SBM", "num-clients": 4, "rounds": 8,
                          "hidden": 8, "fraction": 0.5, "output-dir": str(tmp_path)}, write=False)
    latest: dict[str, tuple[float, float]] = {}
    held = []
    for r in run["rounds"]:
        assert len(r["clients"]) == 2
        for cid, m in r["clients"].items():
            latest[cid] = (m["val_metric"], m["test_metric"])
        expected = (np.mean([v for v, _ in latest.values()]), np.mean([t for _, t in latest.values()])
                    ) if len(latest) == 4 else (np.nan, np.nan)
        np.testing.assert_allclose([r["held_mean_val"], r["held_mean_test"]], expected)
        held.append((r["held_mean_val"], -r["round"], r["held_mean_test"], r["round"]))
    scored = [h for h in held if not np.isnan(h[0])]
    assert scored, "every client should have been sampled within 8 rounds"
    best = max(scored)
    assert run["final"]["best_round"] == best[3]
    assert run["final"]["test_at_best_val"] == pytest.approx(100 * best[2])


def test_pooled_protocol_picks_the_round_of_lowest_pooled_val_loss(tmp_path):
    """FedSpray's selection (docs/reading/fedspray.md §7): Σ CE_k·|val_k| / Σ |val_k| over all clients'
    held models, and there pooled overall / minority / majority test accuracy."""
    cfg = resolve_config(None, {"algorithm": "fedavg", "num-clients": 2, "hidden": 8,
                                "output-dir": str(tmp_path)})
    roster = {c: {"num-features": NUM_FEATURES, "num-classes": NUM_CLASSES, "num-train": 10}
              for c in range(2)}
    fed = Federation(cfg, roster, log=lambda msg: None)

    def reply(val_loss, val_count, correct, minority_correct):
        m = {"val_metric": 0.5, "test_metric": correct / 10.0, "val_loss_sum": val_loss * val_count,
             "minority_metric": minority_correct / 4.0,
             "val_count": val_count, "test_correct": correct, "test_count": 10.0,
             "minority_correct": minority_correct, "minority_count": 4.0, "partition-id": 0,
             "num-train": 10.0, "train_loss": 1.0, "val_loss": val_loss}
        return ClientReply(dict(fed.initial), {}, m)

    # Round 2 has the lowest pooled loss (client 1's many val nodes dominate), though its
    # *mean* per-client loss (0.95) is higher than round 1's (0.6).
    losses = {1: ((0.2, 1.0), (1.0, 9.0)), 2: ((1.8, 1.0), (0.1, 9.0)), 3: ((1.0, 1.0), (1.0, 9.0))}
    for rnd, ((l0, n0), (l1, n1)) in losses.items():
        fed.complete_round(rnd, [0, 1], {0: reply(l0, n0, 6.0 + rnd, 2.0),
                                         1: reply(l1, n1, 7.0, 1.0 + rnd)}, {}, {})
    final = fed.final()
    assert final["pooled_best_round"] == 2
    assert final["pooled_val_loss"] == pytest.approx((1.8 + 0.9) / 10)
    assert final["pooled_test_at_best_val_loss"] == pytest.approx(100 * (8 + 7) / 20)
    assert final["pooled_minority_at_best_val_loss"] == pytest.approx(100 * (2 + 3) / 8)
    assert final["pooled_majority_at_best_val_loss"] == pytest.approx(100 * (15 - 5) / 12)
    assert final["macro_test_at_best_val_loss"] == pytest.approx(100 * (0.8 + 0.7) / 2)
    assert final["macro_minority_at_best_val_loss"] == pytest.approx(100 * (0.5 + 0.75) / 2)


def test_a_run_that_never_samples_some_clients_scores_those_it_did(tmp_path):
    """Issue #76 finding 10: a fraction=0.5 run short enough that some client is never
    sampled printed `nan%` as its final accuracy (the protocols waited for every client's
    held model). Its figures are now over the clients that were evaluated, and say so."""
    from fedgraph_flwr.summary import format_summary

    run = run_federation({"algorithm": "fedavg", "dataset": "SBM", "num-clients": 10,
                          "rounds": 2, "hidden": 8, "fraction": 0.5,
                          "output-dir": str(tmp_path)}, write=False)
    sampled = {c for r in run["rounds"] for c in r["sampled"]}
    assert len(sampled) == 8  # seed 0's draws: [0, 2, 4, 6, 9], then [0, 1, 4, 5, 7]
    final = run["final"]
    assert (final["clients_evaluated"], final["clients"]) == (8, 10)
    latest: dict[str, tuple[float, float]] = {}
    for r in run["rounds"]:  # the held models of the evaluated clients, round by round
        latest.update({c: (m["val_metric"], m["test_metric"]) for c, m in r["clients"].items()})
    assert final["best_round"] == 2  # round 1 held only 5 of the 8
    assert final["test_at_best_val"] == pytest.approx(
        100 * np.mean([t for _, t in latest.values()]))
    assert sorted(final["per_client"]) == sorted(str(c) for c in sampled)
    assert final["per_client_best_val_test"] == pytest.approx(
        np.mean([v["test"] for v in final["per_client"].values()]))
    for key in ("test_at_best_val", "per_client_best_val_test", "pooled_test_at_best_val_loss"):
        assert np.isfinite(final[key]), key
    text = format_summary(dict(run, wall_time_s=0.0))
    assert "nan" not in text and "over the 8 of 10 clients ever sampled" in text
