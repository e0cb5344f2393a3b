"""SCAFFOLD's control-variate update and MOON's model-contrastive term on hand-made inputs
with known answers, plus a 3-round smoke of each through the trainers and aggregators."""

from __future__ import annotations

import math

import numpy as np
import pytest
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

from fedgraph_flwr.algorithms import moon, scaffold
from fedgraph_flwr.algorithms.fedavg import FedAvgAggregator, FedAvgOptions, GCNTrainer
from fedgraph_flwr.core.options import ConfigError
from fedgraph_flwr.core.phases import ClientUpdate


# --- SCAFFOLD ----------------------------------------------------------------------------
def test_one_sgd_step_makes_the_control_variate_the_gradient_at_the_received_model():
    """Option II after K = 1 plain SGD step: c_i⁺ = c_i − c + (x − y)/η and
    y = x − η(g − c_i + c), so c_i⁺ = g, the local gradient at x (weight decay included),
    whatever c and c_i were."""
    config = make_config(scaffold.ScaffoldOptions, scaffold_optimizer="sgd", lr=0.1,
                         weight_decay=0.01, dropout=0.0)
    data = tiny_graph(3)
    initial = scaffold.ScaffoldTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    rng = np.random.default_rng(0)
    payload = {k: (rng.normal(size=v.shape).astype(np.float32) if k.startswith("control.") else v)
               for k, v in initial.items()}
    trainer = scaffold.ScaffoldTrainer(data, config, NUM_CLASSES, CPU)
    for c_i in trainer.local_control.values():
        c_i.copy_(torch.from_numpy(rng.normal(size=tuple(c_i.shape)).astype(np.float32)))
    previous_local = {n: c.clone() for n, c in trainer.local_control.items()}
    trainer.load_payload(payload)

    reference = GCNTrainer(data, make_config(FedAvgOptions, dropout=0.0), NUM_CLASSES, CPU)
    reference.load_payload(initial)
    loss = F.cross_entropy(reference.forward()[data.train_mask], data.y[data.train_mask])
    loss.backward()
    gradient = {n: p.grad + 0.01 * p.detach() for n, p in reference.model.named_parameters()}

    trainer.train(1)
    upload = trainer.upload()
    for name, g in gradient.items():
        assert torch.allclose(trainer.local_control[name], g, atol=1e-4), name
        sent_c = torch.from_numpy(payload[scaffold.control_key(name)])
        # upload = c + Δc_i with Δc_i = c_i⁺ − c_i
        expected = sent_c + g - previous_local[name]
        assert np.allclose(upload[scaffold.control_key(name)], expected.numpy(), atol=1e-4)


def test_server_steps_the_model_and_adds_the_participants_share_of_the_mean_control_change():
    config = make_config(scaffold.ScaffoldOptions, scaffold_weighting="uniform",
                         scaffold_global_lr=0.5)
    initial = {"w": np.array([1.0, 1.0], np.float32), "control.w": np.zeros(2, np.float32)}
    agg = scaffold.ScaffoldAggregator(config, [0, 1, 2, 3], initial)
    agg.control["control.w"] = np.array([0.2, -0.2])
    updates = {  # two of four clients: y_i and c + Δc_i
        0: ClientUpdate({"w": np.array([3.0, 1.0], np.float32),
                         "control.w": np.array([1.2, -0.2], np.float32)}, {}, 5),
        2: ClientUpdate({"w": np.array([1.0, 5.0], np.float32),
                         "control.w": np.array([0.2, 1.8], np.float32)}, {}, 50),
    }
    result = agg.aggregate(1, updates)
    # x += 0.5 · mean(y − x) = 1 + 0.5 · [1, 2]; c += (2/4) · mean([1, 0], [0, 2])
    assert np.allclose(result.payloads[1]["w"], [1.5, 2.0])
    assert np.allclose(result.payloads[3]["control.w"], [0.2 + 0.25, -0.2 + 0.5])
    assert set(result.payloads) == {0, 1, 2, 3}  # every client gets the new x and c
    assert result.payloads[0]["w"].dtype == np.float32
    # resumable: state_dict round-trips
    again = scaffold.ScaffoldAggregator(config, [0, 1, 2, 3], initial)
    again.load_state_dict(agg.state_dict())
    assert all(np.array_equal(agg.control[k], again.control[k]) for k in agg.control)


