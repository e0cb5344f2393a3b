"""FedLit: edge-type assignment and the EM centroid update on hand-made embeddings, the
server's greedy centroid alignment on hand-made centroids, the per-type channel means and
per-client permuted download, server state through checkpoint/resume, and short runs
(SBM in process; a Flower simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from fedgraph_flwr.algorithms.fedlit import (
    CENTROIDS_KEY,
    CLUSTER_TRAIN_KEY,
    FedLitAggregator,
    FedLitTrainer,
    assign_types,
    cluster_train_counts,
    edge_embeddings,
    em_step,
    greedy_match,
    kmeans_init,
    matched_centres,
    undirected_pairs,
    update_centroids,
)
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine import state_codec
from fedgraph_flwr.engine.checkpoint import to_numpy
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.nn.multichannel_gcn import LinkTypeChannel, MultiChannelGCN

from helpers import labelled_graph, round_metrics, simulation_equals_in_process

CPU = torch.device("cpu")
# A path 0 - 1 - 2 - 3; the first edge listed as (1, 0) before (0, 1).
PATH4 = torch.tensor([[1, 0, 1, 2, 2, 3], [0, 1, 2, 1, 3, 2]])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _graph(n: int = 60, seed: int = 0) -> Data:
    return labelled_graph(n, seed=seed)


def _config(**extra) -> dict:
    return resolve_config(None, {"algorithm": "fedlit", "hidden": 8, "dataset": "SBM",
                                 "fedlit-link-types": 2, **extra})


# --- the client's link types ---------------------------------------------------------------
def test_link_type_assignment_and_centroid_update_by_hand():
    """h = (1, 0, 2, −1) on the path 0-1-2-3: the edges embed as [1, 0], [0, 2], [2, −1]
    (u < v, whatever the direction). Against μ = [1, 0], [0, 1], [−1, −1]: [2, −1] has
    cosines 2/√5, −1/√5, −1/√10, so it joins type 0 with [1, 0]; [0, 2] is type 1; type 2
    gets nothing and keeps its centroid."""
    h = torch.tensor([[1.0], [0.0], [2.0], [-1.0]])
    pairs = undirected_pairs(PATH4)
    assert pairs.tolist() == [[0, 0, 1, 1, 2, 2], [1, 1, 2, 2, 3, 3]]
    embeddings = edge_embeddings(h, pairs)
    torch.testing.assert_close(embeddings, torch.tensor(
        [[1.0, 0], [1, 0], [0, 2], [0, 2], [2, -1], [2, -1]]))
    centroids = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    types = assign_types(embeddings, centroids)
    assert types.tolist() == [0, 0, 1, 1, 0, 0]  # both directions of an edge share a type
    new, counts = update_centroids(embeddings, types, centroids)
    torch.testing.assert_close(new, torch.tensor([[1.5, -0.5], [0.0, 2.0], [-1.0, -1.0]]))
    assert counts.tolist() == [4, 2, 0]
    assert torch.isfinite(new).all()  # the code's mean of an empty cluster would be NaN
    # One EM iteration = assign to the old centroids, then average.
    em_centroids, em_types = em_step(embeddings, centroids, 1)
    assert em_types.tolist() == types.tolist()
    torch.testing.assert_close(em_centroids, new)
    # A second iteration re-assigns against [1.5, −0.5]: [1, 0] and [2, −1] stay in type 0.
    _, twice = em_step(embeddings, centroids, 2)
    assert twice.tolist() == [0, 0, 1, 1, 0, 0]
    # Training nodes among each type's endpoints: type 0 spans {0, 1, 2, 3}, type 1 {1, 2}.
    train = torch.tensor([True, False, False, True])
    assert cluster_train_counts(PATH4, types, train, 3).tolist() == [2, 0, 0]


def test_kmeans_init_separates_blobs_and_handles_few_edges():
    g = torch.Generator().manual_seed(0)
    blobs = torch.cat([torch.randn(40, 4, generator=g) * 0.05 + 5,
                       torch.randn(40, 4, generator=g) * 0.05 - 5])
    centroids, types = kmeans_init(blobs, 2, seed=42)
    assert centroids.shape == (2, 4) and types.shape == (80,)
    assert len(set(types[:40].tolist())) == 1 and len(set(types[40:].tolist())) == 1
    assert types[0] != types[40]
    again = kmeans_init(blobs, 2, seed=42)
    torch.testing.assert_close(again[0], centroids)  # seeded: the same every time
    # Fewer edges than K: the edges' embeddings in turn; none: zeros.
    few, few_types = kmeans_init(blobs[:2], 3, seed=0)
    torch.testing.assert_close(few, blobs[[0, 1, 0]])
    assert few_types.tolist() == [0, 1]
    none, none_types = kmeans_init(blobs[:0], 3, seed=0)
    assert none.shape == (3, 4) and not none.any() and none_types.numel() == 0


# --- the model ----------------------------------------------------------------------------
def test_channels_run_on_their_edge_subgraphs_and_sum():
    """Channel k on the relabelled type-k subgraph equals channel k on the whole node set
    with only the type-k edges, read on the subgraph's nodes; an isolated node gets only
    the classifier's bias."""
    torch.manual_seed(0)
    model = MultiChannelGCN(3, 4, 2, num_link_types=2, num_layers=2, dropout=0.0).eval()
    x = torch.randn(5, 3)  # node 4 is isolated
    types = torch.tensor([1, 1, 0, 0, 1, 1])  # 0-1 and 2-3 type 1, 1-2 type 0
    h = model.project(x)
    out = model.propagate(h, PATH4, types)
    expected = torch.zeros(5, 4)
    for k, nodes in ((0, [1, 2]), (1, [0, 1, 2, 3])):
        full = model.channels[k](h, PATH4[:, types == k])
        expected[nodes] += full[nodes]
    torch.testing.assert_close(out, expected)
    logits = model(x, PATH4, types)
    torch.testing.assert_close(logits[4], model.classifier.bias)
    names = {k for k, _ in model.named_parameters()}
    assert {"feature1.weight", "classifier.weight", "channels.1.lin.weight",
            "channels.1.convs.1.lin.weight", "channels.0.convs.0.bias"} <= names
    with pytest.raises(ValueError, match="edge_type"):
        model.propagate(h, PATH4, types[:3])
    with pytest.raises(ValueError, match="num_link_types"):
        MultiChannelGCN(3, 4, 2, num_link_types=0)
    assert isinstance(model.channels[0], LinkTypeChannel)


