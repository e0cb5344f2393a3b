"""The package uses Flower's public API only; Flower internals stay in the accelerators.

A Flower release may move or change any module outside ``flwr.app``, ``flwr.serverapp``,
``flwr.clientapp`` and ``flwr.simulation`` (the names in their ``__all__``). Only
``fedgraph_flwr/engine/accelerate/`` may import others, and it steps aside on a Flower
it was not tested with: the second half of this file checks that guard.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

from fedgraph_flwr.engine import accelerate

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ("flwr.app", "flwr.serverapp", "flwr.clientapp", "flwr.simulation")
ACCELERATOR = ROOT / "fedgraph_flwr" / "engine" / "accelerate"
FLWR_MODULE = re.compile(r"flwr(\.[A-Za-z_]\w*)*")
#: A string that names a Flower module (``import_module("flwr.x")``, a patch target).
FLWR_PATH = re.compile(r"flwr(\.[A-Za-z_]\w*)+")


def flower_uses(source: str) -> list[tuple[int, str, list[str]]]:
    """``(line, module, imported names)`` for each Flower module that ``source`` imports
    or names in a string (docstrings aside)."""
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            uses += [(node.lineno, a.name, []) for a in node.names if FLWR_MODULE.fullmatch(a.name)]
        elif (isinstance(node, ast.ImportFrom) and node.level == 0
              and FLWR_MODULE.fullmatch(node.module or "")):
            uses.append((node.lineno, node.module, [a.name for a in node.names]))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings and FLWR_PATH.fullmatch(node.value)):
            uses.append((node.lineno, node.value, []))
    return sorted(uses)


def violations(source: str) -> list[str]:
    found = []
    for line, module, names in flower_uses(source):
        if module not in PUBLIC:
            found.append(f"{line}: {module}")
            continue
        public = set(importlib.import_module(module).__all__)
        found += [f"{line}: {module}.{name} (not in __all__)" for name in names if name not in public]
    return found


def test_checker_sees_every_form_of_import():
    source = '''"""Docstring naming flwr.common.constant is fine."""
import flwr
import flwr.common
from flwr.supercore.inflatable import inflatable_utils
from flwr.app import (
    Array,
    NotPublic,
)
from flwr.serverapp.strategy import Strategy
import importlib
importlib.import_module("flwr.supernode.cli")
LOOP = "flwr.supernode.start_client_internal"
from flwr.clientapp import ClientApp
'''
    assert violations(source) == [
        "2: flwr", "3: flwr.common", "4: flwr.supercore.inflatable",
        "5: flwr.app.NotPublic (not in __all__)", "9: flwr.serverapp.strategy",
        "11: flwr.supernode.cli", "12: flwr.supernode.start_client_internal"]


def test_only_the_accelerators_use_flower_internals():
    files = sorted((ROOT / "fedgraph_flwr").rglob("*.py")) + [ROOT / "server_app.py",
                                                             ROOT / "client_app.py"]
    found = [f"{path.relative_to(ROOT)}:{v}" for path in files
             if ACCELERATOR not in path.parents
             for v in violations(path.read_text())]
    assert not found, ("Flower outside its public API (flwr.app, flwr.serverapp, flwr.clientapp, "
                       "flwr.simulation); move it into fedgraph_flwr/engine/accelerate/:\n"
                       + "\n".join(found))


# --- the guard ---------------------------------------------------------------------------
WARNING = ("fedgraph-flwr: Flower 9.99.0 is not one the speed-ups were tested with "
           "(1.41, 1.42); running stock Flower behaviour")


@pytest.fixture
def untested_flower(monkeypatch):
    monkeypatch.setattr(accelerate, "flower_version", lambda: "9.99.0")
    monkeypatch.setattr(accelerate, "_warned", False)


def test_untested_flower_keeps_its_object_pull_backoff(untested_flower, capsys):
    from flwr.supercore.inflatable import inflatable_utils

    before = dict(inflatable_utils.pull_objects.__kwdefaults__)
    assert accelerate.speed_up_reply_pulls() is False
    assert accelerate.speed_up_reply_pulls() is False  # warned once per process
    out = capsys.readouterr()
    assert out.out == "" and out.err.splitlines() == [WARNING]
    assert inflatable_utils.pull_objects.__kwdefaults__ == before


@pytest.mark.parametrize("main, argv, stock, rest", [
    (accelerate.supernode_main, ["--poll-interval", "0.1", "--insecure", "--superlink", "h:1"],
     "flower-supernode", ["--insecure", "--superlink", "h:1"]),
    (accelerate.superexec_main, ["--preload", "torch", "--insecure", "--executor", "x"],
     "flower-superexec", ["--insecure", "--executor", "x"]),
])
def test_untested_flower_runs_the_stock_command(untested_flower, monkeypatch, capsys,
                                                 main, argv, stock, rest):
    """Our own flags are dropped and Flower's console script runs with the rest."""
    def ran(command, args):
        raise SystemExit((command, list(args)))

    monkeypatch.setattr(accelerate, "run_stock", ran)
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == (stock, rest)
    assert capsys.readouterr().err.splitlines() == [WARNING]


@pytest.mark.parametrize("command", ["flower-supernode", "flower-superexec"])
def test_stock_commands_are_found_through_flowers_metadata(command, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:])  # run_stock sets it
    with pytest.raises(SystemExit) as done:
        accelerate.run_stock(command, ["--help"])
    assert done.value.code == 0 and command in capsys.readouterr().out
