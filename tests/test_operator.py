"""An operator's view of a run (issue #82): the summary's clients per round."""

from __future__ import annotations

from fedgraph_flwr.summary import clients_per_round, format_summary


def _round(number: int, replied: list[int], sampled: list[int]) -> dict:
    return {"round": number, "sampled": sampled,
            "clients": {str(c): {"val_metric": 0.5, "test_metric": 0.5} for c in replied},
            "failures": {str(c): "no reply" for c in sampled if c not in replied}}


def test_clients_per_round_groups_rounds_alike_and_names_who_was_missing():
    rounds = [_round(r, [0, 2] if 3 <= r <= 5 else [0, 1, 2], [0, 1, 2]) for r in range(1, 9)]
    assert clients_per_round(rounds) == (
        "rounds 1-2: 3/3 clients; rounds 3-5: 2/3 clients (without 1); rounds 6-8: 3/3 clients")
    assert clients_per_round(rounds[:2]) == "3/3 clients in each of the 2 rounds"
    # sampled (fraction < 1) is the denominator, not num-clients
    sampled = [_round(1, [0, 4], [0, 4]), _round(2, [1], [1, 3])]
    assert clients_per_round(sampled) == "round 1: 2/2 clients; round 2: 1/2 clients (without 3)"


def test_the_run_summary_says_which_rounds_were_short_of_a_client():
    rounds = [_round(r, [0, 2] if r == 2 else [0, 1, 2], [0, 1, 2]) for r in (1, 2, 3)]
    results = {"config": {"algorithm": "fedavg", "dataset": "Cora", "partition": "louvain",
                          "num-clients": 3, "seed": 0},
               "clients": {}, "rounds": rounds, "wall_time_s": 1.0,
               "final": {"test_at_best_val": 50.0, "best_round": 3}}
    text = format_summary(results)
    assert ("clients per round: round 1: 3/3 clients; round 2: 2/3 clients (without 1); "
            "round 3: 3/3 clients") in text
    full = dict(results, rounds=[_round(r, [0, 1, 2], [0, 1, 2]) for r in (1, 2)])
    assert "clients per round" not in format_summary(full)


# --- fedgraph-run's restart of a run whose ServerApp died ---------------------------------

import json  # noqa: E402

import pytest  # noqa: E402

from fedgraph_flwr import run as fedgraph_run  # noqa: E402


def _script(monkeypatch, attempts):
    """fedgraph-run over scripted ``flwr run`` attempts: (Attempt, status) each."""
    calls = []

    def follow(args):
        calls.append(list(args))
        return attempts[len(calls) - 1][0]

    monkeypatch.setattr(fedgraph_run, "follow", follow)
    monkeypatch.setattr(fedgraph_run, "config_error", lambda args: None)
    monkeypatch.setattr(fedgraph_run, "final_status",
                        lambda run_id, superlink: attempts[run_id - 1][1])
    return calls


FAILED = ("finished:failed", "Task failed because the run expired")
DONE = ("finished:completed", "")


def test_a_run_whose_serverapp_died_is_resumed_by_itself(monkeypatch, capsys):
    calls = _script(monkeypatch, [
        (fedgraph_run.Attempt(rc=0, run_id=1, last_round=4), FAILED),
        (fedgraph_run.Attempt(rc=0, run_id=2, last_round=0), FAILED),  # died again, no round
        (fedgraph_run.Attempt(rc=0, run_id=3, last_round=8), DONE)])
    assert fedgraph_run.main([".", "--restarts", "2"]) == 0
    assert calls[0] == [".", "--stream"]  # --restarts is this command's, not flwr's
    assert calls[1] == calls[2] == [".", "--stream", "--run-config", "resume=true"]
    err = capsys.readouterr().err
    assert ("fedgraph-run: run 1 finished:failed with no error from its ServerApp (it died: "
            "Task failed because the run expired); restart 1 of 2: resuming from its "
            "last checkpoint (its log had reached round 4)") in err
    assert "restart 2 of 2: resuming from its last checkpoint (its log had reached round 4)" in err


def test_restarts_are_bounded_and_a_run_that_died_before_round_1_starts_again(monkeypatch, capsys):
    calls = _script(monkeypatch, [(fedgraph_run.Attempt(rc=0, run_id=i), FAILED)
                                  for i in (1, 2)])
    assert fedgraph_run.main([".", "--restarts=1"]) == 1
    assert calls == [[".", "--stream"], [".", "--stream"]]
    err = capsys.readouterr().err
    assert "restart 1 of 1: starting it again (no round's checkpoint)" in err
    assert err.rstrip().endswith("fedgraph-run: run 2 finished:failed: "
                                 "Task failed because the run expired")


@pytest.mark.parametrize("attempt", [
    fedgraph_run.Attempt(rc=0, run_id=1, last_round=3, said=True),  # the ServerApp's own stop
    fedgraph_run.Attempt(rc=0, run_id=1, last_round=3, raised=True)])  # a bug: same again
