"""Seconds from ``flwr run`` to the one-line config error, in a real local simulation.

For each of a newcomer's five mistakes (issue #81: the federation's size, an algorithm's
name, a missing ``config-file``, an empty data root with ``download=false``, a misspelt
key) and a misspelt key inside a ``config-file``, it runs
``flwr run . --run-config <cfg> --stream --federation-config <README's: 10 SuperNodes>``
against the local SuperLink (started once, by a first run that is not counted, with its
state in a private FLWR_HOME) and reports when the ``fedgraph-flwr: error:`` line
appeared, whether a traceback or a ClientApp (a Ray actor) showed up, when the command
returned and with what exit status. Flower rejects an unknown key itself, before any of our code runs
(``[code: 15] Invalid run configuration``, without the key's name); in a ``config-file``
our check names it. Each case is timed twice: with ``flwr run`` and with ``fedgraph-run``
(same arguments), which checks the run config before it submits anything.

Run it where the local SuperLink's ports are free, e.g. in a private network namespace:

    unshare -n sh -c 'ip link set lo up; python benchmarks/config_error_latency.py'

Prints a table and one JSON line (``{"benchmark": "config_error_latency", ...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flwr_run_rounds import stop_superlink  # this folder is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
#: The mistakes, by name; ``{empty}`` is an empty folder, ``{typo}`` a config file with a misspelt key.
CASES = {
    "num-supernodes != num-clients": "num-clients=5",
    "unknown algorithm": "algorithm='FedIHH'",
    "missing config-file": "config-file='configs/fediih/cora-disjont-10.yaml'",
    "empty data root, download=false": "data-root='{empty}' download=false",
    "misspelt key": "fedaux-sigmaa=2",
    "misspelt key in a config-file": "config-file='{typo}'",
}
MARKERS = ("fedgraph-flwr: error:", "Invalid run configuration")
FEDERATION = "num-supernodes=10 client-resources-num-cpus=1"  # README's


COMMANDS = ("flwr run", "fedgraph-run")


#: How each command is run: fedgraph-run as a module, so that this checkout's code runs
#: (the console script imports wherever the project was installed from).
ARGV = {"flwr run": ["flwr", "run"], "fedgraph-run": [sys.executable, "-m", "fedgraph_flwr.run"]}


def timed_run(run_config: str, env: dict[str, str], timeout: float, command: str = "flwr run"
              ) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen([*ARGV[command], ".", "--run-config", run_config, "--stream",
                             "--federation-config", FEDERATION],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first, line_seen, lines, traceback, actor = None, "", 0, False, False
    try:
        for line in proc.stdout:
            lines += 1
            traceback |= line.startswith("Traceback")
            actor |= "ClientAppActor" in line
            if first is None and any(m in line for m in MARKERS):
                first, line_seen = time.perf_counter() - t0, line.strip(" │\n")
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
    return {"command": command, "run_config": run_config, "error_line_s": first, "error_line": line_seen,
            "exit_s": time.perf_counter() - t0, "exit_status": proc.returncode, "lines": lines,
            "traceback": traceback, "clientapp_started": actor}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    home = tempfile.mkdtemp(prefix="flwr-home-")
    env = dict(os.environ, FLWR_HOME=home, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    subprocess.run(["flwr", "federation", "simulation-config", "@none/default", "local",
                    "--num-supernodes", "10", "--client-resources-num-cpus", "1"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    typo = Path(home) / "typo.yaml"
    typo.write_text("algorithm: fedaux\nfedaux-sigmaa: 2\n")
    empty = Path(home) / "empty-data-root"
    empty.mkdir()
    timed_run("rounds=1 num-clients=5", env, args.timeout)  # starts the local SuperLink; not counted
    rows = []
    for mistake, case in CASES.items():
        for command in COMMANDS:
            row = timed_run(case.format(empty=empty, typo=typo), env, args.timeout, command)
            rows.append({"mistake": mistake, **row})
    print(f"load average before / after: {load} / {os.getloadavg()}")
    print(f"{'mistake':32} {'command':13} {'error line':>10} {'exit':>7} {'rc':>3} {'lines':>5} "
          f"{'tb':>3} {'actor':>5}  line")
    for r in rows:
        seen = f"{r['error_line_s']:.1f}s" if r["error_line_s"] is not None else "none"
        print(f"{r['mistake']:32} {r['command']:13} {seen:>10} {r['exit_s']:6.1f}s "
              f"{r['exit_status']!s:>3} {r['lines']:>5} {'yes' if r['traceback'] else 'no':>3} "
              f"{'yes' if r['clientapp_started'] else 'no':>5}  {r['error_line'][:110]}")
    print(json.dumps({"benchmark": "config_error_latency", "load_average": [load, os.getloadavg()],
                      "rows": rows}))
    stop_superlink(home)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
