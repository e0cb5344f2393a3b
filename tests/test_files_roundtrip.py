"""Bring your own subgraphs: an exported partition runs exactly like the original one."""

from __future__ import annotations

import math

import pytest

from fedgraph_flwr.config import ConfigError
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.partition import main as partition_main

from helpers import round_metrics


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["npz", "pt"])
def test_export_then_files_run_gives_the_same_numbers(tmp_path, data_root, fmt):
    cfg = {"algorithm": "fedaux", "dataset": "Cora", "num-clients": 3, "rounds": 3,
           "hidden": 16, "data-root": str(data_root), "output-dir": str(tmp_path)}
    original = run_federation(dict(cfg, partition="metis", **{"run-name": "original"}))
    folder = tmp_path / "exported"
    assert partition_main(["--dataset", "Cora", "--num-clients", "3", "--partition", "metis",
                           "--data-root", str(data_root), "--export", str(folder),
                           "--format", fmt]) == 0
    assert sorted(p.name for p in folder.glob(f"client_*.{fmt}")) == [
        f"client_{i}.{fmt}" for i in range(3)]
    moved = run_federation(dict(cfg, partition="files", **{"partition-dir": str(folder),
                                                           "run-name": "files"}))
    assert round_metrics(moved) == round_metrics(original)
    assert moved["final"]["test_at_best_val"] == original["final"]["test_at_best_val"]
    assert math.isfinite(moved["final"]["test_at_best_val"])


def test_files_run_with_wrong_client_count_is_one_line(tmp_path, reference_partitions):
    cfg = {"algorithm": "fedavg", "dataset": "Cora", "partition": "files", "rounds": 1,
           "partition-dir": str(reference_partitions), "num-clients": 4,
           "output-dir": str(tmp_path)}
    with pytest.raises(ConfigError) as info:
        run_federation(cfg)
    message = str(info.value)
    assert "\n" not in message and "10" in message and "num-clients=4" in message
    assert not any(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize("source", ["dir", "file"])
def test_client_file_rewritten_in_place_is_read_again(tmp_path, reference_partitions, source):
    """A client's data cache notices a new file even where the copy kept the old mtime."""
    import os
    import shutil

    from fedgraph_flwr.engine.client_runtime import ClientIdentity, load_client_data

    target = tmp_path / "client_0.npz"
    shutil.copy(reference_partitions / "client_0.npz", target)
    identity = ClientIdentity(0, source, str(tmp_path if source == "dir" else target))
    config = {"partition": "files", "partition-dir": str(tmp_path)}
    before, _ = load_client_data(identity, config)
    assert load_client_data(identity, config)[0] is before  # cached
    stamp = target.stat()
    target.write_bytes((reference_partitions / "client_1.npz").read_bytes())  # same inode
    os.utime(target, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    after, _ = load_client_data(identity, config)
    expected, _ = load_client_data(ClientIdentity(1, "dir", str(reference_partitions)), config)
    assert after.num_nodes == expected.num_nodes != before.num_nodes
