"""Golden figures: the engine's numbers for five algorithms, bit for bit, in process
and in a real Flower simulation (Cora-10, 5 rounds, seed 0, CPU).

The figures were recorded by ``tests/golden/record.py`` before the engine-v2 refactor;
any change to the engine must leave them exactly as they are.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fedgraph_flwr.engine.loop import run_federation

from helpers import simulate

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
_spec = importlib.util.spec_from_file_location("golden_record", GOLDEN_DIR / "record.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)
GOLDEN = json.loads((GOLDEN_DIR / "cora10.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", record.ALGORITHMS)
def test_in_process_equals_golden(tmp_path, data_root, algorithm, one_torch_thread):
    results = run_federation(record.config(algorithm, str(data_root), str(tmp_path)), write=False)
    assert record.figures(results) == GOLDEN[algorithm]


@pytest.mark.simulation
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", record.ALGORITHMS)
def test_flower_simulation_equals_golden(tmp_path, data_root, algorithm):
    from fedgraph_flwr.engine.client_app import make_client_app
    from fedgraph_flwr.engine.server_app import make_server_app

    simulate(make_server_app(record.config(algorithm, str(data_root), str(tmp_path))),
             make_client_app(), num_supernodes=10)
    results = json.loads((tmp_path / algorithm / "results.json").read_text())
    assert record.figures(results) == GOLDEN[algorithm]
