"""A real deployment on 127.0.0.1: SuperLink + 3 SuperNodes as separate processes.

TLS on, SuperNode authentication on, a temporary FLWR_HOME (never the user's
~/.flwr), free ports, and the exact command lines of deploy/layout.py (those
deploy/README.md gives for N machines and deploy/docker-compose.yml runs), started
by deploy/local_cluster.py. ``flwr run`` submits the app from a temporary copy of
the project (flwr 1.41 rewrites a pyproject.toml that still has
``[tool.flwr.federations]``; the test must never touch the repository).

Checks: 2 rounds with 3 clients on the reference Cora files reach results.json;
a SuperNode with an unregistered key is refused; a SuperNode killed in the middle of
local training, and again while the server aggregates, costs each round at most
``round-timeout`` + 5 s, its reason is recorded, and once restarted it trains again
on the server's personalized payload; a SIGTERMed ``fedgraph-superexec`` with a
ClientApp in flight leaves no process behind within 5 s; a ServerApp killed at a
random round is restarted by fedgraph-run, resumes and ends as an uninterrupted run; a SuperNode
whose file is missing or has another feature width stops the run at the handshake
with a message naming the problem; a forked ClientApp that asks for its message before
its SuperNode has stored it waits for it; a data owner whose ClientApp executor tampers
with its replies (update x100, then num-train NaN) is named in every round's record and
report under robust=median, the run completes and the honest clients train as in an honest
run (and without robust, the same owner takes the model over). Every process started here
is stopped (its whole process group) in the fixture's ``finally``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import through_the_guard

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
NUM_CLIENTS = 3
INTRUDER = "intruder"  # a key pair that is never registered
RUN_TIMEOUT = 420  # generous: ClientApp processes start per message; slow on a loaded 2-core box


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# SuperLink, SuperNodes and `flwr run` as processes: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.deploy, pytest.mark.slow]

L = _load("layout", DEPLOY / "layout.py")
cluster = _load("deploy_local_cluster", DEPLOY / "local_cluster.py")


def algorithm_under_test() -> str:
    from fedgraph_flwr.algorithms import ALGORITHMS

    return "fedaux" if "fedaux" in ALGORITHMS else "fedavg"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, reference_partitions):
    """SuperLink + ServerApp executor; 3 registered SuperNodes + executors; 1 intruder."""
    tmp = tmp_path_factory.mktemp("deploy")
    owners = []  # each data owner's own copy of its file
    for i in range(NUM_CLIENTS + 1):
        folder = tmp / f"owner-{i}"
        folder.mkdir()
        shutil.copy(reference_partitions / L.partition_file_name(i), folder)
        owners.append(folder / L.partition_file_name(i))
    dep = cluster.LocalDeployment(tmp / "cluster")
    try:
        dep.up(owners[:NUM_CLIENTS])
        # Same command line as the others, but its key was never registered.
        dep.make_keys([INTRUDER])
        dep.start_supernode(INTRUDER, owners[NUM_CLIENTS], executor=None, partition_id=NUM_CLIENTS)
        dep.app = cluster.copy_app(tmp / "app")
        dep.owners = owners
        dep.tmp = tmp
        yield dep
    finally:
        dep.stop_all()


def flwr_run(dep, run_name: str, extra: dict | None = None, timeout: float = RUN_TIMEOUT):
    """deploy/README's run command, ``fedgraph-run <app> fedgraph --run-config ... --stream``
    (``flwr run`` with the run's outcome as exit status); returns (process, results or None)."""
    cfg = {"algorithm": algorithm_under_test(), "num-clients": NUM_CLIENTS, "hidden": 32,
           "output-dir": str(dep.tmp / "outputs"), "run-name": run_name, **(extra or {})}
    run_config = " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={str(v).lower()}"
                          if isinstance(v, bool) else f"{k}={v}" for k, v in cfg.items())
    t0 = time.perf_counter()
    out = subprocess.run(L.run_cmd(app=str(dep.app), run_config=run_config), cwd=dep.tmp,
                         env=dep.env, capture_output=True, text=True, timeout=timeout)
    out.elapsed = time.perf_counter() - t0
    path = dep.tmp / "outputs" / run_name / "results.json"
    return out, (json.loads(path.read_text()) if path.is_file() else None)


def _context(dep, out) -> str:
    return (f"flwr run ({out.elapsed:.0f}s):\n{out.stdout[-4000:]}\n{out.stderr[-1500:]}\n"
            f"serverapp executor:\n{dep.log(L.SERVERAPP_EXECUTOR)[-2000:]}")


def test_unregistered_supernode_is_refused(deployment):
    dep = deployment
    intruder = dep.procs[INTRUDER]
    try:
        intruder.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the unregistered SuperNode is still running:\n{dep.log(INTRUDER)[-2000:]}")
    assert intruder.returncode != 0
    assert "Failed to activate SuperNode" in dep.log(INTRUDER)
    assert "No SuperNode found with the given public key" in dep.log("superlink")
    listed = json.loads(cluster.check_call(
        ["flwr", "supernode", "list", L.CONNECTION, "--format", "json"], dep.env))
    nodes = listed["nodes"]
    assert len(nodes) == NUM_CLIENTS and all(n["status"] == "online" for n in nodes), nodes


