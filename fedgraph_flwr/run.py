"""``fedgraph-run``: ``flwr run ... --stream`` with an exit status a script can test.

``flwr run --stream`` (Flower 1.41) exits 0 whether the run completed or failed (a
failed handshake, a ServerApp that raised or was killed). This command runs it with
the same arguments, passes its output through, then asks the SuperLink for the run's
final status (``flwr ls --run-id <id> --format json``) and exits with

- 0: the run finished and completed;
- 1: it failed or was stopped (its status and details are printed last);
- ``flwr run``'s own status when that is not 0 (e.g. no SuperLink, a bad argument);
- 2: the run's outcome is unknown (no run id in the output, no status from the SuperLink).

A run whose ServerApp died (``finished:failed`` with neither the ServerApp's own error
line nor a traceback in the log: a SIGKILL, the OOM killer, its host gone) is restarted
with no operator action, up to ``--restarts N`` times (default 2; 0 turns it off; this
command's flag, not passed to ``flwr run``): with ``--run-config resume=true`` once a
round was done, so it continues from its checkpoint (with ``client-state="file"`` it
ends bit-identical to an uninterrupted run), else from the start. Each restart is one
line here, and each resume an entry of results.json's ``resumes`` and report.html.

Before anything is submitted, the ``--run-config`` values are checked exactly as the
ServerApp will check them (unknown keys by name, with the closest valid one; bad
values; a missing ``config-file``), ``num-clients`` against this command's
``num-supernodes``, and, with a local SuperLink, that the dataset is under
``data-root``: a bad one is one line and exit status 1 within seconds, where ``flwr run``
alone says only ``[code: 15] Invalid run configuration.`` for an unknown key and
reports the rest from the ServerApp half a minute later.

With a local SuperLink (the default ``local`` connection) ``FEDGRAPH_DATA_ROOT`` of
this shell is passed on as ``--run-config data-root=...`` unless the arguments set
``data-root``: the local SuperLink runs the apps with the environment it had when it
started, which a variable exported since never reaches.

Usage: ``fedgraph-run . --run-config "rounds=5" [--restarts 2]`` (any ``flwr run`` arguments).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``flwr run`` options that take a value (the rest of the tokens are flags or positionals).
VALUE_OPTIONS = {"--federation", "--run-config", "-c", "--federation-config", "--format"}
RUN_ID = re.compile(r"Successfully started run (\d+)|\"run-id\":\s*\"?(\d+)")
#: The driver's line for a finished round (driver.py: ``round 3/8: mean val ...``).
ROUND_DONE = re.compile(r"\bround (\d+)/\d+: mean val")
TRACEBACK = "Traceback (most recent call last)"
NO_CHECKPOINT = "resume=true but there is no checkpoint"  # checkpoint.py's ConfigError
#: Restarts of a run whose ServerApp died, unless ``--restarts`` says otherwise.
DEFAULT_RESTARTS = 2
#: Seconds to wait, after the log stream ends, for the SuperLink to record the outcome.
#: Each ``flwr ls`` is a fresh CLI process: at load 40 on 2 cores the compose smoke got
#: no status within 30 s ("outcome unknown" for a run that had written its results).
STATUS_WAIT_S = 180.0
LOCAL_ADDRESSES = (":local:", ":local-in-memory:")
ERROR_LINE = "fedgraph-flwr: error: "  # what server_app.py prints before it stops a run


def _flwr() -> list[str]:
    exe = shutil.which("flwr")
    return [exe] if exe else [sys.executable, "-c", "from flwr.cli.app import app; app()"]


def split_args(args: Sequence[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``flwr run``'s positionals (app, superlink) and option values by option."""
    positionals: list[str] = []
    options: dict[str, list[str]] = {}
    it = iter(args)
    for token in it:
        name, eq, value = token.partition("=")
        if token.startswith("-") and eq and name in VALUE_OPTIONS:
            options.setdefault(name, []).append(value)
        elif token in VALUE_OPTIONS:
            options.setdefault(token, []).append(next(it, ""))
        elif token.startswith("-"):
            options.setdefault(token, [])
        else:
            positionals.append(token)
    return positionals, options


def sets_data_root(options: dict[str, list[str]]) -> bool:
    """Whether a ``--run-config`` value (inline or a TOML file) sets ``data-root``."""
    for value in options.get("--run-config", []) + options.get("-c", []):
        text = value
        path = Path(value).expanduser()
        if "=" not in value and path.is_file():
            text = path.read_text(errors="replace")
        if re.search(r"(^|\s)[\"']?data-root[\"']?\s*=", text):
            return True
    return False


