"""FedGNN: the server's matching on hand-made hashed ids, virtual neighbours in the GCN's
second layer worked by hand, the client's side of the expansion, and short federations
(overlapping: the expansion is used; disjoint: it is empty and FedGNN is FedAvg; a
Flower simulation equal to in-process)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from fedgraph_flwr.algorithms.fedgnn import (
    EMBED,
    EXPAND,
    FedGNNAggregator,
    FedGNNTrainer,
    check_upload,
    hash_ids,
    match_expansion,
)
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.nn.fedgnn_net import FedGNNNet

from helpers import round_metrics, simulation_equals_in_process

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _upload(client: int, ids: list[int], edges: list[tuple[int, int]]) -> dict:
    """A hand-made ``embed`` upload whose "hashes" are the ids themselves; the embedding
    of node x at client c is [x, c], so every returned row says where it came from."""
    node_hash = np.array(ids, dtype=np.int64)
    und = edges + [(b, a) for a, b in edges]
    return {"node_hash": node_hash,
            "edge_hash": np.array(und, dtype=np.int64).T.reshape(2, -1),
            "embedding": np.array([[x, client] for x in ids], dtype=np.float32)}


def _links(answer: dict) -> dict[int, list[tuple[int, list[float]]]]:
    """{target node: sorted [(virtual embedding as a list)]} of one client's answer."""
    out: dict[int, list] = {}
    for src, tgt in zip(answer["virtual_source"], answer["virtual_target"]):
        out.setdefault(int(tgt), []).append(answer["virtual_embedding"][src].tolist())
    return {k: sorted(v) for k, v in out.items()}


# --- the server's matching ---------------------------------------------------------------------
def test_matching_returns_exactly_the_foreign_neighbours_of_shared_nodes():
    """A holds 1-2-3; B holds 2, 3, 4, 5 with 2-3, 2-4, 4-5; D holds 2, 4, 6 with 2-4, 2-6;
    E holds 7-8 alone.

    A shares 2 (with B, D) and 3 (with B). Foreign neighbours of 2: 4 (B and D: one virtual
    node, mean of [4, B] and [4, D]) and 6 (D); of 3: only 2, which A holds. 5 is two hops
    from A's nodes: not sent. B gets 1 (A) and 6 (D) at 2; D gets 1 (A) and 3 (mean over A
    and B) at 2, and 5 (B) at 4. E shares nothing: empty."""
    a, b, d, e = 0, 1, 2, 3
    uploads = {a: _upload(a, [1, 2, 3], [(1, 2), (2, 3)]),
               b: _upload(b, [2, 3, 4, 5], [(2, 3), (2, 4), (4, 5)]),
               d: _upload(d, [2, 4, 6], [(2, 4), (2, 6)]),
               e: _upload(e, [7, 8], [(7, 8)])}
    assert all(check_upload(u, 2) is None for u in uploads.values())
    out, stats = match_expansion(uploads, hidden=2)
    assert _links(out[a]) == {2: [[4.0, 1.5], [6.0, 2.0]]}
    assert _links(out[b]) == {2: [[1.0, 0.0], [6.0, 2.0]]}
    assert _links(out[d]) == {2: [[1.0, 0.0], [3.0, 0.5]], 4: [[5.0, 1.0]]}
    assert out[e]["virtual_embedding"].shape == (0, 2) and out[e]["virtual_source"].size == 0
    # One virtual node per foreign neighbour, never a node the client holds.
    for c, ids in ((a, {1, 2, 3}), (b, {2, 3, 4, 5}), (d, {2, 4, 6})):
        ours = set(out[c]["virtual_embedding"][:, 0].astype(int).tolist())
        assert not ours & ids
        assert len(ours) == out[c]["virtual_embedding"].shape[0]
    assert out[a]["virtual_embedding"].dtype == np.float32
    assert out[a]["virtual_target"].dtype == out[a]["virtual_source"].dtype == np.int64
    # shared: 2 (A, B, D), 3 (A, B), 4 (B, D)
    assert stats == {"shared_nodes": 3.0, "virtual_nodes": 7.0, "virtual_edges": 7.0}


def test_matching_on_disjoint_clients_is_empty_and_bad_uploads_are_refused():
    uploads = {0: _upload(0, [1, 2], [(1, 2)]), 1: _upload(1, [3, 4], [(3, 4)])}
    out, stats = match_expansion(uploads, hidden=2)
    assert stats["shared_nodes"] == 0 and all(o["virtual_source"].size == 0 for o in out.values())
    bad = _upload(0, [1, 2], [(1, 9)])
    assert "outside" in check_upload(bad, 2)
    assert "repeats" in check_upload(_upload(0, [1, 1], []), 2)
    assert "embedding" in check_upload(_upload(0, [1, 2], []), 3)
    aggregator = FedGNNAggregator(_config(hidden=2), [0, 1], {})
    result = aggregator.step(EMBED, 1, {0: ClientUpdate(bad, {}, 1), 1: ClientUpdate(uploads[1], {}, 1)})
    assert result.metrics["rejected_uploads"] == 1
    assert aggregator.configure(EXPAND, 1, [0])[0]["virtual_embedding"].shape == (0, 2)


