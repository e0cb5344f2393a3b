"""FGSSL's node contrast, structure distillation, OpenFGL's edge term and the views, on
hand-made inputs with known answers; each flavour through 3 rounds of trainers and server."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_baselines import CPU, NUM_CLASSES, NUM_FEATURES, make_config, run_rounds, tiny_graph

from fedgraph_flwr.algorithms import fgssl
from fedgraph_flwr.algorithms.fedavg import FedAvgAggregator


def test_info_nce_closed_form():
    """Two nodes of different classes, orthogonal unit embeddings, τ = 1: each anchor's only
    positive is itself, s = I, so ℓ_i = log(e¹ + e⁰) − 1 = log(1 + e⁻¹)."""
    h = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    loss = fgssl.supervised_info_nce(h, h, torch.tensor([0, 1]), tau=1.0)
    assert math.isclose(float(loss), math.log(1 + math.exp(-1.0)), rel_tol=1e-6)
    # the same two nodes in one class: both are positives, ℓ_i = log(e + 1) − (1 + 0)/2
    same = fgssl.supervised_info_nce(h, h, torch.tensor([0, 0]), tau=1.0)
    assert math.isclose(float(same), math.log(math.e + 1) - 0.5, rel_tol=1e-6)


def test_info_nce_equals_pygcl_masked_form_and_blocks_do_not_change_it(monkeypatch):
    """The linear positive sum and the blocked denominator give PyGCL's masked InfoNCE."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, 8, generator=g), torch.randn(50, 8, generator=g)
    y = torch.randint(0, 4, (50,), generator=g)
    sim = F.normalize(a) @ F.normalize(b).t() / 0.1
    pos = (y[:, None] == y[None]).float()
    log_prob = sim - torch.log(torch.exp(sim).sum(1, keepdim=True))
    expected = -((log_prob * pos).sum(1) / pos.sum(1)).mean()
    whole = fgssl.supervised_info_nce(a, b, y, 0.1)
    monkeypatch.setattr(fgssl, "CONTRAST_BLOCK", 7)
    blocked = fgssl.supervised_info_nce(a, b, y, 0.1)
    assert torch.allclose(whole, expected, atol=1e-5) and torch.allclose(blocked, whole, atol=1e-6)


def test_structure_distillation_closed_form():
    """Nodes 0 and 1, one edge, τ_s = 1. Local: equal logits, so each node's distribution
    over (itself, the other) is (½, ½). Global: logits (a, 0) and (0, a), so with σ = e^a /
    (e^a + 1) the cosine is c = 2σ(1−σ) / (σ² + (1−σ)²) and S = softmax(1, c)."""
    a = 2.0
    local = torch.zeros(2, 2)
    global_ = torch.tensor([[a, 0.0], [0.0, a]])
    edge_index = fgssl.neighbourhood_edges(torch.tensor([[0, 1], [1, 0]]), 2)
    sigma = math.exp(a) / (math.exp(a) + 1)
    c = 2 * sigma * (1 - sigma) / (sigma**2 + (1 - sigma) ** 2)
    s = [math.exp(1) / (math.exp(1) + math.exp(c)), math.exp(c) / (math.exp(1) + math.exp(c))]
    expected = sum(p * math.log(p / 0.5) for p in s)
    loss = fgssl.structure_distillation(local, global_, edge_index, tau=1.0)
    assert math.isclose(float(loss), expected, rel_tol=1e-5)
    with_loop = fgssl.neighbourhood_edges(torch.tensor([[0, 0, 1], [0, 1, 0]]), 2)
    assert sorted(map(tuple, with_loop.t().tolist())) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    same = fgssl.structure_distillation(global_, global_, edge_index, tau=1.0)
    assert float(same) == pytest.approx(0.0, abs=1e-7)


