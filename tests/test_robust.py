"""Robust aggregation (engine/robust.py): Flower's definitions on uniform rows, each row of a
personalized plan made robust, a hostile update bounded against the cohort and named in the
round's record, and the settings a run cannot honour refused in one line."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum

from fedgraph_flwr.config import ConfigError, resolve_config
from fedgraph_flwr.core.mixing import MixingPlan
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.federation import Federation
from fedgraph_flwr.engine.robust import (
    RobustAggregation,
    ScreenedRound,
    krum_select,
    weighted_median,
)
from fedgraph_flwr.engine.transport import ClientReply

from helpers import contract_metrics

NUM_FEATURES, NUM_CLASSES = 6, 3


def _uniform(values: np.ndarray):
    order = np.argsort(values, axis=0, kind="stable")
    ranked = np.take_along_axis(values, order, axis=0)
    return ranked, np.full_like(ranked, 1.0 / values.shape[0])


@pytest.mark.parametrize("n", [5, 8, 10, 11])
def test_equal_weights_give_flowers_median_and_trimmed_mean(n):
    values = np.random.default_rng(n).normal(size=(n, 40))
    ranked, w = _uniform(values)
    np.testing.assert_allclose(weighted_median(ranked, w), np.median(values, axis=0), rtol=0,
                               atol=1e-12)
    agg = RobustAggregation("trimmed-mean", 1, 0.2)
    plan = MixingPlan(list(range(n)), np.full((1, n, n), 1 / n))
    screened = ScreenedRound({c: ClientUpdate({"w": values[c]}, {}, 1) for c in range(n)},
                             list(range(n)), 1)
    np.testing.assert_allclose(agg.combine(plan, screened)[0]["w"], trim_mean(values, 0.2),
                               rtol=0, atol=1e-12)


def test_krum_selection_is_flowers_select_multikrum():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(9, 30))
    vectors[4] *= 50  # an outlier is never chosen
    contents = [RecordDict({"arrays": ArrayRecord({"w": Array(v.copy())})}) for v in vectors]
    for f, keep in [(1, 1), (2, 5), (3, 6)]:
        flower = select_multikrum(contents, f, keep)
        ours = krum_select(vectors, f, keep)
        assert sorted(ours) == sorted(contents.index(c) for c in flower)
        assert 4 not in ours


def test_bulyan_row_is_flowers_n_closest_average():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(7, 25))  # θ = 7 selected, f = 1: the 5 closest to the median
    agg = RobustAggregation("bulyan", 1, 0.2)
    plan = MixingPlan(list(range(7)), np.full((1, 7, 7), 1 / 7))
    screened = ScreenedRound({c: ClientUpdate({"w": values[c]}, {}, 1) for c in range(7)},
                             list(range(7)), 1)
    ours = agg.combine(plan, screened)[0]["w"]
    flower = aggregate_n_closest_weights([np.median(values, axis=0)], [[v] for v in values], 5)[0]
    np.testing.assert_allclose(ours, flower, rtol=0, atol=1e-12)


def test_a_personalized_row_keeps_its_own_weight_and_makes_the_others_robust():
    """Client 0's row: 0.6 on itself, the rest on four others of which one sends 100: it
    receives 0.6·(its own) + 0.4·median(others). Client 1's row is uniform: 0.2·(its own)
    + 0.8·median(0, 2, 3, 100). The hostile client's own row gives it its own share back."""
    values = np.array([[0.0], [1.0], [2.0], [3.0], [100.0]])
    matrix = np.full((5, 5), 0.2)
    matrix[0] = [0.6, 0.1, 0.1, 0.1, 0.1]
    plan = MixingPlan(list(range(5)), matrix[None])
    updates = {c: ClientUpdate({"w": values[c].astype(np.float32)}, {}, 1) for c in range(5)}
    out = RobustAggregation("median", 1, 0.2).combine(plan, ScreenedRound(updates, list(range(5)), 1))
    assert out[0]["w"][0] == np.float32(0.4 * 2.5)
    assert out[1]["w"][0] == np.float32(0.2 * 1.0 + 0.8 * 2.5)
    assert out[4]["w"][0] == np.float32(0.2 * 100.0 + 0.8 * 1.5)
    assert out[1]["w"].dtype == np.float32


