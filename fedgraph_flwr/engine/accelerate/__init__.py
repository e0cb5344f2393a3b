"""Optional speed-ups that patch Flower internals, behind an opt-in and a version guard.

Everything else in this package uses Flower's public API only (``flwr.app``,
``flwr.serverapp``, ``flwr.clientapp``, ``flwr.simulation``;
tests/test_flower_surface.py checks at run time that a default-path run leaves every
Flower attribute as it found it). What stock Flower does slowly for small
graphs (a fresh ``flwr-clientapp`` process importing torch per message, 3 s idle polls,
1 s object-pull backoffs) is fixed here by patching Flower's own modules, which no
release promises to keep. So nothing here runs unless asked for: only the
``fedgraph-superexec`` / ``fedgraph-supernode`` commands patch anything, and they set
:data:`OPT_IN_ENV` for the processes they start (a ServerApp launched by
``fedgraph-superexec --plugin-type serverapp`` inherits it; an operator may also export
it before ``flower-superexec``). ``flwr run .`` and stock ``flower-superlink`` /
``flower-superexec`` / ``flower-supernode`` run Flower untouched. Each speed-up then
checks that the installed Flower is one it was tested with (:data:`TESTED_FLOWER`); on
any other it prints one warning line and the stock behaviour runs: the commands become
``flower-supernode`` / ``flower-superexec`` with the same flags, and the ServerApp pulls
replies as Flower does.

- :func:`speed_up_reply_pulls`, :func:`bound_reply_pulls`: for the ServerApp process
  (deployment), only with :data:`OPT_IN_ENV` set to ``1``.
- :func:`supernode_main`: the ``fedgraph-supernode`` command (:mod:`.supernode`).
- :func:`superexec_main`: the ``fedgraph-superexec`` command (:mod:`.superexec`).

Only this package may import Flower internals, and its submodules only after the guard.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata

#: Flower releases (major.minor) the speed-ups were tested with.
TESTED_FLOWER = ("1.41", "1.42")

#: First retry delay and cap (s) for a reply's objects (Flower: 1 s and 10 s).
REPLY_PULL_BACKOFF = (0.02, 0.5)

DEFAULT_POLL_INTERVAL = 0.2

#: What the fork server imports before serving: the heavy part of a ClientApp's start.
#: ``pkg.*`` is every module of package ``pkg``: all ClientApp code then comes from the
#: installed package, none from the FAB's copy (a namespace package would mix the two).
DEFAULT_PRELOAD = ("torch", "torch_geometric", "fedgraph_flwr.engine.client_app",
                   "fedgraph_flwr.algorithms.*", "fedgraph_flwr.data.*", "fedgraph_flwr.nn.*")

#: "1" in a process whose ServerApp may patch Flower's object pulls: set by the
#: ``fedgraph-*`` commands for what they start, never by the default path.
OPT_IN_ENV = "FEDGRAPH_FLOWER_SPEEDUPS"

_warned = False
_pull_defaults: dict | bool | None = None  # pull_objects' defaults, once found usable


def flower_version() -> str:
    """The installed flwr's version, from its package metadata (imports nothing):
    ``flwr``'s, else ``flwr-nightly``'s (which installs the same ``flwr`` package)."""
    try:
        return metadata.version("flwr")
    except metadata.PackageNotFoundError:
        return metadata.version("flwr-nightly")


def opted_in() -> bool:
    """Whether this process was started by a ``fedgraph-*`` command (or by an operator
    who exported :data:`OPT_IN_ENV` set to 1): only then may the ServerApp patch Flower."""
    return os.environ.get(OPT_IN_ENV) == "1"


def flower_is_tested() -> bool:
    """Whether the installed Flower is in :data:`TESTED_FLOWER`; if not, says so in one
    line on stderr (once per process)."""
    global _warned
    version = flower_version()
    if ".".join(version.split(".")[:2]) in TESTED_FLOWER:
        return True
    if not _warned:
        _warned = True
        print(f"fedgraph-flwr: Flower {version} is not one the speed-ups were tested with "
              f"({', '.join(TESTED_FLOWER)}); running stock Flower behaviour",
              file=sys.stderr, flush=True)
    return False


def speed_up_reply_pulls() -> bool:
    """Retry a reply's objects after 20 ms (backing off to 0.5 s) instead of Flower's 1 s
    (to 10 s); returns whether it did.

    A SuperNode uploads a reply's message before its objects, so a ServerApp that polls
    every few ms often asks for objects not there yet, and Flower's grid then sleeps its
    1 s initial backoff: that was most of a loopback round. Call it in the ServerApp
    process; only that process is affected (the simulation's in-memory grid pulls no
    objects, so there it changes nothing). Opt-in (:func:`opted_in`): without it Flower's
    own backoff runs and nothing is patched."""
    if not opted_in() or not flower_is_tested():
        return False
    from flwr.supercore.inflatable import inflatable_utils

    # The grid calls pull_objects() without backoff arguments: its defaults apply.
    defaults = inflatable_utils.pull_objects.__kwdefaults__
    assert defaults is not None  # keyword-only parameters with defaults (flower_is_tested)
    defaults["initial_backoff"], defaults["backoff_cap"] = REPLY_PULL_BACKOFF
    return True


def bound_reply_pulls(seconds: float) -> bool:
    """Give up on a reply's objects after ``seconds`` (Flower: 7200 s); returns whether
    it did. A reply announced but whose objects never finish arriving (its SuperNode
    died mid-upload) then becomes Flower's ``MESSAGE_UNAVAILABLE`` error reply instead
    of holding the round for up to two hours. Set before each pull of the ServerApp's
    reply loop, to what is left of the round. Opt-in (:func:`opted_in`): without it a
    reply's objects are waited for as long as Flower's default allows."""
    global _pull_defaults
    if not opted_in():
        return False
    if _pull_defaults is None:  # decided once: it is called before every poll
        _pull_defaults = False
        if flower_is_tested():
            from flwr.supercore.inflatable import inflatable_utils

            _pull_defaults = inflatable_utils.pull_objects.__kwdefaults__
    if not isinstance(_pull_defaults, dict):  # False: not usable
        return False
    _pull_defaults["max_time"] = max(0.1, float(seconds))
    return True


def run_stock(command: str, args: Sequence[str]) -> None:
    """Run Flower's own console script ``command`` with ``args`` in this process (found
    through flwr's package metadata, not a module path), then exit with its status."""
    (entry,) = metadata.entry_points(group="console_scripts", name=command)
    sys.argv = [command, *args]
    sys.exit(entry.load()())


