"""The speed-ups of fedgraph_flwr.engine.accelerate on the Flower we test with (the
guard that sets them aside on another is in tests/test_flower_surface.py).

fedgraph-superexec's fork server is checked without a SuperNode (tests/test_deploy.py
runs it for real: every ClientApp of that deployment is one of its forked children):
the part Flower does not do for us: the child gets the task's token and address, leaves
with run_clientapp's exit code, never runs the exit handlers it inherited from the
SuperExec parent, and the parent reaps it.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from flwr.supercore.constant import TaskType
from flwr.supercore.exit import exit_handler
from flwr.supercore.superexec.executor import ExecutionSpec

from fedgraph_flwr.engine import accelerate
from fedgraph_flwr.engine.accelerate import superexec as fse
from fedgraph_flwr.engine.accelerate import supernode as fps

from helpers import through_the_guard

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX-only")

@pytest.mark.skipif(os.environ.get("FEDGRAPH_FLWR_NIGHTLY") == "1",
                    reason="scripts/test-flwr-nightly.sh: an untested Flower on purpose")
def test_the_installed_flower_is_a_tested_one():
    """Otherwise the commands set the speed-ups aside (and the tests marked
    through_the_guard skip)."""
    assert accelerate.flower_is_tested(), accelerate.flower_version()


def _spec(token: str, task_type: TaskType = TaskType.CLIENT_APP) -> ExecutionSpec:
    return ExecutionSpec(task_type=task_type, runtime_api_address="127.0.0.1:9094",
                         token=token, insecure=True, root_certificates_path=None,
                         runtime_dependency_install=False, parent_pid=None,
                         suppress_output=False, task_id=7)


def _reap(executor: fse.ForkingClientAppExecutor, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while executor.children and time.time() < deadline:
        executor.reconcile()
        time.sleep(0.02)
    assert not executor.children, "forked ClientApp processes were not reaped"


def test_child_runs_the_task_with_its_token_and_exits_with_its_code(tmp_path, monkeypatch):
    parent_marker = tmp_path / "parent-handler-ran"

    def fake_run_clientapp(**kwargs):
        # What flwr_exit does at the end of a real run: trigger the registered handlers.
        exit_handler.trigger_exit_handlers(run_before_force_exit=False)
        (tmp_path / f"{kwargs['token']}.json").write_text(json.dumps(
            {**kwargs, "pid": os.getpid()}))
        raise SystemExit(int(kwargs["token"].split("-")[1]))

    monkeypatch.setattr(fse, "run_clientapp", fake_run_clientapp)
    # The SuperExec parent's own handler (it closes the parent's Runtime API client).
    exit_handler.add_exit_handler(lambda: parent_marker.write_text("ran"))
    try:
        executor = fse.ForkingClientAppExecutor()
        assert executor.launch(_spec("task-0")).status == "accepted"
        assert executor.launch(_spec("task-3")).status == "accepted"
        assert len(executor.children) == 2
        _reap(executor)
    finally:
        exit_handler.registered_exit_handlers.pop()

    for token in ("task-0", "task-3"):
        seen = json.loads((tmp_path / f"{token}.json").read_text())
        assert seen["token"] == token
        assert seen["runtime_api_address"] == "127.0.0.1:9094" and seen["insecure"] is True
        assert seen["pid"] != os.getpid()
    assert not parent_marker.exists(), "a forked ClientApp ran the SuperExec's exit handlers"


def test_child_exit_code_is_reported(tmp_path, monkeypatch, caplog):
    def failing(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(fse, "run_clientapp", failing)
    executor = fse.ForkingClientAppExecutor()
    executor.launch(_spec("task-x"))
    pid = next(iter(executor.children))
    logged = []
    monkeypatch.setattr(fse, "log", lambda level, msg, *args: logged.append(msg % args))
    _reap(executor)
    assert logged == [f"ClientApp process {pid} exited with code 1"]


def test_close_stops_children_at_once_even_under_a_swallowing_handler(monkeypatch):
    """SuperExec stopping (SIGTERM) stops its ClientApps: a child dies on SIGTERM, even
    though it inherited a handler that ignores it (as Flower's graceful handler could)."""
    import signal

    monkeypatch.setattr(fse, "run_clientapp", lambda **kwargs: time.sleep(60))
    before = signal.signal(signal.SIGTERM, lambda *args: None)  # what the child inherits
    try:
        executor = fse.ForkingClientAppExecutor()
        executor.launch(_spec("task-long"))
        (pid,) = executor.children
        time.sleep(0.5)  # the child is in its (fake) ClientApp
        t0 = time.perf_counter()
        executor.close()
        took = time.perf_counter() - t0
    finally:
        signal.signal(signal.SIGTERM, before)
    assert not executor.children
    assert not os.path.exists(f"/proc/{pid}")
    assert took < fse.CHILD_STOP_S, f"needed SIGKILL: {took:.2f}s"  # SIGTERM was enough


def test_child_keeps_flowers_exit_handlers_but_not_its_signal_handlers(tmp_path, monkeypatch):
    """In the child, run_clientapp's registration still adds its exit handler (it pushes
    the task's final status and context; without it the SuperNode waits until the task
    token expires: "ClientApp stopped responding"), but SIGTERM keeps its default action."""
    import signal

    from flwr.supernode.runtime import run_clientapp as runtime

    def fake_run_clientapp(**kwargs):
        runtime.register_signal_handlers(event_type=None, exit_message="Task stopped.",
                                         exit_handlers=[lambda: (tmp_path / "pushed").write_text("ok")])
        (tmp_path / "sigterm").write_text(str(signal.getsignal(signal.SIGTERM)))
        exit_handler.trigger_exit_handlers(run_before_force_exit=False)  # as flwr_exit does

    monkeypatch.setattr(fse, "run_clientapp", fake_run_clientapp)
    executor = fse.ForkingClientAppExecutor()
    executor.launch(_spec("task-exit"))
    _reap(executor)
    assert (tmp_path / "pushed").read_text() == "ok"
    assert (tmp_path / "sigterm").read_text() == str(signal.SIG_DFL)


@through_the_guard
def test_cli_refuses_another_executor_and_unknown_preloads(monkeypatch):
    monkeypatch.delenv(accelerate.OPT_IN_ENV, raising=False)  # the command sets it: restored
    with pytest.raises(SystemExit, match="brings its own executor"):
        accelerate.superexec_main(["--executor", "kubernetes",
                                   "--runtime-api-address", "127.0.0.1:9094"])
    with pytest.raises(SystemExit, match="cannot preload 'no_such_module_xyz'"):
        accelerate.superexec_main(["--preload", "no_such_module_xyz",
                                   "--runtime-api-address", "127.0.0.1:9094"])


# --- fedgraph-supernode: flower-supernode with its poll waits capped -------------------
def test_supernode_poll_cap_applies_to_the_loop_module_only(monkeypatch):
    import importlib
    import time as real_time

    from flwr.supercore.inflatable import inflatable_utils

    loop = importlib.import_module(fps.SUPERNODE_LOOP_MODULE)
    assert loop.time is real_time  # the Flower we pin: the seam exists
    monkeypatch.setattr(loop, "time", real_time)  # restored after the test
    defaults = inflatable_utils.pull_objects.__kwdefaults__
    monkeypatch.setitem(defaults, "initial_backoff", defaults["initial_backoff"])
    monkeypatch.setitem(defaults, "backoff_cap", defaults["backoff_cap"])

    fps.cap_supernode_polls(0.05)
    assert isinstance(loop.time, fps.CappedSleepTime)
    t0 = real_time.perf_counter()
    loop.time.sleep(3)  # the SuperNode's idle wait
    assert real_time.perf_counter() - t0 < 1.0
    assert loop.time.monotonic is real_time.monotonic  # everything else is time's
    assert (defaults["initial_backoff"], defaults["backoff_cap"]) == (0.05, 1.0)
    assert real_time.sleep is not loop.time.sleep  # nobody else's sleep changed


@through_the_guard
def test_supernode_declares_a_10s_heartbeat_so_a_crashed_one_is_let_back_in_20s(monkeypatch):
    """fedgraph-supernode declares the SuperLink's minimum heartbeat interval: the SuperLink
    then counts a SuperNode that died without signing off as online for 2 x 10 s, not
    2 x 30 s, and refuses its restarted self only that long."""
    import importlib
    import inspect

    from flwr.common.constant import HEARTBEAT_PATIENCE
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState
    from flwr.superlink.servicer.fleet.fleet_handlers import _validate_heartbeat_interval

    modules = [importlib.import_module(name) for name in fps.HEARTBEAT_MODULES]
    for module in modules:
        assert module.HEARTBEAT_DEFAULT_INTERVAL == 30  # Flower's, untouched until asked
        monkeypatch.setattr(module, "HEARTBEAT_DEFAULT_INTERVAL", 30)  # restored after
    fps.shorten_heartbeat()
    assert all(m.HEARTBEAT_DEFAULT_INTERVAL == fps.HEARTBEAT_INTERVAL == 10 for m in modules)
    _validate_heartbeat_interval(fps.HEARTBEAT_INTERVAL)  # the SuperLink accepts it
    # The SuperLink keeps an activated node online for PATIENCE x the interval it declared.
    for state in (InMemoryLinkState, SqlLinkState):
        assert "HEARTBEAT_PATIENCE * heartbeat_interval" in inspect.getsource(state.activate_node)
    assert HEARTBEAT_PATIENCE * fps.HEARTBEAT_INTERVAL == 20


def test_executor_exits_once_its_supernode_is_gone(monkeypatch):
    """With FEDGRAPH_EXIT_IF_SUPERNODE_GONE_S (compose sets it), a watcher thread gives up
    on a Runtime API address that has refused connections that long; not before."""
    import socket
    import threading

    assert fse.runtime_api_address(["--insecure", "--runtime-api-address", "127.0.0.1:9094"]) \
        == "127.0.0.1:9094"
    assert fse.runtime_api_address(["--runtime-api-address=[::1]:9"]) == "[::1]:9"
    assert fse.runtime_api_address(["--insecure"]) == ""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    lost = threading.Event()
    seconds: list[float] = []
    fse.watch_supernode(address, 0.5, lambda s: (seconds.append(s), lost.set()), period_s=0.1)
    assert not lost.wait(1.5)  # the SuperNode answers: nothing happens
    listener.close()  # the SuperNode dies
    t0 = time.monotonic()
    assert lost.wait(5.0)
    assert 0.3 < time.monotonic() - t0 < 3.0 and seconds[0] >= 0.5


def test_supernode_poll_interval_is_validated():
    with pytest.raises(SystemExit):
        accelerate.supernode_main(["--poll-interval", "0", "--insecure"])


@through_the_guard
def test_serverapp_retries_reply_objects_sooner(monkeypatch):
    """The ServerApp's grid pulls a reply's objects with inflatable_utils.pull_objects
    (the seam in the flwr we test with); speed_up_reply_pulls sets its first retry to
    20 ms, not 1 s (opted in, as under the fedgraph-* commands)."""
    from flwr.supercore.inflatable import inflatable_utils

    monkeypatch.setenv(accelerate.OPT_IN_ENV, "1")
    from flwr.superlink.grid import http_grid

    assert http_grid.pull_objects is inflatable_utils.pull_objects
    defaults = inflatable_utils.pull_objects.__kwdefaults__
    monkeypatch.setitem(defaults, "initial_backoff", defaults["initial_backoff"])
    monkeypatch.setitem(defaults, "backoff_cap", defaults["backoff_cap"])
    assert accelerate.speed_up_reply_pulls() is True
    assert (defaults["initial_backoff"], defaults["backoff_cap"]) == accelerate.REPLY_PULL_BACKOFF


def test_supernode_waits_on_its_own_state_briefly(monkeypatch):
    """Flower's 3 s idle wait polls the SuperLink: capped at the poll interval. Its 0.5 s
    waits check the SuperNode's own in-memory state for a ClientApp's reply: capped at
    LOCAL_WAIT."""
    slept: list[float] = []
    monkeypatch.setattr(fps.time, "sleep", slept.append)
    capped = fps.CappedSleepTime(0.2)
    capped.sleep(3)
    capped.sleep(0.5)
    capped.sleep(0.001)
    assert slept == [0.2, fps.LOCAL_WAIT, 0.001]


# --- what a forked ClientApp no longer repeats for every message ------------------------
def test_child_installs_each_fab_once(tmp_path, monkeypatch):
    """run_clientapp installs the run's FAB for every message; after the first install
    of the same bytes the child returns the installed folder without unzipping again,
    and installs again when that folder is gone or the FAB differs."""
    from pathlib import Path

    from flwr.cli.build import build_fab_from_disk
    from flwr.supernode.runtime import run_clientapp as runtime

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    real_install = runtime.install_from_fab
    installs: list[bytes] = []

    def counting_install(fab_file, install_dir=None, skip_prompt=False):
        installs.append(fab_file)
        return real_install(fab_file, install_dir=install_dir, skip_prompt=skip_prompt)

    monkeypatch.setattr(runtime, "install_from_fab", counting_install)  # restored after
    fab = build_fab_from_disk(Path(__file__).resolve().parents[1])
    fse._install_each_fab_once()

    first = runtime.install_from_fab(fab, skip_prompt=True)
    assert (first / "fedgraph_flwr" / "engine" / "client_app.py").is_file()
    assert runtime.install_from_fab(fab, skip_prompt=True) == first
    assert len(installs) == 1

    import shutil

    shutil.rmtree(first)
    assert runtime.install_from_fab(fab, skip_prompt=True) == first
    assert first.is_dir() and len(installs) == 2


@pytest.mark.slow
def test_fork_server_warm_up_compiles_message_passing_once(tmp_path):
    """After the preloaded modules' warm-up hooks (the fork server runs them before
    serving; fedgraph_flwr.nn's compiles PyG's templates), building the layers writes no
    new PyG template file."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import glob, tempfile, os
        from fedgraph_flwr.engine.accelerate import superexec as fse
        names = fse.warm_up(fse.preload(["fedgraph_flwr.nn"]))["fedgraph_flwr.nn"]
        pattern = os.path.join(tempfile.gettempdir(), "*_propagate_*.py")
        before = set(glob.glob(pattern))
        assert len(before) >= len(names), before  # PyG writes its templates here
        from torch_geometric.nn import GCNConv, SAGEConv, SGConv
        from fedgraph_flwr.nn.masked import MaskedGCNConv
        for layer in (GCNConv(5, 3), MaskedGCNConv(5, 3), SGConv(5, 3, K=2), SAGEConv(5, 3)):
            assert "_jinja_propagate" in type(layer).__dict__, type(layer).__name__
        assert set(glob.glob(pattern)) == before
        print(",".join(names))
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # only this process's template files
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "GCNConv,MaskedGCNConv,SGConv,SAGEConv"


@pytest.mark.slow
def test_child_reports_its_end_even_when_that_takes_longer_than_flowers_force_exit(tmp_path, monkeypatch):
    """Flower's flwr_exit kills the process 5 s after it starts the exit handlers; the one
    that reports the task's end sends the ClientApp's context, which took longer for a large
    in-memory state (the task then stayed RUNNING and its run got "ClientApp stopped
    responding" 60 s later). A forked ClientApp gives that handler its time."""
    from flwr.supercore.constant import FORCE_EXIT_TIMEOUT_SECONDS
    from flwr.supercore.exit import flwr_exit
    from flwr.supernode.runtime import run_clientapp as runtime

    def report_slowly() -> None:
        time.sleep(FORCE_EXIT_TIMEOUT_SECONDS + 1.5)
        (tmp_path / "reported").write_text("ok")

    def fake_run_clientapp(**kwargs):
        runtime.register_signal_handlers(event_type=None, exit_message="Task stopped.",
                                         exit_handlers=[report_slowly])
        flwr_exit(0, emit_telemetry=False)  # how run_clientapp ends

    monkeypatch.setattr(fse, "run_clientapp", fake_run_clientapp)
    executor = fse.ForkingClientAppExecutor()
    executor.launch(_spec("task-slow-end"))
    _reap(executor, timeout=30)
    assert (tmp_path / "reported").read_text() == "ok"