def test_sgc_and_sage_channels_by_hand():
    """fedlit-gnn: an SGC channel is linear, Â² (lin(x)) W + b with Â = D^-1/2 A D^-1/2 (no
    self-loops) on the path; a SAGE channel's first layer is ReLU(W_r lin(x) + W_l mean of
    the neighbours' lin(x)); the GCN default keeps its parameter names."""
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    adjacency = torch.zeros(4, 4)
    adjacency[PATH4[1], PATH4[0]] = 1.0  # target row, source column
    degree = adjacency.sum(1)
    a_hat = adjacency / torch.sqrt(degree[:, None] * degree[None, :])
    sgc = LinkTypeChannel(3, num_layers=2, dropout=0.5, conv="sgc").eval()
    z = sgc.lin(x)
    expected = (a_hat @ a_hat @ z) @ sgc.convs[0].lin.weight.t() + sgc.convs[0].lin.bias
    torch.testing.assert_close(sgc(x, PATH4), expected)
    assert len(sgc.convs) == 1 and (sgc(x, PATH4) < 0).any()  # no ReLU: linear
    sage = LinkTypeChannel(3, num_layers=1, dropout=0.0, conv="sage").eval()
    z = sage.lin(x)
    mean = (adjacency / degree[:, None]) @ z
    conv = sage.convs[0]
    expected = torch.relu(mean @ conv.lin_l.weight.t() + conv.lin_l.bias + z @ conv.lin_r.weight.t())
    torch.testing.assert_close(sage(x, PATH4), expected)
    with pytest.raises(ValueError, match="conv"):
        LinkTypeChannel(3, 1, 0.0, conv="gat")
    model = FedLitTrainer.build_model(5, 3, _config(**{"fedlit-gnn": "sgc"}))
    assert isinstance(model.channels[0].convs[0], type(sgc.convs[0]))


