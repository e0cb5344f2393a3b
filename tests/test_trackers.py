"""``trackers``: what each tracker wrote, read back with the library's own reader, equals
results.json round by round; a resumed run continues the same tracker runs; a grid groups
its runs by grid and cell; a missing package is one line before any client trains.

The runs: FedAux on the synthetic SBM graph (no data files), 3 clients, in process through
the same round driver the ServerApp runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedgraph_flwr.config import ConfigError, resolve_config
from fedgraph_flwr.engine.loop import InProcessTransport, run_federation
from fedgraph_flwr.engine.trackers import round_scalars

INSTALLED = [n for n in ("tensorboard", "wandb", "mlflow") if importlib.util.find_spec(n)]


def needs(name: str):
    return pytest.mark.skipif(name not in INSTALLED, reason=f"{name} is not installed: "
                              f"pip install -e '.[{name}]' (or '.[tracking]')")


def _config(data_root: Path, out: Path, run_name: str, **extra) -> dict:
    cfg = {"algorithm": "fedaux", "dataset": "SBM", "num-clients": 3, "rounds": 3,
           "hidden": 16, "data-root": str(data_root), "output-dir": str(out),
           "run-name": run_name, "trackers": ",".join(INSTALLED)}
    cfg.update(extra)
    return cfg


def expected(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per round, the figures the trackers should hold: from results.json, and the
    mixing matrix from diagnostics.npz (FedAux's)."""
    results = json.loads((run_dir / "results.json").read_text())
    npz = run_dir / "diagnostics.npz"
    weights = np.load(npz)["weights"] if npz.is_file() else None
    return {e["round"]: round_scalars(e, None if weights is None else weights[e["round"] - 1])
            for e in results["rounds"]}


def check_against_results(run_dir: Path, logged: dict[int, dict[str, float]], rel: float) -> None:
    """``logged`` (per step, tag -> value) holds results.json's rounds, and some of its
    figures checked by name, not through :func:`round_scalars`."""
    results = json.loads((run_dir / "results.json").read_text())
    rounds = [e["round"] for e in results["rounds"]]
    assert sorted(s for s in logged if s > 0) == rounds
    want = expected(run_dir)
    for step in rounds:
        assert set(logged[step]) >= set(want[step])
        for tag, value in want[step].items():
            assert logged[step][tag] == pytest.approx(value, rel=rel, abs=1e-12), (step, tag)
    for phase, costs in results.get("precompute", {}).items():
        assert logged[0][f"precompute/{phase}/seconds"] == pytest.approx(costs["seconds"], rel=rel)
        assert logged[0][f"precompute/{phase}/bytes_sent"] == costs["bytes_sent"]
    for entry in results["rounds"]:
        got = logged[entry["round"]]
        assert got["mean/test"] == pytest.approx(entry["mean_test"], rel=rel)
        assert got["held/val"] == pytest.approx(entry["held_mean_val"], rel=rel)
        assert got["client/2/val"] == pytest.approx(entry["clients"]["2"]["val_metric"], rel=rel)
        assert got["bytes/sent"] == sum(entry["bytes_sent"].values())
        assert got["seconds/round"] == pytest.approx(entry["times"]["round"], rel=rel)
        if results["config"]["algorithm"] != "fedaux":
            continue
        # FedAux's own figure, and the one the trackers derive from its mixing matrix
        assert got["server/spectral_gap"] == pytest.approx(entry["aggregate"]["spectral_gap"], rel=rel)
        assert got["mixing/spectral_gap"] == pytest.approx(entry["aggregate"]["spectral_gap"], rel=1e-5)
        assert got["mixing/self_weight"] == pytest.approx(entry["aggregate"]["self_weight_mean"],
                                                          rel=1e-5)
    last = rounds[-1]
    assert logged[last]["final/test_at_best_val"] == pytest.approx(
        results["final"]["test_at_best_val"], rel=rel)