def test_two_rounds_through_flwr_run(deployment):
    dep = deployment
    out, results = flwr_run(dep, "deploy-e2e", {"rounds": 2, "round-timeout": 300.0})
    assert out.returncode == 0 and results is not None, _context(dep, out)
    assert results["config"]["algorithm"] == algorithm_under_test()
    assert sorted(results["clients"]) == ["0", "1", "2"]  # the intruder's client_3 never appears
    for cid, facts in results["clients"].items():
        with np.load(dep.owners[int(cid)]) as f:
            assert facts["num-nodes"] == f["x"].shape[0]
            assert facts["num-train"] == int(f["train_mask"].sum())
    assert results["num_features"] == 1433
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert sorted(r["clients"]) == ["0", "1", "2"] and not r["failures"] and not r["void"]
        assert all(b > 0 for b in r["bytes_received"].values())
        assert all(math.isfinite(m["train_loss"]) for m in r["clients"].values())
    assert 0.0 < results["final"]["test_at_best_val"] <= 100.0
    per_round = [r["times"]["round"] for r in rounds]
    print(f"\nloopback deployment ({results['config']['algorithm']}, {NUM_CLIENTS} clients, Cora): "
          f"per-round {', '.join(f'{t:.2f}s' for t in per_round)}; flwr run {out.elapsed:.1f}s")
    dep.round_time = max(per_round)
    # Flower's health service answers where README's flags start it; the SuperLink also
    # writes its own (rotating) log file.
    assert dep.healthy("superlink") and dep.healthy(L.supernode_name(0))
    assert "Starting Flower SuperLink" in (dep.logs / "superlink-flower.log").read_text()


#: Every registered method, 3 rounds each through the same deployment (the main test above
#: runs :func:`algorithm_under_test` for longer). Where a method has stages, they are
#: shortened so that all of them happen within 3 rounds. FedGNN's expansion needs global
#: node ids, which the reference client files do not carry: here it runs with the
#: expansion off (its Flower path with the expansion on: tests/test_fedgnn.py's simulation).
#: FedSage+'s state (its generator and two Adam optimizers, 177 MiB per client) stays on the
#: owner's machine (client-state="file", as deploy/README advises for large states): under
#: client-state="context" it would travel between SuperNode and ClientApp with every message.
STAGES_WITHIN_THREE_ROUNDS = {
    "fedgnn": {"fedgnn-expand": False},
    "fedsage": {"fedsage-gen-rounds": 1, "fedsage-pretrain-epochs": 2, "client-state": "file"},
    "adafgl": {"adafgl-rounds-step1": 1, "adafgl-epochs": 5},
    # the deployment's client files carry no global node ids (they go to other machines)
    "fedgl": {"fedgl-node-ids": "local", "fedgl-threshold": 0.0},
    # nor their halo: FedGraph's FedAvg mode (the exchange runs in simulation, tests/test_fedgcn.py)
    "fedgcn": {"fedgcn-hops": 0},
}


def methods_for_three_rounds() -> list[str]:
    from fedgraph_flwr.algorithms import ALGORITHMS

    return sorted(set(ALGORITHMS) - {algorithm_under_test()})


@pytest.mark.parametrize("algorithm", methods_for_three_rounds())
def test_every_method_three_rounds(deployment, algorithm):
    dep = deployment
    extra = dict(STAGES_WITHIN_THREE_ROUNDS.get(algorithm, {}))
    if extra.get("client-state") == "file":
        extra["client-state-dir"] = str(dep.tmp / "client-state" / algorithm)
    out, results = flwr_run(dep, f"deploy-{algorithm}",
                            {"algorithm": algorithm, "rounds": 3, "round-timeout": 300.0, **extra})
    assert out.returncode == 0 and results is not None, _context(dep, out)
    assert results["config"]["algorithm"] == algorithm
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    for r in rounds:
        assert sorted(r["clients"]) == ["0", "1", "2"] and not r["failures"] and not r["void"]
    assert 0.0 < results["final"]["test_at_best_val"] <= 100.0


def test_ckks_and_dp_three_rounds_through_flwr_run(deployment):
    """secure-aggregation=ckks with dp=client across real SuperNodes: the owners' secret
    context as a file on their side (one host here, so one path), the server told only the
    public one; three complete rounds, ε reported within the budget."""
    from fedgraph_flwr import secure_aggregation as secure

    dep = deployment
    secret, public = secure.generate_keys(dep.tmp / "ckks-keys")
    out, results = flwr_run(dep, "deploy-ckks-dp", {
        "rounds": 3, "round-timeout": 300.0, "secure-aggregation": "ckks",
        "ckks-secret-context": str(secret), "ckks-public-context": str(public),
        "dp": "client", "dp-epsilon": 4.0})
    assert out.returncode == 0 and results is not None, _context(dep, out)
    assert [r["round"] for r in results["rounds"]] == [1, 2, 3]
    for r in results["rounds"]:
        assert sorted(r["clients"]) == ["0", "1", "2"] and not r["failures"] and not r["void"]
    assert 0 < results["dp"]["epsilon"] <= 4.0 and results["dp"]["releases"] == 3


def _checkpoint_round(path: Path) -> int:
    from fedgraph_flwr.engine import state_codec

    try:
        return int(state_codec.decode(path.read_bytes())["round"])
    except Exception:  # noqa: BLE001 - not written yet, or being replaced
        return 0


