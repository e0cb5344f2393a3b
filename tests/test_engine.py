"""The engine end to end: real Flower simulations and the in-process loop."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from fedgraph_flwr.algorithms import ALGORITHMS
from fedgraph_flwr.config import ClientSettings
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.engine.records import content_scalars

from helpers import round_metrics, simulate


def _sim(overrides: dict, num_supernodes: int, mods: list | None = None) -> None:
    from fedgraph_flwr.engine.client_app import make_client_app
    from fedgraph_flwr.engine.server_app import make_server_app

    simulate(make_server_app(overrides), make_client_app(mods), num_supernodes)


def _config_keys_recorder(folder: Path):
    """A Flower client mod that writes the config keys of every message a ClientApp
    receives to ``folder`` (one file per message type; the ClientApps run in Ray workers)."""
    def mod(message, context, call_next):
        if "config" in message.content:
            name = message.metadata.message_type.replace(".", "_")
            config = content_scalars(message.content, "config")
            (folder / f"{name}.json").write_text(json.dumps(sorted(config)))
        return call_next(message, context)

    return mod


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


@pytest.mark.slow
@pytest.mark.smoke
def test_inprocess_is_deterministic(tmp_path, synthetic_root):
    cfg = {"algorithm": "fedavg", "dataset": "SBM", "num-clients": 3, "rounds": 3, "hidden": 16,
           "data-root": str(synthetic_root), "output-dir": str(tmp_path)}
    a = run_federation(dict(cfg, **{"run-name": "a"}))
    b = run_federation(dict(cfg, **{"run-name": "b"}))
    assert _same(round_metrics(a), round_metrics(b))
    assert a["final"]["test_at_best_val"] == b["final"]["test_at_best_val"]
    assert (tmp_path / "a" / "results.json").is_file() and (tmp_path / "a" / "history.csv").is_file()


#: Run the live-vs-restored comparison in their own test file, on a config that suits them.
OWN_STATE_TEST = {"adafgl", "fedgnn", "fedlit"}
#: More than a few seconds each here (fedsage: about 90 s on 2 cores).
SLOW_STATE_TEST = {"fedaux", "fediih", "fedsage", "fedspray"}


@pytest.mark.parametrize("algorithm", [
    pytest.param(a, marks=pytest.mark.slow) if a in SLOW_STATE_TEST else a
    for a in sorted(ALGORITHMS) if a not in OWN_STATE_TEST])
@pytest.mark.slow
def test_live_trainers_equal_trainers_restored_from_state(tmp_path, synthetic_root, algorithm):
    """The in-process loop keeps each client's trainer alive between rounds; a ClientApp
    rebuilds it from its serialised local state every round (here: client-state=file).
    Equal numbers mean local_state() holds everything a trainer carries across rounds."""
    cfg = {"algorithm": algorithm, "dataset": "SBM", "num-clients": 3, "rounds": 3, "hidden": 16,
           "local-epochs": 2, "data-root": str(synthetic_root), "output-dir": str(tmp_path)}
    live = run_federation(dict(cfg, **{"run-name": "live"}), write=False)
    restored = run_federation(dict(cfg, **{"run-name": "restored", "client-state": "file",
                                           "client-state-dir": str(tmp_path / "state")}),
                              write=False)
    assert _same(round_metrics(live), round_metrics(restored))


@pytest.mark.slow
def test_a_client_whose_state_is_not_where_it_saved_it_fails_instead_of_training_on_less(
        tmp_path, synthetic_root):
    """client-state=file, and client 1's folder vanishes after round 2 (a client landing on
    a machine without the shared folder sees the same): in round 3 it fails with a
    one-line reason instead of silently starting over; the others train on."""
    import shutil

    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.client_runtime import state_dir
    from fedgraph_flwr.engine.driver import RoundDriver
    from fedgraph_flwr.engine.loop import InProcessTransport

    cfg = resolve_config(None, {
        "algorithm": "fedavg", "dataset": "SBM", "num-clients": 3, "rounds": 3, "hidden": 16,
        "data-root": str(synthetic_root), "output-dir": str(tmp_path), "run-name": "moved",
        "client-state": "file", "client-state-dir": str(tmp_path / "state"), "fail-fast": False})

    class Moved(InProcessTransport):
        def exchange(self, phase, requests, timeout):
            config = next(iter(requests.values())).config
            if config.server_round == 3:
                shutil.rmtree(state_dir(config, 1))
            return super().exchange(phase, requests, timeout)

    fed = RoundDriver(cfg, Moved(), write=False).run()
    assert not fed.rounds[1].failures
    reason = fed.rounds[2].failures[1]
    assert reason.startswith("StaleClientStateError: client 1: its state from round 2 is not in")
    assert "\n" not in reason and sorted(fed.rounds[2].clients) == [0, 2]


@pytest.mark.slow
def test_inprocess_is_deterministic_with_threaded_scatter(tmp_path, data_root):
    """FedIIH's routing sums over edges with scatter-add; with two CPU threads that sum
    used to come out in varying order (last-digit differences). Same config, same numbers."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        config_file = Path(__file__).resolve().parents[1] / "configs/fediih/cora-disjoint-10.yaml"
        cfg = {"config-file": str(config_file), "num-clients": 3,
               "rounds": 2, "hidden": 32, "data-root": str(data_root), "output-dir": str(tmp_path)}
        a = run_federation(dict(cfg, **{"run-name": "a"}), write=False)
        b = run_federation(dict(cfg, **{"run-name": "b"}), write=False)
    finally:
        torch.set_num_threads(threads)
    assert _same(round_metrics(a), round_metrics(b))