# --- readers: each library's own -----------------------------------------------------------
def tensorboard_scalars(logdir: Path) -> dict[int, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    out: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            assert tag not in out.setdefault(event.step, {}), f"{tag} twice at step {event.step}"
            out[event.step][tag] = event.value
    return out


def wandb_records(run_dir: Path) -> list[dict]:
    """The records of an offline run's .wandb file, by wandb's own reader (`wandb beta leet
    inspect --json`)."""
    text = subprocess.run([sys.executable, "-m", "wandb", "beta", "leet", "inspect", "--json",
                           str(run_dir)], check=True, capture_output=True, text=True,
                          timeout=120).stdout
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def wandb_history(records: list[dict]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for rec in records:
        if rec["type"] == "history":
            item = rec["history"]["item"]
            out[int(item["_step"])] = {k: v for k, v in item.items() if not k.startswith("_")}
    return out


def wandb_summary(records: list[dict]) -> dict:
    summary: dict = {}
    for rec in records:
        if rec["type"] == "summary":
            summary.update(rec["summary"].get("update", {}))
    return summary


def wandb_runs(root: Path) -> list[Path]:
    return sorted((root / "wandb").glob("offline-run-*"))


def mlflow_metrics(client, run_id: str) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            assert key not in out.setdefault(m.step, {}), f"{key} twice at step {m.step}"
            out[m.step][key] = m.value
    return out


def mlflow_client(state: dict):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=state["mlflow"]["tracking_uri"])


# --- one run, every installed tracker --------------------------------------------------------
@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, synthetic_root) -> Path:
    if not INSTALLED:
        pytest.skip("no tracker installed: pip install -e '.[tracking]'")
    out = tmp_path_factory.mktemp("tracked")
    run_federation(_config(synthetic_root, out, "run"))
    return out


@pytest.mark.slow
@needs("tensorboard")
def test_tensorboard_event_file_holds_every_round_of_results_json(tracked_run):
    run_dir = tracked_run / "run"
    logdir = tracked_run / "trackers" / "tensorboard" / "run"
    assert json.loads((run_dir / "trackers.json").read_text())["tensorboard"]["logdir"] == str(logdir)
    check_against_results(run_dir, tensorboard_scalars(logdir), rel=1e-6)  # stored as float32


@pytest.mark.slow
@needs("wandb")
def test_wandb_offline_run_holds_every_round_of_results_json(tracked_run):
    run_dir = tracked_run / "run"
    state = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    (offline,) = wandb_runs(tracked_run / "trackers")
    assert offline.name.endswith(state["id"])
    records = wandb_records(offline)
    history = wandb_history(records)
    # the final figures are the run's summary (not a step of its history)
    summary = wandb_summary(records)
    results = json.loads((run_dir / "results.json").read_text())
    history[results["rounds"][-1]["round"]].update(
        {k: v for k, v in summary.items() if k.startswith("final/")})
    check_against_results(run_dir, history, rel=1e-12)
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert run["run_id"] == state["id"] and run["display_name"] == "run"
    assert run["config"]["update"]["fedaux-sigma"] == results["config"]["fedaux-sigma"]


