#!/usr/bin/env python3
"""Measure what the compose healthchecks are derived from (deploy/layout.py, "Healthchecks").

    python deploy/scripts/measure_health.py [--probes 10] [--stress 40 --stress-s 60]

Starts a loopback SuperLink as deploy/README runs it (TLS, SuperNode auth, its own
FLWR_HOME and free ports; deploy/local_cluster.py) and prints, as JSON:

- ``superlink_start``: wall and CPU seconds (the SuperLink's process, user + system)
  from its start to its health service answering SERVING;
- ``probe``: per probe (``python deploy/scripts/health_probe.py ADDRESS``, exactly the
  healthcheck's command), wall and CPU seconds (the probe process, user + system), the
  median and the largest;
- ``derived``: the healthcheck's ``timeout`` and ``start_period`` that deploy/layout.py
  computes from the CPU figures it holds, for the load it is designed for.

With ``--stress N`` the SuperLink starts and the probes run while N busy processes
(``stress-ng --cpu N``, else a Python busy loop per process) load the machine, once N
processes are runnable (the instantaneous load; the 1-minute average follows minutes
later): the check that the derived timeout and start period hold (tests/test_compose.py runs this). Exit 0 iff
every probe passed within the derived timeout and the SuperLink was SERVING within the
derived start period.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DEPLOY))
import layout as L  # noqa: E402
import local_cluster as cluster  # noqa: E402

PROBE = DEPLOY / "scripts" / "health_probe.py"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe_once(address: str, timeout: float) -> dict:
    """One healthcheck as compose runs it: its wall and CPU seconds, and whether it passed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, str(PROBE), address, "--timeout",
                              f"{L.healthcheck_timing()['rpc_timeout_s']:g}"],
                             capture_output=True, text=True, timeout=timeout)
        passed, said = out.returncode == 0, out.stdout.strip() or out.stderr.strip()[-200:]
    except subprocess.TimeoutExpired:
        passed, said = False, f"killed after {timeout:g} s (compose's timeout)"
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "passed": passed, "said": said}


def start_stress(workers: int) -> subprocess.Popen:
    """``workers`` CPU-bound processes, in their own process group (stopped by its id)."""
    if shutil.which("stress-ng"):
        cmd = ["stress-ng", "--cpu", str(workers), "--cpu-method", "int64", "--quiet"]
    else:
        cmd = [sys.executable, "-c", "import multiprocessing as m, sys\n"
               "def spin(_):\n    while True: pass\n"
               f"m.Pool({workers}).map(spin, range({workers}))"]
    return subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def runnable() -> int:
    """Processes runnable now (/proc/loadavg's 4th field, ``running/total``): the
    instantaneous load, which the 1-minute average follows only after minutes."""
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])


def wait_for_load(target: int, limit_s: float) -> int:
    """Until ``target`` processes are runnable (or ``limit_s`` passes); returns the most seen."""
    deadline, seen = time.time() + limit_s, 0
    while time.time() < deadline:
        seen = max(seen, runnable())
        if seen >= target:
            break
        time.sleep(0.2)
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--stress", type=int, default=0, help="busy processes during the probes")
    parser.add_argument("--stress-s", type=float, default=30.0,
                        help="most seconds to wait for --stress processes to be runnable")
    args = parser.parse_args(argv)
    timing = L.healthcheck_timing()
    work = Path(tempfile.mkdtemp(prefix="fedgraph-health-"))
    dep = cluster.LocalDeployment(work / "cluster")
    stress = None
    report: dict = {"cores": os.cpu_count(), "designed_for": {
        "load": L.HEALTHCHECK_LOAD, "cores": L.HEALTHCHECK_CORES}, "derived": timing}
    try:
        dep.make_tls()
        if args.stress:  # the SuperLink starts under the load too (compose's start_period)
            stress = start_stress(args.stress)
            report["runnable_before_start"] = wait_for_load(args.stress, args.stress_s)
        t0 = time.perf_counter()
        dep.start_superlink()
        pid = dep.procs["superlink"].pid
        while not probe_once(dep.health["superlink"], 120.0)["passed"]:
            time.sleep(0.2)
        report["superlink_start"] = {"wall_s": round(time.perf_counter() - t0, 2),
                                     "cpu_s": round(cpu_seconds(pid), 2)}
        probes, seen = [], []
        for _ in range(args.probes):
            seen.append(runnable())
            probes.append(probe_once(dep.health["superlink"], timing["timeout_s"]))
        if stress is not None:
            report["runnable_during_probes"] = {"min": min(seen), "median": statistics.median(seen)}
            report["loadavg_1min_after"] = round(os.getloadavg()[0], 1)
        walls, cpus = [p["wall_s"] for p in probes], [p["cpu_s"] for p in probes]
        report["probe"] = {"wall_s_median": statistics.median(walls), "wall_s_max": max(walls),
                           "cpu_s_median": statistics.median(cpus), "cpu_s_max": max(cpus),
                           "passed": sum(p["passed"] for p in probes), "of": len(probes),
                           "failures": [p["said"] for p in probes if not p["passed"]]}
    finally:
        if stress is not None:
            os.killpg(stress.pid, signal.SIGKILL)
            stress.wait()
        dep.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=1))
    started = report["superlink_start"]["wall_s"] <= timing["start_period_s"]
    return 0 if report["probe"]["passed"] == report["probe"]["of"] and started else 1


if __name__ == "__main__":
    sys.exit(main())
