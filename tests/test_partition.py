"""Partitioning, the partition cache, the CLI (fedgraph_flwr.data.partition, fedgraph_flwr.partition)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from fedgraph_flwr.config import ClientSettings
from fedgraph_flwr.data import files
from fedgraph_flwr.data import partition as P
from fedgraph_flwr.data.datasets import load_dataset
from fedgraph_flwr.data.splits import random_split
from fedgraph_flwr.data.synthetic import sbm_edge_index

from conftest import DATASETS as SHARED
from conftest import NO_DATASETS
from conftest import SHARED as SHARED_DIR

# ../shared beside the checkout (as in CI), else FEDGRAPH_DATA_ROOT; never written to.
REFERENCE = SHARED_DIR / "reference-partitions" / "fedaux-cora-disjoint-10"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    if not SHARED.is_dir():
        pytest.skip(NO_DATASETS)
    root = tmp_path_factory.mktemp("datasets")
    shutil.copytree(SHARED / "Cora" / "raw", root / "Cora" / "raw")
    return root


@pytest.fixture(scope="module")
def cora(data_root) -> Data:
    g = load_dataset("Cora", data_root)
    g.train_mask, g.val_mask, g.test_mask = random_split(g.num_nodes, 0.2, 0.4, 1234)
    return g


def _edge_keys(edge_index: torch.Tensor, n: int) -> set[int]:
    return set((edge_index[0] * n + edge_index[1]).tolist())


def _assert_induced(graph: Data, client: Data) -> None:
    """Client edges are exactly the global edges with both ends in the client."""
    gid = client.global_id
    n = graph.num_nodes
    mapped = gid[client.edge_index]
    inside = torch.zeros(n, dtype=torch.bool)
    inside[gid] = True
    expected = graph.edge_index[:, inside[graph.edge_index[0]] & inside[graph.edge_index[1]]]
    assert _edge_keys(mapped, n) == _edge_keys(expected, n)
    assert client.edge_index.size(1) == expected.size(1)
    assert torch.equal(client.x, graph.x[gid]) and torch.equal(client.y, graph.y[gid])


def test_csr_adjacency_matches_naive():
    ei = torch.tensor([[0, 1, 1, 2, 2, 3, 3], [1, 0, 2, 1, 2, 0, 0]])  # self loop, duplicate, one-way
    xadj, adjncy = P.csr_adjacency(ei, 4)
    naive = {i: sorted({int(b) for a, b in ei.t().tolist() if a == i and b != i}
                       | {int(a) for a, b in ei.t().tolist() if b == i and a != i}) for i in range(4)}
    for i in range(4):
        assert adjncy[xadj[i]:xadj[i + 1]].tolist() == naive[i]


def test_metis_disjoint_covering_induced_deterministic(cora):
    clients = P.partition_graph(cora, 10, "metis", seed=1234)
    again = P.partition_graph(cora, 10, "metis", seed=999)  # METIS ignores the partition seed
    assert len(clients) == 10
    ids = torch.cat([c.global_id for c in clients])
    assert ids.numel() == cora.num_nodes and ids.unique().numel() == cora.num_nodes
    for c, d in zip(clients, again):
        assert torch.equal(c.global_id, d.global_id) and torch.equal(c.edge_index, d.edge_index)
        _assert_induced(cora, c)
        assert torch.equal(c.train_mask, cora.train_mask[c.global_id])  # inherited global split
        assert bool(c.train_mask.any())
    sizes = [c.num_nodes for c in clients]
    assert max(sizes) - min(sizes) < 0.1 * cora.num_nodes / 10 + 10  # METIS balances parts
    cut = cora.edge_index.size(1) - sum(c.edge_index.size(1) for c in clients)
    assert cut < 0.2 * cora.edge_index.size(1)  # a real min-cut, not a random split


def test_metis_overlapping(cora):
    clients = P.partition_graph(cora, 10, "metis-overlapping", seed=5)
    parts = P._groups(P.metis_membership(cora.edge_index, cora.num_nodes, 2), 2)
    for part_id, part in enumerate(parts):
        members = [clients[part_id * 5 + j] for j in range(5)]
        for c in members:
            assert c.num_nodes == part.size // 2
            assert set(c.global_id.tolist()) <= set(part.tolist())
            _assert_induced(cora, c)
        assert len({tuple(c.global_id.tolist()) for c in members}) == 5  # independent halves
    again = P.partition_graph(cora, 10, "metis-overlapping", seed=5)
    other = P.partition_graph(cora, 10, "metis-overlapping", seed=6)
    assert all(torch.equal(a.global_id, b.global_id) for a, b in zip(clients, again))
    assert not torch.equal(clients[0].global_id, other[0].global_id)
    with pytest.raises(ValueError, match="divisible by 5"):
        P.partition_graph(cora, 12, "metis-overlapping", seed=5)


def test_louvain_keeps_k_largest(cora):
    import networkx as nx

    g = nx.Graph()  # same node and edge insertion order as the partitioner (Louvain depends on it)
    g.add_nodes_from(range(cora.num_nodes))
    g.add_edges_from(cora.edge_index.t().tolist())
    direct = sorted(nx.community.louvain_communities(g, resolution=1, seed=3),
                    key=lambda c: (-len(c), min(c)))
    clients = P.partition_graph(cora, 5, "louvain", seed=3)
    assert [set(c.global_id.tolist()) for c in clients] == direct[:5]  # the 5 largest, in order
    assert sum(c.num_nodes for c in clients) < cora.num_nodes  # the rest is dropped
    for c in clients:
        _assert_induced(cora, c)
        n = c.num_nodes  # per-client FedSpray split 40/30/30
        assert (int(c.train_mask.sum()), int(c.val_mask.sum())) == (int(0.4 * n), int(0.3 * n))
    glob = P.partition_graph(cora, 5, "louvain", seed=3, split="global")
    assert torch.equal(glob[0].train_mask, cora.train_mask[glob[0].global_id])


def test_blocks_partition_on_csbm():
    g = load_dataset("CSBM", "/nonexistent")  # synthetic: no files needed
    g.train_mask, g.val_mask, g.test_mask = random_split(g.num_nodes)
    clients = P.partition_graph(g, 10, "blocks", seed=0)
    assert [c.num_nodes for c in clients] == [300] * 10
    assert all(bool((g.block[c.global_id] == i).all()) for i, c in enumerate(clients))
    with pytest.raises(ValueError, match="10 planted blocks"):
        P.partition_graph(g, 5, "blocks", seed=0)


def test_partition_errors(cora):
    with pytest.raises(ValueError, match="exceeds"):
        P.partition_graph(cora, cora.num_nodes + 1, "metis", seed=0)
    with pytest.raises(ValueError, match=">= 1"):
        P.partition_graph(cora, 0, "metis", seed=0)
    with pytest.raises(ValueError, match="unknown partition mode"):
        P.partition_graph(cora, 3, "random", seed=0)
    few = cora.clone()
    few.train_mask = torch.zeros(cora.num_nodes, dtype=torch.bool)
    few.train_mask[:3] = True
    with pytest.raises(ValueError, match="no training node"):
        P.partition_graph(few, 10, "metis", seed=0)


def test_reference_split_reproduced(cora):
    """The shipped Cora-10 files carry the 2nd permutation of seed 1234 (skip=1)."""
    if not REFERENCE.is_dir():
        pytest.skip(f"{REFERENCE} not found: reference-partition tests skipped")
    tr, _, te = random_split(cora.num_nodes, 0.2, 0.4, 1234, skip=1)
    index = {}
    for gid, row in enumerate(cora.x.numpy()):
        index.setdefault((row.tobytes(), int(cora.y[gid])), []).append(gid)
    matched = 0
    for c in files.load_partition_dir(REFERENCE, 10):
        for r in range(c.num_nodes):
            hits = index[(c.x[r].numpy().tobytes(), int(c.y[r]))]
            if len(hits) == 1:  # skip the few duplicate feature rows
                matched += 1
                assert bool(c.train_mask[r]) == bool(tr[hits[0]])
                assert bool(c.test_mask[r]) == bool(te[hits[0]])
    assert matched > 2400



def _system_metis_or_skip() -> None:
    from fedgraph_flwr.data.libmetis import LibMetisNotFound, idx_bits

    try:
        bits = idx_bits()
    except LibMetisNotFound as exc:
        pytest.skip(f"no system METIS library ({exc})")
    if bits != 32:
        pytest.skip(f"the system METIS library has {bits}-bit idx_t; the reference used 32-bit")


@pytest.mark.slow
def test_system_metis_reproduces_reference_files(data_root, tmp_path):
    """metis-library=system (32-bit libmetis) + split-draw=1 rebuilds the shipped Cora-10 files.

    Same nodes per client, in the same order, same features, labels, masks and edges:
    the reference generator's partition and split, node for node.
    """
    _system_metis_or_skip()
    config = _config(data_root, **{"num-clients": 10, "metis-library": "system", "split-draw": 1})
    ours = P.load_all_clients(config)
    theirs = files.load_partition_dir(REFERENCE, 10)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.num_nodes == b.num_nodes, i
        assert torch.allclose(a.x, b.x) and torch.equal(a.y, b.y), i
        for key in files.MASK_KEYS:
            assert torch.equal(a[key], b[key]), (i, key)
        assert _edge_keys(a.edge_index, a.num_nodes) == _edge_keys(b.edge_index, b.num_nodes), i
    # ...while pymetis (64-bit idx_t) partitions the same graph differently
    sizes = sorted(c.num_nodes for c in P.load_all_clients(_config(data_root, **{"num-clients": 10})))
    assert sizes != sorted(c.num_nodes for c in theirs)
    folder = P.ensure_partitions(config)
    assert folder.name.endswith("-d1-systemmetis")
    assert "32-bit" in P.read_manifest(folder)["versions"]["metis_library"]


def test_system_metis_missing_library_is_one_clear_error(cora, monkeypatch):
    from fedgraph_flwr.data.libmetis import LibMetisNotFound

    monkeypatch.setenv("METIS_DLL", "/nonexistent/libmetis.so.5")
    with pytest.raises(LibMetisNotFound, match="apt install libmetis5"):
        P.metis_membership(cora.edge_index, cora.num_nodes, 5, library="system")
    with pytest.raises(ValueError, match="unknown metis-library"):
        P.metis_membership(cora.edge_index, cora.num_nodes, 5, library="metis5")

# --- the cache ------------------------------------------------------------------------------
def _config(root: Path, **kw) -> ClientSettings:
    cfg = {"dataset": "Cora", "num-clients": 5, "partition": "metis", "split-seed": 1234,
           "partition-seed": 1234, "data-root": str(root)}
    cfg.update(kw)
    return ClientSettings.from_config(cfg)


@pytest.mark.slow
def test_cache_build_reuse_and_verify(data_root, tmp_path, monkeypatch):
    root = tmp_path / "root"
    shutil.copytree(data_root / "Cora", root / "Cora")
    cfg = _config(root)
    folder = P.ensure_partitions(cfg)
    assert folder == root / "partitions" / "Cora-metis-5-s1234-p1234"
    manifest = P.read_manifest(folder)
    assert manifest["num_classes"] == 7 and manifest["num_features"] == 1433
    assert sum(c["nodes"] for c in manifest["clients"]) == 2485
    assert sorted(manifest["files"]) == [f"client_{i}.pt" for i in range(5)]
    assert {"torch", "torch_geometric", "pymetis"} <= set(manifest["versions"])

    def boom(*a, **k):
        raise AssertionError("rebuilt although the cache is valid")

    monkeypatch.setattr(P, "build_partitions", boom)
    assert P.ensure_partitions(cfg) == folder  # reused
    c2 = P.load_client(cfg, 2)
    raw = torch.load(folder / "client_2.pt", weights_only=True)
    assert set(raw) >= set(files.REQUIRED_KEYS) | {"global_id"}
    assert torch.equal(c2.global_id, raw["global_id"]) and c2.num_classes_total == 7
    with pytest.raises(ValueError, match="outside 0..4"):
        P.load_client(cfg, 5)
    monkeypatch.undo()

    with open(folder / "client_1.pt", "ab") as fh:  # corrupt one file
        fh.write(b"x")
    with pytest.raises(files.SubgraphFileError, match="checksum"):
        P.load_client(cfg, 1)
    P.ensure_partitions(cfg, verify=True)  # detects it and rebuilds
    assert P.load_client(cfg, 1).num_nodes == manifest["clients"][1]["nodes"]
    other = P.ensure_partitions(_config(root, **{"split-seed": 7}))
    assert other.name == "Cora-metis-5-s7-p1234" and other != folder
    assert not [p for p in (root / "partitions").iterdir() if p.name.startswith((".tmp", ".trash"))]


_WORKER = """
import json, sys
from fedgraph_flwr.data.partition import ensure_partitions, read_manifest
from fedgraph_flwr.config import ClientSettings
folder = ensure_partitions(ClientSettings.from_config(json.loads(sys.argv[1])))
m = read_manifest(folder)
print(json.dumps({"folder": str(folder), "files": m["files"], "created": m["created"],
                  "build_seconds": m["build_seconds"]}))