def test_a_run_that_stopped_on_purpose_or_raised_is_not_restarted(monkeypatch, attempt):
    calls = _script(monkeypatch, [(attempt, FAILED)])
    assert fedgraph_run.main(["."]) == 1 and len(calls) == 1
    stopped = _script(monkeypatch, [(fedgraph_run.Attempt(rc=0, run_id=1), ("finished:stopped", ""))])
    assert fedgraph_run.main(["."]) == 1 and len(stopped) == 1


def test_a_resume_that_finds_no_checkpoint_starts_again(monkeypatch, capsys):
    """Died after round 1's line, before round 1's checkpoint was written."""
    calls = _script(monkeypatch, [
        (fedgraph_run.Attempt(rc=0, run_id=1, last_round=1), FAILED),
        (fedgraph_run.Attempt(rc=0, run_id=2, said=True, no_checkpoint=True), FAILED),
        (fedgraph_run.Attempt(rc=0, run_id=3, last_round=5), DONE)])
    assert fedgraph_run.main(["."]) == 0
    assert calls[2] == [".", "--stream"]
    assert "restart 2 of 2: starting it again" in capsys.readouterr().err


def test_restarts_must_be_a_count(capsys):
    assert fedgraph_run.main([".", "--restarts", "many"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fedgraph-run: error: --restarts 'many': give a whole number of restarts (0: none)")


def test_round_lines_and_resumes_are_read_as_the_driver_writes_them():
    line = "round 3/8: mean val 71.20 test 70.10 loss 0.5123 (2/3 clients, 4.10s)"
    assert fedgraph_run.ROUND_DONE.search(line)[1] == "3"
    assert not fedgraph_run.ROUND_DONE.search("round 3: client 1 failed: timeout")
    import inspect

    from fedgraph_flwr.engine.checkpoint import Checkpointer

    assert fedgraph_run.NO_CHECKPOINT in inspect.getsource(Checkpointer.load)


def test_each_resume_is_kept_across_resumes_and_shown_in_the_report(tmp_path):
    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.run_recorder import RunRecorder
    from fedgraph_flwr.report import run_report_html

    config = resolve_config(None, {"output-dir": str(tmp_path), "run-name": "r"})
    first = RunRecorder(config, {0: {}}, 4, 2)
    first.save_checkpoint({})
    first.wait()
    assert "resumes" not in first.results()
    second = RunRecorder(config, {0: {}}, 4, 2)
    second.load_checkpoint()
    second.save_checkpoint({})
    second.wait()
    third = RunRecorder(config, {0: {}}, 4, 2)
    third.load_checkpoint()
    resumes = third.results()["resumes"]
    assert [r["after_round"] for r in resumes] == [0, 0] and resumes == third.progress()["resumes"]
    html = run_report_html(third.results(), tmp_path)
    assert "Resumed from the checkpoint" in html and resumes[1]["at"] in html


# --- a missing or refused node, named while the server waits ------------------------------

from types import SimpleNamespace  # noqa: E402


class DeployedGrid:
    """A deployment's grid as the transport sees it: nodes heartbeat every 30 s; node
    ``n`` answers the handshake as client ``n - 1``; ``join`` says when each connects."""

    def __init__(self, join: dict[int, float]) -> None:
        import time

        self.t0, self.join, self.sent, self.pushed_at = time.time(), join, {}, {}

    def get_node_ids(self):
        import time

        return [n for n, at in self.join.items() if time.time() - self.t0 >= at]

    def get_nodes(self):
        return [SimpleNamespace(node_id=n, heartbeat_interval=30.0) for n in self.get_node_ids()]

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = f"m{len(self.sent)}"
            self.sent[mid] = m.metadata.dst_node_id
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        def answer(node, mid):
            info = {"partition-id": node - 1, "num-nodes": 5, "num-features": 3,
                    "num-classes": 2, "num-train": 2}
            return SimpleNamespace(metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=mid),
                                   has_error=lambda: False, content={"info": info})
        return [answer(self.sent[mid], mid) for mid in message_ids]


@pytest.fixture
def deployed(monkeypatch):
    from fedgraph_flwr.engine import flower_transport

    def message(content, dst_node_id, message_type, group_id=""):
        return SimpleNamespace(content=content, metadata=SimpleNamespace(
            dst_node_id=dst_node_id, message_type=message_type, group_id=group_id))

    monkeypatch.setattr(flower_transport, "Message", message)
    monkeypatch.setattr(flower_transport, "WAIT_FIRST_REPORT_S", 0.5)
    monkeypatch.setattr(flower_transport, "WAIT_REPORT_S", 0.5)
    return flower_transport


def test_a_client_that_never_connects_is_named_while_waited_for_and_at_the_timeout(deployed, tmp_path):
    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.driver import RunAborted
    from fedgraph_flwr.engine.run_recorder import write_waiting

    config = resolve_config({"algorithm": "fedavg", "dataset": "Cora", "num-clients": 3,
                             "handshake-timeout": 1.6, "output-dir": str(tmp_path),
                             "run-name": "wait"})
    lines, reports = [], []
    transport = deployed.FlowerTransport(DeployedGrid({1: 0.0, 3: 0.3}), log=lines.append)
    transport.on_waiting = lambda w: (reports.append(w), write_waiting(config, w))
    with pytest.raises(RunAborted, match=r"2 SuperNodes but num-clients=3 \(2 of 3 SuperNodes "
                                         r"connected after \d s .*client 1 not seen"):
        transport.connect(config)
    # Reports at 0.5 s, 1.0 s, 1.5 s (wall clock: fewer where a loaded host stalls the loop).
    assert reports and 1 in reports[-1]["missing"] and reports[-1]["answered"].get("0") == 1
    assert all(line.startswith("fedgraph-flwr: waiting for clients: ") for line in lines)
    progress = json.loads((tmp_path / "wait" / "progress.json").read_text())
    assert progress["round"] == 0 and progress["waiting_for_clients"]["missing"] == [1]
    assert "fedgraph-preflight" in progress["waiting_for_clients"]["line"]


def test_clients_asked_while_others_were_awaited_are_not_asked_twice(deployed, tmp_path):
    from fedgraph_flwr.config import resolve_config

    config = resolve_config({"algorithm": "fedavg", "dataset": "Cora", "num-clients": 3,
                             "handshake-timeout": 10.0})
    grid = DeployedGrid({1: 0.0, 2: 0.0, 3: 0.7})
    lines: list[str] = []
    roster = deployed.FlowerTransport(grid, log=lines.append).connect(config)
    assert sorted(roster) == [0, 1, 2]
    assert sorted(grid.sent.values()) == [1, 2, 3]  # one handshake per node
    assert lines and "client 2 not seen" in lines[0]


# --- the SuperLink's "ApiError:1008 Runtime task-token authentication failed" lines -----

SLOW_SERVERAPP_START = '''
# Test aid: the first flwr-serverapp started with this on PYTHONPATH sleeps first, as a
# ServerApp process that imports for 40 s on a host at load 40.
import os, sys, time
if os.path.basename(sys.argv[0] if sys.argv else "") == "flwr-serverapp":
    marker = os.path.join(os.path.dirname(__file__), "slept")
    if not os.path.exists(marker):
        open(marker, "w").write(str(os.getpid()))
        time.sleep(40)
'''


@pytest.mark.deploy
@pytest.mark.slow
def test_a_serverapp_slower_to_start_than_its_claim_makes_the_1008_lines_and_is_relaunched(tmp_path):
    """Issue #82's ``ApiError:1008 Runtime task-token authentication failed`` lines: the
    ServerApp executor claims the run's task (a token valid 30 s, Flower's
    HEARTBEAT_DEFAULT_INTERVAL) and starts a ServerApp process; one that takes longer
    than that to make its first request (40 s here) finds the claim expired: the
    SuperLink has put the task back to pending and dropped the token, so each of that
    process's requests is a 1008 line, and the executor claims the task again and starts
    a second process, which runs the run (here to its handshake, which has no SuperNode)."""
    import importlib.util
    import subprocess
    from pathlib import Path

    deploy = Path(__file__).resolve().parents[1] / "deploy"
    spec = importlib.util.spec_from_file_location("tasktoken_local_cluster", deploy / "local_cluster.py")
    cluster = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cluster)
    slow = tmp_path / "slow-start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW_SERVERAPP_START)
    here = str(Path(__file__).resolve().parents[1])
    cluster.L.SERVERAPP_ENV = {**cluster.L.SERVERAPP_ENV, "PYTHONPATH": f"{slow}:{here}"}
    dep = cluster.LocalDeployment(tmp_path / "cluster")
    dep.env["PYTHONPATH"] = here  # this checkout's fedgraph-run
    try:
        dep.make_tls()
        dep.start_superlink()
        app = cluster.copy_app(tmp_path / "app")
        run = subprocess.run(
            [*cluster.L.run_cmd(app=str(app), run_config="num-clients=1 handshake-timeout=15 rounds=1"),
             "--restarts", "0"], cwd=tmp_path, env=dep.env, capture_output=True, text=True,
            timeout=300)
        refused = [line for line in dep.log("superlink").splitlines() if "ApiError:1008" in line]
    finally:
        dep.stop_all()
    assert (slow / "slept").is_file()  # the first ServerApp process was the slow one
    assert refused and all("Runtime task-token authentication failed" in line for line in refused)
    # The second process ran the run: its own handshake stopped it, not the 1008s.
    assert run.returncode == 1 and "0 of 1 SuperNodes connected" in run.stdout + run.stderr, (
        run.stdout[-2000:], run.stderr[-1000:])
    print(f"\n{len(refused)} ApiError:1008 lines from the slow ServerApp process: "
          + "; ".join(sorted({line.split("]")[0].split("[")[-1] for line in refused})))