def test_with_every_client_c_is_the_mean_of_their_control_variates_as_openfgl_sets_it():
    log, agg = run_rounds(scaffold.ScaffoldTrainer, scaffold.ScaffoldAggregator,
                          make_config(scaffold.ScaffoldOptions), rounds=3)
    assert_smoke(log)
    assert log[-1]["result"].metrics["control-norm"] > 0


def test_scaffold_smoke_with_sgd():
    log, _ = run_rounds(scaffold.ScaffoldTrainer, scaffold.ScaffoldAggregator,
                        make_config(scaffold.ScaffoldOptions, scaffold_optimizer="sgd", lr=0.5), rounds=3)
    assert_smoke(log)


# --- MOON --------------------------------------------------------------------------------
def test_model_contrastive_loss_closed_form():
    """cos(z, z_glob) = 1, cos(z, z_prev) = 0, τ = 0.5: −log(e² / (e² + e⁰)) = log(1 + e⁻²)."""
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    z_prev = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    loss = moon.model_contrastive_loss(z, z_glob, z_prev, 0.5)
    assert math.isclose(float(loss), math.log(1 + math.exp(-2.0)), rel_tol=1e-6)
    # swapping the roles: cos(z, z_glob) = 0, cos(z, z_prev) = 1
    assert math.isclose(float(moon.model_contrastive_loss(z, z_prev, z_glob, 0.5)),
                        math.log(1 + math.exp(2.0)), rel_tol=1e-6)


def test_first_round_is_fedavg_to_the_bit_then_the_term_acts():
    """No previous model in round 1, so the term is 0 (the official code's empty pool)."""
    config = make_config(moon.MOONOptions)
    data = tiny_graph(5)
    initial = moon.MOONTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    trainer = moon.MOONTrainer(data, config, NUM_CLASSES, CPU)
    plain = GCNTrainer(data, make_config(FedAvgOptions), NUM_CLASSES, CPU)
    losses = []
    for t in (trainer, plain):
        t.load_payload(initial)
        torch.manual_seed(3)
        losses.append(t.train(2)["train_loss"])
    assert losses[0] == losses[1]
    assert all(np.array_equal(v, plain.upload()[k]) for k, v in trainer.upload().items())
    # round 2: the previous model is the one just trained, the global one the initial
    trainer.load_payload(initial)
    torch.manual_seed(4)
    second = trainer.train(1)
    assert second["contrastive_loss"] > 0


@pytest.mark.parametrize("nodes", ["train", "all"])
def test_moon_smoke(nodes):
    log, _ = run_rounds(moon.MOONTrainer, moon.MOONAggregator,
                        make_config(moon.MOONOptions, moon_nodes=nodes), rounds=3)
    # train_loss holds μ·ℓ_con (μ = 1) from round 2 on: the cross-entropy part must fall
    cross_entropy = [np.mean([m["train_loss"] - m["contrastive_loss"] for m in e["metrics"].values()])
                     for e in log]
    assert cross_entropy[-1] < cross_entropy[0]
    assert all(m["contrastive_loss"] == 0.0 for m in log[0]["metrics"].values())
    assert all(m["contrastive_loss"] > 0.0 for m in log[1]["metrics"].values())


def test_moon_server_is_fedavg():
    assert issubclass(moon.MOONAggregator, FedAvgAggregator)


def test_moon_without_its_term_is_fedavg_round_for_round():
    moon_log, _ = run_rounds(moon.MOONTrainer, moon.MOONAggregator,
                             make_config(moon.MOONOptions, moon_mu=0.0), rounds=3)
    fedavg_log, _ = run_rounds(GCNTrainer, FedAvgAggregator, make_config(FedAvgOptions), rounds=3)
    for a, b in zip(moon_log, fedavg_log):
        for c, payload in a["result"].payloads.items():
            assert all(np.array_equal(v, b["result"].payloads[c][k]) for k, v in payload.items())


@pytest.mark.parametrize("overrides", [{"num_layers": 1}, {"gnn": "sage"}])
def test_moon_refuses_a_model_without_a_gcn_hidden_layer_before_round_one(overrides):
    config = make_config(moon.MOONOptions, **overrides)
    initial = moon.MOONTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    with pytest.raises(ConfigError, match="gnn=gcn and num-layers >= 2"):
        moon.MOONAggregator(config, [0, 1], initial)
