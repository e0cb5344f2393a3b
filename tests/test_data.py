"""Datasets, synthetic graphs, splits, subgraph files (fedgraph_flwr.data)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch_geometric.data import Data
from torch_geometric.utils import is_undirected

from fedgraph_flwr.config import ClientSettings
from fedgraph_flwr.data import datasets as ds
from fedgraph_flwr.data import files, synthetic
from fedgraph_flwr.data.splits import per_client_split, random_split, split_ratios

from conftest import DATASETS as SHARED
from conftest import NO_DATASETS
from conftest import SHARED as SHARED_DIR

REFERENCE = SHARED_DIR / "reference-partitions" / "fedaux-cora-disjoint-10"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A writable copy of the shared raw datasets (never write into ../shared)."""
    if not SHARED.is_dir():
        pytest.skip(NO_DATASETS)
    root = tmp_path_factory.mktemp("datasets")
    for name in ("Cora", "CiteSeer", "minesweeper", "tolokers"):
        shutil.copytree(SHARED / name / "raw", root / name / "raw")
    return root


def _check_graph(d: Data, extra: tuple[str, ...] = ()) -> None:
    assert set(d.keys()) == {"x", "edge_index", "y", *extra}  # shipped splits are dropped
    assert d.x.dtype == torch.float32 and d.edge_index.dtype == torch.int64 and d.y.dtype == torch.int64
    assert d.y.shape == (d.num_nodes,)
    assert is_undirected(d.edge_index, num_nodes=d.num_nodes)


# --- real datasets from the shared folder ---------------------------------------------------
def test_planetoid_lcc_and_normalised(data_root):
    cora = ds.load_dataset("Cora", data_root)
    _check_graph(cora)
    assert cora.num_nodes == 2485 and cora.num_features == 1433 and int(cora.y.max()) == 6
    assert torch.allclose(cora.x.sum(1), torch.ones(2485), atol=1e-5)
    citeseer = ds.load_dataset("CiteSeer", data_root)
    _check_graph(citeseer)
    assert citeseer.num_nodes == 2120
    sums = citeseer.x.sum(1)
    ones = (sums - 1).abs() < 1e-5
    assert bool((ones | (sums == 0)).all()) and int(ones.sum()) == 2110  # 10 all-zero rows stay 0


def test_raw_features_and_no_lcc_as_fedsprays_official_code_loads_planetoid(data_root):
    raw = ds.load_dataset("Cora", data_root, features="raw", lcc=False)
    _check_graph(raw)
    assert raw.num_nodes == 2708  # every component
    assert set(raw.x.unique().tolist()) == {0.0, 1.0}  # binary bag of words, not row-normalised
    lcc_raw = ds.load_dataset("Cora", data_root, features="raw")
    assert lcc_raw.num_nodes == 2485 and float(lcc_raw.x.sum(1).max()) > 1
    with pytest.raises(ValueError, match="unknown features 'scaled'"):
        ds.load_dataset("Cora", data_root, features="scaled")


@pytest.mark.slow
def test_the_switches_name_their_partition_build_and_reach_its_manifest(data_root):
    from fedgraph_flwr.data import partition

    keys = {"dataset": "Cora", "num-clients": 5, "partition": "louvain", "data-root": str(data_root)}
    cfg = ClientSettings.from_config(keys)
    raw = ClientSettings.from_config({**keys, "features": "raw", "lcc": False})
    assert partition.cache_name(partition.cache_key(cfg)) == "Cora-louvain-5-s1234-p1234"
    assert partition.cache_name(partition.cache_key(raw)).endswith("-rawfeatures-nolcc")
    manifest = partition.read_manifest(partition.ensure_partitions(raw))
    assert (manifest["features"], manifest["lcc"]) == ("raw", False)
    assert manifest["graph"]["nodes"] == 2708
    clients = partition.load_all_clients(raw)
    assert float(torch.cat([c.x for c in clients]).sum(1).max()) > 1


def test_heterophilous_from_shared(data_root):
    mine = ds.load_dataset("Minesweeper", data_root)
    _check_graph(mine)
    assert (mine.num_nodes, mine.num_features, int(mine.y.sum())) == (10000, 7, 2000)
    tol = ds.load_dataset("tolokers", data_root)  # case-insensitive name
    _check_graph(tol)
    assert (tol.num_nodes, tol.num_features, tol.edge_index.size(1)) == (11758, 10, 1038000)


