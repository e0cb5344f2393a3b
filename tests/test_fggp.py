"""FGGP: its characteristic steps on hand-made inputs, the server's queue, and short runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_fedsage import _graph  # a small three-class graph
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from fedgraph_flwr.algorithms.fggp import (
    PROTOTYPES_KEY,
    QUEUE_KEY,
    QUEUE_LABELS_KEY,
    FGGPAggregator,
    FGGPTrainer,
    cluster_class_prototypes,
    graph_augmentation_loss,
    knn_view_edges,
    official_alignment,
    openfgl_alignment,
    pseudo_labels,
    queue_scores,
    weighted_class_prototypes,
)
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.options import ConfigError
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.client_runtime import state_from_bytes, state_to_bytes
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.nn.pmlp_gcn import GraphAugmenter, gcn_propagation, row_normalised

from helpers import simulation_equals_in_process

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(round_: int = 1, **extra):
    return resolve_config(None, {"algorithm": "fggp", "dataset": "SBM", "hidden": 8,
                                 "num-layers": 3, **extra}).with_keys({"server-round": round_})


# --- the characteristic steps, by hand --------------------------------------------------------
def test_official_alignment_by_hand():
    """K = 2: row k's logits are [ĝ_k·ô_k, ĝ_k·ĝ_j, ĝ_k·ô_j] / τ, target the first."""
    g = torch.tensor([[2.0, 0.0], [0.0, 3.0]])  # normalised: e1, e2
    o = torch.tensor([[1.0, 1.0], [0.0, 5.0]])  # normalised: (1,1)/√2, e2
    s = 1 / math.sqrt(2)
    row0 = torch.tensor([s, 0.0, 0.0]) / 0.5  # ĝ0·ô0, ĝ0·ĝ1, ĝ0·ô1
    row1 = torch.tensor([1.0, 0.0, s]) / 0.5  # ĝ1·ô1, ĝ1·ĝ0, ĝ1·ô0
    expected = 0.5 * sum(torch.logsumexp(r, 0) - r[0] for r in (row0, row1))
    torch.testing.assert_close(official_alignment(g, o, 0.5), expected)
    assert float(official_alignment(g[:1], o[:1], 0.5)) == 0.0  # one class: no negatives


def test_openfgl_alignment_uses_raw_dot_products_across_views_only():
    view = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    own = torch.tensor([[1.0, 1.0], [0.0, 5.0]])
    p0, p1 = (1 / math.sqrt(2)) / 0.5, 1.0 / 0.5  # cosines / τ
    n0, n1 = (view[0] @ own[1]) / 0.5, (view[1] @ own[0]) / 0.5  # raw dots: 0 and 3
    expected = 0.5 * (-math.log(math.exp(p0) / (math.exp(p0) + math.exp(n0)))
                      - math.log(math.exp(p1) / (math.exp(p1) + math.exp(n1))))
    assert float(openfgl_alignment(view, own, 0.5)) == pytest.approx(expected, rel=1e-6)


def test_weighted_class_prototypes_and_pseudo_labels():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    labels = torch.tensor([1, 0, 0, 0])
    train = torch.tensor([True, False, False, False])
    y_hat, w = pseudo_labels(probs, labels, train)
    assert y_hat.tolist() == [1, 1, 0, 1] and w.tolist() == pytest.approx([1.0, 0.8, 0.6, 0.7])
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [1.0, 1.0]])
    proto = weighted_class_prototypes(h, y_hat, w, 3)
    torch.testing.assert_close(proto[0], torch.tensor([2.0, 2.0]) * 0.6 / (0.6 + 1e-6))
    torch.testing.assert_close(proto[1], torch.tensor([1.0 + 0.7, 0.8 + 0.7]) / (2.5 + 1e-6))
    assert proto[2].abs().sum() == 0  # absent class
    # The confidences are not detached: the prototypes' gradient reaches the probabilities.
    probs.requires_grad_(True)
    y_hat, w = pseudo_labels(probs, labels, train)
    weighted_class_prototypes(h, y_hat, w, 3).sum().backward()
    assert probs.grad is not None and probs.grad[1:].abs().sum() > 0 and probs.grad[0].abs().sum() == 0


