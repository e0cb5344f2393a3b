"""Prompt exits on SIGTERM/SIGINT/SIGQUIT for ``fedgraph-superexec`` and ``fedgraph-supernode``.

Flower's handler (``flwr.supercore.exit.register_signal_handlers``) exits gracefully:
it logs, runs the registered exit handlers, waits up to 4 s for a telemetry event and
leaves through the interpreter's shutdown; measured on a 2-core host a
``fedgraph-superexec`` took 7-8 s to exit on SIGTERM (an operator saw 10-25 s), and the
ClientApp it had forked kept training until then. Here the module's
``register_signal_handlers`` is wrapped: Flower's is called as before (it registers the
exit handlers: close the Runtime API client, stop the health server, ...), then our
handler replaces Flower's on each signal. It starts a watchdog that ends the process
``EXIT_GRACE_S`` seconds later whatever happens, runs ``before`` (stop the child
processes), then Flower's exit handlers, and leaves at once (``os._exit``: no telemetry
wait, no interpreter shutdown). So the process and its children are gone within
``EXIT_GRACE_S``: under 5 s. The SuperNode keeps Flower's graceful exit (it signs off
at the SuperLink), only bounded by a watchdog (``graceful=True``).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

#: Seconds Flower's exit handlers may take before the process ends anyway.
EXIT_GRACE_S = 2.0
#: The same when Flower's whole graceful exit runs (``graceful=True``: the SuperNode).
GRACEFUL_EXIT_S = 4.0
#: Seconds children get to end on SIGTERM before SIGKILL.
CHILD_STOP_S = 1.0

SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGQUIT", None)) if s)


def _exit_after(seconds: float) -> None:
    threading.Event().wait(seconds)
    os._exit(0)


def exit_promptly(module_name: str, program: str, before: Callable[[], None] | None = None,
                  graceful: bool = False) -> None:
    """Wrap ``register_signal_handlers`` as imported by ``module_name`` (see above).

    ``graceful``: after ``before``, Flower's own handler runs as usual, under a watchdog
    of ``GRACEFUL_EXIT_S``. The SuperNode needs it: its way out (``finally`` blocks)
    tells the SuperLink it is leaving (``DeactivateNode``), so the SuperLink answers the
    next messages for it with Node Unavailable at once and lets it back in when
    restarted, instead of counting it online for 60 s of missed heartbeats."""
    from flwr.supercore.exit import exit_handler

    module: Any = importlib.import_module(module_name)  # Any: we set a function Flower defines
    register = module.register_signal_handlers

    def handler(signum, frame) -> None:
        grace = GRACEFUL_EXIT_S if graceful else EXIT_GRACE_S
        threading.Thread(target=_exit_after, args=(grace,), daemon=True).start()
        if graceful:
            flower = flowers.get(signum)
            if before is not None:
                before()
            if callable(flower):
                flower(signum, frame)  # flwr_exit: SystemExit through the finally blocks
                return
        for sig in SIGNALS:  # a second signal while stopping: the default action
            signal.signal(sig, signal.SIG_DFL)
        if before is not None:
            before()
        for phase in (True, False):  # Flower's order: the force-exit-timer phase first
            exit_handler.trigger_exit_handlers(run_before_force_exit=phase)
        print(f"{program}: stopped on {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)  # as Flower's graceful exit on a signal: status 0

    flowers: dict[int, object] = {}

    def register_then_ours(*args, **kwargs):
        register(*args, **kwargs)
        for sig in SIGNALS:
            flowers[sig] = signal.getsignal(sig)
            signal.signal(sig, handler)

    module.register_signal_handlers = register_then_ours
