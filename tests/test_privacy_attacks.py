"""benchmarks/privacy_attacks.py's attack maths on hand-made inputs with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import benchmark_module

pa = benchmark_module("privacy_attacks")


def test_auc_of_separated_identical_and_reversed_scores():
    assert pa.roc_auc(np.array([3.0, 4.0, 5.0]), np.array([0.0, 1.0])) == 1.0
    assert pa.roc_auc(np.array([0.0, 1.0]), np.array([3.0, 4.0, 5.0])) == 0.0
    assert pa.roc_auc(np.full(7, 2.5), np.full(4, 2.5)) == 0.5
    # one tie across the classes: (1 + 1 + 0.5 + ...) / (2 * 2)
    assert pa.roc_auc(np.array([1.0, 3.0]), np.array([1.0, 0.0])) == pytest.approx(0.875)
    assert np.isnan(pa.roc_auc(np.array([1.0]), np.array([])))


def test_auc_equals_the_pairwise_count():
    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 5, 30).astype(float), rng.integers(0, 5, 20).astype(float)
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert pa.roc_auc(pos, neg) == pytest.approx(pairs)


def test_total_variation():
    p = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    q = np.array([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])
    assert pa.total_variation(p, q).tolist() == [1.0, 0.0]


def test_ridge_recovers_a_planted_linear_map():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 5))
    w = rng.normal(size=(5, 3))
    logits = x @ w
    y = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)  # distributions ...
    y_lin = 0.2 + 0.02 * (x @ w)  # ... and an exactly linear target
    model = pa.fit_ridge(x, y_lin, 1e-8)
    raw = ((x - model[0]) / model[1]) @ model[2] + model[3]
    np.testing.assert_allclose(raw, y_lin, atol=1e-6)
    groups = np.repeat(np.arange(4), 20)
    out = pa.label_attack(x[:60], y[:60], groups[:60], x[60:], y[60:], y[:60].mean(0))
    assert out["tv"] < 0.5 * out["prior_tv"]  # far better than guessing the prior
    pred = np.array(out["predicted"])
    assert (pred >= 0).all() and np.allclose(pred.sum(1), 1.0, atol=1e-3)


def test_alpha_choice_prefers_little_penalty_on_noiseless_data():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 3))
    y = 1 / 3 + 0.05 * x @ np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0], [1.0, 0.0, -1.0]])
    assert pa.pick_alpha(x, y, np.repeat(np.arange(4), 10)) == min(pa.RIDGE_ALPHAS)


def test_label_features_per_class_rows_deltas_and_signature():
    c = 3
    rec = pa.Received(
        sent={"clf.weight": np.zeros((c, 2)), "clf.bias": np.zeros(c)},
        upload={"clf.weight": np.array([[3.0, 4.0], [0.0, 1.0], [0.0, 0.0]]),
                "clf.bias": np.array([1.0, 2.0, 3.0]), "conv.weight": np.ones((5, 2))},
        signature={"s": np.array([[0.5, -0.5]])}, metrics={})
    feats = pa.label_features([("train", rec)], c)
    # norms, norms of the change, bias, bias change (sorted by name: bias before weight)
    np.testing.assert_allclose(feats["weights"], [1, 2, 3, 1, 2, 3, 5, 1, 0, 5, 1, 0])
    np.testing.assert_allclose(feats["signature"], [0.5, -0.5])
    assert feats["all"].size == 14


def test_node_losses_and_a_perfectly_separating_model():
    logits = torch.tensor([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0], [0.0, 5.0]])
    y = torch.tensor([0, 1, 1, 0])  # the first two are fitted (members), the rest not
    loss = pa.node_losses(logits, y)
    assert loss[0] == pytest.approx(loss[1]) and loss[0] < loss[2]
    assert pa.roc_auc(-loss[:2], -loss[2:]) == 1.0
    binary = pa.node_losses(torch.tensor([[0.0]]), torch.tensor([1]))
    assert binary[0] == pytest.approx(np.log(2.0))


def test_dp_settings_map_to_config_keys():
    assert pa.dp_overrides("off", 4.0) == {}
    assert pa.dp_overrides("client", 4.0) == {"dp": "client", "dp-epsilon": 4.0}


def test_sign_estimate_is_the_share_of_rising_entries_per_class_row():
    c = 3
    sent = {"clf.weight": np.zeros((c, 4)), "clf.bias": np.zeros(c), "conv.weight": np.zeros((5, 4))}
    upload = {"clf.weight": np.array([[1.0, 2.0, 3.0, 4.0], [1.0, -1.0, 1.0, -1.0], [-1.0] * 4]),
              "clf.bias": np.array([5.0, -5.0, 5.0]), "conv.weight": np.ones((5, 4))}
    np.testing.assert_allclose(pa.sign_label_estimate(sent, upload, c), [2 / 3, 1 / 3, 0.0])
    falling = {**upload, "clf.weight": -np.ones((c, 4))}
    np.testing.assert_allclose(pa.sign_label_estimate(sent, falling, c), np.full(c, 1 / 3))
    assert pa.sign_label_estimate(sent, {"conv.weight": np.ones((5, 4))}, c) is None


@pytest.mark.slow
def test_one_round_of_fedavg_betrays_the_label_mix_and_dp_client_hides_it(monkeypatch):
    """The classifier-sign attack on a real one-round FedAvg federation (SBM, 4 clients, in
    process): nearer every client's training labels than guessing uniform or the prior;
    under dp=client (a 100-round ε = 4 run's noise, seeded so the test is repeatable) no
    nearer than guessing."""
    from fedgraph_flwr.privacy.accountant import calibrate

    base = {"algorithm": "fedavg", "dataset": "SBM", "num-clients": 4, "rounds": 1,
            "hidden": 16}
    transport, _ = pa.run_recorded(base)
    plain = pa.sign_attack(transport, 5)
    assert plain["tv_train"] < 0.75 * min(plain["uniform"]["tv_train"], plain["prior"]["tv_train"])
    monkeypatch.setattr(pa, "KEYED_NOISE", False)
    transport, _ = pa.run_recorded({**base, "dp": "client",
                                    "dp-noise-multiplier": calibrate(4.0, 100, 1e-5)})
    noised = pa.sign_attack(transport, 5)
    assert noised["tv_train"] > 0.9 * min(noised["uniform"]["tv_train"], noised["prior"]["tv_train"])
