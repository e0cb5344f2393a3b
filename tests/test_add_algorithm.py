"""Adding a method takes its own file and one registry line: a throwaway method shows it.

``throwaway`` (FedAvg whose client weights are n_k^power, with one typed option) is
written to a temporary file and registered with one ``register(...)`` call, undone after
each test. Nothing else is edited, and still: ``resolve_config`` checks its option, the
pyproject generator writes its key, the in-process engine runs it (results, report,
checkpoint), the privacy test's checks apply to it, and live and restored trainers agree.

Files the addition needed: 2 by hand, its own module and the registry (in the product:
``fedgraph_flwr/algorithms/<name>.py`` and two lines of ``algorithms/__init__.py``, the
import and the ``register`` line). A method with options also changes ``pyproject.toml``'s
generated block, rewritten by ``python -m fedgraph_flwr.config --write-pyproject``, not by
hand (tests/test_config.py fails until it is); README's algorithm table is where users
read of it. No hand-kept list of the methods exists that it would have to join
(:func:`test_no_hand_kept_list_of_the_methods`).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from fedgraph_flwr.algorithms import ALGORITHMS, ConfigError, register
from fedgraph_flwr.config import PYPROJECT, pyproject_block, pyproject_with_block, resolve_config
from fedgraph_flwr.engine.loop import run_federation

NAME = "throwaway"
REPO = Path(__file__).resolve().parents[1]

METHOD_SOURCE = '''
"""throwaway: FedAvg whose client weights are (training nodes)^power."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedgraph_flwr.algorithms import Options, option
from fedgraph_flwr.algorithms.base import AggregateResult, Aggregator
from fedgraph_flwr.algorithms.fedavg import GCNTrainer
from fedgraph_flwr.algorithms.mixing import average


@dataclass(frozen=True)
class ThrowawayOptions(Options, prefix="throwaway"):
    """throwaway's knob (``throwaway-*``)."""

    power: float = option(0.5, "client weight ∝ (training nodes)^power", low=0.0, high=2.0)


class ThrowawayTrainer(GCNTrainer):
    options_class = ThrowawayOptions


class ThrowawayAggregator(Aggregator):
    options_class = ThrowawayOptions

    def aggregate(self, server_round, updates):
        ids = sorted(updates)
        w = np.array([updates[c].num_train for c in ids], dtype=np.float64) ** self.options.power
        w = w / w.sum()
        shared = average(w, [updates[c].arrays for c in ids], self.mix_dtype)
        return AggregateResult(payloads={c: shared for c in updates},
                               metrics={"max_weight": float(w.max())})
'''


@pytest.fixture
def throwaway(tmp_path):
    """The method's module, loaded from its own file, and registered for one test."""
    path = tmp_path / "throwaway_method.py"
    path.write_text(METHOD_SOURCE)
    spec = importlib.util.spec_from_file_location("throwaway_method", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    register(NAME, module.ThrowawayTrainer, module.ThrowawayAggregator, module.ThrowawayOptions)
    try:
        yield module
    finally:
        ALGORITHMS.pop(NAME, None)
        sys.modules.pop(spec.name, None)


def _config(root, out, **extra) -> dict:
    return {"algorithm": NAME, "dataset": "SBM", "num-clients": 3, "rounds": 2, "hidden": 16,
            "data-root": str(root), "output-dir": str(out), **extra}


def test_resolve_config_takes_and_checks_its_option(throwaway):
    assert resolve_config(None, {"algorithm": NAME}).options.power == 0.5
    assert resolve_config(None, {"algorithm": NAME, "throwaway-power": 1.5}).options.power == 1.5
    with pytest.raises(ConfigError, match="throwaway-power=3.0 is out of range"):
        resolve_config(None, {"algorithm": NAME, "throwaway-power": 3.0})
    with pytest.raises(ConfigError, match="throwaway-power"):  # the closest valid key offered
        resolve_config(None, {"algorithm": NAME, "throwaway-pow": 1.0})


def test_the_pyproject_generator_writes_its_key_and_nothing_else_changes(throwaway):
    current = PYPROJECT.read_text()
    regenerated = pyproject_with_block(current)
    changed = [line for line in difflib.ndiff(current.splitlines(), regenerated.splitlines())
               if line[:2] in ("+ ", "- ")]
    assert changed == [
        "+ # throwaway (throwaway_method.ThrowawayOptions)",
        "+ throwaway-power = 0.5  # client weight ∝ (training nodes)^power (must be in [0, 2])",
    ], changed
    assert "throwaway-power = 0.5" in pyproject_block()


@pytest.mark.slow
def test_the_engine_runs_it_end_to_end(throwaway, tmp_path, synthetic_root):
    cfg = _config(synthetic_root, tmp_path, **{"run-name": "throwaway", "throwaway-power": 1.0})
    results = run_federation(cfg)
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert all(len(r["clients"]) == 3 and not r["failures"] for r in results["rounds"])
    assert all(0 < r["aggregate"]["max_weight"] < 1 for r in results["rounds"])
    assert 0 < results["final"]["test_at_best_val"] <= 100
    run = tmp_path / "throwaway"
    saved = json.loads((run / "results.json").read_text())
    assert saved["config"]["throwaway-power"] == 1.0
    assert "throwaway-power" in (run / "report.html").read_text()


def test_the_privacy_checks_apply(throwaway):
    import test_privacy_and_replies as privacy

    privacy.test_nothing_a_client_sends_scales_with_its_node_count(NAME)
    assert not ALGORITHMS[NAME].trainer.per_node_arrays  # so no exemption to disclose


@pytest.mark.slow
def test_live_and_restored_trainers_agree(throwaway, tmp_path, synthetic_root):
    import test_engine

    test_engine.test_live_trainers_equal_trainers_restored_from_state(
        tmp_path, synthetic_root, NAME)


def _string_collections(path: Path):
    """(line, the strings) of every list, tuple, set literal and dict's keys in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        yield node.lineno, {e.value for e in items if isinstance(e, ast.Constant)
                            and isinstance(e.value, str)}


def test_no_hand_kept_list_of_the_methods():
    """A literal list naming half or more of the registered methods is a list of "all"
    of them that a new method would have to join: the registry is the only one. Chosen
    subsets (golden's five, a test's per-method configs) stay below half."""
    methods = set(ALGORITHMS)
    lists = [f"{path.relative_to(REPO)}:{line} {sorted(found & methods)}"
             for folder in ("fedgraph_flwr", "tests", "benchmarks", "deploy")
             for path in sorted((REPO / folder).rglob("*.py"))
             for line, found in _string_collections(path)
             if len(found & methods) >= len(methods) / 2]
    assert lists == []
