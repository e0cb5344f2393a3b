"""FedDC's drift and correction updates (client and server) on hand-made inputs with
known answers, OpenFGL's flavour's round-1 and lagging drift, and a 3-round smoke."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from test_baselines import (
    CPU,
    NUM_CLASSES,
    NUM_FEATURES,
    assert_smoke,
    make_config,
    run_rounds,
    tiny_graph,
)

from fedgraph_flwr.algorithms import feddc
from fedgraph_flwr.algorithms.fedavg import FedAvgOptions, GCNTrainer
from fedgraph_flwr.core.phases import ClientUpdate


def _model_keys(initial):
    return [k for k in initial if not k.startswith(feddc.DRIFT_PREFIX)]


def test_one_sgd_step_follows_the_official_penalty_correction_and_state_updates():
    """θ = w − η(∇CE(w) + (α/ω)·h_i + g/ω − g_i) from θ = w; then h_i += Δθ and
    g_i ← g_i − g/ω − Δθ/η (K = 1), and the upload's drift is the new h_i."""
    alpha, share, lr = 0.3, 2.0, 0.1
    config = make_config(feddc.FedDCOptions, feddc_optimizer="sgd", feddc_alpha=alpha, lr=lr,
                         weight_decay=0.0, dropout=0.0, feddc_max_grad_norm=1e6)
    data = tiny_graph(3)
    initial = feddc.FedDCTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    rng = np.random.default_rng(0)
    payload = {k: initial[k] for k in _model_keys(initial)}
    for k in _model_keys(initial):
        payload[feddc.correction_key(k)] = rng.normal(size=initial[k].shape).astype(np.float32)
    payload[feddc.SHARE_KEY] = np.array([share])
    trainer = feddc.FedDCTrainer(data, config, NUM_CLASSES, CPU)
    for name in trainer.drift:
        shape = tuple(trainer.drift[name].shape)
        trainer.drift[name] = torch.from_numpy(rng.normal(size=shape).astype(np.float32))
        trainer.local_correction[name] = torch.from_numpy(rng.normal(size=shape).astype(np.float32))
    h = {n: t.clone() for n, t in trainer.drift.items()}
    g_i = {n: t.clone() for n, t in trainer.local_correction.items()}
    trainer.load_payload(payload)

    reference = GCNTrainer(data, make_config(FedAvgOptions, dropout=0.0), NUM_CLASSES, CPU)
    reference.load_payload(initial)
    F.cross_entropy(reference.forward()[data.train_mask], data.y[data.train_mask]).backward()

    trainer.train(1)
    upload = trainer.upload()
    for name, param in trainer.model.named_parameters():
        w = torch.from_numpy(initial[name])
        g = torch.from_numpy(payload[feddc.correction_key(name)])
        grad = dict(reference.model.named_parameters())[name].grad
        expected = w - lr * (grad + alpha / share * h[name] + g - g_i[name])
        assert torch.allclose(param.detach(), expected, atol=1e-5), name
        delta = param.detach() - w
        assert torch.allclose(trainer.drift[name], h[name] + delta, atol=1e-6)
        assert torch.allclose(trainer.local_correction[name], g_i[name] - g - delta / lr, atol=1e-4)
        assert np.allclose(upload[feddc.drift_key(name)], trainer.drift[name].numpy())


