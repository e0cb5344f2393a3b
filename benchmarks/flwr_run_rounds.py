"""Seconds per round as a user sees them: ``flwr run . --stream``, 60 rounds minus 10, over 50.

    python benchmarks/flwr_run_rounds.py --data-root DIR [--pairs 2] [--short 10] [--long 60]
        [--ray-cpus N] [--floor] [--set KEY=VALUE ...]

README's set-up (a local SuperLink with ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``,
10 simulated SuperNodes, one CPU each) in a private ``FLWR_HOME``. A first 2-round run
starts the SuperLink and is not counted; then short and long runs alternate, ``--pairs``
times. The difference of their wall times, divided by the difference of their rounds, is
what each round costs end to end: the round itself plus whatever happens between rounds
(checkpoint, ``progress.json``, logging, the SuperLink's bookkeeping), which the round
timer of ``results.json`` (also printed) leaves out. Prints a table and one JSON line.
Stops only the SuperLink it started.

``--floor`` also times Flower's own floor on the same SuperLink, alternating with ours: a
ten-line app (written to a temporary folder) whose ClientApps reply at once with an empty
message and whose ServerApp pushes one message per node and polls every 2 ms, as the
engine does. The host's speed drifts (the same code gave 0.63 and 0.73 s per round hours
apart on 2026-11-24), so only figures taken side by side compare; the floor says how fast
this host is now.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLOOR_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "flower-floor"
version = "0.1.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedgraph-flwr"

[tool.flwr.app.components]
serverapp = "floor_app:server"
clientapp = "floor_app:client"

[tool.flwr.app.config]
rounds = 10
"""

FLOOR_APP = """\
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client = ClientApp()
server = ServerApp()


@client.train()
def reply_at_once(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"reply": ConfigRecord({"ok": 1})}), reply_to=msg)


@server.main()
def rounds(grid: Grid, context: Context) -> None:
    nodes = list(grid.get_node_ids())
    while len(nodes) < 10:
        time.sleep(0.05)
        nodes = list(grid.get_node_ids())
    for rnd in range(int(context.run_config["rounds"])):
        pending = set()
        for node in nodes:
            msg = Message(RecordDict({"round": ConfigRecord({"round": rnd})}),
                          dst_node_id=node, message_type="train")
            pending.update(grid.push_messages([msg]))
        while pending:
            pending -= {m.metadata.reply_to_message_id for m in grid.pull_messages(pending)}
            time.sleep(0.002)
"""


