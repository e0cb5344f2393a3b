"""FedGTA: the r-normalised adjacency, GAMLP's hop attention, label propagation, moments,
the smoothing confidence, the server's accept sets and confidence-weighted mixing, and
short runs (Cora-10 in process; a Flower simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from fedgraph_flwr.algorithms.fedgta import (
    CONFIDENCE_KEY,
    MOMENTS_KEY,
    FedGTAAggregator,
    FedGTAOptions,
    FedGTATrainer,
    accept_sets,
    accept_weights,
    label_propagation,
    moments,
    smoothing_confidence,
)
from fedgraph_flwr.config import all_defaults, resolve_config
from fedgraph_flwr.core.options import ConfigError
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.nn.gamlp import GAMLP, normalized_adjacency, propagate_hops

from helpers import labelled_graph, round_metrics, simulation_equals_in_process

CPU = torch.device("cpu")
# A path 0 - 1 - 2, both directions.
PATH = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _graph(n: int = 60, num_classes: int = 3, seed: int = 0) -> Data:
    return labelled_graph(n, num_classes, seed=seed)


def _config(**extra) -> dict:
    return resolve_config(None, {"algorithm": "fedgta", "hidden": 16, "dataset": "SBM", **extra})


# --- the client's maths ---------------------------------------------------------------------
def test_normalized_adjacency_is_d_half_a_plus_i_d_half_on_a_path():
    # Ã = A + I on the path has row sums 2, 3, 2: Â_uv = 1/sqrt(d_u d_v) on Ã's entries.
    dense = normalized_adjacency(PATH, 3, r=0.5).to_dense()
    s6 = 1 / math.sqrt(6)
    expected = torch.tensor([[1 / 2, s6, 0], [s6, 1 / 3, s6], [0, s6, 1 / 2]])
    torch.testing.assert_close(dense, expected)
    # r = 1: D̃⁰ Ãᵀ D̃⁻¹, columns sum to 1 (Â x averages what each source sends).
    torch.testing.assert_close(normalized_adjacency(PATH, 3, r=1.0).to_dense().sum(dim=0),
                               torch.ones(3))
    x = torch.arange(6.0).view(3, 2)
    hops = propagate_hops(x, normalized_adjacency(PATH, 3), 2)
    assert hops.shape == (3, 3, 2)
    torch.testing.assert_close(hops[0], x)
    torch.testing.assert_close(hops[2], expected @ (expected @ x))


def _official_jk_scores(model: GAMLP, hops: torch.Tensor) -> torch.Tensor:
    """The code's construction: rows [all hops ‖ hop k] stacked hop-major, one Linear."""
    feat = list(hops)
    reference = torch.hstack(feat).repeat(len(feat), 1)
    stacked = torch.hstack((reference, torch.vstack(feat)))  # [(K+1)·m, (K+2)·d]
    return model.gate(stacked).view(-1)  # hop-major


@pytest.mark.parametrize("layout", ["node", "code"])
def test_gamlp_hop_attention_matches_the_stacked_linear(layout):
    torch.manual_seed(0)
    model = GAMLP(4, 8, 3, num_hops=2, num_layers=3, dropout=0.0, gate_layout=layout)
    hops = torch.randn(3, 5, 4)  # K+1 = 3 hops, 5 nodes
    flat = _official_jk_scores(model, hops)
    if layout == "node":
        scores = flat.view(3, 5).t()  # node i, hop k
    else:
        scores = flat.view(5, 3)  # the code's view(-1, K+1)
    expected = F.softmax(torch.sigmoid(scores), dim=1)
    attention = model.hop_attention(hops)
    torch.testing.assert_close(attention, expected)
    torch.testing.assert_close(attention.sum(dim=1), torch.ones(5))
    # The node layout is row-wise: feeding a subset of rows gives those rows' outputs.
    model.eval()
    full, part = model(hops), model(hops, torch.tensor([1, 3]))
    if layout == "node":
        torch.testing.assert_close(part, full[[1, 3]])


def test_gamlp_parameters_and_validation():
    model = GAMLP(6, 10, 3, num_hops=3, num_layers=3)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["gate.weight"] == (1, 5 * 6)
    assert shapes["mlp.0.weight"] == (10, 6) and shapes["mlp.2.weight"] == (3, 10)
    assert shapes["prelu.weight"] == (1,)
    assert torch.all(model.mlp[0].bias == 0)
    with pytest.raises(ValueError, match="num_layers"):
        GAMLP(6, 10, 3, num_layers=1)
    with pytest.raises(ValueError, match="gate_layout"):
        GAMLP(6, 10, 3, gate_layout="x")
    with pytest.raises(ValueError, match="shape"):
        model(torch.randn(2, 4, 6))


