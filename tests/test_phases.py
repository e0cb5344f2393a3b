"""The round-phase contract: phase-demo (a precompute phase and two exchanges per round,
tests/phase_demo.py, registered for this module only) runs in process and in a real Flower simulation
with identical numbers, and both client-state modes agree."""

from __future__ import annotations

import json

import pytest

from fedgraph_flwr.core.phases import TRAIN_PHASE, Phase, check_phases
from fedgraph_flwr.engine.loop import run_federation

import phase_demo
from helpers import round_metrics, simulate


@pytest.fixture(autouse=True, scope="module")
def phase_demo_registered():
    with phase_demo.registered():
        yield


def _config(synthetic_root, out, run_name: str, **extra) -> dict:
    return {"algorithm": "phase-demo", "dataset": "SBM", "num-clients": 3, "rounds": 3,
            "hidden": 16, "data-root": str(synthetic_root), "output-dir": str(out),
            "run-name": run_name, **extra}


def _phase_record(results: dict) -> tuple:
    """What the non-train phases leave in results.json: the precompute's counts and
    every round's probe step."""
    pre = results["precompute"]["label_counts"]
    return (pre["metrics"], pre["bytes_received"],
            [r["aggregate"] for r in results["rounds"]],
            [r["bytes_received"] for r in results["rounds"]])


@pytest.mark.slow
def test_phase_demo_runs_every_phase_in_process(tmp_path, synthetic_root):
    results = run_federation(_config(synthetic_root, tmp_path, "inproc"), write=False)
    pre = results["precompute"]["label_counts"]
    assert pre["metrics"]["train_nodes"] == sum(c["num-train"] for c in results["clients"].values())
    assert not pre["failures"]
    for r in results["rounds"]:
        assert set(r["aggregate"]) == {"probe.mean_probe_loss", "max_weight"}
        assert len(r["clients"]) == 3 and not r["failures"]
    # probe replies (metrics only) add nothing, train replies add the model
    first = results["rounds"][0]
    assert all(first["bytes_received"][c] == first["bytes_sent"][c] // 2 for c in first["bytes_sent"])


@pytest.mark.slow
def test_phase_demo_state_files_equal_live_trainers(tmp_path, synthetic_root):
    live = run_federation(_config(synthetic_root, tmp_path, "live"), write=False)
    files = run_federation(_config(synthetic_root, tmp_path, "files", **{
        "client-state": "file", "client-state-dir": str(tmp_path / "state")}), write=False)
    assert round_metrics(live) == round_metrics(files)
    assert _phase_record(live) == _phase_record(files)


@pytest.mark.simulation
@pytest.mark.slow
def test_phase_demo_in_flower_simulation_equals_in_process(tmp_path, synthetic_root):
    from ray import cloudpickle

    from fedgraph_flwr.engine.client_app import make_client_app
    from fedgraph_flwr.engine.server_app import make_server_app

    cloudpickle.register_pickle_by_value(phase_demo)  # Ray's workers cannot import tests/
    try:
        simulate(make_server_app(_config(synthetic_root, tmp_path, "flower")),
                 make_client_app(mods=[phase_demo.register_in_client_app]), 3)
    finally:
        cloudpickle.unregister_pickle_by_value(phase_demo)
    flower = json.loads((tmp_path / "flower" / "results.json").read_text())
    inproc = run_federation(_config(synthetic_root, tmp_path, "inproc"))
    assert round_metrics(flower) == round_metrics(inproc)
    assert _phase_record(flower) == _phase_record(inproc)
    assert flower["final"]["test_at_best_val"] == inproc["final"]["test_at_best_val"]


def test_phases_are_checked_when_declared():
    with pytest.raises(ValueError, match="lower-case"):
        Phase("Probe")
    with pytest.raises(ValueError, match="when="):
        Phase("probe", when="sometimes")
    with pytest.raises(ValueError, match="train phase runs every round"):
        Phase("train", when="before-first-round")
    with pytest.raises(ValueError, match="last phase"):
        check_phases((TRAIN_PHASE, Phase("probe")))
    with pytest.raises(ValueError, match="repeat"):
        check_phases((Phase("probe"), Phase("probe"), TRAIN_PHASE))
    assert Phase("probe").message_type == "train.probe" and TRAIN_PHASE.message_type == "train"


@pytest.mark.slow
def test_one_deadline_per_round_shared_by_its_phases(tmp_path, synthetic_root):
    """round-timeout bounds the whole round: each phase's exchange gets what the earlier
    ones left of it (not a fresh round-timeout each), and refresh gets the same deadline."""
    import time

    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.driver import RoundDriver
    from fedgraph_flwr.engine.loop import InProcessTransport

    seen: list[tuple[int, str, float]] = []
    deadlines: list[float] = []

    class SlowProbe(InProcessTransport):
        def refresh(self, config, deadline=None):
            deadlines.append(deadline - time.monotonic())

        def exchange(self, phase, requests, timeout):
            seen.append((next(iter(requests.values())).config.server_round, phase.name, timeout))
            if phase.name == "probe":
                time.sleep(0.5)
            return super().exchange(phase, requests, timeout)

    cfg = resolve_config(None, _config(synthetic_root, tmp_path, "deadline", rounds=2,
                                       **{"round-timeout": 5.0}))
    RoundDriver(cfg, SlowProbe(), write=False).run()
    assert seen[0][:2] == (0, "label_counts") and seen[0][2] == 5.0  # precompute: its own
    per_round = [[(name, t) for r, name, t in seen if r == rnd] for rnd in (1, 2)]
    for phases in per_round:
        (probe, t_probe), (train, t_train) = phases
        assert (probe, train) == ("probe", "train")
        assert 4.0 < t_probe <= 5.0 and t_train <= t_probe - 0.5, phases
    assert len(deadlines) == 2 and all(4.9 < d <= 5.0 for d in deadlines), deadlines
