"""A Flower simulation across a Ray cluster: ``flwr run`` attached through ``RAY_ADDRESS``.

Starts a two-node Ray cluster on this machine, a head and a worker as separate
``ray start --block`` processes (1 CPU and a 100 MB object store each, each with its own
``--temp-dir`` and ports), then ``fedgraph-run .`` (``flwr run . --stream`` with an exit
status) against a fresh local SuperLink (its own ``FLWR_HOME``) whose environment
carries ``RAY_ADDRESS``: Flower's Ray backend calls ``ray.init()`` without an address,
which then joins the cluster instead of starting a private one. After the run it reads
Ray's actor table (the GCS keeps dead actors) and reports on which node each
``ClientAppActor`` ran. Everything it started is stopped in a ``finally``.

The worker node runs in its own mount namespace where the head's ``FLWR_HOME`` (the
unpacked FAB the simulation imports the apps from) is an empty folder, as on another
machine: there the ClientApps import ``fedgraph_flwr`` from the worker's own copy of the
project (here ``PYTHONPATH``), not from anything the head ships.

``--local-too`` also runs the same ``flwr run`` as a plain single-node simulation
(``RAY_ADDRESS=local``, ``init-args-num-cpus=2``: the same two ClientApps at once) on a
fresh local SuperLink, for seconds per round side by side.

The local SuperLink listens on Flower's fixed ports, so run it in a private network and
PID namespace (what ``tests/test_ray_cluster.py`` does):

    unshare -n -p -f --mount-proc --kill-child sh -c 'ip link set lo up; \\
        OMP_NUM_THREADS=1 python benchmarks/ray_cluster.py --data-root /tmp/gdata --local-too'

Prints a summary and one JSON line (``{"benchmark": "ray_cluster", ...}``); ``--json``
also writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "deploy"))
from local_cluster import copy_app  # noqa: E402, I001

ACTOR_CLASS = "ClientAppActor"  # Flower's simulation actor (flwr.simulation.ray_transport.ray_actor)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_ports() -> list[str]:
    """Explicit ports for the ones Ray would otherwise take at fixed defaults."""
    return [f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}"]


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process group of a ``ray start --block`` (it stops its node), then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def ancestors() -> set[int]:
    """This process and its parents (a shell whose command line names the work folder)."""
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def stop_marked(marker: str) -> list[int]:
    """SIGKILL every process whose environment or command line holds ``marker`` (a temp
    folder of this run: the local SuperLink, the simulation, stray Ray workers); nothing else."""
    killed, spare = [], ancestors()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) in spare:
            continue
        try:
            proc = Path("/proc", pid)
            found = marker.encode() in (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if found:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
            except ProcessLookupError:
                pass
    return killed


def wait_for_nodes(address: str, count: int, timeout: float) -> list[dict]:
    import ray

    deadline = time.monotonic() + timeout
    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:
        while True:
            alive = [n for n in ray.nodes() if n["Alive"]]
            if len(alive) >= count or time.monotonic() > deadline:
                return alive
            time.sleep(1.0)
    finally:
        ray.shutdown()


def actor_placement(address: str) -> tuple[list[dict], list[dict]]:
    """(nodes, ClientApp actors) from the cluster's GCS, dead actors included.

    ``ray.util.state.list_actors`` would say the same but needs the dashboard, which
    these nodes do not run; the GCS actor table is read through ``ray._private.state``."""
    import ray
    import ray._private.state

    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:
        nodes = [{"node_id": n["NodeID"], "alive": n["Alive"], "cpus": n["Resources"].get("CPU"),
                  "head": "node:__internal_head__" in n["Resources"]} for n in ray.nodes()]
        actors = [{"actor_id": a["ActorID"], "class": a["ActorClassName"], "state": a["State"],
                   "node_id": a["Address"]["NodeID"], "pid": a.get("Pid")}
                  for a in ray._private.state.actors().values()
                  if a["ActorClassName"].endswith(ACTOR_CLASS)]
        return nodes, actors
    finally:
        ray.shutdown()


def flwr_run(app: Path, run_config: str, federation_config: str, env: dict, log: Path,
             timeout: float) -> dict:
    """``fedgraph-run .`` (``flwr run . --stream`` with an exit status): seconds, status."""
    cmd = [sys.executable, "-m", "fedgraph_flwr.run", ".", "--run-config", run_config,
           "--federation-config", federation_config, "--stream"]
    t0 = time.perf_counter()
    with open(log, "w") as out:
        rc = subprocess.run(cmd, cwd=app, env=env, stdout=out, stderr=subprocess.STDOUT,
                            timeout=timeout).returncode
    return {"rc": rc, "wall_s": time.perf_counter() - t0, "log": str(log)}


def round_times(results: Path) -> list[float]:
    return [r["times"]["round"] for r in json.loads(results.read_text())["rounds"]]


def summary(run: dict, results: Path) -> dict:
    if results.is_file():
        times = round_times(results)
        run["round_s"] = times
        later = times[1:] or times
        run["median_round_s_after_first"] = statistics.median(later)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, help="holds Cora/raw (same path on every node)")
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--num-clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--object-store-memory", type=int, default=100_000_000)
    parser.add_argument("--timeout", type=float, default=300.0, help="per flwr run, seconds")
    parser.add_argument("--local-too", action="store_true",
                        help="also the same run as a single-node local simulation")
    parser.add_argument("--workdir", help="keep logs and outputs here (default: a temp folder, removed)")
    parser.add_argument("--json", help="also write the JSON summary to this file")
    args = parser.parse_args(argv)

    # Short paths: Ray's Unix sockets live under --temp-dir (107-byte limit).
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rc-", dir="/tmp")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    marker = str(work)
    app = copy_app(work / "app")
    out_dir = work / "outputs"
    port = free_port()
    address = f"127.0.0.1:{port}"
    base = {k: v for k, v in os.environ.items()
            if k not in ("RAY_ADDRESS", "FEDGRAPH_DATA_ROOT", "FLWR_HOME")}
    base.update({"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                 "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
                 "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"})
    node_args = ["--num-cpus=1", f"--object-store-memory={args.object_store_memory}",
                 "--disable-usage-stats", "--block"]
    run_config = (f"algorithm='{args.algorithm}' dataset='Cora' num-clients={args.num_clients} "
                  f"rounds={args.rounds} data-root='{Path(args.data_root).resolve()}' "
                  f"output-dir='{out_dir}'")
    report: dict = {"benchmark": "ray_cluster", "address": address, "workdir": marker,
                    "run_config": run_config}
    procs: list[subprocess.Popen] = []
    try:
        flwr_home = work / "flwr-home"
        flwr_home.mkdir()
        head = subprocess.Popen(
            ["ray", "start", "--head", f"--port={port}", "--include-dashboard=false",
             f"--ray-client-server-port={free_port()}", f"--temp-dir={work}/head", *node_ports(),
             *node_args],
            env=base, start_new_session=True, stdout=open(work / "head.log", "w"), stderr=subprocess.STDOUT)
        procs.append(head)
        # The worker: its own mount namespace, where the head's FLWR_HOME is empty (as on
        # another machine); the rest of the file system (the project, the data) is shared.
        worker_cmd = ["ray", "start", f"--address={address}", f"--temp-dir={work}/worker",
                      *node_ports(), *node_args]
        hide = ["unshare", "-m", "sh", "-c",
                f"mount -t tmpfs none '{flwr_home}' && exec \"$@\"", "sh"]
        can_hide = shutil.which("unshare") and subprocess.run(
            ["unshare", "-m", "sh", "-c", f"mount -t tmpfs none '{flwr_home}'"],
            capture_output=True).returncode == 0
        report["worker_sees_head_flwr_home"] = not can_hide
        time.sleep(3.0)  # the GCS first
        worker = subprocess.Popen([*(hide if can_hide else []), *worker_cmd], env=base,
                                  start_new_session=True, stdout=open(work / "worker.log", "w"),
                                  stderr=subprocess.STDOUT)
        procs.append(worker)
        alive = wait_for_nodes(address, 2, timeout=120.0)
        if len(alive) < 2:
            raise RuntimeError(f"the Ray cluster has {len(alive)} live node(s), not 2: see {work}/*.log")

        cluster_env = dict(base, RAY_ADDRESS=address, FLWR_HOME=str(flwr_home))
        federation = f"num-supernodes={args.num_clients} client-resources-num-cpus=1"
        cluster = flwr_run(app, f"{run_config} run-name='cluster'", federation, cluster_env,
                           work / "cluster.log", args.timeout)
        report["cluster"] = summary(cluster, out_dir / "cluster" / "results.json")
        report["results"] = str(out_dir / "cluster" / "results.json")
        nodes, actors = actor_placement(address)
        report["nodes"], report["actors"] = nodes, actors
        by_node = {n["node_id"]: 0 for n in nodes}
        for a in actors:
            by_node[a["node_id"]] = by_node.get(a["node_id"], 0) + 1
        report["actors_per_node"] = by_node
        report["nodes_with_clientapps"] = sum(1 for v in by_node.values() if v)
        stop_marked(str(flwr_home))  # this run's local SuperLink and simulation

        if args.local_too:
            local_home = work / "flwr-home-local"
            local_env = dict(base, RAY_ADDRESS="local", FLWR_HOME=str(local_home))
            local = flwr_run(app, f"{run_config} run-name='local'",
                             f"{federation} init-args-num-cpus=2", local_env, work / "local.log",
                             args.timeout)
            report["local"] = summary(local, out_dir / "local" / "results.json")
            stop_marked(str(local_home))
    finally:
        for proc in reversed(procs):
            stop_group(proc)
        report["stray_processes_killed"] = stop_marked(marker)

    c = report.get("cluster", {})
    print(f"cluster run: rc {c.get('rc')}, {c.get('wall_s', float('nan')):.1f}s wall, rounds "
          f"{', '.join(f'{t:.2f}s' for t in c.get('round_s', []))}")
    for node in report.get("nodes", []):
        print(f"  node {node['node_id'][:12]} ({'head' if node['head'] else 'worker'}): "
              f"{report['actors_per_node'].get(node['node_id'], 0)} {ACTOR_CLASS}(s)")
    if "local" in report:
        lo = report["local"]
        print(f"local run:   rc {lo['rc']}, {lo['wall_s']:.1f}s wall, rounds "
              f"{', '.join(f'{t:.2f}s' for t in lo.get('round_s', []))}")
    line = json.dumps(report)
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    ok = c.get("rc") == 0 and report.get("nodes_with_clientapps", 0) >= 2
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
