"""The default path leaves Flower as it found it; Flower internals stay in the accelerators.

A Flower release may move or change anything outside its public API, and patching it
changes Flower for everything else in the process. So a default-path run (a Flower
simulation of our ServerApp and ClientApp, as ``flwr run .`` and a stock deployment run
them) must change no attribute of any loaded ``flwr`` module: checked at run time, by a
snapshot of every module's namespace, every class's dict, and every function's defaults
before and after the run. Only ``fedgraph_flwr/engine/accelerate/`` patches Flower, only
when a ``fedgraph-*`` command opted in (``FEDGRAPH_FLOWER_SPEEDUPS=1``), and it steps
aside on a Flower it was not tested with: the second half of this file checks that guard.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import types
import warnings
from pathlib import Path

import pytest

from fedgraph_flwr.engine import accelerate

import phase_demo
from helpers import simulate

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedgraph_flwr"


# --- a default-path run changes no Flower attribute --------------------------------------
def _defaults(function: types.FunctionType) -> tuple:
    kw = function.__kwdefaults__
    return function.__defaults__, (dict(kw) if kw is not None else None)


def _is_flower(name: str) -> bool:
    return name == "flwr" or name.startswith("flwr.")


def flower_state() -> dict[str, tuple[str, object]]:
    """Every attribute of every loaded ``flwr`` module: ``name -> ("is", value)``, and
    ``("eq", copy)`` for what can change in place: a function's ``__defaults__`` and
    ``__kwdefaults__``, a module-level dict, list or set. Classes defined in a flwr
    module add their own dicts (methods' defaults too); ``__slotnames__`` is skipped,
    Python's own cache that the first pickle of a class adds."""
    state: dict[str, tuple[str, object]] = {}
    for name, module in list(sys.modules.items()):
        if not _is_flower(name) or not isinstance(module, types.ModuleType):
            continue
        for attr, value in list(vars(module).items()):
            if attr == "__warningregistry__":
                # The warnings machinery's record of a warning issued in that module: whether
                # there is one depends on the filters earlier tests left, not on our code.
                continue
            key = f"{name}.{attr}"
            state[key] = ("is", value)
            if isinstance(value, types.FunctionType):
                state[key + ":defaults"] = ("eq", _defaults(value))
            elif isinstance(value, (dict, list, set)) and not attr.startswith("__"):
                state[key + ":items"] = ("eq", value.copy())
            elif isinstance(value, type) and getattr(value, "__module__", None) == name:
                for cattr, cvalue in list(vars(value).items()):
                    if cattr == "__slotnames__":
                        continue
                    state[f"{key}.{cattr}"] = ("is", cvalue)
                    function = getattr(cvalue, "__func__", cvalue)
                    if isinstance(function, types.FunctionType):
                        state[f"{key}.{cattr}:defaults"] = ("eq", _defaults(function))
    return state


def state_changes(before: dict, after: dict) -> dict[str, str]:
    """What differs between two :func:`flower_state` snapshots (modules loaded since
    ``before`` aside), as ``key -> "old -> new"``."""
    changes = {}
    for key, (how, old) in before.items():
        if key not in after:
            changes[key] = "removed"
            continue
        new = after[key][1]
        try:
            same = new is old if how == "is" else bool(new == old)
        except Exception:  # noqa: BLE001 - a value that cannot be compared has changed
            same = False
        if not same:
            changes[key] = f"{old!r:.120} -> {new!r:.120}"
    owners = {key.rsplit(".", 1)[0] for key in before}
    changes.update({key: "added" for key, (_, value) in after.items()
                    if key not in before and ":" not in key and key.rsplit(".", 1)[0] in owners
                    and not isinstance(value, types.ModuleType)})  # a submodule imported
    return changes


def loaded_flower_modules() -> set[str]:
    return {name for name in sys.modules if _is_flower(name)}


def stock_apps(num_supernodes: int):
    """A ServerApp and a ClientApp of Flower's public API only: one query to every node.
    What Flower itself changes in its modules during a run is what this run changes."""
    from flwr.app import Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    server, client = ServerApp(), ClientApp()

    @server.main()
    def main(grid, context):
        deadline = time.monotonic() + 60
        while len(list(grid.get_node_ids())) < num_supernodes and time.monotonic() < deadline:
            time.sleep(0.1)
        messages = [Message(RecordDict({"m": MetricRecord({"x": 1.0})}), node, "query")
                    for node in grid.get_node_ids()]
        replies = list(grid.send_and_receive(messages, timeout=60))
        assert len(replies) == num_supernodes and not any(r.has_error() for r in replies)

    @client.query()
    def query(message, context):
        return Message(RecordDict({"m": MetricRecord({"x": 2.0})}), reply_to=message)

    return server, client


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _ours(filename: str) -> bool:
    path = Path(filename).resolve()
    return PACKAGE in path.parents or path.parent == ROOT


@pytest.mark.simulation
@pytest.mark.slow
def test_a_default_path_run_changes_no_flower_attribute(tmp_path, synthetic_root, monkeypatch):
    """A simulation of our apps, without the ``fedgraph-*`` commands' opt-in, leaves
    every attribute of every loaded flwr module as it was, beyond what a run of stock
    Flower apps changes by itself (Flower's telemetry state, its task identity). A
    stock run first also loads every flwr module a simulation needs, so that nothing
    ours touches is loaded only during our run (where no "before" would exist).

    It also sees no deprecation from our side: no DeprecationWarning raised in our code,
    no "deprecated" record on Flower's logger (``run_simulation``'s own one is dropped at
    the call, fedgraph_flwr/engine/simulation.py)."""
    from fedgraph_flwr.engine.client_app import make_client_app
    from fedgraph_flwr.engine.server_app import make_server_app

    monkeypatch.delenv(accelerate.OPT_IN_ENV, raising=False)
    before = flower_state()
    simulate(*stock_apps(2), 2)
    flowers_own = set(state_changes(before, flower_state()))

    config = {"algorithm": "phase-demo", "dataset": "SBM", "num-clients": 2, "rounds": 2,
              "hidden": 8, "data-root": str(synthetic_root), "output-dir": str(tmp_path),
              "run-name": "surface", "verbose": False}
    modules = loaded_flower_modules()
    before = flower_state()
    records = _Records()
    logging.getLogger("flwr").addHandler(records)
    from ray import cloudpickle

    # phase-demo (every message kind: a precompute phase, two exchanges a round) is a test
    # fixture: registered here and, by a client mod, in Ray's workers (which cannot
    # import tests/, so it travels by value).
    cloudpickle.register_pickle_by_value(phase_demo)
    try:
        with phase_demo.registered(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecationWarning)
            simulate(make_server_app(config),
                     make_client_app(mods=[phase_demo.register_in_client_app]), 2)
    finally:
        cloudpickle.unregister_pickle_by_value(phase_demo)
        logging.getLogger("flwr").removeHandler(records)
    changes = {k: v for k, v in state_changes(before, flower_state()).items() if k not in flowers_own}
    assert (tmp_path / "surface" / "results.json").is_file()
    assert not changes, ("a default-path run changed Flower (patch it only behind the opt-in, "
                         "in fedgraph_flwr/engine/accelerate/):\n"
                         + "\n".join(f"{k}: {v}" for k, v in sorted(changes.items())))
    assert loaded_flower_modules() - modules == set(), "flwr modules first loaded by our run"
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if issubclass(w.category, DeprecationWarning) and _ours(w.filename)]
    assert not ours, ours
    deprecated = [r.getMessage() for r in records.records if "deprecat" in r.getMessage().lower()]
    assert not deprecated, deprecated