@pytest.mark.slow
@needs("mlflow")
def test_mlflow_store_holds_every_round_of_results_json(tracked_run):
    run_dir = tracked_run / "run"
    state = json.loads((run_dir / "trackers.json").read_text())
    client = mlflow_client(state)
    run = client.get_run(state["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    results = json.loads((run_dir / "results.json").read_text())
    assert run.data.params["rounds"] == "3" and run.data.params["algorithm"] == "fedaux"
    # the common keys and FedAux's options, not every method's
    assert "fedaux-sigma" in run.data.params and "fediih-tau" not in run.data.params
    metrics = mlflow_metrics(client, run.info.run_id)
    check_against_results(run_dir, metrics, rel=1e-12)
    table = Path(run.info.artifact_uri.removeprefix("file://")) / "final.md"
    assert f"| test_at_best_val | {results['final']['test_at_best_val']:.6g} |" in table.read_text()


# --- resume ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_resumed_run_continues_its_tracker_runs(tmp_path, synthetic_root):
    """Rounds 1-2, then resume=true to round 4: the same tracker runs (ids in trackers.json),
    each round once, at step = round, equal to the resumed run's results.json."""
    if not INSTALLED:
        pytest.skip("no tracker installed: pip install -e '.[tracking]'")
    cfg = _config(synthetic_root, tmp_path, "resumed", rounds=4)
    run_federation(dict(cfg, rounds=2))
    before = json.loads((tmp_path / "resumed" / "trackers.json").read_text())
    if "tensorboard" in INSTALLED:
        # as if the stopped process had logged round 3 after its last checkpoint (round 2)
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(before["tensorboard"]["logdir"], filename_suffix=".stale") as stale:
            stale.add_scalar("mean/test", 99.0, 3)
    run_federation(dict(cfg, resume=True))
    after = json.loads((tmp_path / "resumed" / "trackers.json").read_text())
    assert after == before
    run_dir = tmp_path / "resumed"
    if "tensorboard" in INSTALLED:
        logdir = Path(after["tensorboard"]["logdir"])
        assert len(list(logdir.glob("events.out.tfevents.*"))) == 3  # two runs and the stale one
        # one value per step (the stale round 3 purged), each equal to results.json
        check_against_results(run_dir, tensorboard_scalars(logdir), rel=1e-6)
    if "wandb" in INSTALLED:
        first, second = wandb_runs(tmp_path / "trackers")
        steps = []
        history: dict[int, dict[str, float]] = {}
        for offline in (first, second):
            records = wandb_records(offline)
            (run,) = [r["run"] for r in records if r["type"] == "run"]
            assert run["run_id"] == after["wandb"]["id"]  # `wandb sync` merges them into one run
            part = wandb_history(records)
            steps.append(sorted(part))
            history.update(part)
        assert steps == [[1, 2], [3, 4]]
        history[4].update({k: v for k, v in wandb_summary(records).items() if k.startswith("final/")})
        check_against_results(run_dir, history, rel=1e-12)
    if "mlflow" in INSTALLED:
        client = mlflow_client(after)
        run = client.get_run(after["mlflow"]["run_id"])
        assert run.info.status == "FINISHED"
        assert len(client.search_runs([run.info.experiment_id])) == 1
        check_against_results(run_dir, mlflow_metrics(client, run.info.run_id), rel=1e-12)


@pytest.mark.slow
def test_a_tracker_added_at_resume_gets_the_rounds_before(tmp_path, synthetic_root):
    """Rounds 1-2 without trackers, then resumed to 4 with them: each new tracker run holds
    the before-first-round phases' costs at step 0 (FedGCN's neighbour sums) and rounds 1-4."""
    if not INSTALLED:
        pytest.skip("no tracker installed: pip install -e '.[tracking]'")
    cfg = _config(synthetic_root, tmp_path, "added", algorithm="fedgcn", rounds=4,
                  **{"client-state": "file", "client-state-dir": str(tmp_path / "state")})
    run_federation(dict(cfg, rounds=2, trackers=""))
    assert not (tmp_path / "added" / "trackers.json").exists()
    run_federation(dict(cfg, resume=True))
    state = json.loads((tmp_path / "added" / "trackers.json").read_text())
    results = json.loads((tmp_path / "added" / "results.json").read_text())
    assert set(results["precompute"]) == {"neighbour_sums", "halo_sums"}
    run_dir = tmp_path / "added"
    if "tensorboard" in INSTALLED:
        check_against_results(run_dir, tensorboard_scalars(Path(state["tensorboard"]["logdir"])),
                              rel=1e-6)
    if "wandb" in INSTALLED:
        (offline,) = wandb_runs(tmp_path / "trackers")
        records = wandb_records(offline)
        history = wandb_history(records)
        assert sorted(history) == [0, 1, 2, 3, 4]  # step 0 first: wandb drops a step that falls
        history[4].update({k: v for k, v in wandb_summary(records).items() if k.startswith("final/")})
        check_against_results(run_dir, history, rel=1e-12)
    if "mlflow" in INSTALLED:
        client = mlflow_client(state)
        check_against_results(run_dir, mlflow_metrics(client, state["mlflow"]["run_id"]), rel=1e-12)


# --- grids -----------------------------------------------------------------------------------
@pytest.mark.slow
@needs("tensorboard")
@needs("mlflow")
def test_a_grid_groups_its_tracker_runs_by_grid_and_cell(tmp_path, synthetic_root):
    from fedgraph_flwr.experiments import run_grid

    spec = {"name": "tiny-grid", "base": {"dataset": "SBM", "num-clients": 3, "rounds": 2,
                                          "hidden": 16, "data-root": str(synthetic_root)},
            "grid": {"algorithm": ["fedaux", "fedavg"]}, "seeds": [0, 1]}
    run_grid(spec, tmp_path, None, "inprocess", {"trackers": "tensorboard,mlflow"})
    root = tmp_path / "trackers"
    # the run folders are named as without trackers (a grid's finished runs are found again)
    names = sorted(p.name for p in (tmp_path / "tiny-grid").glob("*-seed*"))
    assert [n.split("-seed")[0] for n in names] == ["fedaux-SBM-metis-3"] * 2 + ["fedavg-SBM-metis-3"] * 2
    cells = sorted({n.replace("-seed0", "").replace("-seed1", "") for n in names})
    assert sorted(p.name for p in (root / "tensorboard" / "tiny-grid").iterdir()) == cells
    for cell in cells:
        seeds = sorted(p.name for p in (root / "tensorboard" / "tiny-grid" / cell).iterdir())
        assert seeds == ["seed0", "seed1"]
    state = json.loads((tmp_path / "tiny-grid" / names[-1] / "trackers.json").read_text())
    client = mlflow_client(state)
    experiment = client.get_experiment_by_name("tiny-grid")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted((r.data.tags["cell"], r.data.tags["seed"]) for r in runs) == [
        (cell, seed) for cell in cells for seed in ("0", "1")]
    assert sorted(r.info.run_name for r in runs) == names


# --- errors, in one line, before any client ----------------------------------------------------
def test_a_missing_tracker_package_is_one_line_naming_its_extra(tmp_path, monkeypatch,
                                                                 synthetic_root):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))

    def connect(self, config):
        raise AssertionError("a client was contacted before the tracker check")

    monkeypatch.setattr(InProcessTransport, "connect", connect)
    with pytest.raises(ConfigError) as err:
        run_federation(_config(synthetic_root, tmp_path, "r", trackers="tensorboard,wandb"))
    assert str(err.value) == ("trackers=wandb needs the wandb package, which is not installed here: "
                              "pip install -e '.[wandb]' ('.[tracking]' installs all three)")