def _split(argv: Sequence[str] | None, parser: argparse.ArgumentParser):
    return parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))


def _interval(text: str) -> float:
    value = float(text)
    if not 0.01 <= value <= 3.0:
        raise argparse.ArgumentTypeError(f"--poll-interval must be in [0.01, 3] s, got {text}")
    return value


def supernode_main(argv: Sequence[str] | None = None) -> None:
    """``fedgraph-supernode [--poll-interval S] <flower-supernode flags>``."""
    ours = argparse.ArgumentParser(prog="fedgraph-supernode", add_help=False)
    ours.add_argument("--poll-interval", type=_interval, default=DEFAULT_POLL_INTERVAL,
                      help="longest wait between polls, seconds (Flower: 3 idle, 0.5 for replies)")
    args, rest = _split(argv, ours)
    os.environ[OPT_IN_ENV] = "1"  # this command is the opt-in
    if not flower_is_tested():
        run_stock("flower-supernode", rest)
    from . import supernode

    supernode.main(args.poll_interval, rest)


def superexec_main(argv: Sequence[str] | None = None) -> None:
    """``fedgraph-superexec [--preload MOD ...] <flower-superexec flags>``."""
    ours = argparse.ArgumentParser(
        prog="fedgraph-superexec", add_help=False,
        description="flower-superexec whose ClientApp processes fork from a pre-imported parent.")
    ours.add_argument("--preload", action="append", metavar="MODULE",
                      help=f"module to import before serving (repeatable; default: "
                           f"{' '.join(DEFAULT_PRELOAD)})")
    args, rest = _split(argv, ours)
    os.environ[OPT_IN_ENV] = "1"  # this command is the opt-in: a ServerApp it starts inherits it
    if not hasattr(os, "fork") or sys.platform == "darwin":
        print("fedgraph-superexec: forking after importing torch is only safe on Linux; "
              "running stock flower-superexec", file=sys.stderr, flush=True)
        run_stock("flower-superexec", rest)
    if not flower_is_tested():
        run_stock("flower-superexec", rest)
    from . import superexec

    superexec.main(args.preload or DEFAULT_PRELOAD, rest)