@pytest.mark.slow
@pytest.mark.smoke
def test_local_never_uploads_and_differs_from_fedavg(tmp_path, synthetic_root):
    cfg = {"dataset": "SBM", "num-clients": 3, "rounds": 3, "hidden": 16,
           "data-root": str(synthetic_root), "output-dir": str(tmp_path)}
    local = run_federation(dict(cfg, algorithm="local"))
    fedavg = run_federation(dict(cfg, algorithm="fedavg"))
    assert local["final"]["total_bytes_received"] == 0
    assert fedavg["final"]["total_bytes_received"] > 0
    # Round 1 is identical (same initial model, same seeds); mixing changes round 2.
    assert _same(round_metrics(local)[0], round_metrics(fedavg)[0])
    assert not _same(round_metrics(local)[1], round_metrics(fedavg)[1])


@pytest.mark.simulation
@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["SBM", "Cora"])
def test_flower_simulation_matches_inprocess(tmp_path, request, dataset):
    data_root = request.getfixturevalue("synthetic_root" if dataset == "SBM" else "data_root")
    cfg = {"algorithm": "fedavg", "dataset": dataset, "num-clients": 3, "rounds": 2,
           "hidden": 16, "data-root": str(data_root), "output-dir": str(tmp_path),
           "run-name": "flower"}
    seen = tmp_path / "config-keys"
    seen.mkdir()
    _sim(cfg, num_supernodes=3, mods=[_config_keys_recorder(seen)])
    # A client hears the common client keys, its algorithm's options and the engine's
    # per-round keys: nothing of the other algorithms or the server's own settings.
    from fedgraph_flwr.algorithms import get_algorithm
    from fedgraph_flwr.config import client_keys

    engine_keys = {"server-round", "num-classes-global", "num-features-global",
                   "client-state-token"}
    train_keys = set(json.loads((seen / "train.json").read_text()))
    assert train_keys == set(client_keys()) | set(get_algorithm("fedavg").options.keys()) | engine_keys
    assert len(train_keys) == len(client_keys()) + 1 + 4 == 40  # fedavg has one option
    assert set(json.loads((seen / "query.json").read_text())) <= train_keys
    flower = json.loads((tmp_path / "flower" / "results.json").read_text())
    assert [r["round"] for r in flower["rounds"]] == [1, 2]
    assert all(len(r["clients"]) == 3 and not r["failures"] for r in flower["rounds"])
    inproc = run_federation(dict(cfg, **{"run-name": "inproc"}))
    assert _same(round_metrics(flower), round_metrics(inproc))
    assert 0 < flower["final"]["test_at_best_val"] <= 100
    assert flower["rounds"][0]["bytes_sent"] == inproc["rounds"][0]["bytes_sent"]