def test_label_propagation_by_hand():
    """Path 0 - 1 - 2, node 0 labelled class 0, one step with α = 0.5."""
    adjacency = normalized_adjacency(PATH, 3)
    a = adjacency.to_dense()
    probs = torch.tensor([[0.2, 0.8], [0.6, 0.4], [0.1, 0.9]])
    labels = torch.tensor([0, 1, 1])
    train = torch.tensor([True, False, False])
    start = torch.tensor([[1.0, 0.0], [0.6, 0.4], [0.1, 0.9]])  # F⁰: one-hot on train
    for boost in (False, True):
        f = 0.5 * a @ start + 0.5 * start
        if boost:
            f[0] += start[0]
        raw, sharp = label_propagation(probs, labels, train, adjacency, steps=1, alpha=0.5,
                                       temperature=20.0, train_boost=boost)
        torch.testing.assert_close(raw[1:], F.softmax(f, dim=1)[1:])
        torch.testing.assert_close(sharp[1:], F.softmax(f / 20.0, dim=1)[1:])
        torch.testing.assert_close(raw[0], torch.tensor([1.0, 0.0]))  # train rows reset
        torch.testing.assert_close(sharp[0], torch.tensor([1.0, 0.0]))
    # The boost reaches the neighbours from the second step on.
    two = [label_propagation(probs, labels, train, adjacency, 2, 0.5, 20.0, b)[0] for b in (0, 1)]
    assert not torch.allclose(two[0][1], two[1][1])
    # No steps: the softmax of F⁰ itself.
    raw, _ = label_propagation(probs, labels, train, adjacency, 0, 0.5, 20.0)
    torch.testing.assert_close(raw[1:], F.softmax(start, dim=1)[1:])



def test_openfgl_label_propagation_is_pygs_label_propagation():
    """``variant="openfgl"`` on Â without self-loops = PyG's LabelPropagation with a mask (what
    OpenFGL's FedGTA client calls), before the softmaxes and the reset of the training rows."""
    from torch_geometric.nn.models import LabelPropagation

    gen = torch.Generator().manual_seed(0)
    n, c = 12, 3
    edges = torch.randint(0, n, (2, 30), generator=gen)
    edges = torch.unique(torch.cat([edges, edges.flip(0)], 1), dim=1)
    edges = edges[:, edges[0] != edges[1]]
    probs = F.softmax(torch.randn(n, c, generator=gen), dim=1)
    labels = torch.randint(0, c, (n,), generator=gen)
    train = torch.zeros(n, dtype=torch.bool)
    train[:4] = True
    expected = LabelPropagation(num_layers=5, alpha=0.5)(probs, edges, mask=train)
    raw, sharp = label_propagation(probs, labels, train, normalized_adjacency(
        edges, n, self_loops=False), 5, 0.5, 20.0, variant="openfgl")
    rest = ~train
    torch.testing.assert_close(raw[rest], F.softmax(expected, dim=1)[rest])
    torch.testing.assert_close(sharp[rest], F.softmax(expected / 20.0, dim=1)[rest])
    torch.testing.assert_close(raw[train], F.one_hot(labels[train], c).float())
    # The project's default (the official code's) differs: one-hot F⁰ on training rows.
    code, _ = label_propagation(probs, labels, train, normalized_adjacency(edges, n), 5, 0.5, 20.0)
    assert not torch.allclose(code[rest], raw[rest])
    with pytest.raises(ValueError, match="LP variant"):
        label_propagation(probs, labels, train, normalized_adjacency(edges, n), 1, 0.5, 20.0,
                          variant="pyg")
    with pytest.raises(ConfigError, match="fedgta-lp-train-boost"):
        FedGTAOptions.from_config({**all_defaults(), "fedgta-lp": "openfgl",
                                   "fedgta-lp-train-boost": True})

