"""``fedgraph-supernode``: ``flower-supernode`` that waits less between its polls.

Reached through :func:`fedgraph_flwr.engine.accelerate.supernode_main`, which runs stock
``flower-supernode`` instead on a Flower this was not tested with.

Flower's SuperNode loop (``flwr/supernode/start_client_internal.py``, 1.41 and 1.42)
sleeps 3 s whenever the SuperLink has no message for it, and 0.5 s between checks for
its ClientApp's reply. In a federated round every SuperNode that replied before the
slowest one has gone back to its 3 s sleep by the time the server sends the next
round, so a round can never take less than about 3 s, however small the training.
And a message's metadata reaches the SuperNode while the ServerApp is still uploading
its objects (the model): the SuperNode's first object pull then fails and it backs off
Flower's 1 s, then 2 s, ... before it retries.

This command is Flower's own ``flower-supernode`` (same flags, same protocol, same
code) with the idle wait capped at ``--poll-interval`` seconds (default 0.2), the
object-pull backoff starting at that interval (capped at 1 s instead of 10 s), and the
0.5 s waits for its ClientApp's reply capped at 10 ms (those check the SuperNode's own
in-memory state, not the SuperLink), a SIGTERM ends it within 4 s, still signing
off at the SuperLink (:mod:`.exits`), and a 10 s heartbeat instead of 30 s, so that the
SuperLink lets a SuperNode restarted after a crash back in after 20 s, not 60 s
(:data:`HEARTBEAT_INTERVAL`). Nothing else changes. The cost is more requests to
the SuperLink while idle (one per node per interval, each a small Fleet API call),
which is why it is a flag.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Sequence
from typing import Any

#: Longest wait between checks of the SuperNode's own state for a ClientApp's reply.
LOCAL_WAIT = 0.01
#: The module whose ``time.sleep`` calls are the SuperNode's poll waits.
SUPERNODE_LOOP_MODULE = "flwr.supernode.start_client_internal"


class CappedSleepTime:
    """Stands in for the ``time`` module inside the SuperNode loop module. Its waits of
    a second or more are idle polls of the SuperLink (a network request each): capped at
    ``cap``. Shorter ones (Flower's 0.5 s) wait on the SuperNode's own in-memory state for
    its ClientApp's reply and that reply's objects: capped at ``local_cap``, since each
    check is a dictionary lookup. Every other attribute is ``time``'s."""

    def __init__(self, cap: float, local_cap: float = LOCAL_WAIT) -> None:
        self.cap = cap
        self.local_cap = local_cap

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        """Sleep, capped at ``cap`` for long waits and ``local_cap`` for short ones."""
        time.sleep(min(seconds, self.cap if seconds >= 1.0 else self.local_cap))


def cap_supernode_polls(cap: float) -> None:
    """Install :class:`CappedSleepTime` into Flower's SuperNode loop module."""
    loop: Any = importlib.import_module(SUPERNODE_LOOP_MODULE)  # Any: we replace its ``time``
    loop.time = CappedSleepTime(cap)
    from flwr.supercore.inflatable import inflatable_utils

    # The loop calls pull_objects() without backoff arguments: its defaults apply.
    defaults = inflatable_utils.pull_objects.__kwdefaults__
    assert defaults is not None  # keyword-only parameters with defaults
    defaults["initial_backoff"], defaults["backoff_cap"] = cap, max(cap, 1.0)


#: Heartbeat interval (s) this SuperNode declares: the SuperLink counts it online for two
#: intervals after each heartbeat. Flower's 30 s means a SuperNode restarted after a crash
#: is refused (``Failed to activate SuperNode``, exit 305) for up to 60 s; 10 s, the
#: SuperLink's minimum, makes that 20 s. The cost: a heartbeat every ~4 s instead of ~20 s.
HEARTBEAT_INTERVAL = 10
#: The modules whose ``HEARTBEAT_DEFAULT_INTERVAL`` the SuperNode reads when it activates
#: and when it sends heartbeats (Flower 1.41, 1.42).
HEARTBEAT_MODULES = ("flwr.supernode.fleet_http_connection", "flwr.supercore.heartbeat")


def shorten_heartbeat(interval: float = HEARTBEAT_INTERVAL) -> None:
    """Declare ``interval`` to the SuperLink, and send heartbeats to match."""
    for name in HEARTBEAT_MODULES:
        module: Any = importlib.import_module(name)  # Any: we set a module constant
        assert hasattr(module, "HEARTBEAT_DEFAULT_INTERVAL"), name  # flower_is_tested
        module.HEARTBEAT_DEFAULT_INTERVAL = interval


def main(poll_interval: float, flower_args: Sequence[str]) -> None:
    """``flower-supernode <flower_args>`` with its polls capped at ``poll_interval`` and
    its heartbeat at :data:`HEARTBEAT_INTERVAL`."""
    cap_supernode_polls(poll_interval)
    shorten_heartbeat()
    from .exits import exit_promptly

    # SIGTERM: Flower's graceful exit (it signs off at the SuperLink), within 4 s (exits.py).
    exit_promptly(SUPERNODE_LOOP_MODULE, "fedgraph-supernode", graceful=True)
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    sys.argv = ["fedgraph-supernode", *flower_args]
    cli.flower_supernode()
