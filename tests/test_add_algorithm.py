"""Adding a method takes its own file and one name in the registry: a throwaway method shows it.

``throwaway`` (FedAvg whose client weights are n_k^power, with one typed option) is
written to a temporary file that ends, as every method's module does, with its entry
``ALGORITHM = Algorithm("throwaway", ...)``, and declared with one ``declare(...)`` call
(undone after each test): the registry imports the file the first time the method is asked
for, not before. Nothing else is edited, and still: ``resolve_config`` checks its option,
the pyproject generator writes its key, the in-process engine runs it (results, report,
checkpoint), the privacy test's checks apply to it, and live and restored trainers agree.

Files the addition needed: 2 by hand, its own module and the registry (in the product:
``fedgraph_flwr/algorithms/<name>.py``, ending with its ``ALGORITHM``, and its name in
``BUILT_IN`` of ``fedgraph_flwr/core/registry.py``: what ``declare`` does here). A method
with options also changes ``pyproject.toml``'s generated block, rewritten by
``python -m fedgraph_flwr.config --write-pyproject``, not by hand (tests/test_config.py
fails until it is), and README's algorithm table, where users read of it, rewritten by
``python -m fedgraph_flwr.docs_tables --write`` (tests/test_docs_tables.py fails until it
is). No other hand-kept list of the methods exists that it would have to join
(:func:`test_no_hand_kept_list_of_the_methods`).
"""

from __future__ import annotations

import ast
import difflib
import json
import sys
from pathlib import Path

import pytest

from fedgraph_flwr.algorithms import ALGORITHMS, ConfigError, declare, get_algorithm, unregister
from fedgraph_flwr.config import PYPROJECT, pyproject_block, pyproject_with_block, resolve_config
from fedgraph_flwr.core.registry import BUILT_IN
from fedgraph_flwr.engine.loop import run_federation

NAME = "throwaway"
MODULE = "throwaway_method"
REPO = Path(__file__).resolve().parents[1]

METHOD_SOURCE = '''
"""throwaway: FedAvg whose client weights are (training nodes)^power."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedgraph_flwr.algorithms.base import Aggregator
from fedgraph_flwr.algorithms.fedavg import GCNTrainer
from fedgraph_flwr.core.mixing import average
from fedgraph_flwr.core.options import Options, option
from fedgraph_flwr.core.phases import AggregateResult
from fedgraph_flwr.core.registry import Algorithm


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


ALGORITHM = Algorithm("throwaway", ThrowawayTrainer, ThrowawayAggregator, ThrowawayOptions)
'''


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """The method's module in its own file, declared for one test (imported when asked for)."""
    (tmp_path / f"{MODULE}.py").write_text(METHOD_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    declare(NAME, MODULE)
    try:
        yield
    finally:
        unregister(NAME)
        sys.modules.pop(MODULE, None)


def test_the_registry_imports_it_when_it_is_first_asked_for(throwaway):
    assert NAME in ALGORITHMS and MODULE not in sys.modules
    algorithm = get_algorithm(NAME)
    assert sys.modules[MODULE].ALGORITHM is algorithm
    assert algorithm.options.defaults() == {"throwaway-power": 0.5}


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
    of them that a new method would have to join: the registry's ``BUILT_IN`` is the only
    one. Chosen subsets (golden's five, a test's per-method configs) stay below half."""
    methods = set(ALGORITHMS)
    lists = [f"{path.relative_to(REPO)}:{line} {sorted(found & methods)}"
             for folder in ("fedgraph_flwr", "tests", "benchmarks", "deploy")
             for path in sorted((REPO / folder).rglob("*.py"))
             for line, found in _string_collections(path)
             if len(found & methods) >= len(methods) / 2]
    assert lists == [f"fedgraph_flwr/core/registry.py:{_built_in_line()} {sorted(BUILT_IN)}"]


def _built_in_line() -> int:
    """The line of the registry's ``BUILT_IN`` tuple."""
    tree = ast.parse((REPO / "fedgraph_flwr/core/registry.py").read_text())
    return next(node.value.lineno for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "BUILT_IN" for t in node.targets))