# --- faults ------------------------------------------------------------------------------
#: Test-only components written over the app copy's server_app.py / client_app.py (the FAB's
#: entry points; the package itself is the one under test). Both leave marks under
#: ``<output-dir>/<run-name>/marks/`` so the test knows when a process is where it wants it.
MARKING_CLIENT_APP = """
import json, os
from pathlib import Path

from fedgraph_flwr.engine.client_app import make_client_app

SLOW = {slow!r}  # (client, round) -> local-epochs: a training long enough to be killed in


def _write(path, data):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def marks(msg, ctx, call_next):
    if msg.metadata.message_type != "train":
        return call_next(msg, ctx)
    config = msg.content["config"]
    cid = int(Path(str(ctx.node_config["partition-file"])).stem.split("_")[1])
    rnd = int(config["server-round"])
    folder = Path(str(ctx.run_config["output-dir"])) / str(ctx.run_config["run-name"]) / "marks"
    folder.mkdir(parents=True, exist_ok=True)
    start = folder / f"train-start-c{{cid}}-r{{rnd}}"
    if (cid, rnd) not in SLOW or start.exists():
        return call_next(msg, ctx)
    config["local-epochs"] = SLOW[(cid, rnd)]
    _write(start, {{"pid": os.getpid()}})
    reply = call_next(msg, ctx)
    _write(folder / f"train-end-c{{cid}}-r{{rnd}}", {{"pid": os.getpid()}})
    return reply


app = make_client_app(mods=[marks])
"""

PAUSING_SERVER_APP = """
import json, os, signal
from pathlib import Path

from fedgraph_flwr.engine.driver import RoundDriver
from fedgraph_flwr.engine.server_app import make_server_app

PAUSE_FROM = {pause_from}  # pause in the first round >= this one that all clients answered


class PausesHoldingReplies(RoundDriver):
    \"\"\"Stops itself (SIGSTOP) once it holds a round's train replies, before it aggregates.\"\"\"

    def send(self, fed, phase, server_round, clients, deadline=None):
        exchange, sent = super().send(fed, phase, server_round, clients, deadline)
        mark = Path(self.config.output_dir) / self.config.run_name / "marks" / "server-paused"
        if (phase.name == "train" and server_round >= PAUSE_FROM and not mark.exists()
                and len(exchange.replies) == self.config.num_clients):
            mark.parent.mkdir(parents=True, exist_ok=True)
            tmp = mark.with_name("server-paused.tmp")
            tmp.write_text(json.dumps({{"round": server_round, "pid": os.getpid(),
                                       "replies": sorted(exchange.replies)}}))
            tmp.replace(mark)
            os.kill(os.getpid(), signal.SIGSTOP)  # the test kills a node, then SIGCONTs
        return exchange, sent


app = make_server_app(driver_cls=PausesHoldingReplies)
"""

SLOW_EPOCHS = 20_000  # ~ a minute of local training on a Cora client: killed long before it ends
KILL_DELAY = 1.0  # seconds into that training


def instrumented_app(dep, name: str, slow: dict, pause_from: int | None = None) -> Path:
    app = cluster.copy_app(dep.tmp / name)
    (app / "client_app.py").write_text(MARKING_CLIENT_APP.format(slow=slow))
    if pause_from is not None:
        (app / "server_app.py").write_text(PAUSING_SERVER_APP.format(pause_from=pause_from))
    return app