def is_local_superlink(name: str | None, env: Mapping[str, str] | None = None) -> bool:
    """Whether the SuperLink connection ``name`` (the default when None) is Flower's
    local one, which the CLI starts on this machine. Read from the Flower configuration
    file (``$FLWR_HOME/config.toml``, default ``~/.flwr``), which ``flwr`` creates with
    ``local`` as the default connection when there is none."""
    env = os.environ if env is None else env
    path = Path(env.get("FLWR_HOME") or Path.home() / ".flwr") / "config.toml"
    if not path.is_file():
        return name in (None, "local")
    try:
        links = tomllib.loads(path.read_text()).get("superlink", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False
    connection = links.get(name or links.get("default", ""))
    return isinstance(connection, dict) and connection.get("address") in LOCAL_ADDRESSES


def with_data_root(args: list[str], env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """``args`` plus ``--run-config data-root=...`` from ``FEDGRAPH_DATA_ROOT`` where it
    applies (a local SuperLink, data-root not set), and the note saying so (or "")."""
    root = (env if env is not None else os.environ).get("FEDGRAPH_DATA_ROOT", "")
    if not root:
        return args, ""
    positionals, options = split_args(args)
    if sets_data_root(options):
        return args, ""
    if not is_local_superlink(positionals[1] if len(positionals) > 1 else None):
        return args, ""
    path = str(Path(root).expanduser().resolve())
    note = (f"fedgraph-run: FEDGRAPH_DATA_ROOT passed on as --run-config data-root={path} "
            f"(the local SuperLink keeps the environment it started with)")
    return [*args, "--run-config", f"data-root={json.dumps(path)}"], note


#: Flower's own ``--run-config`` grammar (``flwr.common.config.parse_config_args``).
CONFIG_PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


def run_config_values(options: dict[str, list[str]]) -> dict[str, Any] | None:
    """The ``--run-config`` overrides as Flower parses them; None where Flower itself
    will refuse them (a malformed value), so that its own message is the one shown."""
    values: dict[str, Any] = {}
    for line in options.get("--run-config", []) + options.get("-c", []):
        try:
            if line.endswith(".toml"):
                with Path(line).expanduser().open("rb") as fh:
                    values.update(_flatten(tomllib.load(fh)))
            else:
                pairs = CONFIG_PAIR.findall(line)
                values.update(_flatten(tomllib.loads("\n".join(f"{k} = {v}" for k, v in pairs))))
        except (OSError, tomllib.TOMLDecodeError):
            return None
    return values


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        flat.update(_flatten(value, name) if isinstance(value, Mapping) else {name: value})
    return flat


def app_config_keys(app: Path) -> set[str] | None:
    """The run-config keys the app declares; None if unreadable."""
    from .config import declared_app_config  # the config module only: no torch

    defaults = declared_app_config(app)
    return None if defaults is None else set(defaults)


def federation_size(options: dict[str, list[str]]) -> int | None:
    """``num-supernodes`` where this command's ``--federation-config`` sets it."""
    size = None
    for line in options.get("--federation-config", []):
        for key, value in CONFIG_PAIR.findall(line):
            if key == "num-supernodes" and value.isdigit():
                size = int(value)
    return size


#: How alike (difflib's ratio) an unknown key and a block key must be to count as a typo of it.
TYPO_RATIO = 0.9


def profile_switch(key: str) -> str | None:
    """Why Flower refuses ``key`` where it is a switch of a method's reproduction profile
    (kept out of pyproject's block), or None; imports that method only."""
    from .core.registry import ALGORITHMS

    owner = ALGORITHMS.owner_of(key)
    if owner is None:
        return None
    options = ALGORITHMS[owner].options
    if key not in options.behaviour_switch_keys():
        return None
    return (f"{key} is a switch of {options.profile_key()} (docs/methods/{owner}.md), not in "
            f"[tool.flwr.app.config], and Flower refuses --run-config keys that block lacks: "
            f"set {options.profile_key()}, or {key} in a YAML file named by config-file")


def config_error(args: Sequence[str]) -> str | None:
    """The one-line error this command's run would stop with, found before anything is
    submitted, or None. Checked here: the ServerApp's own config check on the
    ``--run-config`` values (an unknown key first, from the app's ``pyproject.toml``,
    before torch is imported); ``num-clients`` against a ``num-supernodes`` this command
    sets; and, for the local SuperLink (same machine) with ``data-root`` set, that the
    dataset's files are there. What cannot be read here is left to Flower and the ServerApp.
    A ``config-file`` is read relative to the app folder, as the ServerApp reads it."""
    positionals, options = split_args(args)
    values = run_config_values(options)
    if values is None:
        return None
    app = Path(positionals[0] if positionals else ".")
    keys = app_config_keys(app)
    unknown = sorted(set(values) - keys) if keys else []
    if unknown:
        # A near-exact match is a typo of a block key: said without importing the method
        # (profile_switch imports it, seconds with torch and PyG).
        typo = difflib.get_close_matches(unknown[0], sorted(keys), n=1, cutoff=TYPO_RATIO)
        switch = None if typo else profile_switch(unknown[0])
        if switch:
            return f"{ERROR_LINE}{switch}"
        close = typo or difflib.get_close_matches(unknown[0], sorted(keys), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(keys))}"
        return f"{ERROR_LINE}unknown config key {unknown[0]!r}{hint}"
    from .config import ConfigError, FederationPreview, declared_app_config, resolve_config

    if isinstance(values.get("config-file"), str) and values["config-file"]:
        path = Path(values["config-file"]).expanduser()
        values["config-file"] = str(path if path.is_absolute() else app / path)
    size = federation_size(options)
    try:
        # Names, the config file and its keys, and the size first: no method (torch) imported.
        preview = FederationPreview.of(values, declared_app_config(app))
        if size is not None and preview is not None and size != preview.num_clients:
            return (f"{ERROR_LINE}--federation-config sets num-supernodes={size} but "
                    f"num-clients={preview.num_clients}; make them equal")
        config = resolve_config(None, values)  # imports the chosen method: seconds
    except ConfigError as exc:
        return f"{ERROR_LINE}{exc}"
    if size is not None and size != config.num_clients:
        return (f"{ERROR_LINE}--federation-config sets num-supernodes={size} but "
                f"num-clients={config.num_clients}; make them equal")
    superlink = positionals[1] if len(positionals) > 1 else None
    if values.get("data-root") and is_local_superlink(superlink):
        from .engine.contract import missing_dataset

        missing = missing_dataset(config, fetch=True)
        if missing:
            return f"{ERROR_LINE}{missing.removeprefix('DataRootError: ')}"
    return None


def run_status(run_id: int, superlink: str | None,
               runner: Callable[..., subprocess.CompletedProcess] = subprocess.run
               ) -> tuple[str, str] | None:
    """The run's ``(status, details)`` from ``flwr ls``, e.g. ``("finished:failed", "...")``;
    None when the SuperLink does not tell."""
    cmd = [*_flwr(), "ls", *([superlink] if superlink else []), "--run-id", str(run_id),
           "--format", "json"]
    try:
        out = runner(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    try:
        payload = json.loads(text[text.find("{"):]) if "{" in text else {}
    except json.JSONDecodeError:
        return None
    for run in payload.get("runs", []):
        if str(run.get("run-id")) == str(run_id):
            return str(run.get("status", "")), str(run.get("status-details", ""))
    return None


def final_status(run_id: int, superlink: str | None, wait_s: float = STATUS_WAIT_S,
                 status: Callable[[int, str | None], tuple[str, str] | None] = run_status
                 ) -> tuple[str, str] | None:
    """The run's status once it is ``finished:*`` (the stream can end a moment before
    the SuperLink records it); the last one seen after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    seen = status(run_id, superlink)
    while (seen is None or not seen[0].startswith("finished")) and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = status(run_id, superlink) or seen
    return seen


def exit_code(status: tuple[str, str] | None) -> int:
    """0 completed, 1 failed or stopped, 2 unknown (no status, or not finished)."""
    if status is None or not status[0].startswith("finished"):
        return 2
    return 0 if status[0] == "finished:completed" else 1


@dataclass
class Attempt:
    """One ``flwr run --stream`` as this command followed it."""

    rc: int  # flwr run's own exit status
    run_id: int | None = None
    said: bool = False  # the ServerApp's own one-line error went by
    raised: bool = False  # a Python traceback went by (an exception, not a death)
    last_round: int = 0  # the last round the stream reported done
    no_checkpoint: bool = False  # resume=true found no checkpoint (died before the first)


def follow(args: Sequence[str]) -> Attempt:
    """Run ``flwr run`` with ``args``, passing its output through, and note what it said."""
    proc = subprocess.Popen([*_flwr(), "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    seen = Attempt(rc=0)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            seen.said |= line.startswith(ERROR_LINE)
            seen.no_checkpoint |= line.startswith(ERROR_LINE) and NO_CHECKPOINT in line
            seen.raised |= line.startswith(TRACEBACK)
            done = ROUND_DONE.search(line)
            if done:
                seen.last_round = max(seen.last_round, int(done[1]))
            match = RUN_ID.search(line) if seen.run_id is None else None
            if match:
                seen.run_id = int(match[1] or match[2])
        seen.rc = proc.wait()
    except KeyboardInterrupt:
        proc.wait()
        if seen.run_id is not None:
            print(f"fedgraph-run: stopped following run {seen.run_id}; it goes on "
                  f"(flwr stop {seen.run_id} ends it)", file=sys.stderr)
        raise
    return seen


def died(attempt: Attempt, status: tuple[str, str] | None) -> bool:
    """Whether the run failed because its ServerApp died (killed, out of memory, its
    host gone) rather than stopped on purpose: ``finished:failed`` with neither the
    ServerApp's own error line nor a traceback in its log. Only such a run is restarted:
    a config error, a failed handshake or a bug would fail the same way again."""
    return (status is not None and status[0] == "finished:failed"
            and not attempt.said and not attempt.raised)


def take_restarts(args: list[str]) -> tuple[list[str], int]:
    """``args`` without ``--restarts N`` (this command's, not flwr's), and N."""
    rest, restarts = [], DEFAULT_RESTARTS
    it = iter(args)
    for token in it:
        name, eq, value = token.partition("=")
        if name != "--restarts":
            rest.append(token)
            continue
        value = value if eq else next(it, "")
        if not value.isdigit():
            raise ValueError(f"--restarts {value!r}: give a whole number of restarts (0: none)")
        restarts = int(value)
    return rest, restarts


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    try:
        args, restarts = take_restarts(args)
    except ValueError as exc:
        print(f"fedgraph-run: error: {exc}", file=sys.stderr)
        return 2
    if "--stream" not in args:
        args.append("--stream")
    args, note = with_data_root(args)
    if note:
        print(note, flush=True)
    error = config_error(args)
    if error:
        print(error, file=sys.stderr)
        return 1
    positionals, _ = split_args(args)
    superlink = positionals[1] if len(positionals) > 1 else None
    attempt_args, done, restart = args, 0, 0
    while True:
        try:
            attempt = follow(attempt_args)
        except KeyboardInterrupt:
            return 130
        if attempt.rc != 0:
            return attempt.rc
        if attempt.run_id is None:
            print("fedgraph-run: flwr run printed no run id: outcome unknown", file=sys.stderr)
            return 2
        status = final_status(attempt.run_id, superlink)
        code = exit_code(status)
        done = max(done, attempt.last_round)
        if attempt.no_checkpoint and attempt_args is not args:
            # Our resume found no checkpoint: the ServerApp died after a round's line and
            # before that round's checkpoint was on disk. Start again from round 1.
            done = 0
        elif not died(attempt, status):
            break
        if code != 1 or restart == restarts:
            break
        restart += 1
        assert status is not None
        # A round the stream called done is checkpointed (or its predecessor, the write
        # ending in the background): resume. Before any round: start again.
        attempt_args = [*args, "--run-config", "resume=true"] if done else args
        how = (f"resuming from its last checkpoint (its log had reached round {done})" if done
               else "starting it again (no round's checkpoint)")
        why = f": {status[1]}" if status[1] else ""
        print(f"fedgraph-run: run {attempt.run_id} {status[0]} with no error from its ServerApp "
              f"(it died{why}); restart {restart} of {restarts}: {how}", file=sys.stderr,
              flush=True)
    if code == 2:
        shown = status[0] if status else "no status from the SuperLink"
        print(f"fedgraph-run: run {attempt.run_id}: outcome unknown ({shown})", file=sys.stderr)
    elif code == 1:
        assert status is not None
        details = " (the reason is above)" if attempt.said else (
            f": {status[1]}" if status[1] else "")
        print(f"fedgraph-run: run {attempt.run_id} {status[0]}{details}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