def test_graph_augmentation_loss_is_the_weighted_bce_over_all_pairs():
    logits = torch.tensor([[0.5, -1.0, 2.0], [0.0, 1.0, -0.5], [1.5, 0.3, -2.0]])
    adjacency = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    n2, e = 9.0, 4.0
    pos_weight, norm_w = (n2 - e) / e, n2 / (2 * (n2 - e))
    def sigmoid(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    terms = [-(pos_weight * a * math.log(sigmoid(x)) + (1 - a) * math.log(1 - sigmoid(x)))
             for x, a in zip(logits.flatten().tolist(), adjacency.flatten().tolist())]
    assert float(graph_augmentation_loss(logits, adjacency)) == pytest.approx(norm_w * sum(terms) / 9,
                                                                              rel=1e-6)


def test_knn_view_joins_the_edges_with_cosine_neighbours_and_self_loops():
    features = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    edges = torch.tensor([[0, 1], [1, 0]])  # one undirected edge 0-1 (already kNN) ...
    edges = torch.cat([edges, torch.tensor([[0], [2]])], dim=1)  # ... and a directed 0→2
    view = knn_view_edges(features, edges, k=1)
    pairs = set(map(tuple, view.t().tolist()))
    assert pairs == {(0, 0), (1, 1), (2, 2), (3, 3), (0, 1), (1, 0), (2, 3), (3, 2), (0, 2)}
    assert view.size(1) == len(pairs)  # no duplicate


def test_queue_scores_vote_with_the_softmaxed_top_k():
    memory = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
    labels = torch.tensor([0, 1, 1])
    features = torch.tensor([[2.0, 0.0]])  # cosines 1, 0, 0.8
    scores = queue_scores(features, memory, labels, 3, k=2, temperature=0.1)
    w = torch.softmax(torch.tensor([1.0, 0.8]) / 0.1, 0)
    torch.testing.assert_close(scores[0], torch.tensor([w[0] + 1e-5, w[1] + 1e-5, 1e-5]))
    # k beyond the queue is cut to its size (the official code would raise)
    assert queue_scores(features, memory, labels, 3, k=30, temperature=0.1).shape == (1, 3)


def test_finch_clusters_each_class_and_averages_the_members():
    a, b = np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0])
    rng = np.random.default_rng(0)
    prototypes = np.zeros((6, 3, 3))
    for k in range(6):  # class 1: three clients near a, three near b; class 0: only client 2
        prototypes[k, 1] = (a if k < 3 else b) + 0.01 * rng.random(3)
    prototypes[2, 0] = [0.5, 0.5, 0.0]
    clustered = cluster_class_prototypes(prototypes)
    assert [c for c, _ in clustered] == [1, 0]  # the order keys first appear
    centres = clustered[0][1]
    assert centres.shape == (2, 3)
    expected = sorted([prototypes[:3, 1].mean(0).tolist(), prototypes[3:, 1].mean(0).tolist()])
    np.testing.assert_allclose(sorted(centres.tolist()), expected)
    np.testing.assert_array_equal(clustered[1][1], prototypes[2:3, 0])


def test_gcn_propagation_is_pyg_gcn_norm():
    data = _graph(n=20)
    matrix = gcn_propagation(data.edge_index, 20).to_dense()
    edge_index, weight = gcn_norm(data.edge_index, num_nodes=20)
    expected = torch.zeros(20, 20)
    expected[edge_index[1], edge_index[0]] = weight  # row = target
    torch.testing.assert_close(matrix, expected)


def test_augmenter_samples_a_symmetric_normalised_graph_and_learns_through_it():
    data = _graph(n=12)
    adjacency = torch.zeros(12, 12)
    adjacency[data.edge_index[0], data.edge_index[1]] = 1.0
    torch.manual_seed(0)
    aug = GraphAugmenter(data.num_features, 4)
    sampled, logits = aug(data.x, row_normalised(data.edge_index, 12), adjacency)
    torch.testing.assert_close(sampled, sampled.t())
    binary = sampled / sampled.diagonal().sqrt()[:, None] / sampled.diagonal().sqrt()[None, :]
    degree = sampled.diagonal().reciprocal()  # diag = 1/d_i after the normalisation
    assert set(torch.unique((binary > 0).float()).tolist()) <= {0.0, 1.0}
    torch.testing.assert_close((binary > 0).float().sum(1), degree)
    (sampled @ data.x).sum().backward()  # the straight-through gradient reaches the augmenter
    assert aug.gcn1.weight.grad is not None and aug.gcn1.weight.grad.abs().sum() > 0
    assert logits.shape == (12, 12)


# --- the client and the server --------------------------------------------------------------
def test_official_client_never_sends_its_classifier_and_resets_it_from_the_payload():
    cfg = _config()
    trainer = FGGPTrainer(_graph(), cfg, 3, CPU)
    initial = [p.detach().clone() for p in trainer.model.fcs[-1].parameters()]
    arrays = FGGPTrainer.initial_arrays(6, 3, cfg)
    assert not any(k.startswith("fcs.2.") for k in arrays) and "aug.gcn1.weight" in arrays
    trainer.load_payload(arrays)
    trainer.train(2)
    assert not torch.equal(trainer.model.fcs[-1].weight, initial[0])
    upload = trainer.upload()
    assert set(upload) == set(arrays) and upload[PROTOTYPES_KEY].shape == (3, 8)
    trainer.load_payload(arrays)
    for param, value in zip(trainer.model.fcs[-1].parameters(), initial):
        torch.testing.assert_close(param, value, rtol=0, atol=0)


@pytest.mark.parametrize("keys", ["code", "class"])
def test_prototype_rows_follow_the_key_rule(keys):
    data = _graph()
    data.y[data.y == 1] = 2  # class 1 never occurs, in labels or (after this) in predictions
    trainer = FGGPTrainer(data, _config(**{"fggp-proto-keys": keys}), 3, CPU)
    probs = F.one_hot(data.y, 3).float()
    prototypes = trainer.upload_prototypes(probs)
    present = (prototypes.abs().sum(1) > 0).tolist()
    assert present == ([True, True, False] if keys == "code" else [True, False, True])


