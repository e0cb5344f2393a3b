"""FedGL: the server's fusion of predictions into pseudo labels, its pseudo graph, the
client's use of both, and federations on overlapping and disjoint partitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_baselines import CPU, NUM_CLASSES, NUM_FEATURES, make_config, tiny_graph
from torch_geometric.nn import GCNConv

from fedgraph_flwr.algorithms import fedgl
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.nn.gcn import GCN

from helpers import round_metrics


def _logits(probabilities) -> np.ndarray:
    return np.log(np.asarray(probabilities, dtype=np.float64))


def test_fusion_thresholds_weights_by_node_share_and_labels_the_argmax():
    """Client 0 holds nodes 10, 11, 12; client 1 holds 12, 13 (12 shared). Rates 3/5, 2/5."""
    uploads = {
        0: (np.array([10, 11, 12]), _logits([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25], [0.6, 0.3, 0.1]])),
        1: (np.array([12, 13]), _logits([[0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])),
    }
    fusion = fedgl.fuse(uploads, "sampling-rate", 0.5)
    assert fusion.hashes.tolist() == [10, 11, 12, 13]
    # node 12: (0.6·[0.6, 0, 0] + 0.4·[0, 0.8, 0]) / (0.6 + 0.4) = [0.36, 0.32, 0] -> class 0
    assert fusion.labels.tolist() == [0, fedgl.NO_LABEL, 0, fedgl.NO_LABEL]
    assert fusion.rows[0].tolist() == [0, 1, 2] and fusion.rows[1].tolist() == [2, 3]
    expected_12 = (0.6 * uploads[0][1][2] + 0.4 * uploads[1][1][0])
    np.testing.assert_allclose(fusion.embedding[2].numpy(), expected_12)
    # Every holder weighing 1: node 12 is (0.6 vs 0.8)/2 -> class 1.
    assert fedgl.fuse(uploads, "mean", 0.5).labels.tolist()[2] == 1


def _openfgl_dense_graph(embedding: np.ndarray, k: int) -> np.ndarray:
    """OpenFGL's construct_server_adj(type='dot') + fill_diagonal + normalize_server_adj,
    dense, for an input whose every column is chosen (no random fill)."""
    full = np.clip(embedding @ embedding.T, 0.0, None)
    z = np.zeros_like(full)
    for i in range(z.shape[0]):
        top = np.argsort(-full[i])[:k]
        z[i, top] = full[i, top]
    z /= z.sum(axis=1)[:, None]
    assert (z != 0).any(axis=0).all()
    np.fill_diagonal(z, 1.0)
    d = np.diag(z.sum(axis=1) ** -0.5)
    return (z @ d).T @ d


@pytest.mark.parametrize("block_entries", [1 << 22, 7])
def test_pseudo_graph_equals_openfgls_dense_construction(monkeypatch, block_entries):
    monkeypatch.setattr(fedgl, "GRAPH_BLOCK_ENTRIES", block_entries)
    embedding = torch.randn(9, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (target, source), value = fedgl.pseudo_graph(embedding, 4, torch.Generator().manual_seed(0))
    dense = np.zeros((9, 9))
    dense[target.numpy(), source.numpy()] = value.numpy()
    np.testing.assert_allclose(dense, _openfgl_dense_graph(embedding.numpy(), 4), atol=1e-12)
    assert target.numel() <= 9 * 5  # sparse: k per row plus the diagonal


def test_pseudo_graph_gives_an_unchosen_column_a_random_row():
    """k = 1 and node 0 the strongest in everyone's direction: every row picks node 0, so
    columns 1-3 are empty and each gets 0.1 in a row drawn from the generator (OpenFGL)."""
    embedding = torch.tensor([[3.0, 0.0], [1.0, 0.0], [1.0, 0.1], [1.0, -0.1]], dtype=torch.float64)
    (target, source), value = fedgl.pseudo_graph(embedding, 1, torch.Generator().manual_seed(0))
    drawn = torch.randint(0, 4, (3,), generator=torch.Generator().manual_seed(0)).tolist()
    z = np.zeros((4, 4))
    z[:, 0] = 1.0
    for column, row in zip((1, 2, 3), drawn):
        z[row, column] = 0.1
    np.fill_diagonal(z, 1.0)
    d = np.diag(z.sum(axis=1) ** -0.5)
    dense = np.zeros((4, 4))
    dense[target.numpy(), source.numpy()] = value.numpy()
    np.testing.assert_allclose(dense, (z @ d).T @ d, atol=1e-12)


def test_client_graph_keeps_only_pairs_of_its_own_nodes_in_its_order():
    graph = (torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), torch.tensor([0.1, 0.2, 0.3, 0.4]))
    source, target, value = fedgl.client_graph(graph, np.array([2, 1]), 4)  # local 0 = global 2
    assert list(zip(source, target)) == [(0, 1)] and value.tolist() == pytest.approx([0.2])


def _trainer(**options) -> fedgl.FedGLTrainer:
    config = make_config(fedgl.FedGLOptions, **options)
    data = tiny_graph(0)
    data.global_id = torch.arange(data.num_nodes) + 100
    return fedgl.FedGLTrainer(data, config, NUM_CLASSES, CPU)


def test_gcn_propagation_is_pygs_gcn_and_openfgl_propagation_is_the_raw_sum():
    trainer = _trainer()
    data = trainer.data
    plain = GCN(NUM_FEATURES, 16, NUM_CLASSES, conv=lambda a, b: GCNConv(a, b)).eval()
    plain.load_state_dict(trainer.model.state_dict())
    trainer.model.eval()
    torch.testing.assert_close(trainer.forward(), plain(data.x, data.edge_index))

    raw = _trainer(fedgl_propagation="openfgl")
    raw.model.eval()
    conv0, conv1 = raw.model.convs
    adjacency = torch.zeros(data.num_nodes, data.num_nodes)
    adjacency[data.edge_index[1], data.edge_index[0]] = 1.0
    hidden = F.relu(adjacency @ conv0.lin(data.x) + conv0.bias)
    torch.testing.assert_close(raw.forward(), adjacency @ conv1.lin(hidden) + conv1.bias)


def test_received_pseudo_graph_is_added_to_the_adjacency():
    trainer = _trainer(fedgl_propagation="openfgl")
    trainer.model.eval()
    before = trainer.forward()
    n = trainer.data.num_nodes
    trainer.receive({"pseudo_label": np.full(n, -1), "graph_source": np.array([0]),
                     "graph_target": np.array([5]), "graph_weight": np.array([2.0], np.float32)})
    after = trainer.forward()
    changed = (after - before).abs().sum(dim=1) > 0
    assert changed[5] and changed.sum() >= 1  # node 5 now also reads node 0 (twice weighted)


def test_predict_reply_and_pseudo_labels_reach_the_loss():
    trainer = _trainer(fedgl_ssl_weight=1.0)
    n = trainer.data.num_nodes
    assert trainer.run_phase(fedgl.PREDICT, {}).arrays == {}  # not a refresh round
    reply = trainer.run_phase(fedgl.PREDICT, {"refresh": np.ones(1, np.int8)}).arrays
    assert set(reply) == fedgl.PER_NODE == trainer.per_node_arrays
    assert reply["node_hash"].shape == (n,) and reply["logits"].shape == (n, NUM_CLASSES)
    assert len(set(reply["node_hash"].tolist())) == n
    torch.manual_seed(0)
    without = trainer.train(1)
    labels = np.full(n, -1)
    labels[:] = 1  # every node labelled 1; the training nodes' own labels still rule them
    trainer.run_phase(fedgl.LABEL, {"pseudo_label": labels})
    torch.manual_seed(0)
    with_labels = trainer.train(1)
    assert without["pseudo-labelled"] == 0
    assert with_labels["pseudo-labelled"] == float((~trainer.data.train_mask).sum())
    with pytest.raises(ValueError, match="do not fit"):
        trainer.receive({"pseudo_label": np.zeros(n + 1, np.int64)})


def test_server_asks_from_round_two_every_update_every_and_first_keeps_the_first():
    config = make_config(fedgl.FedGLOptions, fedgl_update_every=2, fedgl_labels="first")
    initial = fedgl.FedGLTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    agg = fedgl.FedGLAggregator(config, [0], initial)
    asked = [r for r in range(1, 8) if agg.configure(fedgl.PREDICT, r, [0])[0]]
    assert asked == [2, 4, 6]
    hashes = np.array([5, 6])
    for round_, probs in ((2, [[0.9, 0.05, 0.05], [0.9, 0.05, 0.05]]),
                          (4, [[0.05, 0.9, 0.05], [0.05, 0.9, 0.05]])):
        update = ClientUpdate({"node_hash": hashes, "logits": _logits(probs)}, {}, 1)
        agg.step(fedgl.PREDICT, round_, {0: update})
        assert agg.configure(fedgl.LABEL, round_, [0])[0]["pseudo_label"].tolist() == [0, 0]
        agg.step(fedgl.LABEL, round_, {0: ClientUpdate({}, {}, 1)})
        assert agg.configure(fedgl.LABEL, round_ + 1, [0])[0] == {}  # delivered once


# --- federations -------------------------------------------------------------------------------
def _run(tmp_path, synthetic_root, **extra) -> dict:
    return run_federation({
        "algorithm": "fedgl", "dataset": "SBM", "num-clients": 5, "rounds": 4, "hidden": 16,
        "partition": "metis-overlapping", "local-epochs": 5, "data-root": str(synthetic_root),
        "output-dir": str(tmp_path), "verbose": False, "fedgl-threshold": 0.21, **extra},
        write=False)


@pytest.mark.slow
def test_overlapping_federation_fuses_shared_nodes_and_labels_them(tmp_path, synthetic_root):
    results = _run(tmp_path, synthetic_root, **{"fedgl-graph-weight": 0.5, "fedgl-topk": 10})
    rounds = results["rounds"]
    assert "predict.nodes" not in rounds[0]["aggregate"]  # nothing to fuse before training
    total = sum(c["num-nodes"] for c in results["clients"].values())
    for r in rounds[1:]:
        assert r["aggregate"]["predict.pseudo-labelled"] > 0
        assert r["aggregate"]["predict.nodes"] < total  # shared nodes fused into one row
    assert all(m["pseudo-labelled"] > 0 for m in rounds[-1]["clients"].values())
    assert results["final"]["test_at_best_val"] > 30  # chance: 20
    # The predict reply is per node: the refresh rounds receive far more than round 1.
    first, second = rounds[0]["bytes_received"], rounds[1]["bytes_received"]
    assert all(second[c] > first[c] + 500 * 4 for c in first)


@pytest.mark.slow
def test_without_ssl_or_graph_fedgl_trains_as_its_gcn_alone(tmp_path, synthetic_root):
    off = {"fedgl-ssl-weight": 0.0, "fedgl-graph-weight": 0.0, "partition": "metis"}
    on = _run(tmp_path, synthetic_root, partition="metis")
    quiet = _run(tmp_path, synthetic_root, **off)
    again = _run(tmp_path, synthetic_root, **off)
    assert round_metrics(quiet) == round_metrics(again)  # deterministic
    assert round_metrics(on) != round_metrics(quiet)  # the pseudo labels change training


@pytest.mark.slow
def test_state_files_keep_the_pseudo_labels_between_phases(tmp_path, synthetic_root):
    short = {"rounds": 3, "local-epochs": 2, "fedgl-graph-weight": 0.5, "fedgl-topk": 5}
    live = _run(tmp_path, synthetic_root, **short, **{"run-name": "live"})
    restored = _run(tmp_path, synthetic_root, **short, **{
        "run-name": "restored", "client-state": "file",
        "client-state-dir": str(tmp_path / "state")})
    assert round_metrics(live) == round_metrics(restored)


def test_local_node_ids_send_no_hashes_and_keep_every_clients_nodes_apart():
    trainer = _trainer(fedgl_node_ids="local")
    del trainer.data.global_id  # files without global ids, as a deployment's
    reply = trainer.run_phase(fedgl.PREDICT, {"refresh": np.ones(1, np.int8)}).arrays
    assert set(reply) == {"logits"}
    config = make_config(fedgl.FedGLOptions, fedgl_node_ids="local")
    agg = fedgl.FedGLAggregator(config, [0, 1], fedgl.FedGLTrainer.initial_arrays(
        NUM_FEATURES, NUM_CLASSES, config))
    confident = _logits([[0.9, 0.05, 0.05]] * 2)
    agg.step(fedgl.PREDICT, 2, {0: ClientUpdate({"logits": confident}, {}, 1),
                                1: ClientUpdate({"logits": confident[:, ::-1].copy()}, {}, 1)})
    labels = agg.configure(fedgl.LABEL, 2, [0, 1])
    assert labels[0]["pseudo_label"].tolist() == [0, 0] and labels[1]["pseudo_label"].tolist() == [2, 2]
    with pytest.raises(ValueError, match="fedgl-node-ids=local"):
        _trainer().__class__.node_hash(trainer)
