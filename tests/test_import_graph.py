"""The package's import graph, read from the source with ``ast`` (nothing is imported).

Every ``import`` and ``from ... import`` counts, at module level and inside functions
(a lazy import is still a dependency), relative ones resolved against the module's
package; only those under ``if TYPE_CHECKING:`` do not (they never run). ``from pkg
import name`` counts as importing ``pkg.name`` where that is a module, else ``pkg``.
Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``; those implicit
parent-package imports are not edges, or every package that imports its own submodules
(``algorithms/__init__``) would be a cycle with each of them.

Held here:

- no import cycle anywhere in ``fedgraph_flwr``;
- no engine module imports ``fedgraph_flwr.nn`` (models belong to the algorithms; the
  fork server reaches their warm-up through a hook found by name,
  ``engine.accelerate.superexec.WARM_UP_HOOK``);
- the server side of the engine never reaches a client module, directly or through
  other modules, nor the client side a server module: what both need lives in
  ``engine/contract.py`` (or the codecs, :data:`SHARED`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "fedgraph_flwr"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
ENGINE = f"{PACKAGE}.engine"

#: The server's side: a ServerApp process never needs the client's code.
SERVER = {f"{ENGINE}.{m}" for m in (
    "driver", "federation", "flower_transport", "server_app", "roster", "recorder", "ckks_mixing",
    "run_recorder", "replies", "ledger", "checkpoint", "protocols", "transport",
    "privacy_budget", "robust")}
#: The client's side: a ClientApp process never needs the server's code.
CLIENT = {f"{ENGINE}.{m}" for m in ("client_app", "client_runtime")}
#: Used by both sides, so they may import neither: the names both agree on (contract),
#: the Flower-record and state codecs, and the Flower speed-ups (accelerate: the
#: ServerApp's reply pulls, the SuperNode's and SuperExec's commands).
SHARED = {f"{ENGINE}.{m}" for m in (
    "contract", "records", "framing", "state_codec", "accelerate", "accelerate.exits",
    "accelerate.superexec", "accelerate.supernode")}
#: The in-process Flower simulation of a ServerApp and a ClientApp object (experiments,
#: tests): it imports neither side's modules, only Flower's.
LAUNCHERS = {f"{ENGINE}.simulation"}
#: The in-process transport runs the server and every client in one process, by design
#: (experiments, fast tests, Flower's overhead measured against it): it may import both.
BOTH_SIDES = {f"{ENGINE}.loop"}


def module_files(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``) under ``root``."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def imports_of(name: str, path: Path, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports anywhere in its source."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else source)
    # ``import a.b.c`` names a.b.c; keep the longest prefix that is one of ours
    resolved = set()
    for target in found:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``: an import only a type
    checker reads is never run (the typed config's annotations in the algorithms)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def import_graph(root: Path) -> dict[str, set[str]]:
    files = module_files(root)
    names = set(files)
    return {name: imports_of(name, path, is_package, names)
            for name, (path, is_package) in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` imports, directly or not -> the module that imports it."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in graph[v]:
            if w not in via and w != start:
                via[w] = v
                todo.append(w)
    return via


def path_to(via: dict[str, str], start: str, target: str) -> str:
    chain = [target]
    while chain[-1] != start:
        chain.append(via[chain[-1]])
    return " -> ".join(reversed(chain))


def side_violations(graph: dict[str, set[str]], sources: set[str], forbidden: set[str]
                    ) -> list[str]:
    """Each import chain from a module of ``sources`` to one of ``forbidden``."""
    out = []
    for source in sorted(sources):
        via = reachable(graph, source)
        out += [path_to(via, source, target) for target in sorted(forbidden & set(via))]
    return out


def nn_imports(graph: dict[str, set[str]]) -> list[str]:
    nn = f"{PACKAGE}.nn"
    return sorted(f"{m} -> {t}" for m, targets in graph.items()
                  if m == ENGINE or m.startswith(ENGINE + ".")
                  for t in targets if t == nn or t.startswith(nn + "."))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def test_no_import_cycle(graph):
    assert cycles(graph) == []


def test_no_engine_module_imports_the_models(graph):
    assert nn_imports(graph) == []


def test_server_side_never_reaches_a_client_module(graph):
    assert side_violations(graph, SERVER, CLIENT) == []


def test_client_side_never_reaches_a_server_module(graph):
    assert side_violations(graph, CLIENT, SERVER) == []


def test_shared_modules_import_neither_side(graph):
    assert side_violations(graph, SHARED | LAUNCHERS, SERVER | CLIENT) == []


def test_every_engine_module_has_a_side(graph):
    """A new engine module must be placed, or the checks above would not see it."""
    engine = {m for m in graph if m.startswith(ENGINE + ".")}
    assert engine == SERVER | CLIENT | SHARED | BOTH_SIDES | LAUNCHERS


def test_the_reader_sees_what_it_must(tmp_path):
    """The checks can fail: a made-up package with a cycle through a function-level
    relative import, a server module reaching a client one through a third, and an
    engine module importing the models."""
    pkg = tmp_path / PACKAGE
    files = {
        "__init__.py": "",
        "report.py": "def f():\n    from .engine.recorder import Recorder\n",
        "nn/__init__.py": "",
        "nn/masked.py": "",
        "engine/__init__.py": "",
        "engine/recorder.py": "from .. import report\n",
        "engine/federation.py": "from . import contract\n",
        "engine/contract.py": "import fedgraph_flwr.engine.client_runtime as rt\n",
        "engine/client_runtime.py": "",
        "engine/superexec.py": "def warm():\n    from ..nn.masked import MaskedGCNConv\n",
        # a type-only import back is no cycle (it never runs)
        "config.py": "from .engine import contract\n",
        "engine/roster.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from ..config import RunConfig\nelse:\n    from .. import report\n"),
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    fake = import_graph(pkg)
    assert cycles(fake) == [[f"{PACKAGE}.engine.recorder", f"{PACKAGE}.report"]]
    assert fake[f"{ENGINE}.roster"] == {f"{PACKAGE}.report"}  # the else branch runs
    assert nn_imports(fake) == [f"{ENGINE}.superexec -> {PACKAGE}.nn.masked"]
    assert side_violations(fake, {f"{ENGINE}.federation"}, CLIENT) == [
        f"{ENGINE}.federation -> {ENGINE}.contract -> {ENGINE}.client_runtime"]


@pytest.mark.slow
def test_importing_our_packages_prints_no_pyg_warning_a_user_cannot_act_on():
    """PyG's import calls torch.jit.script, which torch >= 2.10 warns about: every package
    of ours that imports PyG silences that one warning first (fedgraph_flwr/pyg_warnings.py).
    Bare PyG still warns here (so this test can fail), ours does not, with every warning shown."""
    import subprocess
    import sys

    def warned(code: str) -> bool:
        out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True,
                             text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
        assert out.returncode == 0, out.stderr[-2000:]
        return "torch.jit.script` is deprecated" in out.stderr

    import torch

    if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 10):
        assert warned("import torch_geometric.nn")
    for module in ("fedgraph_flwr.engine.client_app", "fedgraph_flwr.engine.server_app",
                   "fedgraph_flwr.data.datasets", "fedgraph_flwr.nn.masked",
                   "fedgraph_flwr.experiments"):
        assert not warned(f"import {module}"), module