def test_fggp_alone_holds_dense_node_matrices():
    """The memory rule's named exemption: no other registered trainer declares one."""
    from fedgraph_flwr.algorithms import ALGORITHMS

    assert [name for name, algo in ALGORITHMS.items() if algo.trainer.dense_nodes] == ["fggp"]


def test_a_client_over_the_dense_limit_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="fggp-dense-limit=50") as err:
        FGGPTrainer(_graph(n=60), _config(**{"fggp-dense-limit": 50}), 3, CPU)
    assert "\n" not in str(err.value)


def test_a_one_layer_model_is_refused_in_one_line():
    """The prototypes are a hidden layer's: num-layers=1 is a configuration error."""
    with pytest.raises(ConfigError, match="fggp needs num-layers >= 2"):
        FGGPTrainer.initial_arrays(6, 3, _config(**{"num-layers": 1}))


def test_aggregator_queues_normalised_centres_in_a_ring():
    cfg = resolve_config(None, {"algorithm": "fggp", "dataset": "SBM", "hidden": 4,
                                "fggp-queue-size": 1})
    initial = {"w": np.zeros(2, np.float32), PROTOTYPES_KEY: np.zeros((3, 4), np.float32)}
    agg = FGGPAggregator(cfg, [0, 1], initial)
    assert agg.queue.shape == (3, 4) and not agg.queue_labels.any()
    protos = np.zeros((2, 3, 4), np.float32)
    protos[:, 2] = [[3.0, 0, 0, 0], [3.0, 0.1, 0, 0]]  # one cluster (two members) of class 2
    protos[1, 0] = [0, 2.0, 0, 0]
    updates = {c: ClientUpdate({"w": np.full(2, c, np.float32), PROTOTYPES_KEY: protos[c]}, {}, 1 + c)
               for c in (0, 1)}
    payload = agg.aggregate(1, updates).payloads[0]
    np.testing.assert_allclose(payload["w"], [2 / 3, 2 / 3], rtol=1e-6)  # by training nodes
    assert PROTOTYPES_KEY not in payload
    np.testing.assert_allclose(np.linalg.norm(payload[QUEUE_KEY][:2], axis=1), 1.0, rtol=1e-6)
    assert payload[QUEUE_LABELS_KEY].tolist() == [2, 0, 0] and agg.queue_index == 2
    agg.aggregate(2, updates)  # class 2 into slot 2, then class 0 wraps to slot 0
    assert agg.queue_labels.tolist() == [0, 0, 2] and agg.queue_index == 1


def test_restored_client_carries_on_identically():
    """A client restored from its state bytes (as a ClientApp is) trains the same steps."""
    cfg = _config(**{"fggp-optimizer": "adam"})
    trainer = FGGPTrainer(_graph(seed=1), cfg, 3, CPU)
    torch.manual_seed(0)
    trainer.train(2)
    twin = FGGPTrainer(_graph(seed=1), cfg.with_keys({"server-round": 2}), 3, CPU)
    twin.load_local_state(state_from_bytes(state_to_bytes(trainer.local_state()), CPU))
    trainer.config = twin.config
    for t in (trainer, twin):
        torch.manual_seed(1)
        t.train(2)
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(twin.model.state_dict()[name], value, rtol=0, atol=0)


# --- runs -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["official", "openfgl"])
def test_short_federation_learns(tmp_path, synthetic_root, flavour):
    """SBM, 3 clients: the queue (official) or the local classifiers (openfgl) beat chance
    and improve on round 1."""
    extra = ({"fggp-optimizer": "adam", "num-layers": 3} if flavour == "official" else
             {"fggp-evaluate": "logits", "fggp-knn-every": 1, "fggp-optimizer": "adam"})
    results = run_federation({
        "algorithm": "fggp", "dataset": "SBM", "num-clients": 3, "rounds": 6, "hidden": 16,
        "lr": 0.01, "local-epochs": 3, "fggp-flavour": flavour, "data-root": str(synthetic_root),
        "output-dir": str(tmp_path), "verbose": False, **extra}, write=False)
    rounds = results["rounds"]
    assert not any(r["failures"] for r in rounds)
    first = np.mean([c["val_metric"] for c in rounds[0]["clients"].values()])
    best = max(np.mean([c["val_metric"] for c in r["clients"].values()]) for r in rounds)
    assert best > first
    assert results["final"]["test_at_best_val"] > 100 / 3


@pytest.mark.simulation
def test_flower_simulation_smoke_matches_inprocess(tmp_path, synthetic_root):
    simulation_equals_in_process({
        "algorithm": "fggp", "dataset": "SBM", "num-clients": 3, "rounds": 3, "hidden": 16,
        "num-layers": 3, "data-root": str(synthetic_root)}, tmp_path, num_supernodes=3)
