"""``fedgraph-superexec``: Flower's SuperExec with a pre-imported fork server for ClientApps.

Reached through :func:`fedgraph_flwr.engine.accelerate.superexec_main`, which runs stock
``flower-superexec`` instead on a Flower this was not tested with, or off Linux.

Flower's SuperExec (1.41 and 1.42) runs every message's ClientApp as a fresh
``flwr-clientapp`` process (``SubprocessExecutor``). That process imports torch, PyG and
this package before it trains for milliseconds on a small subgraph, so a deployed round costs
seconds of imports per client. This command is ``flower-superexec`` (same flags,
same poll loop, same Runtime API protocol) whose executor imports those modules
once and then ``fork()``s one child per ClientApp task. The child runs Flower's own
``run_clientapp`` with the task's token, exactly as ``flwr-clientapp`` would: a
process per message still, each with its own memory, so a crash or leak in one
ClientApp cannot touch the next; only the import cost is shared (copy-on-write).

Other task types (ServerApp, simulation) are launched as Flower does, by
subprocess. Forking after importing torch is safe on Linux, not on macOS (whose system
frameworks are not fork-safe) or Windows.

Fork safety: the parent only imports and runs the preloaded modules' warm-up hooks
(:data:`WARM_UP_HOOK`: ``fedgraph_flwr.nn`` builds four 1x1 PyG layers to compile their
templates; single-number parameter init, no parallel torch op, CUDA never initialised,
so the thread pools and the GPU context are created in each child). The child drops
the exit handlers it inherited (they close the parent's Runtime API connection) and
re-creates the telemetry lock a parent thread might have held at fork time.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import os
import pkgutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

from flwr.supercore import log
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult
from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.supernode.runtime.run_clientapp import run_clientapp

from .exits import CHILD_STOP_S, SIGNALS, exit_promptly


class ForkingClientAppExecutor(SubprocessExecutor):
    """A SuperExec executor that forks a pre-imported parent for each ClientApp task.

    ``launch(spec)`` for ``TaskType.CLIENT_APP``: fork; the child calls
    ``flwr.supernode.runtime.run_clientapp.run_clientapp`` with the spec's address,
    token and TLS root certificate and ends with its exit code. Every other task type
    goes to :class:`SubprocessExecutor`. ``reconcile()`` (called by SuperExec's loop
    between polls) reaps finished children; ``close()`` (SuperExec stopping, e.g. on
    SIGTERM) stops the children still running: SIGTERM, SIGKILL after
    ``exits.CHILD_STOP_S``. A child also dies with this process if it is SIGKILLed
    (``PR_SET_PDEATHSIG``).
    """

    def __init__(self) -> None:
        self.children: set[int] = set()

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Fork a child that runs the ClientApp of ``spec``."""
        if spec.task_type != TaskType.CLIENT_APP:
            return super().launch(spec)
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError as err:
            return LaunchResult.failed(f"fork() failed: {err}")
        if pid == 0:  # child: never returns
            _run_clientapp_in_child(spec, parent)
        self.children.add(pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap the children that have exited."""
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                self.children.discard(pid)
                continue
            if done:
                self.children.discard(pid)
                code = os.waitstatus_to_exitcode(status)
                if code != 0:
                    log(ERROR, "ClientApp process %d exited with code %d", pid, code)

    def close(self) -> None:
        """Stop the ClientApp children still running (they would not outlive us)."""
        self.reconcile()
        if not self.children:
            return
        log(INFO, "fedgraph-superexec: stopping %d ClientApp process(es): %s", len(self.children),
            " ".join(map(str, sorted(self.children))))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in list(self.children):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    self.children.discard(pid)
            end = time.monotonic() + CHILD_STOP_S
            while self.children and time.monotonic() < end:
                for pid in list(self.children):
                    try:
                        done, _ = os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        done = pid
                    if done:
                        self.children.discard(pid)
                time.sleep(0.01)
            if not self.children:
                return


def _run_clientapp_in_child(spec: ExecutionSpec, parent: int) -> None:
    code = 1
    try:
        _die_on_signals(parent)
        _reset_inherited_state()
        _poll_local_objects_faster()
        _wait_for_the_message()
        _time_to_report_the_end()
        _install_each_fab_once()
        if spec.suppress_output:  # as SubprocessExecutor's stdout/stderr=DEVNULL
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        run_clientapp(
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=validate_and_resolve_root_certificates(
                spec.root_certificates_path, spec.insecure),
            parent_pid=spec.parent_pid,
            runtime_dependency_install=spec.runtime_dependency_install,
        )
        code = 0
    except SystemExit as done:  # run_clientapp ends with flwr_exit -> sys.exit
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException as err:  # noqa: BLE001 -- report, then leave the child
        log(ERROR, "ClientApp process failed before Flower could report it: %r", err)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never run the parent's atexit hooks or finally blocks


def _die_on_signals(parent: int) -> None:
    """SIGTERM/SIGINT/SIGQUIT end this child at once, and so does its parent's death.

    The child inherited the parent's Flower handlers, and ``run_clientapp`` installs
    Flower's graceful-exit handlers again: those wait for telemetry (whose thread did
    not survive the fork) and raise ``SystemExit`` wherever the child is, which
    Flower's retry loops can swallow; a child was seen ignoring SIGTERM. A ClientApp
    has nothing to save on the way out (its reply is what the SuperNode waits for)."""
    from flwr.supercore.exit import add_exit_handler
    from flwr.supernode.runtime import run_clientapp as runtime

    def exit_handlers_only(*args, exit_handlers=None, **kwargs) -> None:
        # What Flower's does minus the signal handlers: its exit handlers (the one that
        # pushes the task's final status and context to the SuperNode) still run when
        # run_clientapp ends through flwr_exit.
        for handler in exit_handlers or []:
            add_exit_handler(handler)

    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    runtime.register_signal_handlers = exit_handlers_only
    try:  # Linux: SIGKILL this child when the process that forked it dies
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before prctl: nobody waits for this reply
        os._exit(1)


#: prctl option: the signal this process gets when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def _reset_inherited_state() -> None:
    """Forget what belongs to the SuperExec parent (see the module docstring)."""
    from flwr.supercore import telemetry
    from flwr.supercore.exit import exit_handler

    exit_handler.registered_exit_handlers.clear()
    exit_handler._lock_handlers = threading.Lock()  # noqa: SLF001
    telemetry.state_lock = threading.Lock()


#: First retry delay and cap (s) when the ClientApp asks its SuperNode for a message
#: object the SuperNode is still fetching from the SuperLink (Flower: 1 s and 10 s).
CHILD_PULL_BACKOFF = (0.02, 0.5)


def _poll_local_objects_faster() -> None:
    """Flower creates the ClientApp task before the SuperNode has pulled the message's
    objects from the SuperLink. A ``flwr-clientapp`` that took seconds to import never
    noticed; a forked one asks within milliseconds, is told "unavailable" and would then
    sleep Flower's 1 s initial backoff. The objects come from the SuperNode on the same
    host, so this child retries sooner (only this per-message process is affected)."""
    from flwr.supercore.inflatable import inflatable_utils

    defaults = inflatable_utils.pull_and_inflate_object_from_tree.__kwdefaults__
    assert defaults is not None  # keyword-only parameters with defaults
    defaults["initial_backoff"], defaults["backoff_cap"] = CHILD_PULL_BACKOFF


#: Longest time (s) a forked ClientApp waits for its SuperNode to store the message its
#: task was created for: Flower's window for a claimed task to start (30 s).
MESSAGE_WAIT_S = 30.0
#: First and longest pause (s) between the child's checks for that message.
MESSAGE_POLL = (0.005, 0.2)


def _wait_for_the_message() -> None:
    """Flower's SuperNode creates a message's ClientApp task, and only then stores the
    message (``start_client_internal._pull_and_store_message``). A forked ClientApp asks
    for it within milliseconds of the task's creation; on a loaded host it can ask
    before the message is there, and Flower's ``pull_task_input`` then fails with "No
    messages received from Runtime API". That task ends FAILED, nobody ever takes the
    message, and the SuperNode, which waits for a reply to each message before it
    pulls the next, hangs for every later round and run (seen as one organisation
    "missing" in every round). A ``flwr-clientapp`` never asks that early: it spends
    seconds importing first. This child asks again, with short pauses, for up to
    ``MESSAGE_WAIT_S`` (only this per-message process is affected)."""
    from flwr.supernode.runtime import run_clientapp as runtime

    pull_task_input = runtime.pull_task_input

    def pull_task_input_waiting(client):
        pull_messages = client.PullMessages

        def pull_messages_waiting(request):
            pause, longest = MESSAGE_POLL
            deadline = time.monotonic() + MESSAGE_WAIT_S
            while not (response := pull_messages(request)).messages_list:
                if time.monotonic() >= deadline:
                    break
                time.sleep(pause)
                pause = min(2 * pause, longest)
            return response

        client.PullMessages = pull_messages_waiting
        try:
            return pull_task_input(client)
        finally:
            del client.PullMessages  # the class's method again

    runtime.pull_task_input = pull_task_input_waiting


#: Seconds a forked ClientApp has, once it has replied, to report its task's end (status
#: and context) to its SuperNode before Flower's force exit (Flower: 5 s).
CHILD_EXIT_TIMEOUT_S = 120.0


def _time_to_report_the_end() -> None:
    """Flower's ``flwr_exit`` kills the process ``FORCE_EXIT_TIMEOUT_SECONDS`` (5 s) after
    it starts the exit handlers, and the handler that tells the SuperNode the task ended
    also sends the ClientApp's whole context: with ``client-state="context"`` that is the
    client's state (177 MiB for FedSage+ while it trains its generator: the generator and
    two Adam optimizers). Serializing and sending it took more than 5 s on a loaded
    host, so the process died first: the reply had been delivered, but the task stayed
    RUNNING, and when its heartbeat lapsed 60 s later Flower's SuperNode answered every
    message of that run then in flight with "ClientApp stopped responding" (error 8),
    and the state update was lost. Stock ``flwr-clientapp`` has the same limit (use
    ``client-state="file"`` for large states there). This child has nothing else to do
    after its reply, so it waits up to ``CHILD_EXIT_TIMEOUT_S``; its heartbeat keeps
    the task alive meanwhile."""
    exit_module: Any = importlib.import_module("flwr.supercore.exit.exit")  # Any: we set its constant
    exit_module.FORCE_EXIT_TIMEOUT_SECONDS = CHILD_EXIT_TIMEOUT_S


#: Under ``$FLWR_HOME/apps``: one file per FAB this host has installed, named by the
#: FAB's full SHA-256 and holding the installed app's path.
INSTALLED_FABS_DIR = ".fedgraph-installed-fabs"


def _install_each_fab_once() -> None:
    """Flower's ``run_clientapp`` unzips the run's FAB into a temporary folder and checks
    every file's hash for each message, then finds the app already installed and
    discards the copy: a third of a forked ClientApp's CPU on a small graph. This child
    skips that when a ClientApp on this host has already installed the same FAB bytes
    (same full SHA-256) and its folder is still there; otherwise Flower installs it as
    always and the install is recorded. Stock Flower already trusts an existing install
    folder (matched by 8 hex digits of the hash); this only skips re-verifying bytes
    that were verified before."""
    from flwr.common.config import get_flwr_home
    from flwr.common.constant import APP_DIR
    from flwr.supernode.runtime import run_clientapp as runtime

    install = runtime.install_from_fab

    def install_once(fab_file, install_dir=None, skip_prompt=False):
        if not isinstance(fab_file, bytes) or install_dir is not None:
            return install(fab_file, install_dir=install_dir, skip_prompt=skip_prompt)
        record = Path(get_flwr_home()) / APP_DIR / INSTALLED_FABS_DIR / hashlib.sha256(fab_file).hexdigest()
        if record.is_file():
            path = Path(record.read_text())
            if path.is_dir():
                return path
        path = install(fab_file, skip_prompt=skip_prompt)
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        tmp.write_text(str(path))
        tmp.replace(record)  # atomic: a record means a finished install
        return path

    runtime.install_from_fab = install_once


#: A preloaded module may define a function of this name: the fork server calls it once,
#: after preloading and before serving, for work every ClientApp would otherwise repeat
#: (``fedgraph_flwr.nn`` compiles PyG's message-passing templates there). Found by name,
#: so this engine module names no model code.
WARM_UP_HOOK = "fork_server_warm_up"


def warm_up(modules: Sequence[str]) -> dict[str, object]:
    """Call the :data:`WARM_UP_HOOK` of each module in ``modules`` (already imported)
    that has one; returns what each hook returned, by module name."""
    done: dict[str, object] = {}
    for name in modules:
        hook = getattr(sys.modules[name], WARM_UP_HOOK, None)
        if callable(hook):
            done[name] = hook()
    return done


def preload(modules: Sequence[str]) -> list[str]:
    """Import ``modules`` (``pkg.*``: every module of ``pkg``) into the fork server and
    return the names imported; a missing one is an error, not a slow run."""
    names: list[str] = []
    for name in modules:
        try:
            if name.endswith(".*"):
                package = importlib.import_module(name[:-2])
                names.append(package.__name__)
                for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
                    importlib.import_module(info.name)
                    names.append(info.name)
            else:
                importlib.import_module(name)
                names.append(name)
        except ImportError as err:
            raise SystemExit(f"fedgraph-superexec: cannot preload {name!r}: {err}") from err
    return names


#: Seconds this executor may go without reaching its SuperNode's Runtime API before it
#: exits (unset or 0: never, as Flower's). For containers: an executor that shares its
#: SuperNode's network namespace (compose ``network_mode: service:supernode-<i>``) keeps
#: the dead namespace when the SuperNode's container restarts, and retries into it
#: forever; exiting lets the restart policy start it again in the new one.
LOST_SUPERNODE_ENV = "FEDGRAPH_EXIT_IF_SUPERNODE_GONE_S"
#: Exit status of an executor that gave up on its SuperNode (EX_TEMPFAIL: try again).
EXIT_SUPERNODE_GONE = 75


def runtime_api_address(flower_args: Sequence[str]) -> str:
    """The ``--runtime-api-address`` among ``flower-superexec``'s flags ("" if absent)."""
    args = list(flower_args)
    for i, arg in enumerate(args):
        if arg == "--runtime-api-address" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--runtime-api-address="):
            return arg.partition("=")[2]
    return ""


def reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout):
            return True
    except (OSError, ValueError):
        return False


def watch_supernode(address: str, limit_s: float, on_lost, period_s: float = 1.0) -> threading.Thread:
    """A daemon thread that calls ``on_lost(seconds)`` once ``address`` has refused
    connections for ``limit_s`` seconds in a row."""
    def run() -> None:
        last_seen = time.monotonic()
        while True:
            time.sleep(period_s)
            if reachable(address):
                last_seen = time.monotonic()
            elif time.monotonic() - last_seen >= limit_s:
                on_lost(time.monotonic() - last_seen)
                return

    thread = threading.Thread(target=run, name="fedgraph-supernode-watch", daemon=True)
    thread.start()
    return thread


def _exit_lost(executor: ForkingClientAppExecutor, address: str):
    def on_lost(seconds: float) -> None:
        log(ERROR, "fedgraph-superexec: the SuperNode's Runtime API at %s has not answered "
            "for %.0f s: exiting (status %d) so that the supervisor starts this executor "
            "again beside the restarted SuperNode", address, seconds, EXIT_SUPERNODE_GONE)
        executor.close()
        os._exit(EXIT_SUPERNODE_GONE)  # Flower's own loop would retry forever
    return on_lost


def main(modules: Sequence[str], flower_args: Sequence[str]) -> None:
    """``flower-superexec <flower_args>`` whose ClientApps fork after importing ``modules``."""
    if "--executor" in flower_args or any(a.startswith("--executor=") for a in flower_args):
        raise SystemExit("fedgraph-superexec brings its own executor; drop --executor "
                         "(or use flower-superexec for the kubernetes one).")
    if not {"-h", "--help", "-V", "--version"} & set(flower_args):
        names = preload(modules)
        warm_up(names)
        log(INFO, "fedgraph-superexec: preloaded %d modules (%s); ClientApps fork from pid %d",
            len(names), " ".join(modules), os.getpid())

    # The modules, not the same-named functions their packages re-export.
    cli = importlib.import_module("flwr.supercore.cli.flower_superexec")
    loop: Any = importlib.import_module("flwr.supercore.superexec.run_superexec")  # Any: we set a function
    executor = ForkingClientAppExecutor()
    loop.get_executor = lambda *a, **k: executor  # the one seam SuperExec offers
    limit = float(os.environ.get(LOST_SUPERNODE_ENV) or 0)
    address = runtime_api_address(flower_args)
    if limit > 0 and address:
        watch_supernode(address, limit, _exit_lost(executor, address))
    # On SIGTERM/SIGINT: stop the ClientApps, exit within seconds (exits.py).
    exit_promptly(loop.__name__, "fedgraph-superexec", before=executor.close)
    sys.argv = ["fedgraph-superexec", *flower_args]
    cli.flower_superexec()
