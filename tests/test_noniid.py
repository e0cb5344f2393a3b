"""Partition diagnostics (edge cut, FedAux's ξ = JSD + MMD) and similarity-vs-ground-truth
scoring (fedgraph_flwr.data.noniid, fedgraph_flwr.similarity, the partition CLI)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon, pdist
from sklearn.metrics.pairwise import cosine_similarity
from torch_geometric.data import Data

from fedgraph_flwr.config import ClientSettings
from fedgraph_flwr.data import noniid
from fedgraph_flwr.data import partition as P
from fedgraph_flwr.similarity import ground_truth_similarity, match_score, report

NUM_CLASSES = 4


# --------------------------------------------------------------------------------------
# synthetic clients
# --------------------------------------------------------------------------------------
def _client(labels: np.ndarray, noise_seed: int, noise: float = 0.1) -> Data:
    """Homophilous toy subgraph: nodes of one class form a path; x = one-hot(y) + noise."""
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.size
    order = np.argsort(labels, kind="stable")
    same = labels[order[:-1]] == labels[order[1:]]
    src, dst = order[:-1][same], order[1:][same]
    edge_index = torch.from_numpy(np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])]))
    rng = np.random.default_rng(noise_seed)
    x = np.eye(NUM_CLASSES + 2)[labels] + noise * rng.standard_normal((n, NUM_CLASSES + 2))
    return Data(x=torch.from_numpy(x).float(), edge_index=edge_index, y=torch.from_numpy(labels),
                num_nodes=n)


def _skewed_clients(skew: float, n: int = 240) -> list[Data]:
    """K = C clients; client k's labels are (1 − skew)·uniform + skew·one-hot(k) (exact
    counts), so the pooled label distribution stays uniform for every skew."""
    clients = []
    for k in range(NUM_CLASSES):
        p = np.full(NUM_CLASSES, (1.0 - skew) / NUM_CLASSES)
        p[k] += skew
        counts = np.rint(p * n).astype(np.int64)
        assert counts.sum() == n and np.allclose(counts, p * n)
        labels = np.repeat(np.arange(NUM_CLASSES), counts)
        labels = labels[np.random.default_rng(100 + k).permutation(n)]
        clients.append(_client(labels, noise_seed=k))
    return clients


# --------------------------------------------------------------------------------------
# ξ = JSD + MMD
# --------------------------------------------------------------------------------------
def test_xi_is_zero_for_identical_clients():
    one = _client(np.random.default_rng(0).integers(0, NUM_CLASSES, 150), noise_seed=3)
    out = noniid.noniidness([one, one.clone(), one.clone()], NUM_CLASSES)
    assert out["jsd"] == pytest.approx(0.0, abs=1e-12)
    assert out["mmd"] == pytest.approx(0.0, abs=1e-10)
    assert out["xi"] == pytest.approx(0.0, abs=1e-10)
    # ... and clearly positive for a different client (so the zero above is not trivial)
    other = _client(np.zeros(150, dtype=np.int64), noise_seed=4)
    assert noniid.noniidness([one, other], NUM_CLASSES)["xi"] > 0.1


def test_xi_grows_monotonically_with_label_skew():
    skews = [0.0, 0.25, 0.5, 0.75, 1.0]
    results = [noniid.noniidness(_skewed_clients(s), NUM_CLASSES) for s in skews]
    xi = [r["xi"] for r in results]
    jsd = [r["jsd"] for r in results]
    mmd = [r["mmd"] for r in results]
    assert all(a < b for a, b in zip(xi, xi[1:])), xi
    assert all(a < b for a, b in zip(jsd, jsd[1:])), jsd
    assert all(a < b for a, b in zip(mmd, mmd[1:])), mmd
    assert jsd[0] == pytest.approx(0.0, abs=1e-12)  # same label distribution everywhere
    # skew 1: every P_k is one-hot, P uniform over 4 classes, R_k = (5/8 at k, 1/8 elsewhere)
    expected = 0.5 * (math.log(8 / 5) + 0.25 * math.log(2 / 5) + 0.75 * math.log(2))
    assert jsd[-1] == pytest.approx(expected, rel=1e-12)


def test_label_jsd_matches_scipy():
    hists = np.array([[5, 0, 3, 2], [1, 1, 1, 1], [0, 9, 0, 1]])
    pooled = hists.sum(0) / hists.sum()
    expected = np.mean([jensenshannon(h / h.sum(), pooled) ** 2 for h in hists])  # natural log
    assert noniid.label_jsd(hists) == pytest.approx(expected, rel=1e-12)


def test_mmd_matches_dense_formula_and_is_blocked(monkeypatch):
    rng = np.random.default_rng(1)
    feats = [rng.normal(size=(n, 3)) + shift for n, shift in ((30, 0.0), (25, 0.5), (40, 2.0))]
    pooled = np.concatenate(feats)
    h = float(np.median(pdist(pooled)))
    assert noniid.median_bandwidth(pooled) == pytest.approx(h, rel=1e-12)

    def kmean(a, b):
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
        return np.exp(-d2 / (2 * h * h)).mean()

    dense = np.array([[kmean(a, a) + kmean(b, b) - 2 * kmean(a, b) for b in feats] for a in feats])
    got, bandwidth = noniid.mmd_matrix(feats)
    assert bandwidth == pytest.approx(h, rel=1e-12)
    np.testing.assert_allclose(got, dense, atol=1e-12)
    assert noniid.mean_offdiagonal(got) == pytest.approx(dense[np.triu_indices(3, 1)].mean(), abs=1e-12)
    monkeypatch.setattr(noniid, "_BLOCK_ENTRIES", 7 * pooled.shape[0])  # 7-row blocks
    np.testing.assert_allclose(noniid.mmd_matrix(feats)[0], dense, atol=1e-12)
    # subsampling: capped clients, seeded, deterministic, close to the exact value
    a, _ = noniid.mmd_matrix(feats, max_nodes_per_client=20, seed=5)
    b, _ = noniid.mmd_matrix(feats, max_nodes_per_client=20, seed=5)
    np.testing.assert_array_equal(a, b)
    assert np.argmax(a[0]) == np.argmax(dense[0]) == 2


def test_raw_propagation_is_adjacency_times_features():
    c = _client(np.array([0, 0, 0, 1, 1]), noise_seed=0)  # paths 0-1-2 and 3-4
    z = noniid.propagated_features(c, "raw")
    x = c.x.double().numpy()
    np.testing.assert_allclose(z[1], x[0] + x[2])
    np.testing.assert_allclose(z[0], x[1])
    np.testing.assert_allclose(z[3], x[4])


def test_edge_cut_on_a_path():
    # path 0-1-2-3-4 (both directions) plus a self loop; clients {0,1}, {2,3}; node 4 in none
    ei = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4, 2], [1, 0, 2, 1, 3, 2, 4, 3, 2]])
    clients = []
    for nodes in ([0, 1], [2, 3]):
        gid = torch.tensor(nodes)
        clients.append(Data(edge_index=torch.tensor([[0, 1], [1, 0]]), global_id=gid, num_nodes=2))
    cut = noniid.edge_cut(ei, 5, clients)
    assert cut["undirected_edges"] == 4 and cut["kept"] == 2
    assert cut["cut"] == 1 and cut["cut_fraction"] == pytest.approx(0.25)  # 1-2
    assert cut["uncovered"] == 1  # 3-4: node 4 is in no client


# --------------------------------------------------------------------------------------
# ground truth and the match score
# --------------------------------------------------------------------------------------
def test_ground_truth_definitions_symmetric_unit_diagonal():
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    clients = _skewed_clients(0.5)
    gt = ground_truth_similarity(clients, NUM_CLASSES)
    for name in ("features", "labels", "combined"):
        m = gt[name]
        assert m.shape == (4, 4)
        np.testing.assert_allclose(m, m.T, atol=1e-12)
        np.testing.assert_allclose(np.diag(m), 1.0, atol=1e-12)
        assert np.all(m <= 1 + 1e-12)
    # features: cosine of the client means of Â X, Â built independently by PyG's gcn_norm
    means = []
    for c in clients:
        ei, w = gcn_norm(c.edge_index, num_nodes=c.num_nodes, add_self_loops=True)
        ahat = torch.sparse_coo_tensor(ei.flip(0), w.double(), (c.num_nodes, c.num_nodes),
                                       check_invariants=True)
        means.append((ahat @ c.x.double()).mean(0).numpy())
    np.testing.assert_allclose(gt["features"], cosine_similarity(np.stack(means)), atol=1e-10)
    hists = noniid.label_histograms(clients, NUM_CLASSES)
    expected = 1 - jensenshannon(hists[0] / 240, hists[1] / 240) ** 2 / math.log(2)
    assert gt["labels"][0, 1] == pytest.approx(expected, rel=1e-12)
    assert gt["labels"][0, 1] < 1 - 1e-3  # different label distributions are not "identical"


def test_match_score():
    gt = ground_truth_similarity(_skewed_clients(0.5) + _skewed_clients(0.9), NUM_CLASSES)["combined"]
    assert match_score(gt, gt) == pytest.approx(1.0)
    assert match_score(np.exp(3 * gt) / np.exp(3 * gt).sum(1, keepdims=True), gt) < 1.0  # row-normalised
    assert match_score(np.exp(3 * gt), gt) == pytest.approx(1.0)  # monotone transform
    assert match_score(-gt, gt) == pytest.approx(-1.0)
    partial = gt.copy()
    partial[2, :] = partial[:, 2] = np.nan  # client 2 sat the round out
    assert match_score(partial, gt) == pytest.approx(1.0)
    assert math.isnan(match_score(np.ones_like(gt), gt))
    rng = np.random.default_rng(0)
    noise = rng.random(gt.shape)
    assert abs(match_score(noise + noise.T, gt)) < 0.6
    with pytest.raises(ValueError):
        match_score(gt[:3, :3], gt)


# --------------------------------------------------------------------------------------
# the partition cache, the CLI and report() on Cora
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cora_root(data_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("noniid-root")
    shutil.copytree(data_root / "Cora", root / "Cora")
    return root


def _cfg(root, k=5) -> ClientSettings:
    return ClientSettings.from_config({"dataset": "Cora", "num-clients": k, "partition": "metis",
                                       "split-seed": 1234, "partition-seed": 1234,
                                       "data-root": str(root)})


def test_manifest_holds_histograms_edge_cut_and_xi(cora_root):
    from fedgraph_flwr.data.datasets import load_dataset

    folder = P.ensure_partitions(_cfg(cora_root))
    manifest = P.read_manifest(folder)
    clients = P.load_all_clients(_cfg(cora_root))
    for stats, client in zip(manifest["clients"], clients):
        assert stats["class_hist"] == torch.bincount(client.y, minlength=7).tolist()
    diag = manifest["diagnostics"]
    assert diag["version"] == noniid.DIAGNOSTICS_VERSION
    # edge cut, checked against the node → client membership of the global graph
    graph = load_dataset("Cora", cora_root)
    member = torch.empty(graph.num_nodes, dtype=torch.long)
    for i, c in enumerate(clients):
        member[c.global_id] = i
    u, v = graph.edge_index
    crossing = int((member[u] != member[v]).sum()) // 2
    assert diag["edge_cut"]["cut"] == crossing > 0
    assert diag["edge_cut"]["undirected_edges"] == graph.edge_index.size(1) // 2
    assert diag["edge_cut"]["kept"] == sum(c.edge_index.size(1) for c in clients) // 2
    assert diag["edge_cut"]["uncovered"] == 0
    nn = diag["noniid"]
    assert nn["xi"] == pytest.approx(nn["jsd"] + nn["mmd"]) and nn["jsd"] > 0 and nn["mmd"] > 0
    assert nn == pytest.approx(noniid.noniidness(clients, 7))  # deterministic, same as stored


def test_cli_prints_xi_and_edge_cut_and_fills_old_manifests(cora_root, capsys, monkeypatch):
    from fedgraph_flwr.partition import main

    assert main(["--dataset", "Cora", "--num-clients", "5", "--partition", "metis",
                 "--data-root", str(cora_root)]) == 0
    out = capsys.readouterr().out
    folder = P.ensure_partitions(_cfg(cora_root))
    diag = P.read_manifest(folder)["diagnostics"]
    nn, cut = diag["noniid"], diag["edge_cut"]
    assert (f"xi = JSD + MMD = {nn['jsd']:.4f} + {nn['mmd']:.4f} = {nn['xi']:.4f}") in out
    assert f"edge cut: {cut['cut']} of {cut['undirected_edges']} undirected edges" in out
    assert "label histogram" in out and "c6" in out

    # A manifest written before diagnostics existed: still valid, filled in on demand.
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["diagnostics"]
    (folder / "manifest.json").write_text(json.dumps(manifest))

    def boom(*a, **k):
        raise AssertionError("the partition was rebuilt")

    monkeypatch.setattr(P, "build_partitions", boom)
    assert P.load_client(_cfg(cora_root), 0).num_nodes == manifest["clients"][0]["nodes"]
    assert main(["--dataset", "Cora", "--num-clients", "5", "--data-root", str(cora_root)]) == 0
    assert f"= {nn['xi']:.4f}" in capsys.readouterr().out
    again = P.read_manifest(folder)["diagnostics"]
    assert again["edge_cut"] == cut and again["noniid"] == pytest.approx(nn)


def test_report_scores_each_round_and_draws(cora_root, tmp_path, capsys):
    cfg = {**_cfg(cora_root).to_config(), "algorithm": "fedaux", "partition-split": "auto"}
    truth = ground_truth_similarity(P.load_all_clients(_cfg(cora_root)), 7)
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"config": cfg, "num_classes": 7}))
    missing = np.full((5, 5), np.nan)
    stacked = np.stack([truth["features"], -truth["features"], missing, truth["labels"]])
    np.savez(run / "diagnostics.npz", similarity=stacked, weights=np.exp(10 * stacked))
    out = report(run, cora_root)
    sim = out["rounds"]["similarity"]
    assert sim["features"][0] == pytest.approx(1.0) and sim["features"][1] == pytest.approx(-1.0)
    assert sim["features"][2] is None and sim["labels"][3] == pytest.approx(1.0)
    assert out["rounds"]["weights"] == out["rounds"]["similarity"]  # monotone transform
    assert out["last_round"]["similarity"]["round"] == 4
    np.testing.assert_allclose(out["ground_truth"]["labels"], truth["labels"])
    saved = json.loads((run / "similarity_match.json").read_text())
    assert saved["rounds"] == out["rounds"]
    png = run / "similarity_vs_truth_similarity.png"
    assert out["figures"] == [png.name] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "similarity:" in printed and "1.000" in printed and "-1.000" in printed
    np.savez(run / "diagnostics.npz", similarity=np.zeros((2, 3, 3)))
    with pytest.raises(ValueError, match="expected"):
        report(run, cora_root)