def test_the_snapshot_sees_a_patched_default():
    """The check above can fail: a changed keyword default, a replaced module attribute
    and a changed class attribute each show up (then are restored)."""
    from flwr.supercore.inflatable import inflatable_utils

    defaults = inflatable_utils.pull_objects.__kwdefaults__
    before = flower_state()
    saved = defaults["max_time"]
    defaults["max_time"] = 1.0
    try:
        changed = state_changes(before, flower_state())
    finally:
        defaults["max_time"] = saved
    assert "flwr.supercore.inflatable.inflatable_utils.pull_objects:defaults" in changed
    assert not state_changes(before, flower_state())

    import flwr.serverapp

    grid_cls = flwr.serverapp.Grid
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flwr.serverapp, "Grid", type("Grid", (), {}))
        mp.setattr(grid_cls, "get_nodes", lambda self: [])
        changed = state_changes(before, flower_state())
    assert "flwr.serverapp.Grid" in changed
    assert f"{grid_cls.__module__}.Grid.get_nodes" in changed
    assert not state_changes(before, flower_state())


def test_the_speed_ups_are_off_without_the_opt_in(monkeypatch, capsys):
    """Without the opt-in neither ServerApp speed-up touches Flower's pull defaults,
    and neither says anything."""
    from flwr.supercore.inflatable import inflatable_utils

    monkeypatch.delenv(accelerate.OPT_IN_ENV, raising=False)
    before = dict(inflatable_utils.pull_objects.__kwdefaults__)
    assert accelerate.speed_up_reply_pulls() is False
    assert accelerate.bound_reply_pulls(3.0) is False
    assert inflatable_utils.pull_objects.__kwdefaults__ == before
    assert capsys.readouterr().err == ""


# --- the guard ---------------------------------------------------------------------------
WARNING = ("fedgraph-flwr: Flower 9.99.0 is not one the speed-ups were tested with "
           "(1.41, 1.42); running stock Flower behaviour")


@pytest.fixture
def untested_flower(monkeypatch):
    """Opted in (restored after, also when the command under test sets it), on a
    Flower the speed-ups were not tested with."""
    monkeypatch.setenv(accelerate.OPT_IN_ENV, "1")
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
    assert os.environ[accelerate.OPT_IN_ENV] == "1"  # what it starts inherits the opt-in


@pytest.mark.parametrize("command", ["flower-supernode", "flower-superexec"])
def test_stock_commands_are_found_through_flowers_metadata(command, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:])  # run_stock sets it
    with pytest.raises(SystemExit) as done:
        accelerate.run_stock(command, ["--help"])
    assert done.value.code == 0 and command in capsys.readouterr().out


def test_only_run_simulations_own_deprecation_record_is_dropped():
    """fedgraph_flwr/engine/simulation.py drops Flower's record for ``run_simulation``
    (formatted as Flower 1.42 and 1.43 log it), and no other."""
    from fedgraph_flwr.engine.simulation import _DropRunSimulationDeprecation

    def record(msg, *args):
        return logging.LogRecord("flwr", logging.WARNING, __file__, 1, msg, args, None)

    drop = _DropRunSimulationDeprecation()
    assert not drop.filter(record("DEPRECATED FEATURE: %s\n\n  This is a deprecated feature.",
                                  "The `run_simulation` function is deprecated and will be "
                                  "removed in a future version of Flower."))
    assert drop.filter(record("DEPRECATED FEATURE: %s", "Passing `enable_tf_gpu_growth=True`"))
    assert drop.filter(record("Starting Flower ServerApp"))
