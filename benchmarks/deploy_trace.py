"""Where a loopback deployment's round goes: per-phase times and CPU per process.

    python benchmarks/deploy_trace.py [--rounds 20] [--in-memory-state] [--set KEY=VALUE ...]

Runs benchmarks/deploy_round.py (FedAux, width 256, 3 owners on the reference Cora
files, ``client-state="file"`` unless ``--set`` says otherwise) with two additions:

- every Flower process logs with timestamps (a ``sitecustomize`` on ``PYTHONPATH`` turns
  on Flower's own console timestamps), so each SuperNode's log dates the phases of its
  round: ``Receiving`` (its poll found the message) -> ``Received successfully`` (the
  message's objects pulled from the SuperLink) -> ``Sending`` (its ClientApp replied) ->
  ``Sent successfully`` (the reply's objects pushed to the SuperLink);
- the CPU seconds of every process of the deployment (a ClientApp executor's forked
  ClientApps included, as the children it reaped) are sampled from ``/proc`` over the
  middle rounds.

Prints, as medians over rounds 3..N-1: the round timer (results.json), each phase
(its slowest client), the gap from the last reply of one round to the first message of
the next (the ServerApp pulling the replies, aggregating and pushing, plus the
SuperNodes' poll wait), and CPU seconds per round by process kind. One JSON line too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SITECUSTOMIZE = """\
import os
if os.environ.get("FEDGRAPH_TRACE_TIMESTAMPS") == "1":
    from flwr.supercore.logger import update_console_handler
    update_console_handler(timestamps=True, colored=False)
"""

PHASES = {"Receiving": "receiving", "Received successfully": "received",
          "Sending": "sending", "Sent successfully": "sent"}
LINE = re.compile(r"^INFO (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\S*:\s+(.*)$")
ROUND = re.compile(r"\[RUN \d+, ROUND (\d+)\]")


def _kind(cmdline: str, workdir: str) -> str | None:
    """Which process of the deployment a command line is, if any."""
    if "flwr-serverapp" in cmdline:
        return "ServerApp"
    if "flwr run" in cmdline:
        return "flwr run (the operator's CLI)"
    if workdir not in cmdline:
        return None
    if "superlink" in cmdline.split()[1]:
        return "SuperLink"
    if "supernode" in cmdline.split()[1]:
        return "SuperNodes"
    if "superexec" in cmdline.split()[1]:
        return ("ClientApp executors (their ClientApps included)" if "node-tls" in cmdline
                else "ServerApp executor")
    return None


def _cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process's command line and CPU seconds (its own and its reaped children's)."""
    out: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(pid)] = (cmd, sum(int(x) for x in fields[11:15]) / tick)
    return out


def _round_events(log: str) -> dict[int, dict[str, float]]:
    """round -> {phase: unix time} from one SuperNode's timestamped log."""
    events: dict[int, dict[str, float]] = {}
    current = None
    for line in log.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        stamp, text = match.groups()
        found = ROUND.search(text)
        if found:
            current = int(found.group(1))
            continue
        for prefix, phase in PHASES.items():
            if current is not None and text.startswith(prefix):
                when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
                events.setdefault(current, {}).setdefault(phase, when)
    return events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--in-memory-state", action="store_true")
    parser.add_argument("--stock-flower", action="store_true")
    parser.add_argument("--set", nargs="*", default=['client-state="file"'], metavar="KEY=VALUE")
    parser.add_argument("--workdir", type=Path, default=None, help="kept if given (logs)")
    args = parser.parse_args(argv)
    if args.rounds < 5:
        parser.error("--rounds must be at least 5 (rounds 3..N-1 are traced)")
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="fedgraph-deploy-trace-"))).resolve()
    site = workdir / "trace-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, FEDGRAPH_TRACE_TIMESTAMPS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "deploy_round.py"), "--rounds", str(args.rounds),
           "--workdir", str(workdir / "run"), "--set", *args.set]
    cmd += ["--in-memory-state"] * args.in_memory_state + ["--stock-flower"] * args.stock_flower
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # CPU over the middle rounds: from the first round-3 message to the last round-(N-1) reply.
    logs = workdir / "run" / "cluster" / "logs"
    samples: dict[str, tuple[float, dict]] = {}

    def sample() -> None:
        def rounds_seen() -> int:
            text = (logs / "supernode-0.log").read_text(errors="replace") if logs.is_dir() and (
                logs / "supernode-0.log").exists() else ""
            return max([int(r) for r in ROUND.findall(text)] or [0])
        for label, after in (("start", 2), ("end", args.rounds - 1)):
            while proc.poll() is None and rounds_seen() <= after:
                time.sleep(0.05)
            samples[label] = (time.time(), _cpu_by_process())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.communicate()[0]
    sampler.join(timeout=5)
    if proc.returncode != 0:
        print(output[-4000:], file=sys.stderr)
        return proc.returncode
    row = json.loads(output.strip().splitlines()[-1])

    per_node = [_round_events((logs / f"supernode-{i}.log").read_text(errors="replace"))
                for i in range(3)]
    traced = range(3, args.rounds)
    spans = {"pull (SuperLink -> SuperNode)": ("receiving", "received"),
             "ClientApp (fork, restore, train, save)": ("received", "sending"),
             "push (SuperNode -> SuperLink)": ("sending", "sent")}
    phase_rows: dict[str, list[float]] = {name: [] for name in spans}
    phase_rows["first message to last reply"] = []
    phase_rows["last reply to next round's first message"] = []
    for r in traced:
        ev = [n[r] for n in per_node if r in n and len(n[r]) == 4]
        nxt = [n[r + 1]["receiving"] for n in per_node if r + 1 in n and "receiving" in n[r + 1]]
        if len(ev) < 3:
            continue
        for name, (a, b) in spans.items():
            phase_rows[name].append(max(e[b] - e[a] for e in ev))
        last_reply = max(e["sent"] for e in ev)
        phase_rows["first message to last reply"].append(last_reply - min(e["receiving"] for e in ev))
        if nxt:
            phase_rows["last reply to next round's first message"].append(min(nxt) - last_reply)
    phases = {k: round(statistics.median(v), 3) for k, v in phase_rows.items() if v}

    cpu: dict[str, float] = {}
    if "start" in samples and "end" in samples:
        (t0, before), (t1, after) = samples["start"], samples["end"]
        for pid, (cmdline, seconds) in after.items():
            kind = _kind(cmdline, str(workdir))
            if kind is None or pid not in before:
                continue
            cpu[kind] = cpu.get(kind, 0.0) + seconds - before[pid][1]
        n = max(1, args.rounds - 1 - 2)
        cpu = {k: round(v / n, 3) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}
        cpu["all (per round)"] = round(sum(cpu.values()), 3)
        cpu["wall (per round)"] = round((t1 - t0) / n, 3)

    print(f"{row['supernode']} + {row['executor']}, SuperLink state {row['superlink_state']}: "
          f"round timer median {row['round_s_median']} s (rounds 2..{args.rounds})")
    print("phase (median over rounds 3..N-1, slowest client)       seconds")
    for name, value in phases.items():
        print(f"  {name:<52} {value:6.3f}")
    print("CPU seconds per round (rounds 3..N-1)")
    for name, value in cpu.items():
        print(f"  {name:<52} {value:6.3f}")
    print(json.dumps({"benchmark": "deploy_trace", **{k: row[k] for k in (
        "supernode", "executor", "superlink_state", "round_s_median", "rounds", "set")},
        "phases_s": phases, "cpu_s_per_round": cpu}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
