"""The Flower ServerApp: resolve and validate the config, then run the round driver
over Flower's ``Grid``.

What a user can get wrong is checked first, before torch or any method is imported (the
round driver is imported only after the checks): the run config, then, in a simulation,
the federation's size. Under plain ``flwr run`` a simulation's ServerApp runs in a
thread of Flower's simulation process while its main thread starts Ray and the
ClientApps; a config error there would otherwise wait for all of that to start and stop
(minutes on a loaded machine), so the ServerApp ends the process through Flower's own
exit path (:func:`stop_simulation_now`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..config import ConfigError, FederationPreview, RunConfig, declared_app_config, resolve_config
from .flower_transport import FlowerTransport, is_simulation
from .transport import RunAborted

if TYPE_CHECKING:
    from .driver import RoundDriver


#: Seconds the ServerApp of a simulation waits for the ClientApp's import (:func:`wait_for_clientapp`).
CLIENTAPP_IMPORT_WAIT_S = 300.0


def _log(msg: str) -> None:
    print(msg, flush=True)


def changed_keys(run_config: Mapping[str, Any], declared: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of Flower's ``run_config`` that differ from the app's declared defaults:
    what the user set. Flower's ``run_config`` holds every method's keys; resolving only
    these imports only the chosen method instead of all of them (seconds, before the
    first error can be said, while the simulation imports the ClientApp beside it)."""
    return {k: v for k, v in run_config.items() if k not in declared or declared[k] != v}


def check_before_clients(grid: Grid, run_config: Mapping[str, Any],
                         overrides: Mapping[str, Any] | None = None,
                         declared: Mapping[str, Any] | None = None,
                         clientapp_ref: str = "") -> tuple[RunConfig, FlowerTransport]:
    """The run config resolved; in a simulation, the federation's size and the dataset
    checked too (its nodes are all there at once and its ClientApps read this process's
    data root; a deployment's nodes may still be joining, and the driver waits for them):
    a :class:`ConfigError` or :class:`RunAborted` with the fix, before any client is
    contacted, the config and size before torch is imported."""
    transport = FlowerTransport(grid, log=_log)
    # Flower's simulation process: a simulation even before its main thread has
    # registered the SuperNodes (is_simulation reads them).
    simulated = in_flower_simulation_process() or is_simulation(grid)
    if declared is not None:  # same result: run_config's other keys are at their defaults
        explicit = {**changed_keys(run_config, declared), **(overrides or {})}
        preview = FederationPreview.of(explicit, declared)
        if simulated and preview is not None:
            transport.wait_for_nodes(preview)  # the size, before torch: seconds sooner
        if clientapp_ref and in_flower_simulation_process():
            wait_for_clientapp(clientapp_ref)
        config = resolve_config(None, explicit)
    else:
        config = resolve_config(run_config, overrides)
    if simulated:
        nodes = transport.wait_for_nodes(config)
        transport.check_simulated_data(config, len(nodes))
    return config, transport


def run_server(grid: Grid, run_config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None,
               driver_cls: type[RoundDriver] | None = None,
               checked: tuple[RunConfig, FlowerTransport] | None = None) -> RoundDriver:
    """Validate everything before any client is contacted (unless ``checked`` holds what
    :func:`check_before_clients` returned), then run the federation."""
    config, transport = checked or check_before_clients(grid, run_config, overrides)
    from ..report import write_run_report
    from .accelerate import speed_up_reply_pulls  # optional; steps aside on untested Flower
    from .driver import RoundDriver  # torch and the methods: only once the config is known good

    speed_up_reply_pulls()
    driver = (driver_cls or RoundDriver)(config, transport, log=_log, write_report=write_run_report)
    driver.run()
    return driver


