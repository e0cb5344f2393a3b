"""Resume: the ServerApp stops after round r, restarts with resume=true, and the run ends
exactly as an uninterrupted one with the same seed (CPU).

The server's side (per-client payloads, aggregator state, round counter, history,
diagnostics) comes back from ``checkpoint.pt``, written atomically after every round;
the clients' own state (optimiser moments, local layers) from their state files
(``client-state=file``), which survive a server restart while Flower's per-run
``context.state`` does not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedgraph_flwr.config import ClientConfig, ConfigError, RunConfig
from fedgraph_flwr.engine import client_runtime as rt
from fedgraph_flwr.engine import state_codec
from fedgraph_flwr.engine.client_app import make_client_app
from fedgraph_flwr.engine.driver import RoundDriver
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.engine.server_app import make_server_app

from helpers import round_metrics, simulate

ROUNDS, CRASH_ROUND = 4, 3


class ServerDiesInRound(RoundDriver):
    """Dies in round CRASH_ROUND after every client has trained it (and saved its state),
    before the server records, aggregates or checkpoints it: the worst moment to lose
    the ServerApp, since clients are then one round ahead of the checkpoint."""

    def send(self, fed, phase, server_round, clients, deadline=None):
        exchange, sent = super().send(fed, phase, server_round, clients, deadline)
        if server_round == CRASH_ROUND and phase.name == "train":
            assert len(exchange.replies) == 3 and not exchange.failures
            raise RuntimeError(f"ServerApp killed in round {server_round}")
        return exchange, sent


def _simulate(overrides: dict, driver_cls=RoundDriver) -> None:
    simulate(make_server_app(overrides, driver_cls=driver_cls), make_client_app(),
             num_supernodes=3)


def _config(data_root: Path, out: Path, run_name: str, **extra) -> dict:
    cfg = {"algorithm": "fedaux", "dataset": "SBM", "num-clients": 3, "rounds": ROUNDS,
           "hidden": 16, "data-root": str(data_root), "output-dir": str(out),
           "run-name": run_name, "client-state": "file",
           "client-state-dir": str(out / f"{run_name}-client-state")}
    cfg.update(extra)
    return cfg



def _read(out: Path, run_name: str) -> dict:
    return json.loads((out / run_name / "results.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, synthetic_root) -> dict:
    """FedAux, 3 clients, 4 rounds, one Flower simulation, client-state=file."""
    out = tmp_path_factory.mktemp("resume")
    _simulate(_config(synthetic_root, out, "full"))
    return _read(out, "full")


@pytest.mark.simulation
@pytest.mark.slow
def test_flower_resume_after_server_crash_matches_uninterrupted(uninterrupted, tmp_path,
                                                               synthetic_root, capfd):
    cfg = _config(synthetic_root, tmp_path, "crashed")
    with pytest.raises(RuntimeError, match=f"ServerApp killed in round {CRASH_ROUND}"):
        _simulate(cfg, ServerDiesInRound)
    checkpoint = state_codec.decode((tmp_path / "crashed" / "checkpoint.pt").read_bytes())
    assert checkpoint["round"] == CRASH_ROUND - 1
    # The clients got further than the checkpoint: each saved its round-3 state.
    on_disk = sorted(p.name.split(".")[-2] for p in Path(cfg["client-state-dir"]).glob("client_*/*.pt"))
    assert on_disk == ["r000002"] * 3 + ["r000003"] * 3
    capfd.readouterr()

    _simulate(dict(cfg, resume=True))  # a new ServerApp run (new Flower run, fresh context.state)
    assert f"resumed from {tmp_path / 'crashed' / 'checkpoint.pt'} after round 2" in capfd.readouterr().out
    resumed = _read(tmp_path, "crashed")
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4]
    assert round_metrics(resumed) == round_metrics(uninterrupted)
    assert [r["aggregate"] for r in resumed["rounds"]] == [r["aggregate"] for r in uninterrupted["rounds"]]
    for key in ("test_at_best_val", "best_round", "per_client", "total_bytes_sent",
                "total_bytes_received", "failures"):
        assert resumed["final"][key] == uninterrupted["final"][key], key
    assert 0 < resumed["final"]["test_at_best_val"] <= 100


# GCFL splits its one cluster in round 2 here (warm-up 1, 2-long gradient sequences,
# thresholds always met), so rounds 3-4 depend on the clusters and sequences it keeps.
GCFL_SPLITS_EARLY = {"gcfl-warmup-rounds": 1, "gcfl-seq-length": 2, "gcfl-eps1": 1e6, "gcfl-eps2": 0.0}
ALGORITHMS = {"gcfl": GCFL_SPLITS_EARLY, "apfl": {}, "fedspray": {}}
INPROCESS_DATASET = "Cora"  # 3 METIS clients of ~900 nodes: sparser than SBM, so quicker


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_inprocess_resume_matches_uninterrupted(algorithm, tmp_path, data_root):
    """The in-process loop stops after round 2 and resumes to 4 from the same checkpoint code.

    FedAux sends personalized payloads and signatures, GCFL keeps server state beyond
    the payloads (gradient sequences), APFL and FedSpray keep local models and
    optimisers on the clients.
    """
    extra = dict(ALGORITHMS[algorithm], algorithm=algorithm, dataset=INPROCESS_DATASET)
    full = run_federation(_config(data_root, tmp_path, "full", **extra))
    stopped = _config(data_root, tmp_path, "stopped", **extra)
    first = run_federation(dict(stopped, rounds=2))
    assert [r["round"] for r in first["rounds"]] == [1, 2]
    logged: list[str] = []
    resumed = run_federation(dict(stopped, resume=True), log=logged.append)
    assert any("after round 2" in line for line in logged)
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4]
    assert round_metrics(resumed) == round_metrics(full)
    assert resumed["final"]["test_at_best_val"] == full["final"]["test_at_best_val"]
    assert [r["aggregate"] for r in resumed["rounds"]] == [r["aggregate"] for r in full["rounds"]]
    if algorithm == "gcfl":
        assert [r["aggregate"]["num-clusters"] for r in full["rounds"]] == [1, 2, 2, 2]


@pytest.mark.slow
def test_resume_with_context_state_warns_and_clients_restart(tmp_path, data_root):
    """With client-state=context the clients' optimiser state is gone after a restart:
    the server says so, and the numbers indeed differ from an uninterrupted run."""
    cfg = _config(data_root, tmp_path, "full", algorithm="fedavg", dataset=INPROCESS_DATASET,
                  **{"client-state": "context"})
    full = run_federation(cfg)
    stopped = dict(cfg, **{"run-name": "stopped"})
    run_federation(dict(stopped, rounds=2))
    logged: list[str] = []
    resumed = run_federation(dict(stopped, resume=True), log=logged.append)
    warning = [line for line in logged if line.startswith("warning: resume=true with client-state=context")]
    assert len(warning) == 1 and "optimiser" in warning[0] and "\n" not in warning[0]
    assert round_metrics(resumed)[:2] == round_metrics(full)[:2]  # history restored as it was
    assert round_metrics(resumed)[2] != round_metrics(full)[2]  # clients restarted their Adam moments


def test_resume_refuses_a_missing_or_foreign_checkpoint(tmp_path, data_root):
    cfg = _config(data_root, tmp_path, "run", algorithm="fedavg", dataset=INPROCESS_DATASET, rounds=1)
    with pytest.raises(ConfigError, match=r"resume=true but there is no checkpoint at .*run/checkpoint.pt"):
        run_federation(dict(cfg, resume=True))
    run_federation(cfg)
    with pytest.raises(ConfigError, match=r"of a different run \(seed=0 -> 1\)"):
        run_federation(dict(cfg, resume=True, seed=1, rounds=2))
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"checkpoint.pt is unreadable: "):
        run_federation(dict(cfg, resume=True, rounds=2))


def test_client_state_files_keep_the_previous_round_and_ignore_other_runs(tmp_path):
    cfg = ClientConfig(client_state_dir=str(tmp_path), run_name="x", client_state_token="aaa")
    other_run = cfg.with_round(client_state_token="bbb")
    rt.save_state_file(other_run, 0, 5, b"other run")
    assert rt.load_state_file(cfg, 0, 6) is None  # never another run's state
    assert rt.load_state_file(cfg, 0, 1) is None
    for rnd in (1, 2, 3):
        rt.save_state_file(cfg, 0, rnd, f"round {rnd}".encode())
    rt.save_state_file(cfg, 1, 1, b"client 1")  # client_1 never confused with client_0 (or _10)
    names = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.pt"))
    assert names == ["client_0/client_0.aaa.r000002.pt", "client_0/client_0.aaa.r000003.pt",
                     "client_1/client_1.aaa.r000001.pt"]
    assert rt.load_state_file(cfg, 0, 4) == b"round 3"
    # The server died after checkpointing round 2; round 3 is redone from round 2's state.
    assert rt.load_state_file(cfg, 0, 3) == b"round 2"
    rt.save_state_file(cfg, 0, 3, b"round 3 again")
    assert rt.load_state_file(cfg, 0, 4) == b"round 3 again"
    assert rt.load_state_file(cfg, 1, 4) == b"client 1"  # a client skipped by sampling


def test_supernodes_sharing_a_host_keep_their_state_in_distinct_folders(tmp_path, monkeypatch):
    """Two clients of one run on one host, the same data root and no client-state-dir
    (the deployment default ``<data-root>/client-state/<run-name>``): each gets its own
    private folder, and neither lists, reads or prunes the other's files."""
    monkeypatch.delenv("FEDGRAPH_DATA_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # ~/.cache/fedgraph-flwr, here
    cfg = ClientConfig(run_name="shared", client_state_dir="", data_root="",
                       client_state_token="tok")
    a, b = rt.state_dir(cfg, 0), rt.state_dir(cfg, 1)
    assert rt.state_dir(cfg) == tmp_path / "fedgraph-flwr" / "client-state" / "shared"
    assert a != b and a.parent == b.parent == rt.state_dir(cfg)
    for rnd in (1, 2, 3):
        pa = rt.save_state_file(cfg, 0, rnd, f"a{rnd}".encode())
        pb = rt.save_state_file(cfg, 1, rnd, f"b{rnd}".encode())
        assert pa.parent == a and pb.parent == b
    assert sorted(p.name for p in a.iterdir()) == ["client_0.tok.r000002.pt", "client_0.tok.r000003.pt"]
    assert sorted(p.name for p in b.iterdir()) == ["client_1.tok.r000002.pt", "client_1.tok.r000003.pt"]
    assert rt.load_state_file(cfg, 0, 4) == b"a3" and rt.load_state_file(cfg, 1, 4) == b"b3"
    assert (a.stat().st_mode & 0o777) == 0o700


def test_a_checkpoint_written_in_the_background_is_whole_when_read(tmp_path):
    from fedgraph_flwr.engine.checkpoint import Checkpointer

    ckpt = Checkpointer(tmp_path)
    config = RunConfig(algorithm="fedavg", seed=0)
    for rnd in (1, 2, 3):
        ckpt.save(config, {"round": rnd, "payloads": {0: {"w": np.full(4096, float(rnd))}},
                           "diagnostics": {}},
                  background=True)
    state = ckpt.load(config)  # joins the last write first
    assert state["round"] == 3 and np.all(state["payloads"][0]["w"] == 3.0)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temp files left


def test_a_background_checkpoint_that_cannot_be_written_fails_at_the_next_wait(tmp_path):
    from fedgraph_flwr.engine.checkpoint import Checkpointer

    (tmp_path / "out").write_text("a file where the run's folder should be")
    ckpt = Checkpointer(tmp_path / "out")
    ckpt.save(RunConfig(), {"round": 1}, background=True)  # returns at once
    with pytest.raises(OSError):
        ckpt.wait()
    ckpt.wait()  # reported once