"""


@pytest.mark.slow
def test_concurrent_ensure_partitions(data_root, tmp_path):
    """Two fresh processes (as simulation clients are) race on an empty cache.

    Subprocesses, not fork: a forked child of a process that already ran torch ops can
    deadlock in torch's thread pool.
    """
    root = tmp_path / "root"
    shutil.copytree(data_root / "Cora", root / "Cora")
    cfg = json.dumps(_config(root, partition="metis-overlapping", **{"num-clients": 10}).to_config())
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, cfg], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    a, b = (json.loads(o[0].strip().splitlines()[-1]) for o in outs)
    assert a == b  # same folder, same checksums, one build (same creation stamp)
    folder = Path(a["folder"])
    for name, digest in a["files"].items():
        assert P._sha256(folder / name) == digest
    built = sorted(p.name for p in (root / "partitions").iterdir() if not p.name.startswith("."))
    assert built == [folder.name]
    assert not [p for p in (root / "partitions").iterdir() if p.name.startswith((".tmp", ".trash"))]


def test_cache_missing_dataset_message(tmp_path):
    with pytest.raises(Exception, match="data-root") as info:
        P.ensure_partitions(_config(tmp_path, dataset="PubMed"))
    assert type(info.value).__name__ == "DatasetNotAvailable"


def test_cli_prints_table_and_exports(tmp_path, capsys):
    from fedgraph_flwr.partition import main

    rc = main(["--dataset", "CSBM", "--num-clients", "10", "--partition", "blocks",
               "--data-root", str(tmp_path), "--export", str(tmp_path / "exp"), "--format", "npz"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "CSBM: 3000 nodes" in out and "majority" in out
    assert len([ln for ln in out.splitlines() if ln.strip().startswith(("0 ", "9 "))]) == 2
    exported = files.load_partition_dir(tmp_path / "exp", 10)
    assert [c.num_nodes for c in exported] == [300] * 10
    assert exported[0].num_classes_total == 2
    rc = main(["--dataset", "PubMed", "--num-clients", "5", "--data-root", str(tmp_path)])
    assert rc == 2 and "FEDGRAPH_DATA_ROOT" in capsys.readouterr().err


def test_sbm_edge_sampler_exact_density():
    ei = sbm_edge_index([50, 30], np.array([[1.0, 0.0], [0.0, 0.5]]), seed=1)
    block = torch.tensor([0] * 50 + [1] * 30)
    assert not bool((block[ei[0]] != block[ei[1]]).any())
    assert int((block[ei[0]] == 0).sum()) == 50 * 49  # p=1: complete block, no self loops
    assert int((ei[0] == ei[1]).sum()) == 0


@pytest.mark.slow
def test_split_follows_seed_draws_a_new_split_per_run_seed(tmp_path):
    """FedSpray's official code draws a new split for each run seed; the default keeps one
    split for every seed (the FED-PUB protocol). The partition itself does not move."""
    cfg = {"dataset": "SBM", "num-clients": 3, "partition": "metis", "data-root": str(tmp_path)}
    follows = {**cfg, "split-follows-seed": True}
    def settings(keys: dict) -> ClientSettings:
        return ClientSettings.from_config(keys)

    assert P.cache_key(settings({**cfg, "seed": 4}))["split_seed"] == 1234
    assert P.cache_key(settings({**follows, "seed": 4}))["split_seed"] == 1238
    assert P.cache_key(settings({**follows, "seed": 4, "split-seed": 10}))["split_seed"] == 14
    seed0, seed1 = (P.load_all_clients(settings({**follows, "seed": seed})) for seed in (0, 1))
    assert all(torch.equal(a.global_id, b.global_id) for a, b in zip(seed0, seed1))
    masks = {0: [c.train_mask for c in seed0], 1: [c.train_mask for c in seed1]}
    assert any(not torch.equal(a, b) for a, b in zip(masks[0], masks[1]))
    again = P.load_all_clients(settings({**follows, "seed": 1}))
    assert all(torch.equal(a, c.train_mask) for a, c in zip(masks[1], again))