def floor_run(rounds: int, args: argparse.Namespace, env: dict[str, str], app: Path) -> dict:
    """Wall time of ``flwr run`` on the no-op app: Flower's own cost of ``rounds`` rounds."""
    t0 = time.perf_counter()
    proc = subprocess.run(["flwr", "run", str(app), "--stream", "--run-config",
                           f"rounds={rounds}"], cwd=app, env=env, capture_output=True,
                          text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"floor app, {rounds} rounds: exit {proc.returncode}: "
                         f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return {"rounds": rounds, "wall_s": time.perf_counter() - t0}


def flwr_run(rounds: int, name: str, args: argparse.Namespace, env: dict[str, str],
             out: Path) -> dict:
    run_config = " ".join([f"rounds={rounds}", f"data-root='{args.data_root}'",
                           f"output-dir='{out}'", f"run-name='{name}'", *args.set])
    t0 = time.perf_counter()
    proc = subprocess.run(["flwr", "run", ".", "--stream", "--run-config", run_config],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=args.timeout)
    wall = time.perf_counter() - t0
    results_file = out / name / "results.json"
    if not results_file.exists():
        raise SystemExit(f"{name}: no results.json (exit {proc.returncode}): "
                         f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    rounds_done = json.loads(results_file.read_text())["rounds"]
    timer = [r["times"]["round"] for r in rounds_done[1:]]
    return {"rounds": rounds, "wall_s": wall, "round_timer_median_s": statistics.median(timer),
            "round_timer_sum_s": sum(r["times"]["round"] for r in rounds_done)}


def stop_superlink(home: str) -> None:
    """Stop the local SuperLink this script started (found by its FLWR_HOME), nothing else."""
    for pid in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (OSError, ValueError):
            continue
        if pid.isdigit() and f"FLWR_HOME={home}".encode() in environ.split(b"\0"):
            try:
                os.kill(int(pid), 15)
            except ProcessLookupError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--long", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--ray-cpus", type=int, default=None,
                        help="init-args-num-cpus: the CPUs Ray may hand out, so the number of "
                             "one-CPU actors (default: Ray counts the machine's cores)")
    parser.add_argument("--floor", action="store_true",
                        help="also time Flower's floor (ClientApps that reply at once)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more run-config overrides, TOML values (algorithm='fedavg')")
    args = parser.parse_args(argv)
    if args.long <= args.short:
        parser.error("--long must be larger than --short")
    if args.ray_cpus is not None and args.ray_cpus < 1:
        parser.error("--ray-cpus must be at least 1")
    home = tempfile.mkdtemp(prefix="flwr-home-")
    out = Path(tempfile.mkdtemp(prefix="flwr-run-rounds-"))
    env = dict(os.environ, FLWR_HOME=home, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    try:
        subprocess.run(["flwr", "federation", "simulation-config", "@none/default", "local",
                        "--num-supernodes", "10", "--client-resources-num-cpus", "1",
                        *(["--init-args-num-cpus", str(args.ray_cpus)] if args.ray_cpus else [])],
                       cwd=ROOT, env=env, check=True, capture_output=True)
        flwr_run(2, "warm-up", args, env, out)  # starts the local SuperLink; not counted
        if args.floor:
            app = out / "floor-app"
            app.mkdir()
            (app / "pyproject.toml").write_text(FLOOR_PYPROJECT)
            (app / "floor_app.py").write_text(FLOOR_APP)
            floor_run(2, args, env, app)  # not counted either
        rows, floor_rows = [], []
        for i in range(args.pairs):
            for rounds in (args.short, args.long):
                rows.append(flwr_run(rounds, f"r{rounds}-{i}", args, env, out))
                print(f"{rounds:3d} rounds: {rows[-1]['wall_s']:7.1f} s wall, round timer "
                      f"median {rows[-1]['round_timer_median_s']:.3f} s", flush=True)
                if args.floor:
                    floor_rows.append(floor_run(rounds, args, env, app))
                    print(f"{rounds:3d} rounds of the floor app: "
                          f"{floor_rows[-1]['wall_s']:7.1f} s wall", flush=True)
    finally:
        stop_superlink(home)
    result = {"benchmark": "flwr_run_rounds", **per_round(rows, args, "end to end"),
              "set": args.set, "ray_cpus": args.ray_cpus, "rows": rows}
    if floor_rows:
        floor = per_round(floor_rows, args, "Flower's floor")
        result.update(floor_per_round_s=floor["per_round_s"], floor_pairs_s=floor["pairs_s"],
                      floor_rows=floor_rows)
    print(json.dumps(result))
    return 0


def per_round(rows: list[dict], args: argparse.Namespace, label: str) -> dict:
    """(mean long wall − mean short wall) / (long − short rounds), and per pair; printed."""
    short = statistics.mean(r["wall_s"] for r in rows if r["rounds"] == args.short)
    long = statistics.mean(r["wall_s"] for r in rows if r["rounds"] == args.long)
    per_round_s = (long - short) / (args.long - args.short)
    pairs = [(b["wall_s"] - a["wall_s"]) / (args.long - args.short)
             for a, b in zip(rows[::2], rows[1::2], strict=True)]
    print(f"{label}: ({long:.1f} - {short:.1f}) / {args.long - args.short} = "
          f"{per_round_s:.3f} s per round (pairs: {', '.join(f'{p:.3f}' for p in pairs)})")
    return {"per_round_s": per_round_s, "pairs_s": pairs}


if __name__ == "__main__":
    raise SystemExit(main())