# --- the server ---------------------------------------------------------------------------
def test_greedy_alignment_by_hand():
    """Centres e0, e1. Cluster 1 ([1, 0.1], cos 0.995 with e0) beats cluster 0 ([1, 0.5],
    0.894) to e0, so cluster 0 gets e1, although its own best centre is e0 too."""
    centres = np.array([[1.0, 0.0], [0.0, 1.0]])
    mapping, cos = greedy_match(np.array([[1.0, 0.5], [1.0, 0.1]]), centres)
    assert mapping.tolist() == [1, 0]
    np.testing.assert_allclose(cos, [0.5 / math.sqrt(1.25), 1 / math.sqrt(1.01)])
    # A 3-cycle in 3-d: clusters (near e1, e2, e0) -> centres [1, 2, 0].
    eye = np.eye(3)
    mapping, _ = greedy_match(eye[[1, 2, 0]] + 0.01, eye)
    assert mapping.tolist() == [1, 2, 0]
    # New centres: the mean of the centroids matched to each.
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    b = np.array([[0.0, 3.0], [3.0, 0.0]])
    centres = matched_centres([a, b], [np.array([0, 1]), np.array([1, 0])], np.zeros((2, 2)))
    np.testing.assert_allclose(centres, [[2.0, 0.0], [0.0, 2.0]])


def _updates(initial: dict, values: dict, centroids: dict, counts: dict, sizes: dict) -> dict:
    """Client c's arrays: the shared layers all ``values[c]['shared']``, channel k all
    ``values[c][k]``."""
    out = {}
    for c in values:
        arrays = {}
        for name, v in initial.items():
            if name.startswith("channels."):
                fill = values[c][int(name.split(".")[1])]
            else:
                fill = values[c]["shared"]
            arrays[name] = np.full_like(v, fill)
        out[c] = ClientUpdate(arrays, {CENTROIDS_KEY: np.array(centroids[c], np.float32),
                                       CLUSTER_TRAIN_KEY: np.array(counts[c], np.float32)},
                              sizes[c])
    return out


def _channel(arrays: dict, k: int) -> float:
    vals = {float(v.flat[0]) for n, v in arrays.items() if n.startswith(f"channels.{k}.")}
    assert len(vals) == 1
    return vals.pop()


