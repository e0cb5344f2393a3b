"""A simulation across a Ray cluster (docs/running.md, "Simulation across machines").

The ``simulation`` test runs ``benchmarks/ray_cluster.py`` in a private network and PID
namespace: a Ray head and a Ray worker as separate processes (1 CPU, 100 MB object
store each; the worker cannot see the head's FLWR_HOME, as on another machine), then
``flwr run .`` (through ``fedgraph-run``) on a fresh local SuperLink started with
``RAY_ADDRESS`` pointing at the head. It checks that the run completed, that Flower's
ClientApp actors ran on both nodes (Ray's actor table, and the handshake's own line) and
that every client's metrics equal the same federation run in process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fedgraph_flwr.engine.flower_transport import nodes_note

from helpers import round_metrics

ROOT = Path(__file__).resolve().parents[1]
UNSHARE = ["unshare", "-n", "-p", "-f", "--mount-proc", "--kill-child"]


def _can_unshare() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip") or not shutil.which("ray"):
        return False
    probe = subprocess.run([*UNSHARE, "sh", "-c", "ip link set lo up"], capture_output=True)
    return probe.returncode == 0


def test_nodes_note_only_on_a_cluster():
    one = [{"ray-node": "a" * 56, "ray-actor": f"x{i % 2}"} for i in range(4)]
    assert nodes_note(one) is None
    assert nodes_note([{}, {}]) is None  # not a simulation
    two = [{"ray-node": ("a" if i % 2 else "b") * 56, "ray-actor": f"x{i % 2}"} for i in range(4)]
    assert nodes_note(two) == ("fedgraph-flwr: the handshake's 4 ClientApps ran in 2 actors on 2 "
                               f"Ray nodes: {'a' * 12}, {'b' * 12}")


@pytest.mark.simulation
@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare(), reason="needs unshare -n -p (root or user namespaces) and ray")
def test_flwr_run_on_a_two_node_ray_cluster(data_root, one_torch_thread):
    from fedgraph_flwr.engine.loop import run_federation

    # A short folder: Ray's Unix sockets live under the nodes' --temp-dir.
    work = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    try:
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        env.pop("RAY_ADDRESS", None)
        script = (f"ip link set lo up; exec {sys.executable} {ROOT / 'benchmarks' / 'ray_cluster.py'} "
                  f"--data-root '{data_root}' --workdir '{work / 'w'}' --json '{work / 'report.json'}' "
                  f"--rounds 3 --num-clients 4")
        proc = subprocess.run([*UNSHARE, "sh", "-c", script], env=env, capture_output=True, text=True,
                              timeout=480)
        log = work / "w" / "cluster.log"
        shown = (f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n--- cluster.log\n"
                 f"{log.read_text()[-4000:] if log.is_file() else '(none)'}")
        report = json.loads((work / "report.json").read_text())
        assert report["cluster"]["rc"] == 0, shown
        assert report["worker_sees_head_flwr_home"] is False, shown  # the worker as elsewhere

        # Both nodes of the cluster held ClientApp actors (dead now: the run is over).
        nodes = report["nodes"]
        assert len(nodes) == 2 and sum(n["head"] for n in nodes) == 1, shown
        assert all(n["cpus"] == 1.0 for n in nodes), shown
        per_node = report["actors_per_node"]
        assert sorted(per_node) == sorted(n["node_id"] for n in nodes), shown
        assert all(per_node[n["node_id"]] >= 1 for n in nodes), shown
        # ... and ClientApps answered from both (the handshake's line names the nodes).
        text = log.read_text()
        assert "ClientApps ran in 2 actors on 2 Ray nodes" in text, shown
        for n in nodes:
            assert n["node_id"][:12] in text, shown

        # The same federation in process: every client's metrics equal, every round.
        flower = json.loads(Path(report["results"]).read_text())
        assert [r["round"] for r in flower["rounds"]] == [1, 2, 3], shown
        assert all(len(r["clients"]) == 4 and not r["failures"] for r in flower["rounds"]), shown
        config = {"algorithm": "fedavg", "dataset": "Cora", "num-clients": 4, "rounds": 3,
                  "data-root": str(data_root), "output-dir": str(work / "inproc"), "run-name": "inproc"}
        inproc = run_federation(config, write=False)
        assert round_metrics(flower) == round_metrics(inproc)
        print(f"\ncluster run: {report['cluster']['wall_s']:.1f}s wall, rounds "
              f"{', '.join(f'{t:.2f}s' for t in report['cluster']['round_s'])}; actors per node "
              f"{ {k[:12]: v for k, v in per_node.items()} }")
    finally:
        shutil.rmtree(work, ignore_errors=True)
