"""The Flower ServerApp: resolve and validate the config, then run the strategy."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..config import ConfigError, resolve_config
from .strategy import PersonalizedStrategy, RunAborted

logger = logging.getLogger("fedgraph_flwr")


def _log(msg: str) -> None:
    print(msg, flush=True)


def run_server(grid: Grid, run_config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None,
               strategy_cls: type[PersonalizedStrategy] = PersonalizedStrategy):
    """Validate everything before any training, then run the federation."""
    config = resolve_config(run_config, overrides)
    strategy = strategy_cls(config, log=_log)
    strategy.start(grid)
    return strategy


def make_server_app(overrides: Mapping[str, Any] | None = None,
                    strategy_cls: type[PersonalizedStrategy] = PersonalizedStrategy) -> ServerApp:
    """The ServerApp; ``overrides`` apply on top of the run config (tests, runners);
    ``strategy_cls`` a subclass of :class:`PersonalizedStrategy` that changes a phase."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            run_server(grid, dict(context.run_config), overrides, strategy_cls)
        except (ConfigError, RunAborted) as exc:
            # One line: the message says what is wrong and how to fix it. Re-raised as an
            # Exception (not SystemExit) so Flower reports the reason to `flwr run --stream`
            # and `flwr ls` in a deployment instead of a lost heartbeat.
            print(f"fedgraph-flwr: error: {exc}", file=sys.stderr, flush=True)
            raise RuntimeError(f"fedgraph-flwr: {exc}") from None

    return app