def test_aggregator_aligns_averages_and_sends_each_client_its_permutation():
    cfg = _config()
    initial = FedLitTrainer.initial_arrays(5, 3, cfg)
    aggregator = FedLitAggregator(cfg, [0, 1, 2], initial)
    # Client 1's clusters are client 0's, swapped.
    centroids = {0: [[1, 0, 0, 0], [0, 1, 0, 0]], 1: [[0, 2, 0, 0], [2, 0.2, 0, 0]]}
    values = {0: {"shared": 0.0, 0: 0.0, 1: 1.0}, 1: {"shared": 1.0, 0: 20.0, 1: 30.0}}
    updates = _updates(initial, values, centroids, {0: [3, 4], 1: [5, 6]}, {0: 10, 1: 30})
    result = aggregator.aggregate(1, updates)
    assert aggregator.maps[0].tolist() == [0, 1] and aggregator.maps[1].tolist() == [1, 0]
    # Global type 0 = client 0's channel 0 and client 1's channel 1: (0 + 30) / 2.
    assert _channel(aggregator.global_arrays, 0) == 15.0
    assert _channel(aggregator.global_arrays, 1) == 10.5
    np.testing.assert_allclose(aggregator.centres, [[1.5, 0.1, 0, 0], [0, 1.5, 0, 0]], rtol=1e-6)
    assert set(result.payloads) == {0, 1}  # client 2 never took part: it keeps the initial model
    p0, p1 = result.payloads[0], result.payloads[1]
    assert (_channel(p0, 0), _channel(p0, 1)) == (15.0, 10.5)
    assert (_channel(p1, 0), _channel(p1, 1)) == (10.5, 15.0)  # slot k <- global map[k]
    np.testing.assert_allclose(p1[CENTROIDS_KEY], aggregator.centres[[1, 0]], rtol=1e-6)
    np.testing.assert_allclose(p0["feature1.weight"], 0.75)  # ∝ 10 and 30 training nodes
    np.testing.assert_allclose(p1["classifier.bias"], 0.75)
    assert p0.keys() == set(initial) | {CENTROIDS_KEY}
    assert result.metrics["identity_map_fraction"] == 0.5
    # Round 2: client 1's cluster 0 has no training nodes: global type 1 is client 0's alone.
    updates = _updates(initial, values, centroids, {0: [3, 4], 1: [0, 6]}, {0: 10, 1: 30})
    result = aggregator.aggregate(2, updates)
    assert aggregator.maps[0].tolist() == [0, 1] and aggregator.maps[1].tolist() == [1, 0]
    assert _channel(aggregator.global_arrays, 1) == 1.0
    assert result.metrics["empty_cluster_fraction"] == 0.25
    # Round 3, only client 0, none of whose clusters has training nodes: both channels keep
    # their values; client 1 is sent them under its own map.
    result = aggregator.aggregate(3, _updates(initial, {0: values[0]}, {0: centroids[0]},
                                              {0: [0, 0]}, {0: 10}))
    assert (_channel(aggregator.global_arrays, 0), _channel(aggregator.global_arrays, 1)) == (15.0, 1.0)
    assert (_channel(result.payloads[1], 0), _channel(result.payloads[1], 1)) == (1.0, 15.0)


def test_code_download_and_inverse_map_switches():
    """last-client: every client gets the map of the last client matched (the code's loop
    over all clients' entries). inverse: the code's transposed argmax stores the inverse of
    the greedy permutation (a 3-cycle, so it differs)."""
    cfg = _config(**{"fedlit-download": "last-client"})
    initial = FedLitTrainer.initial_arrays(5, 3, cfg)
    aggregator = FedLitAggregator(cfg, [0, 1], initial)
    centroids = {0: [[1, 0, 0, 0], [0, 1, 0, 0]], 1: [[0, 2, 0, 0], [2, 0.2, 0, 0]]}
    values = {0: {"shared": 0.0, 0: 0.0, 1: 1.0}, 1: {"shared": 1.0, 0: 20.0, 1: 30.0}}
    result = aggregator.aggregate(1, _updates(initial, values, centroids, {0: [3, 4], 1: [5, 6]},
                                              {0: 10, 1: 30}))
    for c in (0, 1):  # both get client 1's map [1, 0]
        assert (_channel(result.payloads[c], 0), _channel(result.payloads[c], 1)) == (10.5, 15.0)
    cfg = _config(**{"fedlit-link-types": 3, "fedlit-match-map": "inverse"})
    initial = FedLitTrainer.initial_arrays(5, 3, cfg)
    eye = np.eye(3)
    centroids = {0: eye, 1: eye[[1, 2, 0]] + 0.01}  # greedy map [1, 2, 0]
    values = {c: {"shared": 0.0, 0: 0.0, 1: 1.0, 2: 2.0} for c in (0, 1)}
    aggregator = FedLitAggregator(cfg, [0, 1], initial)
    aggregator.aggregate(1, _updates(
        initial, values, {c: np.pad(v, ((0, 0), (0, 13))) for c, v in centroids.items()},
        {0: [1, 1, 1], 1: [1, 1, 1]}, {0: 1, 1: 1}))
    assert aggregator.maps[0].tolist() == [0, 1, 2]  # the first client's identity
    assert aggregator.maps[1].tolist() == [2, 0, 1]  # argsort([1, 2, 0])


