"""The package's layering, read from the source with ``ast``, and what importing it loads.

The graph (nothing is imported to build it): every ``import`` and ``from ... import``
counts, at module level, inside functions (a lazy import is still a dependency) and under
``if TYPE_CHECKING:`` (a type-only import is still an arrow between modules); relative
ones are resolved against the module's package. ``from pkg import name`` counts as
importing ``pkg.name`` where that is a module, else ``pkg``. Importing ``a.b.c`` also runs
``a/b/__init__`` (and ``a/__init__``): those parent packages are arrows too, except a
module's own (they have run before it, whatever it imports).

Held here:

- no import cycle anywhere in ``fedgraph_flwr``;
- no upward arrow: each module imports only its own layer or those below (:data:`LAYERS`;
  the engine's arrows up to the report and plots are :data:`KNOWN_UPWARD`, to go);
- ``core`` is the bottom: it imports nothing of ours;
- no engine module reaches a method (``fedgraph_flwr.algorithms``) or a model
  (``fedgraph_flwr.nn``), directly or through others: the registry imports a method by
  name when it is asked for (``core/registry.py``), and the fork server reaches the models'
  warm-up through a hook found by name (``engine.accelerate.superexec.WARM_UP_HOOK``);
- the server side of the engine never reaches a client module, nor the client side a
  server module: what both need lives in ``engine/contract.py`` (or the codecs, :data:`SHARED`);
- and, in a fresh interpreter: importing ``engine.transport`` loads neither torch nor PyG,
  importing every engine module loads no method, no model and no PyG, and asking the
  registry for one method imports that method and what its own module imports, no other.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "fedgraph_flwr"
REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / PACKAGE
ENGINE = f"{PACKAGE}.engine"

#: The layers, bottom first: a module may import modules of its own layer and of those
#: below, nothing above. An entry names a module and every module under it; the most
#: specific entry places a module (``data.partition`` is above ``data``).
LAYERS: tuple[tuple[str, ...], ...] = (
    # the contract between the engine and the methods, and helpers importing nothing of ours
    ("core", "pyg_warnings", "generated", "atomic", "metrics"),
    # datasets, subgraph files, splits: read without the run configuration
    ("data",),
    # the typed run configuration, and the privacy rules it checks against
    ("config", "privacy"),
    # what reads the configuration: models, partitioner, secure aggregation
    ("nn", "data.partition", "secure_aggregation", "threshold_ckks"),
    # the methods and the engine (neither imports the other: see the tests below)
    ("algorithms", "engine"),
    # research tooling and commands
    ("summary", "plots", "report", "similarity", "experiments", "docs_tables", "partition",
     "preflight", "run"),
)

#: Upward arrows that exist and are to go (the engine's report and plots, to be reached
#: through a callback): the test fails if one is added, and when one is gone (delete it here).
KNOWN_UPWARD = {
    f"{ENGINE}.driver -> {PACKAGE}.summary",
    f"{ENGINE}.loop -> {PACKAGE}.report",
    f"{ENGINE}.recorder -> {PACKAGE}.plots",
    f"{ENGINE}.server_app -> {PACKAGE}.report",
}

#: The server's side: a ServerApp process never needs the client's code.
SERVER = {f"{ENGINE}.{m}" for m in (
    "driver", "federation", "flower_transport", "server_app", "roster", "recorder", "ckks_mixing",
    "run_recorder", "replies", "ledger", "checkpoint", "protocols", "transport",
    "privacy_budget", "robust", "trackers")}
#: The client's side: a ClientApp process never needs the server's code (nor does the
#: data owner's check of its link to the SuperLink, fleet_check).
CLIENT = {f"{ENGINE}.{m}" for m in ("client_app", "client_runtime", "fleet_check")}
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
    """The modules of ``modules`` that module ``name`` imports anywhere in its source, with
    the parent packages each import runs (but ``name``'s own)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
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
    own_parents = set(_parents(name))
    resolved = set()
    for target in found:
        # ``import a.b.c`` names a.b.c; keep the longest prefix that is one of ours
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target:
            resolved.add(target)  # an own parent too, when named: its __init__'s names
            resolved.update(p for p in _parents(target) if p in modules and p not in own_parents)
    return resolved - {name}


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


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


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int | None:
    """The index in ``layers`` of the most specific entry that names ``module`` or a
    package above it; None for the namespace package itself."""
    best: tuple[int, int] | None = None  # (entry length, layer)
    for i, entries in enumerate(layers):
        for entry in entries:
            full = f"{PACKAGE}.{entry}"
            if (module == full or module.startswith(full + ".")) and (
                    best is None or len(full) > best[0]):
                best = (len(full), i)
    return None if best is None else best[1]


def upward_arrows(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS
                  ) -> set[str]:
    """Every ``a -> b`` where ``b``'s layer is above ``a``'s."""
    out = set()
    for module, targets in graph.items():
        here = layer_of(module, layers)
        for target in targets:
            there = layer_of(target, layers)
            if here is not None and there is not None and there > here:
                out.add(f"{module} -> {target}")
    return out


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


def under(graph: dict[str, set[str]], *packages: str) -> set[str]:
    """The modules of ``graph`` that are one of ``packages`` (dotted, below ``PACKAGE``) or in one."""
    names = [f"{PACKAGE}.{p}" for p in packages]
    return {m for m in graph if any(m == n or m.startswith(n + ".") for n in names)}


def engine_reaches_methods_or_models(graph: dict[str, set[str]]) -> list[str]:
    """Each import chain from an engine module to a method's or a model's module."""
    return side_violations(graph, under(graph, "engine"), under(graph, "algorithms", "nn"))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


@pytest.mark.smoke
def test_no_import_cycle(graph):
    assert cycles(graph) == []


def test_every_module_has_a_layer(graph):
    assert sorted(m for m in graph if m != PACKAGE and layer_of(m) is None) == []


@pytest.mark.smoke
def test_no_upward_arrow(graph):
    assert upward_arrows(graph) == KNOWN_UPWARD


@pytest.mark.smoke
def test_core_imports_nothing_of_ours_but_core(graph):
    core = under(graph, "core")
    assert sorted(f"{m} -> {t}" for m in core for t in graph[m] if t not in core) == []


@pytest.mark.smoke
def test_no_engine_module_reaches_a_method_or_a_model(graph):
    assert engine_reaches_methods_or_models(graph) == []


def test_no_method_imports_the_engine(graph):
    assert side_violations(graph, under(graph, "algorithms"), under(graph, "engine")) == []


@pytest.mark.smoke
def test_server_side_never_reaches_a_client_module(graph):
    assert side_violations(graph, SERVER, CLIENT) == []


@pytest.mark.smoke
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
    relative import, one through a type-only import, one through a parent package's
    ``__init__``, an upward arrow, a server module reaching a client one through a third,
    and an engine module reaching the models through a package it imports."""
    pkg = tmp_path / PACKAGE
    files = {
        "report.py": "def f():\n    from .engine.recorder import Recorder\n",
        "nn/__init__.py": "",
        "nn/masked.py": "",
        "engine/__init__.py": "",
        "engine/recorder.py": "from .. import report\n",
        "engine/federation.py": "from . import contract\n",
        "engine/contract.py": "import fedgraph_flwr.engine.client_runtime as rt\n",
        "engine/client_runtime.py": "",
        "engine/superexec.py": "def warm():\n    from ..models import net\n",
        # importing models.net runs models/__init__, which imports nn.masked
        "models/__init__.py": "from ..nn import masked\n",
        "models/net.py": "",
        # a type-only import back is a cycle (config -> engine.roster -> config)
        "config.py": "from .engine import roster\n",
        "engine/roster.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from ..config import RunConfig\n"),
        # core imports data (its own parent package is no arrow: it has run before it)
        "core/__init__.py": "",
        "core/phases.py": "from . import bases\nfrom ..data import files\n",
        "core/bases.py": "",
        "data/__init__.py": "",
        "data/files.py": "",
        # a package whose __init__ imports a module that imports a name of the package
        "privacy/__init__.py": "from .scope import X\nY = 1\n",
        "privacy/scope.py": "from . import Y\nfrom ..privacy import mechanism\n",
        "privacy/mechanism.py": "",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    fake = import_graph(pkg)
    assert cycles(fake) == [
        [f"{PACKAGE}.config", f"{ENGINE}.roster"],
        [f"{ENGINE}.recorder", f"{PACKAGE}.report"],
        [f"{PACKAGE}.privacy", f"{PACKAGE}.privacy.scope"],
    ]
    assert fake[f"{PACKAGE}.core.phases"] == {f"{PACKAGE}.core.bases", f"{PACKAGE}.data",
                                              f"{PACKAGE}.data.files"}
    layers = (("core",), ("data",), ("engine",))
    assert upward_arrows({m: t for m, t in fake.items() if m.startswith(f"{PACKAGE}.core")},
                         layers) == {f"{PACKAGE}.core.phases -> {PACKAGE}.data",
                                     f"{PACKAGE}.core.phases -> {PACKAGE}.data.files"}
    assert engine_reaches_methods_or_models(fake) == [
        f"{ENGINE}.superexec -> {PACKAGE}.models -> {PACKAGE}.nn",
        f"{ENGINE}.superexec -> {PACKAGE}.models -> {PACKAGE}.nn.masked"]
    assert side_violations(fake, {f"{ENGINE}.federation"}, CLIENT) == [
        f"{ENGINE}.federation -> {ENGINE}.contract -> {ENGINE}.client_runtime"]


#: Run in a fresh interpreter: what each import loads, as JSON.
LOADS = r"""
import importlib, json, sys
import fedgraph_flwr.engine.transport
ours = lambda: sorted(m for m in sys.modules if m.startswith("fedgraph_flwr"))
out = {"transport": ours(), "transport_torch": "torch" in sys.modules,
       "transport_pyg": "torch_geometric" in sys.modules}
for name in sys.argv[1:]:
    importlib.import_module(name)
out["engine"] = ours()
out["engine_pyg"] = sorted(m for m in sys.modules if m.split(".")[0] == "torch_geometric")
from fedgraph_flwr.core.registry import get_algorithm
get_algorithm("fedprox")
out["after_fedprox"] = ours()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def loads(graph) -> dict:
    engine = sorted(under(graph, "engine"))
    out = subprocess.run([sys.executable, "-c", LOADS, *engine], capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.smoke
def test_importing_the_transport_loads_no_torch_and_no_pyg(loads):
    assert not loads["transport_torch"] and not loads["transport_pyg"]
    assert not [m for m in loads["transport"] if m.startswith(f"{PACKAGE}.algorithms")]


def test_importing_the_engine_loads_no_method_no_model_and_no_pyg(loads):
    assert [m for m in loads["engine"] if m.startswith((f"{PACKAGE}.algorithms",
                                                        f"{PACKAGE}.nn"))] == []
    assert loads["engine_pyg"] == []


def test_the_registry_imports_a_method_when_it_is_asked_for(loads, graph):
    """fedprox, asked for, is imported with what its module imports (FedAvg's trainer),
    and no other method."""
    fedprox = f"{PACKAGE}.algorithms.fedprox"
    expected = {fedprox} | (set(reachable(graph, fedprox)) & under(graph, "algorithms"))
    assert f"{PACKAGE}.algorithms.fedavg" in expected  # so the test says something
    assert {m for m in loads["after_fedprox"] if m.startswith(f"{PACKAGE}.algorithms.")} \
        == expected - {f"{PACKAGE}.algorithms"}


@pytest.mark.slow
def test_importing_our_packages_prints_no_pyg_warning_a_user_cannot_act_on():
    """PyG's import calls torch.jit.script, which torch >= 2.10 warns about: every package
    of ours that imports PyG silences that one warning first (fedgraph_flwr/pyg_warnings.py).
    Bare PyG still warns here (so this test can fail), ours does not, with every warning shown."""
    def warned(code: str) -> bool:
        out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True,
                             text=True, timeout=300, cwd=REPO)
        assert out.returncode == 0, out.stderr[-2000:]
        return "torch.jit.script` is deprecated" in out.stderr

    import torch

    if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 10):
        assert warned("import torch_geometric.nn")
    for module in ("fedgraph_flwr.engine.client_app", "fedgraph_flwr.engine.server_app",
                   "fedgraph_flwr.data.datasets", "fedgraph_flwr.nn.masked",
                   "fedgraph_flwr.experiments"):
        assert not warned(f"import {module}"), module