def test_moments_by_hand():
    probs = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5]])
    raw = moments(probs, 2, "raw").view(2, 2)
    torch.testing.assert_close(raw, torch.tensor([[0.5, 0.5], [0.375, 0.375]]))
    central = moments(probs, 2, "central").view(2, 2)
    torch.testing.assert_close(central, torch.tensor([[0.0, 0.0], [0.125, 0.125]]))
    hybrid = moments(probs, 2, "hybrid")
    assert hybrid.shape == (2 * 2 * 2,)
    torch.testing.assert_close(hybrid, torch.cat([raw.view(-1), central.view(-1)]))
    # Third central moment: skew of class 0 is 0 here (symmetric about 0.5).
    assert float(moments(probs, 3, "central").view(3, 2)[2, 0]) == pytest.approx(0.0)


def test_smoothing_confidence_by_hand():
    # A confident node (degree 2) and an undecided one (degree 1), C = 2.
    sharp = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    degree = torch.tensor([2, 1])
    expected = 2 * (2 / math.e) + 1 * (2 / math.e - math.log(2))
    assert float(smoothing_confidence(sharp, degree)) == pytest.approx(expected, abs=1e-6)
    # Never negative: the uniform row is the least confident one and still >= 0 (C = 3).
    uniform = torch.full((4, 3), 1 / 3)
    assert float(smoothing_confidence(uniform, torch.ones(4))) == pytest.approx(
        4 * (3 / math.e - math.log(3)), abs=1e-5)
    assert float(smoothing_confidence(uniform, torch.ones(4))) > 0


# --- the server's maths ---------------------------------------------------------------------
def test_accept_sets_and_confidence_weights_by_hand():
    # cos(s0, s1) = 0.8, cos(s0, s2) = 0, cos(s1, s2) = 0.6.
    signatures = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    confidences = np.array([1.0, 3.0, 4.0])
    weights, similarity = accept_weights(signatures, confidences, threshold=0.7)
    np.testing.assert_allclose(similarity[0, 1], 0.8)
    np.testing.assert_array_equal(accept_sets(similarity, 0.7),
                                  [[1, 1, 0], [1, 1, 0], [0, 0, 1]])
    np.testing.assert_allclose(weights, [[0.25, 0.75, 0], [0.25, 0.75, 0], [0, 0, 1]])
    weights, _ = accept_weights(signatures, confidences, threshold=0.5)  # 1 and 2 now agree
    np.testing.assert_allclose(weights, [[0.25, 0.75, 0], [1 / 8, 3 / 8, 4 / 8], [0, 3 / 7, 4 / 7]])
    # τ = 1: nobody else is accepted, so every client keeps its own model (Local).
    weights, _ = accept_weights(signatures, confidences, threshold=1.0)
    np.testing.assert_allclose(weights, np.eye(3))
    # Zero confidences in an accept set: uniform over it.
    weights, _ = accept_weights(signatures, np.zeros(3), threshold=0.7)
    np.testing.assert_allclose(weights, [[0.5, 0.5, 0], [0.5, 0.5, 0], [0, 0, 1]])


def test_aggregator_sends_each_client_its_confidence_weighted_average():
    cfg = _config(**{"fedgta-accept": 0.7})
    aggregator = FedGTAAggregator(cfg, [0, 1, 2, 3], {})
    signatures = {0: [1.0, 0.0], 1: [0.8, 0.6], 2: [0.0, 1.0]}
    confidences = {0: 1.0, 1: 3.0, 2: 4.0}
    updates = {c: ClientUpdate(
        arrays={"w": np.full((2, 2), float(c), np.float32), "steps": np.array([c], np.int64)},
        signature={MOMENTS_KEY: np.array(signatures[c], np.float32),
                   CONFIDENCE_KEY: np.array([confidences[c]], np.float32)},
        num_train=10) for c in (0, 1, 2)}
    result = aggregator.aggregate(1, updates)
    assert set(result.payloads) == {0, 1, 2}  # client 3 keeps what it was sent last
    np.testing.assert_allclose(result.payloads[0]["w"], np.full((2, 2), 0.75))  # 0.25·0 + 0.75·1
    np.testing.assert_allclose(result.payloads[1]["w"], np.full((2, 2), 0.75))
    np.testing.assert_allclose(result.payloads[2]["w"], np.full((2, 2), 2.0))
    assert result.payloads[2]["steps"].tolist() == [2]  # integer arrays stay per client
    assert result.payloads[0]["w"].dtype == np.float32
    assert result.metrics["accept_size_mean"] == pytest.approx(5 / 3)
    assert result.metrics["accept_size_min"] == 1 and result.metrics["accept_size_max"] == 2
    assert result.diagnostics["weights"].shape == (3, 3)


