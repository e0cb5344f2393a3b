"""benchmarks/gpu_check.py, the prepared GPU check, run with ``--device cpu`` (no GPU here):
its parts run, its record and tables are written, and a CPU run against the CPU agrees to
the bit (the same CPU and thread count)."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import SHARED

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_cuda_without_a_gpu_is_one_line_before_anything_runs(tmp_path, capsys):
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as stopped:
        _gpu_check().main(["--out", str(tmp_path / "out"), "--data-root", str(tmp_path)])
    assert stopped.value.code == 2 and time.perf_counter() - t0 < 20
    assert "error: device=cuda but torch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_in_process_parts_on_the_cpu(tmp_path, synthetic_root):
    gpu_check = _gpu_check()
    out = tmp_path / "out"
    assert gpu_check.main([
        "--out", str(out), "--data-root", str(synthetic_root), "--device", "cpu",
        "--parts", "algorithms", "arxiv", "--algorithms", "fedavg", "adafgl", "fediih",
        "--dataset", "SBM", "--clients", "3", "--rounds", "3", "--deterministic",
        "--arxiv-dataset", "SBM", "--arxiv-rounds", "2", "--set", "hidden=16"]) == 0
    record = json.loads((out / "gpu_check.json").read_text())
    assert record["device"] == "cpu" and record["deterministic"] is True
    rows = record["parts"]["algorithms"]["rows"]
    assert [r["algorithm"] for r in rows] == ["fedavg", "adafgl", "fediih"]
    for row in rows:
        assert "error" not in row, row
        assert row["devices"] == ["cpu"] and row["peak_gpu_mib"] is None
        assert row["max_round_test_diff_pp"] == 0.0 and row["max_round_loss_diff"] == 0.0
        assert row["final_test_device"] == row["final_test_cpu"]
        assert 0 < row["final_test_cpu"] <= 100 and row["cpu_s_per_round"] > 0
    arxiv = record["parts"]["arxiv"]["rows"]
    assert [r["algorithm"] for r in arxiv] == ["fedaux", "fediih"]
    for row in arxiv:
        assert "error" not in row, row
        assert row["projected_100_rounds_s"] > 99 * row["s_per_round"]
    table = (out / "gpu_check.md").read_text()
    assert "| fediih | cpu |" in table and "**SBM**, 5 METIS clients, 2 rounds" in table


@pytest.mark.deploy
@pytest.mark.slow
def test_the_deployment_part_on_the_cpu(tmp_path, synthetic_root):
    partitions = SHARED / "reference-partitions" / "fedaux-cora-disjoint-10"
    if not partitions.is_dir():
        pytest.skip("no ../shared/reference-partitions")
    out = tmp_path / "out"
    assert _gpu_check().main([
        "--out", str(out), "--data-root", str(synthetic_root), "--device", "cpu",
        "--parts", "flower", "--clients", "2", "--flower-rounds", "2",
        "--partitions", str(partitions)]) == 0
    rows = json.loads((out / "gpu_check.json").read_text())["parts"]["flower"]["rows"]
    assert [r["algorithm"] for r in rows] == ["fedaux", "fediih"]
    assert all("error" not in r and r["round_s_median"] > 0 for r in rows), rows
    assert 'device="cpu"' in rows[0]["set"]


@pytest.mark.simulation
@pytest.mark.slow
def test_the_simulation_part_on_the_cpu(tmp_path, synthetic_root):
    out = tmp_path / "out"
    assert _gpu_check().main([
        "--out", str(out), "--data-root", str(synthetic_root), "--device", "cpu",
        "--parts", "simulation", "--dataset", "SBM", "--clients", "2", "--flower-rounds", "2",
        "--set", "hidden=16"]) == 0
    part = json.loads((out / "gpu_check.json").read_text())["parts"]["simulation"]
    assert part["gpus_per_clientapp"] == 0.0
    assert [r["algorithm"] for r in part["rows"]] == ["fedaux", "fediih"]
    for row in part["rows"]:
        assert "error" not in row, row
        assert row["devices"] == ["cpu"] and row["failures"] == 0 and row["round_s_median"] > 0
