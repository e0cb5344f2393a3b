"""Seconds per round of a real deployment on 127.0.0.1 (SuperLink, SuperNodes, executors).

Starts ``deploy/local_cluster.py``'s processes (TLS, SuperNode auth, process isolation,
the command lines of deploy/README.md) on one client file each, runs ``flwr run`` for
``--rounds`` rounds and reads ``rounds[*].times`` from results.json. Variants:

- default: ``fedgraph-supernode`` + ``fedgraph-superexec`` (polls capped, forked ClientApps);
- ``--stock-flower``: ``flower-supernode`` + ``flower-superexec`` with the same flags;
- ``--in-memory-state``: the SuperLink without ``--database`` (Flower keeps state in memory).

    python benchmarks/deploy_round.py --rounds 10
    python benchmarks/deploy_round.py --rounds 10 --stock-flower
    python benchmarks/deploy_round.py --rounds 10 --in-memory-state

Round 1 includes the ServerApp's first contact with each node, so the median is over
rounds 2..N. Prints a table and one JSON line (``{"benchmark": "deploy_round", ...}``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "deploy"))
import layout as L  # noqa: E402
import local_cluster  # noqa: E402

DEFAULT_PARTITIONS = ROOT.parent / "shared" / "reference-partitions" / "fedaux-cora-disjoint-10"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=Path, default=DEFAULT_PARTITIONS,
                        help="folder with client_<i>.npz (default: the reference Cora files)")
    parser.add_argument("--clients", type=int, default=L.NUM_SUPERNODES)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--algorithm", default="fedaux")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more run-config entries, as flwr run --run-config takes them")
    parser.add_argument("--stock-flower", action="store_true")
    parser.add_argument("--in-memory-state", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None, help="kept if given (logs)")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is not timed)")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fedgraph-deploy-bench-"))
    files = []
    for i in range(args.clients):
        src = args.partitions / L.partition_file_name(i)
        if not src.is_file():
            parser.error(f"{src} not found")
        owner = workdir / f"owner-{i}"
        owner.mkdir(parents=True, exist_ok=True)
        files.append(Path(shutil.copy(src, owner)))
    dep = local_cluster.LocalDeployment(workdir / "cluster",
                                        superlink_database=not args.in_memory_state,
                                        stock_flower=args.stock_flower)
    try:
        t0 = time.perf_counter()
        dep.up(files)
        startup = time.perf_counter() - t0
        run_config = (f'algorithm="{args.algorithm}" num-clients={args.clients} '
                      f'rounds={args.rounds} hidden={args.hidden} round-timeout=300.0 '
                      f'output-dir="{workdir / "outputs"}" run-name="bench" ' + " ".join(args.set))
        t0 = time.perf_counter()
        out = dep.flwr_run(run_config, timeout=600 + 60 * args.rounds)
        wall = time.perf_counter() - t0
        results_file = workdir / "outputs" / "bench" / "results.json"
        if out.returncode != 0 or not results_file.is_file():
            print(out.stdout[-3000:], out.stderr[-2000:], file=sys.stderr)
            return 1
        rounds = json.loads(results_file.read_text())["rounds"]
    finally:
        dep.stop_all()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    per_round = [r["times"]["round"] for r in rounds]
    client_compute = [max((c.get("train", 0.0) for c in r.get("client_times", {}).values()),
                          default=0.0) for r in rounds]
    row = {
        "benchmark": "deploy_round", "algorithm": args.algorithm, "clients": args.clients,
        "hidden": args.hidden, "rounds": args.rounds, "set": " ".join(args.set),
        "supernode": "flower-supernode" if args.stock_flower else "fedgraph-supernode",
        "executor": "flower-superexec" if args.stock_flower else "fedgraph-superexec",
        "superlink_state": "memory" if args.in_memory_state else "sqlite file",
        "round_s_median": round(statistics.median(per_round[1:]), 3),
        "round_s_min": round(min(per_round[1:]), 3), "round_s_max": round(max(per_round[1:]), 3),
        "round1_s": round(per_round[0], 3),
        "slowest_client_compute_s_median": round(statistics.median(client_compute[1:]), 3),
        "cluster_startup_s": round(startup, 1), "flwr_run_wall_s": round(wall, 1),
    }
    print(f"{'supernode':<19} {'executor':<19} {'SuperLink state':<15} "
          f"{'s/round (median)':>16} {'min':>6} {'max':>6} {'client s':>8}")
    print(f"{row['supernode']:<19} {row['executor']:<19} {row['superlink_state']:<15} "
          f"{row['round_s_median']:>16.2f} {row['round_s_min']:>6.2f} {row['round_s_max']:>6.2f} "
          f"{row['slowest_client_compute_s_median']:>8.3f}")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