def test_name_lookup():
    assert ds.canonical_name("cora") == "Cora"
    assert ds.canonical_name("Amazon-Photo") == "Photo"
    assert ds.canonical_name("roman-empire") == "Roman-empire"
    with pytest.raises(ValueError, match="unknown dataset 'Corra'.*Cora.*CiteSeer"):
        ds.canonical_name("Corra")


def test_missing_dataset_message(tmp_path):
    with pytest.raises(ds.DatasetNotAvailable) as info:
        ds.load_dataset("PubMed", tmp_path)
    msg = str(info.value)
    assert "\n" not in msg
    assert "'PubMed'" in msg and "PubMed/raw/ind.pubmed.x" in msg
    assert "data-root" in msg and "FEDGRAPH_DATA_ROOT" in msg
    assert not (tmp_path / "PubMed").exists()  # nothing was created, nothing downloaded


def test_default_data_root(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDGRAPH_DATA_ROOT", str(tmp_path / "d"))
    assert ds.default_data_root() == tmp_path / "d"
    monkeypatch.delenv("FEDGRAPH_DATA_ROOT")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    assert ds.default_data_root() == tmp_path / "c" / "fedgraph-flwr"


def test_read_only_root_uses_shadow(data_root, tmp_path, monkeypatch):
    """A non-writable root still loads: PyG's processed/ goes to a shadow root in the cache."""
    root = tmp_path / "ro"
    shutil.copytree(data_root / "minesweeper" / "raw", root / "minesweeper" / "raw")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(ds.os, "access", lambda *a, **k: False)  # root ignores chmod
    d = ds.load_dataset("Minesweeper", root)
    assert d.num_nodes == 10000
    assert not (root / "minesweeper" / "processed").exists()
    assert list((tmp_path / "cache").rglob("processed"))


# --- loaders for datasets not shipped here: raw files in PyG's exact raw format ------------
# Each toy graph: a 4-node path (LCC) plus a separate 2-node component that LCC must drop.
TOY_EDGES = [(0, 1), (1, 2), (2, 3), (4, 5)]
TOY_N = 6


def _toy_features(num_features: int = 3) -> np.ndarray:
    x = np.zeros((TOY_N, num_features), dtype=np.float32)
    x[np.arange(TOY_N), np.arange(TOY_N) % num_features] = 1.0
    x[0, 1] = 1.0  # row 0 sums to 2: NormalizeFeatures must fix it
    return x


def _toy_adj() -> sp.csr_matrix:
    r, c = zip(*TOY_EDGES)
    return sp.csr_matrix((np.ones(len(r)), (r, c)), shape=(TOY_N, TOY_N))  # one direction only


def _write_planetoid(root: Path, name: str) -> None:
    """Planetoid needs >= len(y)+500 nodes (it builds a 500-node val mask): a 600-node toy,
    a 596-node path (LCC) plus a 4-node path; node 0 has two features set."""
    raw = root / name / "raw"
    raw.mkdir(parents=True)
    n = 600
    x = np.zeros((n, 3), dtype=np.float32)
    x[np.arange(n), np.arange(n) % 3] = 1.0
    x[0, 1] = 1.0
    y = np.eye(3)[np.arange(n) % 3]
    graph = {i: [] for i in range(n)}
    for a in list(range(595)) + [596, 597, 598]:
        graph[a].append(a + 1)
        graph[a + 1].append(a)
    # nodes 0..579 are "allx" (0..1 also "x"), nodes 580..599 are the test nodes "tx".
    parts = {"x": x[:2], "allx": x[:580], "tx": x[580:], "y": y[:2], "ally": y[:580], "ty": y[580:],
             "graph": graph}
    for key, value in parts.items():
        with open(raw / f"ind.{name.lower()}.{key}", "wb") as fh:
            pickle.dump(value, fh)
    (raw / f"ind.{name.lower()}.test.index").write_text("\n".join(map(str, range(580, 600))) + "\n")


def _write_amazon_like(path: Path) -> None:
    path.parent.mkdir(parents=True)
    attr, adj = sp.csr_matrix(_toy_features()), _toy_adj()
    np.savez(path, attr_data=attr.data, attr_indices=attr.indices, attr_indptr=attr.indptr,
             attr_shape=attr.shape, adj_data=adj.data, adj_indices=adj.indices,
             adj_indptr=adj.indptr, adj_shape=adj.shape, labels=np.array([0, 1, 2, 0, 1, 2]))


def _write_heterophilous(root: Path, folder: str) -> None:
    (root / folder / "raw").mkdir(parents=True)
    masks = np.ones((10, TOY_N), dtype=bool)
    np.savez(root / folder / "raw" / f"{folder}.npz", node_features=_toy_features(),
             node_labels=np.array([0, 1, 0, 1, 0, 1]), edges=np.array(TOY_EDGES),
             train_masks=masks, val_masks=masks, test_masks=masks)


def _write_wikics(root: Path) -> None:
    (root / "WikiCS" / "raw").mkdir(parents=True)
    links = [[] for _ in range(TOY_N)]
    for a, b in TOY_EDGES:
        links[a].append(b)
    m = [[True] * TOY_N for _ in range(2)]
    blob = {"features": _toy_features().tolist(), "labels": [0, 1, 2, 0, 1, 2], "links": links,
            "train_masks": m, "val_masks": m, "stopping_masks": m, "test_mask": [True] * TOY_N}
    (root / "WikiCS" / "raw" / "data.json").write_text(json.dumps(blob))


def _write_flickr(root: Path) -> None:
    raw = root / "Flickr" / "raw"
    raw.mkdir(parents=True)
    adj = _toy_adj()
    np.savez(raw / "adj_full.npz", data=adj.data, indices=adj.indices, indptr=adj.indptr, shape=adj.shape)
    np.save(raw / "feats.npy", _toy_features())
    (raw / "class_map.json").write_text(json.dumps({str(i): i % 3 for i in range(TOY_N)}))
    (raw / "role.json").write_text(json.dumps({"tr": [0, 1], "va": [2, 3], "te": [4, 5]}))


@pytest.mark.parametrize("name,writer,normalised", [
    ("PubMed", lambda r: _write_planetoid(r, "PubMed"), True),
    ("Computers",
     lambda r: _write_amazon_like(r / "Computers" / "raw" / "amazon_electronics_computers.npz"), True),
    ("Photo", lambda r: _write_amazon_like(r / "Photo" / "raw" / "amazon_electronics_photo.npz"), True),
    ("Physics", lambda r: _write_amazon_like(r / "Physics" / "raw" / "ms_academic_phy.npz"), False),
    ("Roman-empire", lambda r: _write_heterophilous(r, "roman_empire"), False),
    ("Amazon-ratings", lambda r: _write_heterophilous(r, "amazon_ratings"), False),
    ("Questions", lambda r: _write_heterophilous(r, "questions"), False),
    ("WikiCS", _write_wikics, False),
    ("Flickr", _write_flickr, False),
])
def test_loaders_on_toy_raw_files(tmp_path, name, writer, normalised):
    assert ds.missing_raw_files(name, tmp_path)  # before: reported missing
    writer(tmp_path)
    assert ds.missing_raw_files(name, tmp_path) == []
    d = ds.load_dataset(name, tmp_path)
    _check_graph(d)
    lcc_nodes = 596 if name == "PubMed" else 4  # LCC: the long path, both directions
    assert d.num_nodes == lcc_nodes and d.edge_index.size(1) == 2 * (lcc_nodes - 1)
    assert d.num_features == 3
    row0 = d.x[0].sum().item()
    assert row0 == pytest.approx(1.0 if normalised else 2.0)


def test_ogb_arxiv_needs_files_and_ogb(tmp_path):
    with pytest.raises(ds.DatasetNotAvailable, match="ogbn_arxiv/raw/edge.csv.gz"):
        ds.load_dataset("ogbn-arxiv", tmp_path)
    try:
        import ogb  # noqa: F401
    except ImportError:  # files present but no ogb: a clear install hint, not an ImportError
        for rel in ds.get_spec("ogbn-arxiv").raw_files:
            (tmp_path / "ogbn_arxiv" / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "ogbn_arxiv" / rel).write_bytes(b"")
        with pytest.raises(ds.DatasetNotAvailable, match="needs the ogb package"):
            ds.load_dataset("ogbn-arxiv", tmp_path)
    assert ds.get_spec("ogbn-arxiv").train_ratio == 0.05
    assert split_ratios(0.05) == pytest.approx((0.05, 0.475))


# --- synthetic graphs ----------------------------------------------------------------------
def test_upper_triangle_decoding():
    n = 37
    k = np.arange(n * (n - 1) // 2)
    i, j = synthetic._decode_upper_triangle(k, n)
    ti, tj = np.triu_indices(n, 1)
    assert np.array_equal(i, ti) and np.array_equal(j, tj)


def test_fedaux_sbm_statistics():
    g = ds.load_dataset("SBM", "/nonexistent")  # no files needed
    _check_graph(g, ("block", "group"))
    assert g.num_nodes == 3000 and g.num_features == 5
    assert torch.equal(g.x.argmax(1), g.y)  # features are one-hot labels
    assert torch.equal(torch.bincount(g.block), torch.full((20,), 150))
    row, col = g.edge_index
    same = g.block[row] == g.block[col]
    pairs_per_block = 150 * 149  # directed pairs
    for grp in range(5):  # intra-block density 0.15*(grp+1)
        in_group = same & (g.group[row] == grp)
        density = in_group.sum().item() / (4 * pairs_per_block)
        assert density == pytest.approx(0.15 * (grp + 1), abs=0.01)
    inter = (~same).sum().item() / (3000 * 2850)
    assert inter == pytest.approx(0.02, abs=0.002)
    share = (g.y == g.group).float().mean().item()
    assert share == pytest.approx(0.8, abs=0.03)
    again = synthetic.fedaux_sbm(seed=0)
    assert torch.equal(again.edge_index, g.edge_index) and torch.equal(again.y, g.y)
    assert not torch.equal(synthetic.fedaux_sbm(seed=1).edge_index, g.edge_index)


def test_csbm_minority_neighbours_are_mostly_majority():
    g = synthetic.csbm(seed=3)
    _check_graph(g, ("block", "p_majority", "minority_ratio"))
    row, col = g.edge_index
    majority = torch.arange(10) % 2  # client k's majority class
    nb_is_major = g.y[col] == majority[g.block[row]]
    minority_node = g.y[row] != majority[g.block[row]]
    same_client = g.block[row] == g.block[col]
    share = nb_is_major[minority_node & same_client].float().mean().item()
    assert share > 0.7  # p_k in [0.7, 0.9]: a minority node's neighbours are mostly majority
    assert abs(int((g.y == 0).sum()) - 1500) < 75  # roughly balanced globally
    mu = torch.stack([g.x[g.y == c].mean(0) for c in range(2)])
    assert (mu[0] - mu[1]).norm().item() == pytest.approx(2.0, abs=0.25)
    assert torch.equal(synthetic.csbm(seed=3).x, g.x)



@pytest.mark.slow
def test_arxiv_like_has_arxivs_shape_and_communities_that_differ():
    g = ds.load_dataset("arxiv-synthetic", "/nonexistent")  # no files needed
    _check_graph(g, ("community",))
    shape = synthetic.ARXIV_SHAPE
    assert (g.num_nodes, g.num_features) == (shape["num_nodes"], shape["num_features"])
    assert int(g.y.max()) + 1 == shape["num_classes"] == ds.num_classes_of(g, "Synthetic-arxiv")
    assert g.edge_index.shape[1] // 2 == pytest.approx(shape["num_edges"], rel=0.01)
    assert ds.get_spec("Synthetic-arxiv").train_ratio == ds.get_spec("ogbn-arxiv").train_ratio
    row, col = g.edge_index
    assert (g.community[row] == g.community[col]).float().mean().item() == pytest.approx(0.8, abs=0.01)
    # A community holds a few neighbouring classes: its top class is far above 1/40.
    counts = torch.zeros(200, 40).index_put_((g.community, g.y), torch.ones(g.num_nodes), accumulate=True)
    top_share = (counts.max(1).values / counts.sum(1)).mean().item()
    assert top_share > 0.4
    assert not torch.equal(counts[0].argmax(), counts[100].argmax())  # opposite sides of the ring
    assert torch.equal(synthetic.arxiv_like(seed=0).y, g.y)


def test_arxiv_like_small_is_exact_in_nodes_and_refuses_bad_arguments():
    g = synthetic.arxiv_like(seed=1, num_nodes=3001, num_edges=12000, num_features=8,
                             num_classes=5, num_communities=10)
    assert g.num_nodes == 3001 and g.x.shape == (3001, 8)
    assert int(torch.bincount(g.community).min()) >= 2
    with pytest.raises(ValueError, match="intra_share"):
        synthetic.arxiv_like(intra_share=0.0)
    with pytest.raises(ValueError, match="probability > 1"):
        synthetic.arxiv_like(num_nodes=200, num_edges=100_000, num_communities=10)

# --- splits ----------------------------------------------------------------------------------
def test_random_split_sizes_and_determinism():
    tr, va, te = random_split(2485, 0.2, 0.4, seed=1234)
    assert (int(tr.sum()), int(te.sum()), int(va.sum())) == (497, 994, 994)
    assert bool((tr.int() + va.int() + te.int() == 1).all())
    again = random_split(2485, 0.2, 0.4, seed=1234)
    assert all(torch.equal(a, b) for a, b in zip((tr, va, te), again))
    assert not torch.equal(random_split(2485, seed=1)[0], tr)
    torch.manual_seed(1234)  # the reference's global-RNG formulation gives the same split
    perm = torch.randperm(2485)
    assert bool(tr[perm[:497]].all()) and bool(te[perm[497:1491]].all())
    second = torch.randperm(2485)  # skip=1 is the second permutation of the same stream
    assert bool(random_split(2485, seed=1234, skip=1)[0][second[:497]].all())
    tr5, va5, te5 = random_split(1000, *split_ratios(0.05), seed=0)
    assert (int(tr5.sum()), int(te5.sum()), int(va5.sum())) == (50, 475, 475)


def test_per_client_split():
    tr, va, te = per_client_split(101, seed=7)
    assert (int(tr.sum()), int(va.sum()), int(te.sum())) == (40, 30, 31)
    assert bool((tr.int() + va.int() + te.int() == 1).all())
    assert torch.equal(per_client_split(101, seed=7)[0], tr)
    assert not torch.equal(per_client_split(101, seed=8)[0], tr)


# --- subgraph files --------------------------------------------------------------------------
def _good_arrays(n: int = 5) -> dict[str, np.ndarray]:
    return {
        "x": np.random.default_rng(0).random((n, 3)).astype(np.float32),
        "edge_index": np.array([[0, 1, 1, 2], [1, 0, 2, 1]], dtype=np.int64),
        "y": np.array([0, 1, 0, 1, 2][:n], dtype=np.int64),
        "train_mask": np.array([True, False, True, False, False][:n]),
        "val_mask": np.array([False, True, False, False, False][:n]),
        "test_mask": np.array([False, False, False, True, True][:n]),
    }


def test_reference_partitions_load():
    if not REFERENCE.is_dir():
        pytest.skip(f"{REFERENCE} not found: reference-partition tests skipped")
    clients = files.load_partition_dir(REFERENCE, 10)
    stats = json.loads((REFERENCE / "stats.json").read_text())
    for c, s in zip(clients, stats):
        got = (c.num_nodes, c.edge_index.size(1), int(c.train_mask.sum()), int(c.val_mask.sum()),
               int(c.test_mask.sum()))
        assert got == (s["nodes"], s["edges"], s["train"], s["val"], s["test"])
        assert c.num_features == 1433 and c.num_classes_total == 7
        assert is_undirected(c.edge_index, num_nodes=c.num_nodes)
    with pytest.raises(files.SubgraphFileError, match="expected client_0..client_4"):
        files.load_partition_dir(REFERENCE, 5)


def _save_npz(path: Path, arrays: dict) -> Path:
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("mutate,message", [
    (lambda a: a.pop("y"), "missing key\\(s\\) y"),
    (lambda a: a.update(y=a["y"].astype(np.float32)), "y has dtype torch.float32"),
    (lambda a: a.update(edge_index=a["edge_index"].astype(np.float64)), "edge_index has dtype"),
    (lambda a: a.update(train_mask=a["train_mask"].astype(np.int64)), "train_mask has dtype torch.int64"),
    (lambda a: a.update(edge_index=np.array([[0, 5], [5, 0]])), "outside \\[0, 5\\)"),
    (lambda a: a.update(edge_index=np.array([[0, -1], [-1, 0]])), "outside \\[0, 5\\)"),
    (lambda a: a.update(val_mask=np.zeros(4, dtype=bool)), "val_mask has shape \\(4,\\); expected \\(5,\\)"),
    (lambda a: a.update(y=np.zeros(6, dtype=np.int64)), "y has shape \\(6,\\)"),
    (lambda a: a.update(train_mask=np.zeros(5, dtype=bool)), "no training node"),
    (lambda a: a.update(x=np.full((5, 3), np.nan, dtype=np.float32)), "NaN"),
    (lambda a: a.update(edge_index=np.zeros((3, 2), dtype=np.int64)), "expected 2 x m"),
])
def test_bad_subgraph_files_refused(tmp_path, mutate, message):
    arrays = _good_arrays()
    mutate(arrays)
    path = _save_npz(tmp_path / "client_0.npz", arrays)
    with pytest.raises(files.SubgraphFileError, match=message) as info:
        files.load_subgraph_file(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_pickled_objects_refused(tmp_path):
    arrays = _good_arrays()
    arrays["y"] = np.array([0, 1, 0, 1, {"evil": 1}], dtype=object)
    path = _save_npz(tmp_path / "client_0.npz", arrays)  # np.savez pickles object arrays
    with pytest.raises(files.SubgraphFileError, match="Python objects"):
        files.load_subgraph_file(path)
    pt = tmp_path / "client_1.pt"
    torch.save({"payload": Path("/etc")}, pt)  # an arbitrary class: refused by weights_only
    with pytest.raises(files.SubgraphFileError, match="weights_only"):
        files.load_subgraph_file(pt)
    junk = tmp_path / "client_2.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(files.SubgraphFileError, match="not a readable .npz"):
        files.load_subgraph_file(junk)


def test_pt_files_dict_and_pyg_data(tmp_path):
    arrays = {k: torch.from_numpy(v) for k, v in _good_arrays().items()}
    torch.save(arrays, tmp_path / "a.pt")
    torch.save(Data(**arrays), tmp_path / "b.pt")
    a, b = files.load_subgraph_file(tmp_path / "a.pt"), files.load_subgraph_file(tmp_path / "b.pt")
    for key in files.REQUIRED_KEYS:
        assert torch.equal(a[key], arrays[key]) and torch.equal(b[key], arrays[key])


@pytest.mark.parametrize("fmt", ["npz", "pt"])
def test_export_load_round_trip(tmp_path, fmt):
    clients = []
    for i in range(3):
        c = files.validate_subgraph(_good_arrays())
        c.x = c.x + i
        c.global_id = torch.arange(5) + 10 * i
        c.num_classes_total = 4
        clients.append(c)
    out = files.export_partitions(clients, tmp_path / "exp", fmt)
    back = files.load_partition_dir(out, 3)
    for c, b in zip(clients, back):
        for key in files.REQUIRED_KEYS:
            assert b[key].dtype == c[key].dtype and torch.equal(b[key], c[key])
        assert "global_id" not in b  # stays on the machine that partitioned
        assert b.num_classes_total == 4
    stats = json.loads((out / "stats.json").read_text())
    assert [s["nodes"] for s in stats] == [5, 5, 5] and stats[0]["class_hist"] == [2, 2, 1, 0]
    with pytest.raises(files.SubgraphFileError, match="beyond the 2 being exported"):
        files.export_partitions(clients[:2], out, fmt)


def test_partition_dir_mismatched_widths(tmp_path):
    a = _good_arrays()
    b = _good_arrays()
    b["x"] = np.ones((5, 4), dtype=np.float32)
    _save_npz(tmp_path / "client_0.npz", a)
    _save_npz(tmp_path / "client_1.npz", b)
    with pytest.raises(files.SubgraphFileError, match="feature width"):
        files.load_partition_dir(tmp_path, 2)