def clientapp_ref_of(app_dir: Path) -> str:
    """The app's ClientApp reference (``[tool.flwr.app.components] clientapp`` of its
    ``pyproject.toml``, e.g. ``client_app:app``), or "" if unreadable."""
    try:
        project = tomllib.loads((app_dir / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return ""
    ref = project.get("tool", {}).get("flwr", {}).get("app", {}).get("components", {}).get("clientapp", "")
    return ref if isinstance(ref, str) else ""


def wait_for_clientapp(ref: str, timeout: float = CLIENTAPP_IMPORT_WAIT_S) -> bool:
    """Wait until this process has imported the ClientApp ``ref`` (``module:attribute``);
    False after ``timeout`` seconds.

    Flower's simulation imports the ClientApp (here: every method, torch, PyG) on its
    main thread while the ServerApp runs on another. Two threads importing PyG's circular
    modules at once can leave one with a half-initialised module (``cannot import name
    'TopKPooling' from partially initialized module 'torch_geometric.nn'``, seen here), and
    importing it on this thread instead would let Flower's loader take the half-imported
    module. So the ServerApp imports no method before that import is done; the checks
    that need none (the run config's names and files, the federation's size) come first."""
    module, _, attribute = ref.partition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, attribute.split(".")[0]):
            return True
        time.sleep(0.05)
    return False


def in_flower_simulation_process() -> bool:
    """Whether this ServerApp runs in a thread of Flower's ``flwr-simulation`` process
    (plain ``flwr run`` of a simulation): the main thread is Flower's, which registered
    its graceful exit (push the logs and a failed status, then exit) for SIGTERM. False
    in a deployment's ServerApp process (the ServerApp runs on its main thread, and a
    raised error ends it at once) and in ``run_simulation`` called from Python (tests,
    ``fedgraph-experiments --engine flower``), where no such handler is registered."""
    handler = signal.getsignal(signal.SIGTERM)
    return (threading.current_thread() is not threading.main_thread()
            and getattr(handler, "__qualname__", "").endswith("graceful_exit_handler")
            and getattr(handler, "__module__", "").startswith("flwr."))


def stop_simulation_now() -> None:
    """End this simulation process through Flower's own SIGTERM handler: it flushes the
    log (the error line included) and reports the run as failed, so ``flwr run --stream``
    returns within seconds instead of after Ray and every ClientApp have started and
    stopped. Flower logs it as ``Task stopped by user.``."""
    os.kill(os.getpid(), signal.SIGTERM)


def make_server_app(overrides: Mapping[str, Any] | None = None,
                    driver_cls: type[RoundDriver] | None = None,
                    app_dir: Path | None = None) -> ServerApp:
    """The ServerApp; ``overrides`` apply on top of the run config (tests, runners);
    ``driver_cls`` a subclass of :class:`RoundDriver` that changes a step (tests);
    ``app_dir`` the Flower app's folder, whose ``pyproject.toml`` declares the run
    config's defaults (:func:`changed_keys`)."""
    app = ServerApp()
    declared = declared_app_config(app_dir) if app_dir is not None else None
    clientapp_ref = clientapp_ref_of(app_dir) if app_dir is not None else ""

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        checked = None  # what the checks before any client returned, once they passed
        try:
            checked = check_before_clients(grid, dict(context.run_config), overrides, declared,
                                           clientapp_ref)
            run_server(grid, dict(context.run_config), overrides, driver_cls, checked)
        except (ConfigError, RunAborted) as exc:
            # One line: the message says what is wrong and how to fix it. Re-raised as an
            # Exception (not SystemExit) so Flower reports the reason to `flwr run --stream`
            # and `flwr ls` in a deployment instead of a lost heartbeat.
            print(f"fedgraph-flwr: error: {exc}", file=sys.stderr, flush=True)
            if checked is None and in_flower_simulation_process():
                print("fedgraph-flwr: stopping the simulation now (Flower logs this as "
                      "'Task stopped by user'; `flwr ls` shows the run failed)", file=sys.stderr, flush=True)
                stop_simulation_now()
            raise RuntimeError(f"fedgraph-flwr: {exc}") from None

    return app