def _federation(tmp_path, algorithm="fedavg", num_clients=10, **extra) -> Federation:
    cfg = resolve_config(None, {"algorithm": algorithm, "num-clients": num_clients, "hidden": 8,
                                "dataset": "SBM", "output-dir": str(tmp_path), **extra})
    roster = {c: {"partition-id": c, "num-features": NUM_FEATURES, "num-classes": NUM_CLASSES,
                  "num-train": 10, "num-val": 10, "num-test": 10, "num-nodes": 30}
              for c in range(num_clients)}
    return Federation(cfg, roster, log=lambda msg: None)


def _honest_and_scaled(fed: Federation, scale: float, hostile=(3,)):
    """Honest uploads = initial + a small update around a common direction; hostile ones
    = initial + ``scale`` × that update."""
    rng = np.random.default_rng(0)
    direction = {k: rng.normal(size=v.shape).astype(v.dtype) for k, v in fed.initial.items()}
    replies = {}
    for c in fed.client_ids:
        noise = {k: 0.1 * rng.normal(size=v.shape) for k, v in fed.initial.items()}
        step = scale if c in hostile else 1.0
        upload = {k: (v + step * (direction[k] + noise[k])).astype(v.dtype)
                  for k, v in fed.initial.items()}
        replies[c] = ClientReply(upload, {}, contract_metrics(**{"num-train": 10.0}))
    honest_mean = {k: v + direction[k] for k, v in fed.initial.items()}
    return replies, honest_mean


def _error(payload, target) -> float:
    return max(float(np.abs(payload[k] - target[k]).max()) for k in target)


@pytest.mark.parametrize("rule", ["norm-bound", "trimmed-mean", "median", "krum", "multi-krum",
                                  "bulyan"])
def test_a_scaled_update_does_not_take_fedavg_over_and_its_sender_is_named(tmp_path, rule):
    fed = _federation(tmp_path, robust=rule)
    replies, honest = _honest_and_scaled(fed, 100.0)
    record = fed.complete_round(1, fed.client_ids, replies, {}, {})
    assert not record.void and len(record.clients) == 10
    assert _error(fed.payloads[0], honest) < 1.0  # the honest clients' common direction
    assert "update norm" in record.robust[3] and set(record.robust) == {3} | (
        set(record.robust) - {3})
    assert record.to_json()["robust"]["3"] == record.robust[3]
    plain = _federation(tmp_path / "none")
    plain.complete_round(1, plain.client_ids, replies, {}, {})
    assert _error(plain.payloads[0], honest) > 5.0  # without robust: the attacker's model


def test_counts_are_capped_against_the_cohort_median(tmp_path):
    fed = _federation(tmp_path, robust="median")
    fed.roster.facts[3]["num-train"] = 10**6  # declared at the handshake, so within bounds
    replies, _ = _honest_and_scaled(fed, 1.0)
    replies[3] = ClientReply(replies[3].upload, {}, contract_metrics(**{"num-train": 1e6}))
    record = fed.complete_round(1, fed.client_ids, replies, {}, {})
    assert "num-train 1000000 capped at 30" in record.robust[3]


def test_a_personalized_method_keeps_its_rows_under_robust_aggregation(tmp_path):
    """FedAux's plan rows differ per client; with an honest cohort the robust rows stay
    close to the plain mixture (median of near-equal updates), and differ per client."""
    fed = _federation(tmp_path, algorithm="fedaux", num_clients=5, robust="trimmed-mean")
    plain = _federation(tmp_path / "plain", algorithm="fedaux", num_clients=5)
    rng = np.random.default_rng(2)
    replies = {}
    for c in range(5):
        upload = {k: (v + 0.01 * rng.normal(size=v.shape)).astype(v.dtype)
                  for k, v in fed.initial.items()}
        replies[c] = ClientReply(upload, {"apv": upload["apv"].copy()},
                                 contract_metrics(**{"num-train": 10.0}))
    for f in (fed, plain):
        record = f.complete_round(1, f.client_ids, replies, {}, {})
        assert not record.void and not record.failures
    for c in range(5):
        assert _error(fed.payloads[c], plain.payloads[c]) < 0.02
    assert _error(fed.payloads[0], fed.payloads[1]) > 0