def test_official_server_step_on_two_of_three_clients():
    """β = 1/(Kη) = 2; ω = n·2/Σn over the two seen = 0.5, 1.5; g += Σ(−g − ωβΔθ)/3;
    w = mean θ + Σh/3 (the unseen client's h is 0)."""
    config = make_config(feddc.FedDCOptions, local_epochs=2, lr=0.25)
    initial = {"w": np.array([1.0, 1.0], np.float32), "drift.w": np.zeros(2, np.float32)}
    agg = feddc.FedDCAggregator(config, [0, 1, 2], initial)
    agg.correction["w"] = np.array([0.3, -0.6])
    updates = {
        0: ClientUpdate({"w": np.array([2.0, 1.0], np.float32),
                         "drift.w": np.array([0.5, 0.0], np.float32)}, {}, 10),
        1: ClientUpdate({"w": np.array([1.0, 3.0], np.float32),
                         "drift.w": np.array([0.0, -1.0], np.float32)}, {}, 30),
    }
    result = agg.aggregate(1, updates)
    g = np.array([0.3, -0.6]) + (2 * -np.array([0.3, -0.6]) - 0.5 * 2 * np.array([1.0, 0.0])
                                 - 1.5 * 2 * np.array([0.0, 2.0])) / 3
    assert np.allclose(agg.correction["w"], g)
    w = np.array([1.5, 2.0]) + np.array([0.5, -1.0]) / 3
    for c in (0, 1, 2):
        assert np.allclose(result.payloads[c]["w"], w)
        assert result.payloads[c]["w"].dtype == np.float32
    assert np.allclose(result.payloads[0]["correction.w"], g / 0.5)
    assert np.allclose(result.payloads[1]["correction.w"], g / 1.5)
    assert np.allclose(result.payloads[2]["correction.w"], g)  # not seen yet: ω = 1
    assert result.payloads[1][feddc.SHARE_KEY][0] == 1.5
    again = feddc.FedDCAggregator(config, [0, 1, 2], initial)
    again.load_state_dict(agg.state_dict())
    assert again.drifts.keys() == agg.drifts.keys() and again.num_train == agg.num_train
    assert np.array_equal(again.correction["w"], agg.correction["w"])
    assert np.array_equal(again.drifts[1]["w"], agg.drifts[1]["w"])


def test_openfgl_server_weights_model_plus_drift_by_training_nodes():
    config = make_config(feddc.FedDCOptions, feddc_flavour="openfgl")
    initial = {"w": np.array([1.0], np.float32), "drift.w": np.zeros(1, np.float32)}
    agg = feddc.FedDCAggregator(config, [0, 1], initial)
    def update(theta: float, h: float, n: int) -> ClientUpdate:
        return ClientUpdate({"w": np.array([theta], np.float32), "drift.w": np.array([h], np.float32)}, {}, n)

    updates = {0: update(2.0, 1.0, 10), 1: update(4.0, 0.0, 30)}
    result = agg.aggregate(1, updates)
    assert np.allclose(result.payloads[0]["w"], 0.25 * 3.0 + 0.75 * 4.0)
    assert set(result.payloads[0]) == {"w"}  # nothing but w: Δ̄ adds no gradient


def test_openfgl_round_one_is_plain_training_and_its_drift_lags_one_round():
    config = make_config(feddc.FedDCOptions, feddc_flavour="openfgl", feddc_alpha=0.1,
                         feddc_optimizer="adam")
    data = tiny_graph(5)
    initial = feddc.FedDCTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    trainer = feddc.FedDCTrainer(data, config, NUM_CLASSES, CPU)
    plain = GCNTrainer(data, make_config(FedAvgOptions), NUM_CLASSES, CPU)
    trainer.load_payload(initial)
    plain.load_payload(initial)
    for t in (trainer, plain):
        torch.manual_seed(11)
        t.train(3)
    for (name, p), q in zip(trainer.model.named_parameters(), plain.model.parameters()):
        assert torch.equal(p, q), name
        assert not trainer.drift[name].any()  # h grew by the previous update: 0
    first = {n: t.clone() for n, t in trainer.previous_update.items()}
    assert any(t.any() for t in first.values())
    round2 = config.with_keys({"server-round": 2})
    trainer2 = feddc.FedDCTrainer(data, round2, NUM_CLASSES, CPU)
    trainer2.load_local_state(trainer.local_state())
    trainer2.load_payload({k: v for k, v in trainer.upload().items()})
    trainer2.train(3)
    for name, h in trainer2.drift.items():
        assert torch.equal(h, first[name])  # round 2 adds round 1's update


def test_feddc_smoke_both_flavours():
    for flavour in feddc.FLAVOURS:
        config = make_config(feddc.FedDCOptions, feddc_flavour=flavour, lr=0.1)  # plain SGD
        initial = feddc.FedDCTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
        keys = set(_model_keys(initial))
        if flavour == "official":
            keys |= {feddc.correction_key(k) for k in _model_keys(initial)} | {feddc.SHARE_KEY}
        log, agg = run_rounds(feddc.FedDCTrainer, feddc.FedDCAggregator, config, rounds=3,
                              payload_keys=keys)
        assert_smoke(log)
        assert any(np.abs(h).sum() > 0 for h in agg.drifts[0].values())  # h_i was sent
