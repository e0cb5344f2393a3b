"""benchmarks/openfgl_export.py and openfgl_side_by_side.py's scoring, on hand-made inputs
laid out as OpenFGL 1.1.0 caches a split (OpenFGL itself is not a dependency)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from fedgraph_flwr.data.files import load_partition_dir

from helpers import benchmark_module


def _openfgl_split(folder: Path) -> list[Data]:
    """Two clients as OpenFGL writes them: one direction of each edge, a self-loop, y as a
    column, global_map a dict, masks in node_cls/default_split."""
    masks = folder / "node_cls" / "default_split"
    masks.mkdir(parents=True)
    clients = [
        Data(x=torch.eye(4, 3, dtype=torch.float64), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 3]]),
             y=torch.tensor([[0], [1], [2], [1]]), global_map={0: 7, 1: 2, 2: 9, 3: 4}),
        Data(x=torch.ones(3, 3), edge_index=torch.tensor([[0, 2], [1, 1]]),
             y=torch.tensor([[4], [0], [4]]), global_map={0: 0, 1: 1, 2: 3}),
    ]
    for i, c in enumerate(clients):
        torch.save(c, folder / f"data_{i}.pt")
        n = c.num_nodes
        torch.save(torch.arange(n) == 0, masks / f"train_{i}.pt")
        torch.save(torch.arange(n) == 1, masks / f"val_{i}.pt")
        torch.save(torch.arange(n) >= 2, masks / f"test_{i}.pt")
    return clients


def test_an_openfgl_split_exports_to_client_files_as_openfgl_loads_it(tmp_path):
    export = benchmark_module("openfgl_export")
    _openfgl_split(tmp_path / "split")
    assert export.main([str(tmp_path / "split"), "--out", str(tmp_path / "files")]) == 0
    back = load_partition_dir(tmp_path / "files", 2)
    first = back[0]
    # undirected, no self-loop: 0-1, 1-2, 2-3 in both directions (OpenFGL's get_client_data)
    pairs = {tuple(e) for e in first.edge_index.t().tolist()}
    assert pairs == {(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)}
    assert first.x.dtype == torch.float32 and first.y.tolist() == [0, 1, 2, 1]
    assert first.test_mask.tolist() == [False, False, True, True]
    assert back[1].num_classes_total == 5  # the largest label over all clients, + 1
    assert first.global_id.tolist() == [7, 2, 9, 4]


def test_a_split_without_its_masks_is_refused_in_one_line(tmp_path):
    export = benchmark_module("openfgl_export")
    _openfgl_split(tmp_path / "split")
    (tmp_path / "split" / "node_cls" / "default_split" / "val_1.pt").unlink()
    with pytest.raises(SystemExit, match="val_1.pt: missing"):
        export.main([str(tmp_path / "split"), "--out", str(tmp_path / "files")])


def test_the_three_scoring_rules_on_a_known_curve():
    side = benchmark_module("openfgl_side_by_side")
    # two rounds, two clients: (val, test, nodes)
    per_round = [[(0.5, 0.4, 100), (0.9, 0.8, 300)],
                 [(0.8, 0.6, 100), (0.7, 0.7, 300)]]
    got = side.scores(per_round)
    # weighted val: round 1 0.8, round 2 0.725 -> round 1, weighted test 0.7
    assert got["openfgl"] == pytest.approx(70.0)
    # unweighted val: 0.70 vs 0.75 -> round 2, test 0.65
    assert got["mean_val"] == pytest.approx(65.0)
    # per client: client 0 best at round 2 (0.6), client 1 at round 1 (0.8)
    assert got["per_client"] == pytest.approx(70.0)


def test_openfgl_names_map_to_ours_by_the_one_rename():
    side = benchmark_module("openfgl_side_by_side")
    assert side.ours("fedsage_plus") == "fedsage" and side.ours("fgssl") == "fgssl"
    with pytest.raises(ValueError, match="unknown algorithm 'gcn_only'"):
        side.ours("gcn_only")


def test_our_partition_imports_into_openfgl_and_reads_back_equal(tmp_path, data_root):
    """openfgl_import writes what openfgl_export reads: a round trip keeps every client's
    graph, features, labels, masks and global ids, and OpenFGL's global-id lists."""
    import pickle

    from fedgraph_flwr.config import ClientSettings
    from fedgraph_flwr.data.partition import load_all_clients

    importer, export = benchmark_module("openfgl_import"), benchmark_module("openfgl_export")
    keys = ["dataset=Cora", "partition=metis", "num-clients=3", f"data-root={data_root}"]
    assert importer.main(["--root", str(tmp_path), "--set", *keys]) == 0
    folder = tmp_path / "distrib" / "subgraph_fl_metis_Cora_client_3"
    ours = load_all_clients(ClientSettings.from_config(dict(k.split("=", 1) for k in keys)))
    back = export.read_openfgl_split(folder)
    assert len(back) == 3
    for i, (a, b) in enumerate(zip(ours, back)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        assert torch.equal(a.global_id, b.global_id)
        assert {tuple(e) for e in a.edge_index.t().tolist()} == {tuple(e) for e in b.edge_index.t().tolist()}
        for key in ("train", "val", "test"):
            assert torch.equal(a[f"{key}_mask"], b[f"{key}_mask"])
            with open(folder / "node_cls" / "default_split" / f"glb_{key}_{i}.pkl", "rb") as f:
                assert pickle.load(f) == a.global_id[a[f"{key}_mask"]].tolist()
    assert int(torch.load(folder / "data_0.pt", weights_only=False).num_global_classes) == 7
    with pytest.raises(SystemExit, match="exists"):  # never writes over a cache
        importer.main(["--root", str(tmp_path), "--set", *keys])