@pytest.mark.parametrize(("keys", "message"), [
    ({"robust": "median", "secure-aggregation": "ckks"},
     "robust=median needs the uploads in the clear, but under secure-aggregation=ckks"),
    ({"robust": "median", "algorithm": "scaffold"},
     "robust=median makes each client's row of the mixing plan robust, and "
     "algorithm=scaffold has no mixing plan"),
    ({"robust": "bulyan", "robust-malicious": 2},
     "robust=bulyan with robust-malicious=2 needs at least 11 clients, num-clients=10"),
    ({"robust": "everything"}, "robust='everything' is not a valid choice"),
])
def test_settings_a_run_cannot_honour_are_refused_in_one_line(keys, message):
    with pytest.raises(ConfigError) as err:
        resolve_config(None, {"num-clients": 10, **keys})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_krum_screens_an_algorithm_without_a_plan(tmp_path):
    """SCAFFOLD has no mixing plan: multi-krum leaves the outlier out of its aggregation."""
    fed = _federation(tmp_path, algorithm="scaffold", robust="multi-krum")
    plain = _federation(tmp_path / "plain", algorithm="scaffold")
    replies, honest = _honest_and_scaled(fed, 100.0)
    record = fed.complete_round(1, fed.client_ids, replies, {}, {})
    plain.complete_round(1, plain.client_ids, replies, {}, {})
    assert record.robust[3].endswith("left out by multi-krum (f=1)")
    model = [k for k in honest if not k.startswith("control.")]
    assert _error({k: fed.payloads[0][k] for k in model}, {k: honest[k] for k in model}) < 1.0
    assert _error({k: plain.payloads[0][k] for k in model}, {k: honest[k] for k in model}) > 5.0


def test_an_overflowing_model_is_similar_to_nobody_and_outvoted(tmp_path):
    """FED-PUB's server embeds each uploaded model: one scaled to 1e30 overflowed to Inf and,
    unguarded, made every row of the plan NaN (found by benchmarks/hostile_clients.py). Its
    embedding now counts as zero (similar to nobody): without robust the honest clients get
    a finite but poisoned mixture and the sender is named; with robust=median they do not."""
    for rule in ("none", "median"):
        fed = _federation(tmp_path / rule, algorithm="fedpub", num_clients=5, robust=rule)
        rng = np.random.default_rng(3)
        replies = {}
        for c in range(5):
            scale = 1e30 if c == 4 else 1.0
            upload = {k: (v + 0.01 * rng.normal(size=v.shape)).astype(v.dtype) * scale
                      for k, v in fed.initial.items()}
            replies[c] = ClientReply(upload, {}, contract_metrics(**{"num-train": 10.0}))
        record = fed.complete_round(1, fed.client_ids, replies, {}, {})
        assert not record.failures and list(record.robust) == [4]
        honest = max(float(np.abs(v).max()) for c in range(4) for v in fed.payloads[c].values())
        assert np.isfinite(honest) and (honest < 10.0) == (rule == "median")


def test_a_client_whose_new_model_is_not_finite_keeps_its_last(tmp_path, monkeypatch):
    fed = _federation(tmp_path, num_clients=3)
    replies, _ = _honest_and_scaled(fed, 1.0)
    inf = {k: np.full_like(v, np.inf) for k, v in fed.initial.items()}
    plain = fed.aggregator.aggregate
    monkeypatch.setattr(fed.aggregator, "aggregate", lambda r, u: replace(
        plain(r, u), payloads={**plain(r, u).payloads, 0: inf}))
    record = fed.complete_round(1, fed.client_ids, replies, {}, {})
    assert record.robust == {0: "its new model was not finite: it keeps last round's"}
    assert 0 not in fed.payloads and set(fed.payloads) == {1, 2}
