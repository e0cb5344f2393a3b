"""FedProto and FedTGP: prototype aggregation, local prototypes, the margin loss and the
class gaps on hand-made inputs with known answers, both flavours, and 3-round smokes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_baselines import CPU, NUM_CLASSES, make_config, run_rounds, tiny_graph

from fedgraph_flwr.algorithms import fedproto, fedtgp


def test_class_means_and_absent_classes():
    z = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    labels = torch.tensor([0, 0, 2])
    means = fedproto.class_means(z, labels, 3)
    assert torch.equal(means, torch.tensor([[2.0, 1.0], [0.0, 0.0], [5.0, 5.0]]))


def test_official_aggregation_averages_over_the_clients_that_have_the_class():
    prototypes = np.array([[[1.0, 1.0], [0.0, 0.0]],    # client 0: class 0 only
                           [[3.0, 5.0], [2.0, 4.0]],    # client 1: both
                           [[0.0, 0.0], [0.0, 0.0]]])   # client 2: neither
    out = fedproto.aggregate_prototypes(prototypes, np.array([0.2, 0.3, 0.5]), "official")
    assert np.allclose(out, [[2.0, 3.0], [2.0, 4.0]])


def test_openfgl_aggregation_is_the_weighted_sum_zero_rows_included():
    prototypes = np.array([[[1.0, 1.0], [0.0, 0.0]],
                           [[3.0, 5.0], [2.0, 4.0]],
                           [[0.0, 0.0], [0.0, 0.0]]])
    out = fedproto.aggregate_prototypes(prototypes, np.array([0.2, 0.3, 0.5]), "openfgl")
    assert np.allclose(out, [[0.2 + 0.9, 0.2 + 1.5], [0.6, 1.2]])


@pytest.mark.parametrize("flavour", ["official", "openfgl"])
def test_uploads_are_class_means_of_the_training_nodes(flavour):
    """official: z of the last epoch's forward, before its step (here the initial model);
    openfgl: z of the trained model in eval mode. No dropout, so both are deterministic."""
    config = make_config(fedproto.FedProtoOptions, fedproto_flavour=flavour, dropout=0.0)
    data = tiny_graph(4)
    trainer = fedproto.FedProtoTrainer(data, config, NUM_CLASSES, CPU)
    twin = fedproto.FedProtoTrainer(data, config, NUM_CLASSES, CPU)  # the same initial model
    trainer.load_payload(fedproto.FedProtoTrainer.initial_arrays(8, NUM_CLASSES, config))
    trainer.train(1)
    reference = twin if flavour == "official" else trainer
    with torch.no_grad():
        z, _ = reference.hidden(training=False)
    expected = np.stack([z[data.train_mask & (data.y == c)].mean(0).numpy()
                         for c in range(NUM_CLASSES)])
    assert np.allclose(trainer.upload()[fedproto.PROTOTYPES_KEY], expected, atol=1e-6)
    assert not np.allclose(twin.upload()[fedproto.PROTOTYPES_KEY], expected)  # zeros before training


def test_regulariser_is_the_mse_to_the_global_prototype_of_each_nodes_class():
    config = make_config(fedproto.FedProtoOptions, dropout=0.0)
    data = tiny_graph(6)
    trainer = fedproto.FedProtoTrainer(data, config, NUM_CLASSES, CPU)
    g = torch.randn(NUM_CLASSES, config.hidden)
    g[2] = 0.0  # class 2 has no global prototype: its nodes add 0 but count
    trainer.global_prototypes = g
    with torch.no_grad():
        z, _ = trainer.hidden(training=False)
        zt, yt = z[data.train_mask], data.y[data.train_mask]
        diff = torch.where((yt != 2)[:, None], zt - g[yt], torch.zeros_like(zt))
        assert torch.isclose(trainer.prototype_loss(z), diff.pow(2).mean())


@pytest.mark.parametrize("flavour", ["official", "openfgl"])
def test_fedproto_smoke(flavour):
    log, _ = run_rounds(fedproto.FedProtoTrainer, fedproto.FedProtoAggregator,
                        make_config(fedproto.FedProtoOptions, fedproto_flavour=flavour), rounds=3)
    assert all(m["prototype_loss"] == 0.0 for m in log[0]["metrics"].values())
    assert all(m["prototype_loss"] > 0.0 for m in log[1]["metrics"].values())
    ce = [np.mean([m["train_loss"] - m["prototype_loss"] for m in e["metrics"].values()]) for e in log]
    assert ce[-1] < ce[0]


# --- FedTGP (FedProto's clients, a trained server) ------------------------------------------
def test_margin_loss_closed_form():
    """One prototype at distance 1 from its class centre and 3 from the other, margin 1:
    logits −(1 + 1), −3, so CE = log(1 + e^{−1})."""
    p = torch.tensor([[1.0, 0.0]])
    centres = torch.tensor([[0.0, 0.0], [4.0, 0.0]])
    loss = fedtgp.margin_loss(p, torch.tensor([0]), centres, 1.0)
    assert torch.isclose(loss, torch.log1p(torch.exp(torch.tensor(-1.0))))


def test_class_gaps_nearest_other_class_and_lonely_classes_take_the_smallest():
    means = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0], [9.0, 9.0]])
    present = torch.tensor([True, True, True, False])
    gaps = fedtgp.class_gaps(means, present)
    assert torch.allclose(gaps, torch.tensor([3.0, 3.0, 4.0, 3.0]))


@pytest.mark.parametrize("flavour", ["official", "openfgl"])
def test_fedtgp_smoke_and_the_server_pulls_prototypes_to_their_classes(flavour):
    config = make_config(fedtgp.FedTGPOptions, fedtgp_flavour=flavour, fedtgp_server_epochs=50)
    log, agg = run_rounds(fedtgp.FedTGPTrainer, fedtgp.FedTGPAggregator, config, rounds=3)
    assert all(m["prototype_loss"] == 0.0 for m in log[0]["metrics"].values())
    assert all(m["prototype_loss"] > 0.0 for m in log[1]["metrics"].values())
    assert all(np.isfinite(e["result"].metrics["tgp-loss"]) for e in log)
    initial = {fedproto.PROTOTYPES_KEY: np.zeros((3, 16), np.float32)}
    again = fedtgp.FedTGPAggregator(config, [0, 1, 2], initial)
    again.load_state_dict(agg.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(agg.tgp.parameters(), again.tgp.parameters()))


@pytest.mark.parametrize("flavour, predict, rule", [
    ("official", "auto", "prototype"), ("openfgl", "auto", "head"),
    ("official", "head", "head"), ("openfgl", "prototype", "prototype")])
def test_fedtgp_prediction_rule_follows_the_flavour_unless_set(flavour, predict, rule):
    """With global prototypes placed on class c's side, the prototype rule scores what the
    nearest prototype says and the head rule what the GCN's head says."""
    config = make_config(fedtgp.FedTGPOptions, fedtgp_flavour=flavour, fedtgp_predict=predict)
    trainer = fedtgp.FedTGPTrainer(tiny_graph(3), config, NUM_CLASSES, CPU)
    assert trainer.prediction_rule() == rule
    trainer.model.eval()
    z, _ = trainer.hidden(training=False)
    logits = trainer.forward()
    far = z.abs().max() * 100
    trainer.global_prototypes = torch.full((NUM_CLASSES, z.size(1)), float(far))
    trainer.global_prototypes[1] = z.mean(0)  # every node nearest to class 1's prototype
    data = trainer.data
    expected_prototype = float((data.y[data.test_mask] == 1).float().mean())
    expected_head = float((logits.argmax(1) == data.y)[data.test_mask].float().mean())
    expected = expected_prototype if rule == "prototype" else expected_head
    assert trainer.evaluate()["test_metric"] == pytest.approx(expected)
