"""The Flower ServerApp: resolve and validate the config, then run the round driver
over Flower's ``Grid``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..config import ConfigError, resolve_config
from .driver import RoundDriver, RunAborted
from .flower_transport import FlowerTransport


def _log(msg: str) -> None:
    print(msg, flush=True)


def run_server(grid: Grid, run_config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None,
               driver_cls: type[RoundDriver] = RoundDriver) -> RoundDriver:
    """Validate everything before any client is contacted, then run the federation."""
    config = resolve_config(run_config, overrides)
    from .accelerate import speed_up_reply_pulls  # optional; steps aside on untested Flower

    speed_up_reply_pulls()
    from ..report import write_run_report

    driver = driver_cls(config, FlowerTransport(grid, log=_log), log=_log,
                        write_report=write_run_report)
    driver.run()
    return driver


def make_server_app(overrides: Mapping[str, Any] | None = None,
                    driver_cls: type[RoundDriver] = RoundDriver) -> ServerApp:
    """The ServerApp; ``overrides`` apply on top of the run config (tests, runners);
    ``driver_cls`` a subclass of :class:`RoundDriver` that changes a step (tests)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            run_server(grid, dict(context.run_config), overrides, driver_cls)
        except (ConfigError, RunAborted) as exc:
            # One line: the message says what is wrong and how to fix it. Re-raised as an
            # Exception (not SystemExit) so Flower reports the reason to `flwr run --stream`
            # and `flwr ls` in a deployment instead of a lost heartbeat.
            print(f"fedgraph-flwr: error: {exc}", file=sys.stderr, flush=True)
            raise RuntimeError(f"fedgraph-flwr: {exc}") from None

    return app