def test_hash_ids_is_keyed_and_collision_free():
    ids = np.arange(100_000)
    h = hash_ids(ids, "k")
    assert h.dtype == np.int64 and np.unique(h).size == ids.size
    assert not np.array_equal(h, ids)
    np.testing.assert_array_equal(hash_ids(ids[::-1], "k"), h[::-1])
    assert not np.isin(hash_ids(ids, "other key"), h).any()


# --- virtual neighbours in the GCN --------------------------------------------------------------
def test_virtual_neighbour_enters_the_second_layer_with_gcn_normalisation():
    """Real nodes 0 - 1 and an isolated 2; one virtual node v linked to 0. With conv2 and
    the classifier the identity: layer 2 gives relu of
      node 0: h0/3 + h1/√(3·2) + v/√(3·2)   (degrees with self-loops: 0 → 3, 1 → 2, v → 2)
      node 1: h1/2 + h0/√(2·3)
      node 2: h2                            (untouched)"""
    torch.manual_seed(0)
    net = FedGNNNet(4, 3, 3, dropout=0.0).eval()
    with torch.no_grad():
        net.conv2.lin.weight.copy_(torch.eye(3))
        net.conv2.bias.zero_()
        net.clsif.weight.copy_(torch.eye(3))
        net.clsif.bias.zero_()
    x = torch.rand(3, 4)
    edge_index = torch.tensor([[0, 1], [1, 0]])
    v = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    out = net(x, edge_index, v, torch.tensor([[0], [0]]))
    h = net.embed(x, edge_index).detach()
    expected = torch.stack([h[0] / 3 + h[1] / math.sqrt(6) + v[0].detach() / math.sqrt(6),
                            h[1] / 2 + h[0] / math.sqrt(6), h[2]]).relu()
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert v.grad is None  # the received embedding is a constant
    # Without the virtual node: plain GCN (node 0 has degree 2).
    plain = net(x, edge_index)
    torch.testing.assert_close(plain[0], (h[0] / 2 + h[1] / 2).relu())
    torch.testing.assert_close(plain[2], out[2])


def _graph(ids: list[int], seed: int = 0) -> Data:
    n = len(ids)
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for i in range(n):
        masks[i % 3][i] = True
    return Data(x=torch.randn(n, 8, generator=g) + y[:, None].float(), y=y,
                edge_index=to_undirected(torch.tensor([[i for i in range(n - 1)],
                                                       [i + 1 for i in range(n - 1)]])),
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                global_id=torch.tensor(ids))


def _config(**extra) -> dict:
    return resolve_config(None, {"algorithm": "fedgnn", "hidden": 16, "dataset": "SBM", **extra})


def test_client_sends_hashes_and_embeddings_and_attaches_what_comes_back():
    cfg = _config(**{"fedgnn-salt": "s"})
    data = _graph([10, 20, 30, 40])
    trainer = FedGNNTrainer(data, cfg, 3, CPU)
    reply = trainer.run_phase(EMBED, {}).arrays
    np.testing.assert_array_equal(reply["node_hash"], hash_ids(np.array([10, 20, 30, 40]), "s"))
    np.testing.assert_array_equal(reply["edge_hash"], reply["node_hash"][data.edge_index.numpy()])
    assert reply["embedding"].shape == (4, 16) and reply["embedding"].dtype == np.float32
    assert set(reply) == FedGNNTrainer.per_node_arrays
    before = trainer.evaluate()
    hashes = hash_ids(np.array([30, 10]), "s")
    answer = {"virtual_embedding": np.ones((2, 16), np.float32),
              "virtual_source": np.array([0, 1, 1]), "virtual_target": hashes[[0, 0, 1]]}
    metrics = trainer.run_phase(EXPAND, answer).metrics
    assert metrics == {"virtual_nodes": 2.0, "virtual_edges": 3.0}
    assert trainer.virtual_edges.tolist() == [[0, 1, 1], [2, 2, 0]]  # 30 is row 2, 10 row 0
    assert trainer.evaluate()["val_loss"] != before["val_loss"]  # the neighbours are used
    rebuilt = FedGNNTrainer(data, cfg, 3, CPU)
    rebuilt.load_local_state(trainer.local_state())
    assert rebuilt.evaluate() == trainer.evaluate()
    with pytest.raises(ValueError, match="does not hold"):
        trainer.run_phase(EXPAND, dict(answer, virtual_target=hash_ids(np.array([30, 30, 99]), "s")))
    off = FedGNNTrainer(data, _config(**{"fedgnn-expand": False}), 3, CPU)
    assert off.run_phase(EMBED, {}).arrays == {}