def _three_rounds(cfg: dict, initial: dict) -> list:
    g = np.random.default_rng(0)
    rounds = []
    for _ in range(3):
        values = {c: {"shared": g.normal(), 0: g.normal(), 1: g.normal()} for c in (0, 1, 2)}
        centroids = {c: g.normal(size=(2, 16)) for c in (0, 1, 2)}
        counts = {c: g.integers(0, 3, size=2) for c in (0, 1, 2)}
        rounds.append(_updates(initial, values, centroids, counts, {0: 3, 1: 5, 2: 7}))
    return rounds


def test_server_state_survives_checkpoint_and_resume():
    """An aggregator rebuilt after round 2 from its state_dict (through the checkpoint's
    codec) answers round 3 exactly as the one that never stopped."""
    cfg = _config()
    initial = FedLitTrainer.initial_arrays(5, 3, cfg)
    rounds = _three_rounds(cfg, initial)
    live = FedLitAggregator(cfg, [0, 1, 2], initial)
    live.aggregate(1, rounds[0])
    live.aggregate(2, rounds[1])
    state = to_numpy(state_codec.decode(state_codec.encode({"aggregator": live.state_dict()})))
    rebuilt = FedLitAggregator(cfg, [0, 1, 2], initial)
    rebuilt.load_state_dict(state["aggregator"])
    assert list(rebuilt.maps) == list(live.maps)
    for c in live.maps:
        np.testing.assert_array_equal(rebuilt.maps[c], live.maps[c])
    np.testing.assert_array_equal(rebuilt.centres, live.centres)
    # Round 3 without client 2: its payload is the new model under its stored map.
    third = {c: rounds[2][c] for c in (0, 1)}
    a, b = live.aggregate(3, third), rebuilt.aggregate(3, third)
    assert set(a.payloads) == {0, 1, 2}
    assert a.metrics == b.metrics and a.payloads.keys() == b.payloads.keys()
    for c in a.payloads:
        for name in a.payloads[c]:
            np.testing.assert_array_equal(a.payloads[c][name], b.payloads[c][name])
    # A fresh aggregator (no state) would have answered round 3 differently.
    fresh = FedLitAggregator(cfg, [0, 1, 2], initial).aggregate(3, third)
    assert any(not np.array_equal(fresh.payloads[0][n], a.payloads[0][n]) for n in a.payloads[0])
    # Before any round: no centres, no maps, and that round-trips too.
    empty = FedLitAggregator(cfg, [0], initial)
    empty.load_state_dict(to_numpy(state_codec.decode(state_codec.encode(
        {"s": FedLitAggregator(cfg, [0], initial).state_dict()})))["s"])
    assert empty.centres is None and empty.maps == {}


# --- the trainer --------------------------------------------------------------------------
def test_trainer_uploads_the_model_and_signs_with_centroids_and_counts():
    cfg = _config()
    trainer = FedLitTrainer(_graph(), cfg, 3, CPU)
    initial = FedLitTrainer.initial_arrays(8, 3, cfg)
    assert trainer.upload().keys() == initial.keys()
    for k, v in trainer.upload().items():
        np.testing.assert_array_equal(v, initial[k])
    assert trainer.centroids is None
    trainer.train(1)  # k-means
    first = trainer.centroids.clone()
    signature = trainer.signature()
    assert signature[CENTROIDS_KEY].shape == (2, 16)
    assert signature[CLUSTER_TRAIN_KEY].shape == (2,)
    assert signature[CLUSTER_TRAIN_KEY].sum() > 0
    # The server's centres replace the centroids; the next step starts EM from them.
    payload = dict(trainer.upload(), **{CENTROIDS_KEY: np.ones((2, 16), np.float32)})
    trainer.load_payload(payload)
    torch.testing.assert_close(trainer.centroids, torch.ones(2, 16))
    trainer.train(1)
    assert not torch.allclose(trainer.centroids, first)
    # The local state carries the centroids (and the Adam moments).
    rebuilt = FedLitTrainer(_graph(), cfg, 3, CPU)
    rebuilt.load_local_state(trainer.local_state())
    torch.testing.assert_close(rebuilt.centroids, trainer.centroids)
    assert rebuilt.evaluate() == trainer.evaluate()


