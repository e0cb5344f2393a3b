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


# Retry a reply's objects after 20 ms (backing off to 0.5 s) instead of Flower's 1 s (to 10 s).
REPLY_PULL_BACKOFF = (0.02, 0.5)


def retry_reply_objects_sooner() -> None:
    """A SuperNode uploads a reply's message before its objects, so the ServerApp that
    polls every few ms (``PersonalizedStrategy.exchange``) often asks for objects not
    there yet; Flower's grid then sleeps its 1 s initial backoff, which was most of a
    loopback round. Only this ServerApp process is affected (the simulation's in-memory
    grid does not pull objects)."""
    from flwr.supercore.inflatable import inflatable_utils

    defaults = inflatable_utils.pull_objects.__kwdefaults__
    defaults["initial_backoff"], defaults["backoff_cap"] = REPLY_PULL_BACKOFF


def run_server(grid: Grid, run_config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None,
               strategy_cls: type[PersonalizedStrategy] = PersonalizedStrategy):
    """Validate everything before any training, then run the federation."""
    retry_reply_objects_sooner()
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