def test_ldp_modes_perturb_training():
    data = _graph(list(range(12)))
    runs = {}
    for mode in ("off", "code", "paper"):
        torch.manual_seed(1)
        trainer = FedGNNTrainer(data, _config(**{"fedgnn-ldp": mode}), 3, CPU)
        torch.manual_seed(1)
        trainer.train(2)
        runs[mode] = trainer.upload()
    # code: lr·2·clip/(√B·ε) = 0.01·0.2/2 with B = 4 training nodes
    assert FedGNNTrainer(data, _config(**{"fedgnn-ldp": "code"}), 3, CPU).ldp_scale() == pytest.approx(1e-3)
    assert FedGNNTrainer(data, _config(**{"fedgnn-ldp": "paper"}), 3, CPU).ldp_scale() == pytest.approx(0.2)
    for mode in ("code", "paper"):
        diff = max(float(np.abs(runs[mode][k] - runs["off"][k]).max()) for k in runs["off"])
        assert diff > 1e-4, mode


# --- federations -------------------------------------------------------------------------------
def _run(tmp_path, synthetic_root, **extra) -> dict:
    return run_federation({
        "algorithm": "fedgnn", "dataset": "SBM", "num-clients": 5, "rounds": 3, "hidden": 16,
        "partition": "metis-overlapping", "local-epochs": 5, "data-root": str(synthetic_root),
        "output-dir": str(tmp_path), "verbose": False, **extra}, write=False)


@pytest.mark.slow
def test_overlapping_federation_expands_and_learns(tmp_path, synthetic_root):
    """5 clients, each a random half of the same 3000 SBM nodes: many shared nodes, every
    client gets virtual neighbours every round, and the model learns (5 classes)."""
    results = _run(tmp_path, synthetic_root)
    for r in results["rounds"]:
        assert r["aggregate"]["embed.shared_nodes"] > 1000
        assert r["aggregate"]["embed.virtual_nodes"] > 0
        assert all(m["virtual_nodes"] > 0 for m in r["clients"].values())
    assert results["final"]["test_at_best_val"] > 50  # chance: 20
    off = _run(tmp_path, synthetic_root, **{"fedgnn-expand": False})
    assert all(m["virtual_nodes"] == 0 for r in off["rounds"] for m in r["clients"].values())
    assert round_metrics(off) != round_metrics(results)
    # The embed upload scales with the client (per node), the off switch sends nothing extra.
    assert all(results["rounds"][0]["bytes_received"][c] > off["rounds"][0]["bytes_received"][c]
               + 1500 * 16 * 4 for c in results["rounds"][0]["bytes_received"])


@pytest.mark.slow
def test_disjoint_federation_has_no_expansion_and_is_fedavg(tmp_path, synthetic_root):
    on = _run(tmp_path, synthetic_root, partition="metis")
    off = _run(tmp_path, synthetic_root, partition="metis", **{"fedgnn-expand": False})
    assert all(r["aggregate"]["embed.shared_nodes"] == 0 for r in on["rounds"])
    assert round_metrics(on) == round_metrics(off)


@pytest.mark.slow
def test_state_files_keep_the_expansion_between_phases(tmp_path, synthetic_root):
    """client-state=file: each phase restores the trainer from the file the previous phase
    wrote, so the virtual neighbours must survive in the local state."""
    short = {"rounds": 2, "local-epochs": 1}
    live = _run(tmp_path, synthetic_root, **short, **{"run-name": "live"})
    restored = _run(tmp_path, synthetic_root, **short, **{
        "run-name": "restored", "client-state": "file",
        "client-state-dir": str(tmp_path / "state")})
    assert round_metrics(live) == round_metrics(restored)


@pytest.mark.simulation
def test_flower_simulation_smoke_matches_inprocess(tmp_path, data_root):
    flower = simulation_equals_in_process(
        {"algorithm": "fedgnn", "dataset": "Cora", "num-clients": 5, "rounds": 1, "hidden": 16,
         "partition": "metis-overlapping", "data-root": str(data_root)},
        tmp_path, num_supernodes=5)
    assert all(r["aggregate"]["embed.virtual_nodes"] > 0 for r in flower["rounds"])