# --- the trainer ----------------------------------------------------------------------------
def test_signature_is_the_lp_moments_and_confidence_of_the_current_model():
    data = _graph()
    cfg = _config()
    trainer = FedGTATrainer(data, cfg, 3, CPU)
    trainer.train(2)
    signature = trainer.signature()
    opts = cfg.options_of(FedGTAOptions)
    assert signature[MOMENTS_KEY].shape == (2 * opts.num_moments * 3,)
    assert signature[CONFIDENCE_KEY].shape == (1,) and signature[CONFIDENCE_KEY][0] > 0
    trainer.model.eval()
    with torch.no_grad():
        probs = F.softmax(trainer.model(trainer.hops), dim=1)
    raw, sharp = label_propagation(probs, data.y, data.train_mask, trainer.adjacency, 5, 0.5, 20.0)
    np.testing.assert_allclose(signature[MOMENTS_KEY], moments(raw, 6, "hybrid").numpy(), rtol=1e-5)
    degree = torch.bincount(data.edge_index[0], minlength=data.num_nodes)
    assert signature[CONFIDENCE_KEY][0] == pytest.approx(float(smoothing_confidence(sharp, degree)),
                                                         rel=1e-5)


def test_upload_is_the_whole_model_and_matches_initial_arrays():
    cfg = _config()
    trainer = FedGTATrainer(_graph(), cfg, 3, CPU)
    initial = FedGTATrainer.initial_arrays(8, 3, cfg)
    upload = trainer.upload()
    assert upload.keys() == initial.keys() == {k for k, _ in trainer.model.state_dict().items()}
    for k in upload:
        np.testing.assert_array_equal(upload[k], initial[k])
    gcn = FedGTATrainer(_graph(), _config(**{"fedgta-backbone": "gcn"}), 3, CPU)
    assert gcn.hops is None and any(k.startswith("convs.") for k in gcn.upload())


def test_evaluate_before_train_reports_the_received_model():
    data = _graph()
    before = FedGTATrainer(data, _config(**{"fedgta-evaluate": "before-train"}), 3, CPU)
    after = FedGTATrainer(data, _config(), 3, CPU)
    received = after.evaluate()
    before.train(3)
    after.train(3)
    assert before.evaluate() == received  # the model as the server sent it
    assert after.evaluate() != received
    assert before.evaluate() != received  # consumed: a second call scores the trained model


def test_switches_keep_live_and_restored_trainers_equal(tmp_path, data_root):
    cfg = {"algorithm": "fedgta", "dataset": "SBM", "num-clients": 3, "rounds": 2, "hidden": 16,
           "local-epochs": 2, "data-root": str(data_root), "output-dir": str(tmp_path),
           "fedgta-gate-layout": "code", "fedgta-lp-train-boost": True,
           "fedgta-evaluate": "before-train", "fedgta-moment-type": "raw"}
    live = run_federation(dict(cfg, **{"run-name": "live"}), write=False)
    restored = run_federation(dict(cfg, **{"run-name": "restored", "client-state": "file",
                                           "client-state-dir": str(tmp_path / "state")}),
                              write=False)
    assert round_metrics(live) == round_metrics(restored)


# --- runs -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_cora_10_clients_short_run(tmp_path, data_root):
    """Ten rounds on Cora, 10 METIS clients, the paper's settings: a sane accuracy, and the
    server's accept sets neither empty nor everything."""
    results = run_federation({
        "algorithm": "fedgta", "dataset": "Cora", "num-clients": 10, "rounds": 10,
        "hidden": 64, "lr": 0.01, "weight-decay": 5e-4, "dropout": 0.5, "local-epochs": 3,
        "data-root": str(data_root), "output-dir": str(tmp_path), "verbose": False}, write=False)
    assert results["final"]["test_at_best_val"] > 65
    sizes = [r["aggregate"]["accept_size_mean"] for r in results["rounds"]]
    assert all(1 <= s <= 10 for s in sizes)
    # Each client sends its model, 2·P·C moments and one confidence: the same every round.
    sizes = {tuple(r["bytes_received"].values()) for r in results["rounds"]}
    assert len(sizes) == 1


@pytest.mark.simulation
def test_flower_simulation_smoke_matches_inprocess(tmp_path, data_root):
    simulation_equals_in_process({"algorithm": "fedgta", "dataset": "Cora", "num-clients": 3,
                                  "rounds": 3, "hidden": 16, "data-root": str(data_root)},
                                 tmp_path, num_supernodes=3)