def test_evaluate_before_train_reports_the_received_model():
    data = _graph()
    before = FedLitTrainer(data, _config(**{"fedlit-evaluate": "before-train"}), 3, CPU)
    after = FedLitTrainer(data, _config(), 3, CPU)
    received = after.evaluate()  # no centroids yet: k-means on the fly, not kept
    assert after.centroids is None
    before.train(3)
    after.train(3)
    assert before.evaluate() == received
    assert after.evaluate() != received


# --- runs -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_federation_learns_and_uses_the_alignment(tmp_path, synthetic_root):
    """Six rounds on SBM (5 classes), 3 clients: better than chance, the training loss
    falls, the server aligns every client's centroids, uploads stay the same size, and the
    live and the restored (client-state=file) trainers agree."""
    cfg = {"algorithm": "fedlit", "dataset": "SBM", "num-clients": 3, "rounds": 6, "hidden": 16,
           "data-root": str(synthetic_root), "output-dir": str(tmp_path), "verbose": False}
    live = run_federation(dict(cfg, **{"run-name": "live"}), write=False)
    assert live["final"]["test_at_best_val"] > 30  # chance: 20
    losses = [np.mean([c["train_loss"] for c in r["clients"].values()]) for r in live["rounds"]]
    assert losses[-1] < losses[0]
    for r in live["rounds"]:
        assert 0 < r["aggregate"]["matched_cosine_mean"] <= 1
        assert 0 <= r["aggregate"]["empty_cluster_fraction"] < 1
    assert len({tuple(r["bytes_received"].values()) for r in live["rounds"]}) == 1
    restored = run_federation(dict(cfg, **{"run-name": "restored", "client-state": "file",
                                           "client-state-dir": str(tmp_path / "state")}),
                              write=False)
    assert round_metrics(live) == round_metrics(restored)


def test_inprocess_resume_matches_uninterrupted(tmp_path, data_root):
    """Stop after round 2, resume to 4: the server's centres and maps come back from the
    checkpoint, so rounds 3-4 equal an uninterrupted run's (Cora: 3 sparse METIS clients)."""
    cfg = {"algorithm": "fedlit", "dataset": "Cora", "num-clients": 3, "rounds": 4, "hidden": 16,
           "data-root": str(data_root), "output-dir": str(tmp_path), "verbose": False,
           "client-state": "file"}
    full = run_federation(dict(cfg, **{"run-name": "full",
                                       "client-state-dir": str(tmp_path / "s-full")}))
    stopped = dict(cfg, **{"run-name": "stopped", "client-state-dir": str(tmp_path / "s-stop")})
    run_federation(dict(stopped, rounds=2))
    resumed = run_federation(dict(stopped, resume=True), log=lambda msg: None)
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4]
    assert round_metrics(resumed) == round_metrics(full)
    assert [r["aggregate"] for r in resumed["rounds"]] == [r["aggregate"] for r in full["rounds"]]


@pytest.mark.simulation
def test_flower_simulation_smoke_matches_inprocess(tmp_path, data_root):
    simulation_equals_in_process({"algorithm": "fedlit", "dataset": "Cora", "num-clients": 3,
                                  "rounds": 3, "hidden": 16, "data-root": str(data_root)},
                                 tmp_path, num_supernodes=3)