@pytest.mark.simulation
@pytest.mark.slow
def test_supernode_count_mismatch_names_the_fix(tmp_path, synthetic_root, capfd):
    # The default handshake-timeout (600 s, for deployments whose SuperNodes join over
    # minutes): a simulation's SuperNodes are all there at start, so it fails in seconds.
    cfg = {"algorithm": "fedavg", "dataset": "SBM", "num-clients": 4, "rounds": 1,
           "data-root": str(synthetic_root), "output-dir": str(tmp_path)}
    # run_simulation re-raises the ServerApp's error; the one-line fix is on stderr too.
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="num-supernodes=4"):
        _sim(cfg, num_supernodes=3)
    assert time.perf_counter() - t0 < 120
    err = capfd.readouterr().err
    assert 'fedgraph-flwr: error: the federation has 3 SuperNodes but num-clients=4' in err
    # Run as printed, the fix keeps the user's own settings (num-clients among them).
    assert ('flwr run . --run-config "algorithm=\'fedavg\' dataset=\'SBM\' num-clients=4 '
            f'data-root=\'{synthetic_root}\' rounds=1 output-dir=\'{tmp_path}\'" '
            '--federation-config "num-supernodes=4"') in err
    assert 'or pass --run-config "algorithm=\'fedavg\' dataset=\'SBM\' num-clients=3 ' in err
    assert not any(tmp_path.iterdir())  # nothing half-written


@pytest.mark.slow
def test_progress_json_is_rewritten_after_every_round(tmp_path, data_root):
    """A live run is watchable from its output folder: progress.json after each round."""
    cfg = {"algorithm": "fedavg", "dataset": "SBM", "num-clients": 3, "rounds": 3, "hidden": 16,
           "data-root": str(data_root), "output-dir": str(tmp_path), "run-name": "watch"}
    seen = []

    def log(line: str) -> None:
        path = tmp_path / "watch" / "progress.json"
        if line.startswith("round ") and path.is_file():
            seen.append(json.loads(path.read_text())["round"])

    run_federation(cfg, log=log)
    progress = json.loads((tmp_path / "watch" / "progress.json").read_text())
    # each round's log line comes before that round's progress write: it sees the last one
    assert seen == [1, 2]
    assert progress["round"] == 3 and progress["finished"] and progress["eta_s"] == 0
    assert progress["last_round"]["clients"] == 3 and progress["last_round"]["failures"] == {}
    assert 1 <= progress["best_so_far"]["round"] <= 3


def test_memory_use_reads_a_containers_cgroup_else_the_machine(tmp_path):
    from fedgraph_flwr.engine import client_runtime as rt

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8000000 kB\nMemFree: 1 kB\nMemAvailable:   2000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")  # no limit: the machine's figure
    used, of = rt.memory_use(cgroup, meminfo)
    assert used == pytest.approx(0.75) and of == "this machine's 7.6 GiB"
    (cgroup / "memory.max").write_text(f"{2**30}\n")
    (cgroup / "memory.current").write_text(f"{900 * 2**20}\n")
    (cgroup / "memory.stat").write_text(f"anon 1\ninactive_file {100 * 2**20}\nactive_file 5\n")
    used, of = rt.memory_use(cgroup, meminfo)
    assert used == pytest.approx(800 / 1024) and of == "the container's 1.0 GiB"
    rt.check_memory(ClientSettings(memory_limit=0.0))  # off
    with pytest.raises(rt.MemoryGuardError, match=r"^\d+% of .* memory is in use, over memory-limit=1e-09"):
        rt.check_memory(ClientSettings(memory_limit=1e-9))