def test_openfgl_edge_term_is_zero_for_equal_models_and_its_kl_otherwise():
    g = torch.Generator().manual_seed(1)
    h1, h2 = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    assert float(fgssl.edge_distribution(edge_index, h1, h1)) == pytest.approx(0.0, abs=1e-7)
    p = F.softmax((h2[edge_index[0]] - h2[edge_index[1]]).abs() / 0.1, dim=-1)
    q = F.softmax((h1[edge_index[0]] - h1[edge_index[1]]).abs() / 0.1, dim=-1)
    expected = (p * (p.log() - q.log())).sum() / 4  # KL(global ‖ local), batchmean over edges
    assert torch.allclose(fgssl.edge_distribution(edge_index, h1, h2), expected, atol=1e-5)


def test_views():
    x = torch.ones(4, 6)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    same_x, same_edges = fgssl.augment(x, edge_index, 0.0, 0.0)
    assert torch.equal(same_x, x) and torch.equal(same_edges, edge_index)
    torch.manual_seed(0)
    empty_x, no_edges = fgssl.augment(x, edge_index, 1.0, 1.0)
    assert not empty_x.any() and no_edges.size(1) == 0
    torch.manual_seed(0)
    masked, _ = fgssl.augment(x, edge_index, 0.0, 0.5)
    assert all(bool((masked[:, j] == masked[0, j]).all()) for j in range(6))  # whole columns


def test_views_reach_the_convolutions():
    """The convolutions are uncached: the same eval-mode model gives other logits on a view
    (a cached GCNConv would reuse the first graph's normalisation)."""
    trainer = fgssl.FGSSLTrainer(tiny_graph(0), make_config(fgssl.FGSSLOptions), NUM_CLASSES, CPU)
    trainer.model.eval()
    data = trainer.data
    clean = trainer.encode(trainer.model, data.x, data.edge_index)[2]
    torch.manual_seed(0)
    view = fgssl.augment(data.x, data.edge_index, 0.8, 0.0)
    assert not torch.allclose(trainer.encode(trainer.model, *view)[2], clean)
    assert torch.equal(trainer.encode(trainer.model, data.x, data.edge_index)[2], clean)


@pytest.mark.parametrize("flavour, uses_global", [("paper", True), ("official", False), ("openfgl", True)])
def test_which_flavours_use_the_global_model(flavour, uses_global):
    config = make_config(fgssl.FGSSLOptions, fgssl_flavour=flavour)
    trainer = fgssl.FGSSLTrainer(tiny_graph(2), config, NUM_CLASSES, CPU)
    trainer.load_payload(fgssl.FGSSLTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config))
    data = trainer.data
    views = (fgssl.augment(data.x, data.edge_index, 0.3, 0.3),
             fgssl.augment(data.x, data.edge_index, 0.8, 0.5))
    trainer.model.eval()  # no dropout: the terms are functions of the views alone
    first = trainer.calibration(*views)
    other = copy.deepcopy(trainer.global_model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-2.0)
    trainer.global_model = other
    assert (not torch.equal(trainer.calibration(*views), first)) == uses_global
    assert not any(p.requires_grad for p in trainer.global_model.parameters())


@pytest.mark.parametrize("flavour", fgssl.FLAVOURS)
def test_fgssl_smoke(flavour):
    log, _ = run_rounds(fgssl.FGSSLTrainer, fgssl.FGSSLAggregator,
                        make_config(fgssl.FGSSLOptions, fgssl_flavour=flavour), rounds=3)
    cross_entropy = [np.mean([m["train_loss"] - m["calibration_loss"] for m in e["metrics"].values()])
                     for e in log]
    assert all(np.isfinite(cross_entropy)) and cross_entropy[-1] < cross_entropy[0]
    assert all(m["calibration_loss"] > 0.0 for e in log for m in e["metrics"].values())


def test_fgssl_server_is_fedavg():
    assert issubclass(fgssl.FGSSLAggregator, FedAvgAggregator)


def test_fgssl_refuses_a_one_layer_gcn():
    config = make_config(fgssl.FGSSLOptions, num_layers=1)
    initial = fgssl.FGSSLTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    with pytest.raises(ValueError, match="num-layers"):
        fgssl.FGSSLAggregator(config, [0, 1], initial)
