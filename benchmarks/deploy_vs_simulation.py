"""Seconds per round of the same run in a Flower simulation and in deployments, side by side.

    python benchmarks/deploy_vs_simulation.py [--rounds 10] [--partitions DIR]

One invocation, the same run everywhere (FedAux, hidden 256, 3 clients on the reference
code's Cora files client_0..2, the deploy README's ``client-state="file"``), one after
another on this machine:

- ``simulation``: ``fedgraph-run .`` with ``partition=files`` on a local SuperLink of its
  own: a private ``FLWR_HOME`` and free ports (``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``,
  ``FLWR_LOCAL_CONTROL_API_PORT``; flwr's defaults 39091/39093 would reach another
  user's local SuperLink already there), 3 simulated SuperNodes, one CPU each; stopped
  afterwards;
- ``loopback, fedgraph-*``: benchmarks/deploy_round.py (TLS, SuperNode auth, process
  isolation; ``fedgraph-supernode`` + ``fedgraph-superexec``);
- ``loopback, stock flower-*``: the same with ``--stock-flower``;
- ``containers``: deploy/scripts/compose_smoke.sh's per-round seconds where Docker runs
  here and ``--containers`` is given (``--torch-wheels DIR`` where PyTorch's index is out
  of reach); otherwise the row says why it is missing.

Data: ``--partitions DIR`` holds ``client_0.npz``..``client_2.npz``; the default is the
reference code's Cora files, ``../shared/reference-partitions/fedaux-cora-disjoint-10``
beside the checkout. Without them, make a folder with ``FEDGRAPH_DATA_ROOT=/path/to/datasets
python -m fedgraph_flwr.partition --dataset Cora --num-clients 3 --export DIR --format npz``
(other files: other figures than docs/performance.md's).

Each figure is the median of ``results.json``'s round timer over rounds 2..N (round 1
includes first contact). Prints a Markdown table and one JSON line per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from flwr_run_rounds import stop_superlink  # noqa: E402

DEFAULT_PARTITIONS = ROOT.parent / "shared" / "reference-partitions" / "fedaux-cora-disjoint-10"
CLIENTS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _median_after_first(results: Path) -> dict:
    rounds = json.loads(results.read_text())["rounds"]
    timer = [r["times"]["round"] for r in rounds]
    return {"round_s_median": round(statistics.median(timer[1:]), 3),
            "round_s_min": round(min(timer[1:]), 3), "round_s_max": round(max(timer[1:]), 3),
            "round1_s": round(timer[0], 3)}


def simulation(rounds: int, partitions: Path, work: Path) -> dict:
    folder = work / "three-clients"
    folder.mkdir(parents=True)
    for i in range(CLIENTS):
        shutil.copy(partitions / f"client_{i}.npz", folder)
    home = str(work / "flwr-home")
    env = dict(os.environ, FLWR_HOME=home, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
               FLWR_LOCAL_CONTROL_API_PORT=str(free_port()))
    env.pop("FEDGRAPH_DATA_ROOT", None)
    run_config = (f"algorithm='fedaux' num-clients={CLIENTS} rounds={rounds} hidden=256 "
                  f"partition='files' partition-dir='{folder}' client-state='file' "
                  f"client-state-dir='{work / 'state'}' output-dir='{work / 'out'}' "
                  f"run-name='sim'")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fedgraph_flwr.run", ".", "--run-config", run_config,
             "--federation-config", f"num-supernodes={CLIENTS} client-resources-num-cpus=1"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900 + 30 * rounds)
    finally:
        stop_superlink(home)
    results = work / "out" / "sim" / "results.json"
    if proc.returncode != 0 or not results.is_file():
        raise SystemExit(f"simulation: exit {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-1500:]}")
    return {"variant": "simulation (Ray, 3 simulated SuperNodes)",
            **_median_after_first(results), "wall_s": round(time.perf_counter() - t0, 1)}


def loopback(rounds: int, partitions: Path, stock: bool) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "deploy_round.py"), "--rounds", str(rounds),
           "--clients", str(CLIENTS), "--partitions", str(partitions),
           "--set", 'client-state="file"', *(["--stock-flower"] if stock else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800 + 60 * rounds)
    line = next((x for x in proc.stdout.splitlines() if x.startswith('{"benchmark"')), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"deploy_round {'--stock-flower' if stock else ''}: exit "
                         f"{proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    row = json.loads(line)
    name = "loopback, stock flower-supernode + flower-superexec" if stock else \
        "loopback, fedgraph-supernode + fedgraph-superexec"
    return {"variant": name, **{k: row[k] for k in ("round_s_median", "round_s_min",
                                                    "round_s_max", "round1_s")},
            "wall_s": round(time.perf_counter() - t0, 1)}


def containers(rounds: int, partitions: Path, enabled: bool, torch_wheels: Path | None) -> dict:
    why = ""
    if not enabled:
        why = "not run (--containers not given)"
    elif subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        why = "not run: no Docker daemon answers here"
    if why:
        return {"variant": "containers (docker compose)", "missing": why}
    t0 = time.perf_counter()
    # compose_smoke.sh takes the reference files from ../shared (the default --partitions).
    wheels = ["--torch-wheels", str(torch_wheels)] if torch_wheels else []
    proc = subprocess.run(["bash", str(ROOT / "deploy" / "scripts" / "compose_smoke.sh"),
                           "--rounds", str(rounds), *wheels],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600)
    line = next((x for x in proc.stdout.splitlines() if "seconds per round:" in x), "")
    if proc.returncode != 0 or not line:
        return {"variant": "containers (docker compose)",
                "missing": f"compose_smoke.sh failed (exit {proc.returncode})"}
    timer = [float(x) for x in line.split("seconds per round:", 1)[1].split("(", 1)[0].split()]
    return {"variant": "containers (docker compose)",
            "round_s_median": round(statistics.median(timer[1:]), 3),
            "round_s_min": round(min(timer[1:]), 3), "round_s_max": round(max(timer[1:]), 3),
            "round1_s": round(timer[0], 3), "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--partitions", type=Path, default=DEFAULT_PARTITIONS)
    parser.add_argument("--containers", action="store_true",
                        help="also run deploy/scripts/compose_smoke.sh (needs Docker and the images)")
    parser.add_argument("--torch-wheels", type=Path, default=None,
                        help="compose_smoke.sh --torch-wheels: a folder with a CPU torch wheel")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is not timed)")
    missing = [i for i in range(CLIENTS) if not (args.partitions / f"client_{i}.npz").is_file()]
    if missing:
        parser.error(f"{args.partitions} lacks client_{missing[0]}.npz: pass --partitions DIR "
                     f"with client_0..{CLIENTS - 1}.npz (default: the reference code's Cora "
                     f"files in ../shared/reference-partitions/fedaux-cora-disjoint-10), or make "
                     f"them: FEDGRAPH_DATA_ROOT=/path/to/datasets python -m "
                     f"fedgraph_flwr.partition --dataset Cora --num-clients {CLIENTS} "
                     f"--export DIR --format npz")
    work = Path(tempfile.mkdtemp(prefix="deploy-vs-sim-"))
    rows = []
    try:
        rows.append(simulation(args.rounds, args.partitions, work))
        rows.append(loopback(args.rounds, args.partitions, stock=False))
        rows.append(loopback(args.rounds, args.partitions, stock=True))
        rows.append(containers(args.rounds, args.partitions, args.containers, args.torch_wheels))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sim = rows[0]["round_s_median"]
    print(f"| variant ({args.rounds} rounds, FedAux, 3 Cora clients) | s/round (median, rounds 2..N) "
          f"| min | max | × simulation |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        if "missing" in row:
            print(f"| {row['variant']} | {row['missing']} | | | |")
        else:
            print(f"| {row['variant']} | {row['round_s_median']:.2f} | {row['round_s_min']:.2f} | "
                  f"{row['round_s_max']:.2f} | {row['round_s_median'] / sim:.1f} |")
    for row in rows:
        print(json.dumps({"benchmark": "deploy_vs_simulation", "rounds": args.rounds, **row}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