def test_unknown_or_repeated_trackers_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"unknown tracker 'tensorbord'.*did you mean 'tensorboard'"):
        resolve_config(None, {"trackers": "wandb,tensorbord"})
    with pytest.raises(ConfigError, match="names a tracker twice"):
        resolve_config(None, {"trackers": "wandb, wandb"})
    with pytest.raises(ConfigError, match="must be '<grid>/<cell>'"):
        resolve_config(None, {"trackers": "wandb", "tracker-group": "a grid"})
    cfg = resolve_config(None, {"trackers": " mlflow , tensorboard", "output-dir": "o"})
    assert cfg.tracker_names == ("mlflow", "tensorboard")
    assert cfg.tracker_path == Path("o") / "trackers"


@pytest.mark.slow  # a fresh interpreter importing the driver loads torch: 3-7 s here
def test_the_engine_imports_no_tracker_library():
    code = ("import sys, fedgraph_flwr.engine.driver, fedgraph_flwr.engine.trackers; "
            "print([m for m in ('tensorboard', 'wandb', 'mlflow', 'torch.utils.tensorboard') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1],
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    assert out.strip() == "[]"


# --- under Flower: the ServerApp logs --------------------------------------------------------
@pytest.mark.simulation
@pytest.mark.slow
@needs("tensorboard")
def test_the_serverapp_of_a_flower_simulation_logs_every_round(tmp_path, synthetic_root):
    """The same tracker under Flower's simulation: the ServerApp's round driver writes it
    (no ClientApp imports a tracker: tests/test_import_graph.py keeps the server side apart)."""
    from fedgraph_flwr.engine.client_app import make_client_app
    from fedgraph_flwr.engine.server_app import make_server_app
    from fedgraph_flwr.engine.simulation import simulate

    cfg = _config(synthetic_root, tmp_path, "flower", rounds=2, trackers="tensorboard")
    simulate(make_server_app(cfg), make_client_app(), num_supernodes=3)
    check_against_results(tmp_path / "flower",
                          tensorboard_scalars(tmp_path / "trackers" / "tensorboard" / "flower"), rel=1e-6)
