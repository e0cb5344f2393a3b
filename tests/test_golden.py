"""Golden figures: the engine's numbers for five algorithms, bit for bit, in process
and in a real Flower simulation (Cora-10, 5 rounds, seed 0, CPU).

The figures were recorded by ``tests/golden/record.py`` before the engine-v2 refactor;
any change to the engine must leave them exactly as they are. The same code gives other
last bits on other CPUs (MKL's and oneDNN's kernels sum in another order), so
``golden/`` holds one file per host kind, all from the same code: ``cora10.json`` (the
original recording) and ``cora10.host-b.json`` (commit 64a5ca9 on a Xeon with AMX and
AVX512-FP16: 60 of the 1,015 figures differ from the first, by at most 6.5e-6
relative). A run must equal one of them bit for bit.
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
GOLDENS = [json.loads(path.read_text()) for path in sorted(GOLDEN_DIR.glob("cora10*.json"))]


def equals_a_golden(algorithm: str, figures: dict) -> bool:
    return any(figures == golden[algorithm] for golden in GOLDENS)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", record.ALGORITHMS)
def test_in_process_equals_golden(tmp_path, data_root, algorithm, one_torch_thread):
    results = run_federation(record.config(algorithm, str(data_root), str(tmp_path)), write=False)
    assert equals_a_golden(algorithm, record.figures(results))


@pytest.mark.simulation
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", record.ALGORITHMS)
def test_flower_simulation_equals_golden(tmp_path, data_root, algorithm):
    from fedgraph_flwr.engine.client_app import make_client_app
    from fedgraph_flwr.engine.server_app import make_server_app

    simulate(make_server_app(record.config(algorithm, str(data_root), str(tmp_path))),
             make_client_app(), num_supernodes=10)
    results = json.loads((tmp_path / algorithm / "results.json").read_text())
    assert equals_a_golden(algorithm, record.figures(results))
