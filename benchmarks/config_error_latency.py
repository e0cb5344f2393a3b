"""Seconds from ``flwr run`` to the one-line config error, in a real local simulation.

For each bad run config it runs ``flwr run . --run-config <cfg> --stream`` against the
local SuperLink (started once, by a first run, with its state in a private FLWR_HOME)
and reports when the ``fedgraph-flwr: error:`` line appeared, the line itself, when
``flwr run`` returned and with what exit status. Flower rejects an unknown key itself,
before any of our code runs (``[code: 15] Invalid run configuration``, without the key's
name); in a ``config-file`` our check names it. Each case is timed twice: with
``flwr run`` and with ``fedgraph-run`` (same arguments), which checks the run config
before it submits anything.

Run it where the local SuperLink's ports are free, e.g. in a private network namespace:

    unshare -n sh -c 'ip link set lo up; python benchmarks/config_error_latency.py'

Prints a table and one JSON line (``{"benchmark": "config_error_latency", ...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from flwr_run_rounds import stop_superlink  # this folder is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
CASES = (
    "fedaux-sigma=-1",
    # (was fedspray-kd-threshold=1.5, now a profile switch that --run-config cannot set)
    "algorithm='fedspray' fedspray-lambda1=-1.0",
    "algorithm='fedaux' fedpub-tau=5.0",
    "fedaux-sigmaa=2",
)
MARKERS = ("fedgraph-flwr: error:", "Invalid run configuration")


COMMANDS = ("flwr run", "fedgraph-run")


def timed_run(run_config: str, env: dict[str, str], timeout: float, command: str = "flwr run"
              ) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen([*command.split(), ".", "--run-config", run_config, "--stream"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first, line_seen = None, ""
    try:
        for line in proc.stdout:
            if first is None and any(m in line for m in MARKERS):
                first, line_seen = time.perf_counter() - t0, line.strip(" │\n")
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
    return {"command": command, "run_config": run_config, "error_line_s": first, "error_line": line_seen,
            "exit_s": time.perf_counter() - t0, "exit_status": proc.returncode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    home = tempfile.mkdtemp(prefix="flwr-home-")
    env = dict(os.environ, FLWR_HOME=home, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    subprocess.run(["flwr", "federation", "simulation-config", "@none/default", "local",
                    "--num-supernodes", "10", "--client-resources-num-cpus", "1"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    typo = Path(home) / "typo.yaml"
    typo.write_text("algorithm: fedaux\nfedaux-sigmaa: 2\n")
    timed_run(CASES[0], env, args.timeout)  # starts the local SuperLink; not counted
    rows = [timed_run(case, env, args.timeout, command)
            for case in (*CASES, f"config-file='{typo}'") for command in COMMANDS]
    print(f"{'command':13} {'run config':50} {'error line':>10} {'exit':>7} {'status':>6}  line")
    for r in rows:
        seen = f"{r['error_line_s']:.1f}s" if r["error_line_s"] is not None else "none"
        print(f"{r['command']:13} {r['run_config']:50} {seen:>10} {r['exit_s']:6.1f}s "
              f"{r['exit_status']!s:>6}  {r['error_line'][:90]}")
    print(json.dumps({"benchmark": "config_error_latency", "rows": rows}))
    stop_superlink(home)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