def start_run(dep, app: Path, run_config: dict) -> subprocess.Popen:
    text = " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={str(v).lower()}"
                    if isinstance(v, bool) else f"{k}={v}" for k, v in run_config.items())
    return subprocess.Popen(L.run_cmd(app=str(app), run_config=text), cwd=dep.tmp, env=dep.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for(what: str, check, deadline: float, proc: subprocess.Popen | None = None, pause=0.05):
    while time.time() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended while waiting for {what}:\n{proc.stdout.read()[-4000:]}")
        time.sleep(pause)
    pytest.fail(f"timed out waiting for {what}")


def read_mark(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def proc_state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, T stopped, Z zombie...); None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, from /proc (no psutil needed)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += parents.get(p, [])
    return tree


def kill_in_training(dep, marks: Path, cid: int, rnd: int, deadline: float, proc) -> dict:
    """Once client ``cid``'s ClientApp has trained round ``rnd`` for KILL_DELAY s, SIGKILL its
    SuperNode and executor (whole process groups); returns what shows it was mid-training."""
    start = wait_for(f"client {cid}'s training in round {rnd}",
                     lambda: read_mark(marks / f"train-start-c{cid}-r{rnd}"), deadline, proc)
    time.sleep(KILL_DELAY)
    seen = {"pid": start["pid"], "training": alive(start["pid"]),
            "ended": (marks / f"train-end-c{cid}-r{rnd}").exists()}
    dep.kill(L.supernode_name(cid))
    dep.kill(L.clientapp_executor_name(cid))
    # The SIGKILL reached the whole process group at once, but only the group's leader
    # was waited for: give the kernel a moment to end the ClientApp on a loaded host.
    wait_for("the killed ClientApp to end", lambda: not alive(start["pid"]), time.time() + 5.0,
             pause=0.01)
    seen["gone"] = not alive(start["pid"])
    return seen


def restart_owner(dep, cid: int) -> float:
    """What a supervisor does: the SuperNode again (same key, same node id), then its
    executor; returns the seconds until the SuperLink let the SuperNode back in."""
    back_in = dep.restart_until_online(L.supernode_name(cid))
    dep.restart(L.clientapp_executor_name(cid))
    return back_in


@through_the_guard
def test_supernode_killed_in_training_and_in_aggregation(deployment):
    """Data owner 2 crashes twice (its SuperNode and ClientApp executor SIGKILLed): in the
    middle of its local training in round 2, and later while the ServerApp aggregates a
    round all three answered (the ServerApp stopped with SIGSTOP holding the replies,
    SIGCONT after the kill). Every round ends within round-timeout + 5 s, the rounds it
    misses name why (no reply, or Flower's Node Unavailable, or the ClientApp a restarted
    node had taken stopped responding), it rejoins both times under a supervisor (same
    key, same node id) and trains on the payload the server kept for it, and the run
    completes."""
    dep = deployment
    # Rounds enough for two crashes: each costs round-timeouts until the SuperLink
    # declares the node unavailable (20 s of missed heartbeats), then quick rounds while
    # the supervisor brings it and its executor back (~10-20 s).
    victim, kill_round, rounds_total = 2, 2, 24
    timeout = max(20.0, 2.5 * getattr(dep, "round_time", 8.0))
    run_name = "deploy-fault"
    marks = dep.tmp / "outputs" / run_name / "marks"
    app = instrumented_app(dep, "app-fault", {(victim, kill_round): SLOW_EPOCHS},
                           pause_from=kill_round + 1)
    proc = start_run(dep, app, {"algorithm": algorithm_under_test(), "num-clients": NUM_CLIENTS,
                                "hidden": 32, "rounds": rounds_total, "round-timeout": timeout,
                                "output-dir": str(dep.tmp / "outputs"), "run-name": run_name})
    try:
        deadline = time.time() + RUN_TIMEOUT + 180
        in_training = kill_in_training(dep, marks, victim, kill_round, deadline, proc)
        back_in = restart_owner(dep, victim)
        # It answers again: the ServerApp, holding a round's three replies, stops itself.
        paused = wait_for("the ServerApp to pause holding a round's replies",
                          lambda: read_mark(marks / "server-paused"), deadline, proc)
        in_aggregation = {"round": paused["round"], "state": proc_state(paused["pid"])}
        dep.kill(L.supernode_name(victim))
        dep.kill(L.clientapp_executor_name(victim))
        in_aggregation["state-after-kill"] = proc_state(paused["pid"])
        os.kill(paused["pid"], signal.SIGCONT)
        restart_owner(dep, victim)
        output, _ = proc.communicate(timeout=max(1.0, deadline - time.time()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    results_file = dep.tmp / "outputs" / run_name / "results.json"
    assert proc.returncode == 0 and results_file.is_file(), output[-4000:]
    # The kills happened where intended (else the test would pass vacuously).
    assert in_training["training"] and not in_training["ended"] and in_training["gone"], in_training
    # fedgraph-supernode's 10 s heartbeat: the SuperLink let the restarted SuperNode back in
    # after 2 x 10 s, plus its restart; Flower's 30 s interval would hold it out for 60 s.
    assert back_in < 55.0, back_in
    assert not (marks / f"train-end-c{victim}-r{kill_round}").exists()
    assert in_aggregation["state"] == "T" and in_aggregation["state-after-kill"] == "T", in_aggregation
    rounds = json.loads(results_file.read_text())["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, rounds_total + 1))
    times = [r["times"]["round"] for r in rounds]
    assert max(times) <= timeout + 5.0, times
    paused_round = in_aggregation["round"]
    assert sorted(rounds[0]["clients"]) == ["0", "1", "2"]
    for r in (rounds[kill_round - 1], rounds[paused_round]):  # each kill's first missed round
        assert sorted(r["clients"]) == ["0", "1"] and "2" in r["failures"], r["failures"]
    # The others never lose a ClientApp (a forked one that did not report its end to its
    # SuperNode was answered late as "ClientApp stopped responding").
    assert not [r["failures"] for r in rounds if {"0", "1"} & set(r["failures"])]
    # Aggregated with its reply although it died while the server aggregated.
    assert sorted(rounds[paused_round - 1]["clients"]) == ["0", "1", "2"]
    # Each round it missed names why: no reply at all, or Flower's Node Unavailable reply
    # (sent by the SuperLink, from node 0) recorded for client 2, not as an unknown node.
    reasons = [r["failures"]["2"] for r in rounds if "2" in r["failures"]]
    assert all(x.startswith("missing: no reply before round-timeout")
               or (x.startswith("error 5: ") and "Node Unavailable" in x)
               or x == "error 8: ClientApp stopped responding." for x in reasons), reasons
    assert "unknown node" not in output
    assert "client 2" in output  # the server said so while it ran
    # Back after the second crash too, on the payload the server kept for it. (Not
    # necessarily in the last round: on a loaded 2-core host any ClientApp may miss one.)
    back = [r for r in rounds[paused_round + 1:] if "2" in r["clients"]]
    assert back, [r["failures"] for r in rounds]
    assert math.isfinite(back[-1]["clients"]["2"]["val_metric"])
    assert back[-1]["bytes_sent"]["2"] == rounds[0]["bytes_sent"]["2"]
    missed = {r["round"]: f"{t:.1f}s" for r, t in zip(rounds, times) if "2" in r["failures"]}
    print(f"\nfault run: round-timeout {timeout:.0f}s; killed in training in round {kill_round}, "
          f"while aggregating round {paused_round}; slowest round {max(times):.1f}s; rounds "
          f"client 2 missed: {missed}; let back in {back_in:.0f}s after the first kill; "
          f"back in rounds {[r['round'] for r in back]}; "
          f"reasons: {sorted(set(x[:40] for x in reasons))}")


@through_the_guard
def test_sigterm_superexec_with_clientapp_in_flight_leaves_no_process(deployment):
    """SIGTERM to data owner 1's ``fedgraph-superexec`` while its forked ClientApp trains:
    the executor and every process under it are gone within 5 s. Restarted, the run goes on
    and completes, each round within round-timeout + 5 s."""
    dep = deployment
    owner, executor = 1, L.clientapp_executor_name(1)
    timeout = max(20.0, 2.5 * getattr(dep, "round_time", 8.0))
    run_name = "deploy-sigterm"
    marks = dep.tmp / "outputs" / run_name / "marks"
    app = instrumented_app(dep, "app-sigterm", {(owner, 1): SLOW_EPOCHS})
    proc = start_run(dep, app, {"algorithm": algorithm_under_test(), "num-clients": NUM_CLIENTS,
                                "hidden": 32, "rounds": 2, "round-timeout": timeout,
                                "output-dir": str(dep.tmp / "outputs"), "run-name": run_name})
    try:
        deadline = time.time() + RUN_TIMEOUT
        start = wait_for("client 1's training", lambda: read_mark(marks / f"train-start-c{owner}-r1"),
                         deadline, proc)
        time.sleep(KILL_DELAY)
        parent = dep.procs[executor]
        tree = process_tree(parent.pid)
        assert start["pid"] in tree and alive(start["pid"]), (start, tree)
        t0 = time.perf_counter()
        parent.send_signal(signal.SIGTERM)
        while time.perf_counter() - t0 < 10 and (parent.poll() is None or any(map(alive, tree))):
            time.sleep(0.02)
        took = time.perf_counter() - t0
        left = [pid for pid in tree if alive(pid)]
        dep.restart(executor)
        output, _ = proc.communicate(timeout=max(1.0, deadline - time.time()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"\nSIGTERM to fedgraph-superexec with a ClientApp in flight: {len(tree)} processes "
          f"gone in {took:.2f}s")
    assert not left and took <= 5.0, f"after {took:.1f}s still running: {left}\n{dep.log(executor)[-2000:]}"
    assert not (marks / f"train-end-c{owner}-r1").exists()  # it was stopped mid-training
    assert "stopping 1 ClientApp process" in dep.log(executor)
    results_file = dep.tmp / "outputs" / run_name / "results.json"
    assert proc.returncode == 0 and results_file.is_file(), output[-4000:]
    rounds = json.loads(results_file.read_text())["rounds"]
    assert max(r["times"]["round"] for r in rounds) <= timeout + 5.0, [r["times"] for r in rounds]
    took_rounds = ", ".join(f"{r['times']['round']:.1f}s" for r in rounds)
    print(f"round 1 failures: {rounds[0]['failures']}; rounds took {took_rounds}")


RESUME_ROUNDS = 20


@through_the_guard
def test_serverapp_killed_at_random_round_is_restarted_and_ends_as_uninterrupted(deployment):
    """The ServerApp-kill drill (issue #82): 20 rounds, client-state="file"; the ServerApp
    process is SIGKILLed (by PID) once a randomly chosen round (seeded) is checkpointed,
    and nothing is touched after: ``fedgraph-run`` sees the run fail with no error from
    its ServerApp, restarts it with ``resume=true``, and exits 0. Every round's per-client
    metrics equal an uninterrupted run's (run beside it, on the same SuperNodes), and
    results.json records the resume. Deployment processes rather than a simulation: the
    kill is a real SIGKILL of the ServerApp process, and a round here takes ~2 s."""
    import random

    from helpers import round_metrics

    dep = deployment
    kill_after = random.Random(26).randint(2, RESUME_ROUNDS - 2)
    print(f"\nServerApp-kill drill: the ServerApp is killed after round {kill_after} (seeded)")
    out = dep.tmp / "outputs"

    def config(run_name: str, **extra) -> dict:
        return {"algorithm": algorithm_under_test(), "num-clients": NUM_CLIENTS, "hidden": 32,
                "rounds": RESUME_ROUNDS, "round-timeout": 300.0, "client-state": "file",
                "client-state-dir": str(dep.tmp / "client-state" / run_name),
                "output-dir": str(out), "run-name": run_name, **extra}

    executor = dep.procs[L.SERVERAPP_EXECUTOR].pid
    crashed = start_run(dep, dep.app, config("resume-crashed"))
    full = None
    try:
        deadline = time.time() + 2 * RUN_TIMEOUT
        ckpt = out / "resume-crashed" / "checkpoint.pt"
        wait_for("round 1", lambda: _checkpoint_round(ckpt) >= 1, deadline, crashed)
        serverapps = [p for p in process_tree(executor) if p != executor and alive(p)]
        assert len(serverapps) >= 1, serverapps
        full = start_run(dep, dep.app, config("resume-full"))  # beside it: the reference
        wait_for(f"round {kill_after}", lambda: _checkpoint_round(ckpt) >= kill_after, deadline,
                 crashed, pause=0.01)
        for pid in serverapps:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        at_kill = _checkpoint_round(ckpt)
        # No operator action from here: fedgraph-run must bring the run back by itself.
        crashed_out, _ = crashed.communicate(timeout=max(1.0, deadline - time.time()))
        took = time.time() - killed_at
        full_out, _ = full.communicate(timeout=max(1.0, deadline - time.time()))
    finally:
        for p in (crashed, full):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert full.returncode == 0, full_out[-4000:]
    assert crashed.returncode == 0, crashed_out[-4000:]
    assert "restart 1 of 2: resuming from its last checkpoint" in crashed_out, crashed_out[-4000:]
    assert f"after round {at_kill}" in crashed_out, crashed_out[-4000:]
    a = json.loads((out / "resume-full" / "results.json").read_text())
    b = json.loads((out / "resume-crashed" / "results.json").read_text())
    assert [r["round"] for r in b["rounds"]] == list(range(1, RESUME_ROUNDS + 1))
    assert round_metrics(b) == round_metrics(a)
    assert [r["aggregate"] for r in b["rounds"]] == [r["aggregate"] for r in a["rounds"]]
    assert b["final"]["test_at_best_val"] == a["final"]["test_at_best_val"]
    assert [r["after_round"] for r in b["resumes"]] == [at_kill] and "resumes" not in a
    assert "Resumed from the checkpoint" in (out / "resume-crashed" / "report.html").read_text()
    restart_line = next(line for line in crashed_out.splitlines() if "restart 1 of 2" in line)
    print(f"{restart_line}\nkilled after round {at_kill}; the run completed {took:.0f} s after "
          f"the kill with no operator action; 20 rounds x 3 clients equal the uninterrupted run")


def test_a_refused_supernode_is_named_while_the_run_waits_and_when_it_stops(deployment):
    """Issue #82: client 3's SuperNode (the intruder: its key never registered) is refused
    by the SuperLink. A run for 4 clients names client 3 as not seen while it waits
    (progress.json and the log, within WAIT_REPORT_S plus the log stream's lag), and
    stops at handshake-timeout with that list, exit status 1."""
    from fedgraph_flwr.engine.flower_transport import WAIT_FIRST_REPORT_S, WAIT_REPORT_S

    dep = deployment
    timeout = 45.0
    proc = start_run(dep, dep.app, {"algorithm": algorithm_under_test(), "num-clients": NUM_CLIENTS + 1,
                                    "hidden": 32, "rounds": 1, "handshake-timeout": timeout,
                                    "output-dir": str(dep.tmp / "outputs"), "run-name": "refused"})
    t0 = time.time()
    first, lines = None, []
    try:
        for line in proc.stdout:
            lines.append(line)
            if first is None and "waiting for clients" in line and f"client {NUM_CLIENTS} not seen" in line:
                first = time.time() - t0
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = time.time() - t0
    out = "".join(lines)
    assert first is not None and first < 60.0, out[-4000:]
    assert proc.returncode == 1, out[-4000:]
    stop = (rf"{NUM_CLIENTS} SuperNodes but num-clients={NUM_CLIENTS + 1} \({NUM_CLIENTS} of "
            rf"{NUM_CLIENTS + 1} SuperNodes connected .*client {NUM_CLIENTS} not seen")
    assert re.search(stop, out), out[-4000:]
    progress = json.loads((dep.tmp / "outputs" / "refused" / "progress.json").read_text())
    assert progress["waiting_for_clients"]["missing"] == [NUM_CLIENTS]
    print(f"\nrefused node: first report naming client {NUM_CLIENTS} {first:.1f} s after "
          f"fedgraph-run started (reports after {WAIT_FIRST_REPORT_S:g} s, then every "
          f"{WAIT_REPORT_S:g} s); the run stopped after "
          f"{took:.1f} s (handshake-timeout {timeout:g} s), exit status {proc.returncode}")


@pytest.mark.parametrize("problem", ["missing", "feature-width"])
def test_bad_partition_file_stops_the_run_with_a_clear_error(deployment, problem):
    """A 4th SuperNode whose file is missing / has another feature width: the handshake
    reports it and the run stops before any training, saying why (stream or run status)."""
    dep = deployment
    name = f"bad-{problem}"
    bad = dep.tmp / name / L.partition_file_name(NUM_CLIENTS)
    if problem == "feature-width":
        bad.parent.mkdir()
        with np.load(dep.owners[NUM_CLIENTS]) as f:
            arrays = {k: f[k] for k in f.files}
        arrays["x"] = np.ascontiguousarray(arrays["x"][:, :1000])
        np.savez(bad, **arrays)
    # The owner's pre-flight (deploy/README step 5) finds it before the SuperNode starts.
    check = subprocess.run([*L.preflight_cmd(str(bad))], env=dep.env, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 1 and check.stderr.count("\n") == 1, check.stderr
    assert ("no such file" if problem == "missing" else "feature width 1000") in check.stderr
    dep.make_keys([name])
    # The bulk script of the README / compose file: registers the new key, skips a known one.
    out = cluster.check_call([sys.executable, str(DEPLOY / "scripts" / "register_keys.py"),
                              "--connection", L.CONNECTION, str(dep.keys / f"{name}.pub"),
                              str(dep.keys / "supernode-0.pub")], dep.env)
    assert "registered as node" in out and "already registered" in out, out
    dep.start_supernode(name, bad, executor=f"{name}-executor")
    try:
        dep.wait_for_log(name, r"SuperNode ID: \d+", 90)
        out, results = flwr_run(dep, name, {"num-clients": NUM_CLIENTS + 1, "rounds": 1,
                                            "handshake-timeout": 120.0})
        assert results is None, "the run trained although a client's file is unusable"
        run_id = re.search(r"Successfully started run (\d+)", out.stdout)
        assert run_id, _context(dep, out)
        # fedgraph-run, the documented launcher, exits 1 where `flwr run --stream` exits 0.
        assert out.returncode == 1, _context(dep, out)
        assert f"fedgraph-run: run {run_id.group(1)} finished:failed" in out.stderr, _context(dep, out)
        status = json.loads(cluster.check_call(
            ["flwr", "ls", L.CONNECTION, "--run-id", run_id.group(1), "--format", "json"], dep.env))
        text = out.stdout + out.stderr + json.dumps(status)
        assert "failed" in json.dumps(status)
        if problem == "missing":
            assert "handshake failed" in text and "client_3.npz" in text, _context(dep, out)
        else:
            assert "feature width" in text and "client 3: 1000" in text, _context(dep, out)
    finally:
        dep.stop(name)
        dep.stop(f"{name}-executor")


@through_the_guard
def test_clientapp_forked_before_its_message_is_stored_still_answers(deployment):
    """Flower's SuperNode creates a message's task before it stores the message, and a
    forked ClientApp asks for the message within milliseconds. Data owner 2's SuperNode
    here stores every message 0.5 s late (tests/supernode_storing_late.py), so its ClientApp
    always asks too early; it must wait for the message, not fail and leave its SuperNode
    waiting forever for a reply (before the fix: owner 2 missing from every round)."""
    dep = deployment
    name = L.supernode_name(2)
    cmd, env = dep.commands[name]
    late = [sys.executable, str(ROOT / "tests" / "supernode_storing_late.py"), *cmd[1:]]
    dep.stop(name)
    dep.commands[name] = (late, env)
    try:
        dep.restart_until_online(name)
        out, results = flwr_run(dep, "deploy-late-message",
                                {"rounds": 2, "round-timeout": 60.0}, timeout=240)
        assert out.returncode == 0 and results is not None, _context(dep, out)
        for r in results["rounds"]:
            assert sorted(r["clients"]) == ["0", "1", "2"] and not r["failures"], r["failures"]
        assert "No messages received from Runtime API" not in dep.log(L.clientapp_executor_name(2))
    finally:
        dep.stop(name)
        dep.commands[name] = (cmd, env)
        dep.restart_until_online(name)


# --- a hostile data owner (issue #76) ----------------------------------------------------
HOSTILE = 2  # the owner whose ClientApp executor is tests/hostile_clientapp_executor.py
HOSTILE_ROUNDS = 5  # 3 rounds with its update x100, then 2 with num-train NaN
#: FedAvg on the deployment's Cora files; the honest run and the hostile one differ only
#: in owner 2's executor. Client 2 has the largest training set (51 of 140 nodes): the
#: most weight an attacker of the three can have.
HOSTILE_CONFIG = {"algorithm": "fedavg", "rounds": HOSTILE_ROUNDS, "hidden": 16,
                  "local-epochs": 5, "robust": "median", "round-timeout": 120.0}
NAN_NUM_TRAIN = "rejected: num-train is nan, not a count"


def _report_events(html: str) -> list[tuple[str, str, str]]:
    """(round, client, what happened) of report.html's "Failed, rejected and screened
    replies" table, unescaped."""
    import html as html_module

    section = html.split("<h2>Failed, rejected and screened replies</h2>", 1)
    assert len(section) == 2, "report.html has no events table"
    body = section[1].split("</tbody>", 1)[0].split("<tbody>", 1)[1]
    rows = [[html_module.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)]
    return [(c[0], c[1], c[2]) for c in rows]


def _honest_run(dep) -> dict:
    """The same run with every owner honest (once per deployment): the reference."""
    if getattr(dep, "honest_run", None) is None:
        out, results = flwr_run(dep, "deploy-hostile-reference", HOSTILE_CONFIG)
        assert out.returncode == 0 and results is not None, _context(dep, out)
        for r in results["rounds"]:  # an honest cohort: nobody named, nobody rejected
            assert not r["failures"] and not r.get("robust"), (r["failures"], r.get("robust"))
        dep.honest_run = results
    return dep.honest_run


def _run_with_hostile_owner(dep, run_name: str, config: dict):
    """``flwr_run`` with owner HOSTILE's executor swapped for the hostile one; its own after."""
    executor = L.clientapp_executor_name(HOSTILE)
    cmd, env = dep.commands[executor]
    dep.stop(executor)
    dep.start(executor, [sys.executable, str(ROOT / "tests" / "hostile_clientapp_executor.py"),
                         *cmd[1:]], env)
    try:
        return flwr_run(dep, run_name, config)
    finally:
        dep.stop(executor)
        dep.start(executor, cmd, env)


def _honest_figures(results: dict, honest: list[str]) -> tuple[list[float], float]:
    """The honest clients' mean train loss per round, and their last round's test accuracy."""
    losses = [sum(r["clients"][c]["train_loss"] for c in honest) / len(honest)
              for r in results["rounds"]]
    last = results["rounds"][-1]["clients"]
    accuracy = sum(last[c]["test_correct"] for c in honest) / sum(last[c]["test_count"] for c in honest)
    return losses, accuracy


@through_the_guard
def test_hostile_supernode_is_named_every_round_and_outvoted(deployment):
    """Data owner 2's ClientApp executor tampers with its train replies
    (tests/hostile_clientapp_executor.py): its update x100 in rounds 1-3, num-train NaN
    in rounds 4-5. Under robust=median the run completes all 5 rounds; the hostile client
    is named in every round, in results.json and in report.html's events table (rounds
    1-3: its update norm against the cohort median; rounds 4-5: its reply rejected); the
    honest clients are never rejected nor named, and their figures stay those of the same
    run with owner 2 honest (run first, on the same SuperNodes)."""
    from hostile_clientapp_executor import SCALED_ROUNDS

    dep = deployment
    reference = _honest_run(dep)
    out, results = _run_with_hostile_owner(dep, "deploy-hostile", HOSTILE_CONFIG)
    assert out.returncode == 0 and results is not None, _context(dep, out)
    assert sorted(results["clients"]) == ["0", "1", "2"]
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, HOSTILE_ROUNDS + 1))
    hostile, honest = str(HOSTILE), sorted({"0", "1", "2"} - {str(HOSTILE)})
    ratios = []
    for r in rounds:
        robust = r.get("robust", {})
        # The honest clients: never rejected, never named, always aggregated, finite.
        assert not set(honest) & (set(r["failures"]) | set(robust)), (r["failures"], robust)
        assert set(honest) <= set(r["clients"])
        assert all(math.isfinite(r["clients"][c]["train_loss"]) for c in honest)
        if r["round"] <= SCALED_ROUNDS:
            note = robust.get(hostile, "")
            ratio = re.fullmatch(r"update norm ([0-9.e+]+)× the cohort median", note)
            assert ratio and float(ratio.group(1)) >= 3.0, (r["round"], robust, r["failures"])
            ratios.append(float(ratio.group(1)))
        else:
            assert r["failures"].get(hostile) == NAN_NUM_TRAIN, r["failures"]
            assert hostile not in r["clients"]
    events = _report_events((dep.tmp / "outputs" / "deploy-hostile" / "report.html").read_text())
    for r in rounds:
        named = [what for rnd, cid, what in events if rnd == str(r["round"]) and cid == hostile]
        expected = (f"robust=median: {r['robust'][hostile]}" if r["round"] <= SCALED_ROUNDS
                    else NAN_NUM_TRAIN)
        assert named == [expected], (r["round"], events)
    assert {cid for _, cid, _ in events} == {hostile}, events
    assert f"client {HOSTILE} reply rejected" in out.stdout + out.stderr  # said while it ran
    # Not the attacker's model: the honest clients train from about the honest run's model
    # every round. (Without robust their loss is 3-50 from round 2 on and their accuracy
    # about 1 %: test_hostile_supernode_without_robust_takes_the_model_over.)
    losses, accuracy = _honest_figures(results, honest)
    ref_losses, ref_accuracy = _honest_figures(reference, honest)
    times = [r["times"]["round"] for r in rounds]
    print(f"\nhostile owner {HOSTILE} (fedavg, robust=median, {HOSTILE_ROUNDS} rounds): update "
          f"norm {', '.join(f'{x:.0f}' for x in ratios)}x the cohort median in rounds "
          f"1-{SCALED_ROUNDS}, rejected after; honest clients' train loss "
          f"{', '.join(f'{x:.2f}' for x in losses)} (honest run "
          f"{', '.join(f'{x:.2f}' for x in ref_losses)}), last-round test accuracy "
          f"{100 * accuracy:.1f}% (honest run {100 * ref_accuracy:.1f}%); rounds "
          f"{', '.join(f'{t:.2f}s' for t in times)}; flwr run {out.elapsed:.1f}s")
    assert all(abs(a - b) <= 0.5 for a, b in zip(losses, ref_losses)), (losses, ref_losses)
    assert abs(accuracy - ref_accuracy) <= 0.05, (accuracy, ref_accuracy)


@through_the_guard
def test_hostile_supernode_without_robust_takes_the_model_over(deployment):
    """The same hostile owner under robust=none: what the test above guards against.
    Reply validation still rejects its NaN num-train (rounds 4-5), and the run completes;
    but its x100 updates are mixed, unnamed, and the honest clients' loss and accuracy
    leave the honest run's (the bounds the test above holds them to)."""
    from hostile_clientapp_executor import SCALED_ROUNDS

    dep = deployment
    reference = _honest_run(dep)
    out, results = _run_with_hostile_owner(dep, "deploy-hostile-unguarded",
                                           {**HOSTILE_CONFIG, "robust": "none"})
    assert out.returncode == 0 and results is not None, _context(dep, out)
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, HOSTILE_ROUNDS + 1))
    hostile, honest = str(HOSTILE), sorted({"0", "1", "2"} - {str(HOSTILE)})
    for r in rounds:
        if r["round"] <= SCALED_ROUNDS:
            # Named (nothing bounds it): "update norm …× the cohort median (not bounded: …)".
            assert hostile in r["clients"] and not r["failures"], r
            assert list(r["robust"]) == [hostile] and "not bounded" in r["robust"][hostile], r
        else:
            assert r["failures"] == {hostile: NAN_NUM_TRAIN}, r["failures"]
    losses, accuracy = _honest_figures(results, honest)
    ref_losses, ref_accuracy = _honest_figures(reference, honest)
    print(f"\nhostile owner {HOSTILE} (fedavg, robust=none): honest clients' train loss "
          f"{', '.join(f'{x:.2f}' for x in losses)} (honest run, robust=median: "
          f"{', '.join(f'{x:.2f}' for x in ref_losses)}), last-round test accuracy "
          f"{100 * accuracy:.1f}% (honest run {100 * ref_accuracy:.1f}%)")
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) > 0.5, (losses, ref_losses)
    assert abs(accuracy - ref_accuracy) > 0.05, (accuracy, ref_accuracy)
