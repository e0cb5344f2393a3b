"""Experiment trackers (``trackers=tensorboard,wandb,mlflow``): every round's server-side
figures, the run's config as hyper-parameters and the final table, logged by the server's
round driver (never by a client) through each library's own API:

- TensorBoard: ``torch.utils.tensorboard.SummaryWriter`` under
  ``<tracker-dir>/tensorboard/<run-name>`` (a grid's run: ``<grid>/<cell>/seed<N>``);
- Weights & Biases: ``wandb.init`` in offline mode unless ``WANDB_MODE`` says otherwise (no
  account, no network; ``wandb sync <tracker-dir>/wandb/offline-run-*`` uploads later);
- MLflow: ``MlflowClient`` on MLflow's local store, ``sqlite:///<tracker-dir>/mlflow.db``
  (artifacts under ``<tracker-dir>/mlruns``), or ``MLFLOW_TRACKING_URI`` where set.

The libraries are optional extras, imported only when a run starts its tracker: a missing
one is a one-line :class:`ConfigError` before any client is contacted
(:func:`check_installed`). Every figure is read from the round's entry of results.json
(:meth:`~.run_recorder.RunRecorder.round_entry`), so a tracker shows what results.json
holds; the step is the round. A resumed run (``resume=true``) continues the same tracker
runs: their ids are kept in ``<run dir>/trackers.json``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..config import TRACKERS, ConfigError, RunConfig

#: The tracker run ids of a run, in its run folder (what a resume continues).
STATE_FILE = "trackers.json"
#: Project (wandb) and experiment (MLflow) of a run outside a grid.
DEFAULT_PROJECT = "fedgraph-flwr"
#: The K×K diagnostics that are a round's mixing matrix (FedAux, FedGTA: weights; FED-PUB: mixing).
MIXING_DIAGNOSTICS = ("weights", "mixing")
#: Per-client figures logged each round: results.json's metric key -> the tracker's name.
CLIENT_FIGURES = {"val_metric": "val", "test_metric": "test", "train_loss": "train_loss"}


def check_installed(names: Iterable[str]) -> None:
    """One line naming the extra to install when a tracker's package is missing here."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ConfigError(f"trackers={name} needs the {name} package, which is not installed "
                              f"here: pip install -e '.[{name}]' ('.[tracking]' installs all three)")


def round_scalars(entry: Mapping[str, Any], mixing: np.ndarray | None = None) -> dict[str, float]:
    """A round's figures by tracker name, from its results.json entry; NaN and infinite
    values are left out (a round where nobody reported a metric).

    ``mixing``: the round's K×K mixing matrix (NaN rows and columns for clients that sat
    out), giving its mean self-weight and spectral gap ‖W − 11ᵀ/K‖₂."""
    out: dict[str, float] = {
        "mean/val": entry["mean_val"], "mean/test": entry["mean_test"],
        "mean/train_loss": entry["mean_train_loss"],
        "held/val": entry["held_mean_val"], "held/test": entry["held_mean_test"],
        "bytes/sent": sum(entry["bytes_sent"].values()),
        "bytes/received": sum(entry["bytes_received"].values()),
        "clients/sampled": len(entry["sampled"]), "clients/replied": len(entry["clients"]),
        "clients/failures": len(entry["failures"]), "round/void": float(entry["void"]),
    }
    out.update({f"seconds/{phase}": s for phase, s in entry["times"].items()})
    train = [t["train"] for t in entry["client_times"].values() if "train" in t]
    if train:
        out["seconds/client_train_mean"] = float(np.mean(train))
    for cid, metrics in entry["clients"].items():
        out.update({f"client/{cid}/{name}": metrics[key]
                    for key, name in CLIENT_FIGURES.items() if key in metrics})
    for key, value in entry["aggregate"].items():
        out["dp/epsilon" if key == "dp-epsilon" else f"server/{key}"] = value
    if mixing is not None:
        taken = ~np.isnan(mixing).all(axis=1)
        w = mixing[np.ix_(taken, taken)]
        if w.size:
            k = w.shape[0]
            out["mixing/self_weight"] = float(np.mean(np.diag(w)))
            out["mixing/spectral_gap"] = float(np.linalg.norm(w - np.full((k, k), 1.0 / k), ord=2))
    return {k: float(v) for k, v in out.items() if math.isfinite(float(v))}


def final_scalars(final: Mapping[str, Any]) -> dict[str, float]:
    """results.json's ``final`` figures that are numbers, as ``final/<name>``."""
    return {f"final/{k}": float(v) for k, v in final.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def final_table(final: Mapping[str, Any]) -> str:
    """results.json's ``final`` as a Markdown table (its numbers and short texts)."""
    rows = [f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |"
            for k, v in final.items() if isinstance(v, int | float | str)]
    return "\n".join(["| figure | value |", "|---|---|", *rows])


def hyperparameters(config: Mapping[str, Any]) -> dict[str, bool | int | float | str]:
    """The run's config with every value a bool, number or string (what the trackers take)."""
    return {k: v if isinstance(v, bool | int | float | str) else json.dumps(v, default=str)
            for k, v in config.items()}


class TensorBoardTracker:
    """``SummaryWriter`` scalars, hyper-parameters (the HParams plugin) and texts."""

    name = "tensorboard"
    HPARAM_METRICS = ("held/test", "mean/test", "final/test_at_best_val")

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.writer: Any = None
        self.session_end: Any = None

    def start(self, state: dict[str, Any], config: Mapping[str, Any], first_round: int,
              labels: Mapping[str, str]) -> dict[str, Any]:
        """Open the writer; a resume appends to the same folder and hides what the earlier
        process wrote from ``first_round`` on (``purge_step``), so a repeated round appears once."""
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        logdir = Path(state.get("logdir", self.logdir))
        if state:
            self.writer = SummaryWriter(str(logdir), purge_step=first_round)
        else:  # a fresh run of this name: its earlier events would mix with the new ones
            for old in logdir.glob("events.out.tfevents.*"):
                old.unlink()
            self.writer = SummaryWriter(str(logdir))
        experiment, session_start, self.session_end = hparams(
            hyperparameters(config), {m: 0.0 for m in self.HPARAM_METRICS})
        if not state:
            self.writer.file_writer.add_summary(experiment)
            self.writer.file_writer.add_summary(session_start)
            self.writer.add_text("config", "\n".join(
                ["| key | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in config.items())]), 0)
        return {"logdir": str(logdir)}

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """One round's scalars, flushed (a live run's dashboard reads them)."""
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def finish(self, final: Mapping[str, float], table: str, step: int, failed: bool) -> None:
        """The final figures as scalars at the last round, the table as text; closed."""
        self.log(final, step)
        self.writer.add_text("final", table, step)
        self.writer.file_writer.add_summary(self.session_end)
        self.writer.close()


class WandbTracker:
    """``wandb.init`` (offline unless ``WANDB_MODE`` is set), ``run.log(step=round)``,
    the final figures in the run's summary."""

    name = "wandb"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.run: Any = None

    def start(self, state: dict[str, Any], config: Mapping[str, Any], first_round: int,
              labels: Mapping[str, str]) -> dict[str, Any]:
        """A new run, or (resume) the run of ``state``'s id, continued (``resume='allow'``)."""
        import wandb

        self.directory.mkdir(parents=True, exist_ok=True)
        run_id = state.get("id") or secrets.token_hex(6)  # wandb's ids: letters and digits
        project = os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self.run = wandb.init(
            project=project, id=run_id, resume="allow", name=labels["run-name"],
            group=labels.get("grid"), job_type=labels.get("cell"), dir=str(self.directory),
            config=None if state else dict(hyperparameters(config)),
            tags=[labels["algorithm"], labels["dataset"]],
            mode=os.environ.get("WANDB_MODE") or "offline",  # type: ignore[arg-type]
            # the ServerApp's own output stays its own; no system-metrics sampler beside it
            settings=wandb.Settings(console="off", quiet=True, x_disable_stats=True))
        return {"id": run_id, "project": project}

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """One round's scalars at step = round."""
        self.run.log(dict(scalars), step=step)

    def finish(self, final: Mapping[str, float], table: str, step: int, failed: bool) -> None:
        """The final figures into the summary; the run ended (exit code 1 if it failed)."""
        self.run.summary.update(dict(final))
        self.run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    """``MlflowClient`` on a local store: params, metrics with step = round, the final
    table as an artifact."""

    name = "mlflow"
    BATCH = 100  # MLflow's log_batch takes at most 100 params (1000 metrics) a call

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.client: Any = None
        self.run_id = ""

    def start(self, state: dict[str, Any], config: Mapping[str, Any], first_round: int,
              labels: Mapping[str, str]) -> dict[str, Any]:
        """A new run in the grid's experiment, or (resume) ``state``'s run, running again."""
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.directory.mkdir(parents=True, exist_ok=True)
        uri = (state.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
               or f"sqlite:///{(self.directory / 'mlflow.db').resolve()}")
        self.client = MlflowClient(tracking_uri=uri)
        if state:
            self.run_id = state["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return dict(state)
        experiment_name = labels.get("grid") or DEFAULT_PROJECT
        experiment = self.client.get_experiment_by_name(experiment_name)
        artifacts = (self.directory / "mlruns" / experiment_name).resolve().as_uri()
        experiment_id = (experiment.experiment_id if experiment else
                         self.client.create_experiment(experiment_name, artifact_location=artifacts))
        run = self.client.create_run(experiment_id, run_name=labels["run-name"], tags=dict(labels))
        self.run_id = run.info.run_id
        params = [Param(k, str(v)) for k, v in hyperparameters(config).items()]
        for i in range(0, len(params), self.BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + self.BATCH])
        return {"run_id": self.run_id, "tracking_uri": uri, "experiment": experiment_name}

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """One round's metrics at step = round."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 10 * self.BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 10 * self.BATCH])

    def finish(self, final: Mapping[str, float], table: str, step: int, failed: bool) -> None:
        """The final figures as metrics and ``final.md``; the run FINISHED (or FAILED)."""
        self.log(final, step)
        self.client.log_text(self.run_id, table, "final.md")
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


Tracker = TensorBoardTracker | WandbTracker | MlflowTracker


class RunTrackers:
    """The run's trackers: started once the round to begin with is known, fed each
    completed round (and the ``before-first-round`` phases' costs as step 0), finished
    with the final table. ``seconds`` is what each tracker's calls took."""

    def __init__(self, config: RunConfig, run_dir: Path, log: Callable[[str], None]) -> None:
        self.config = config
        self.run_dir = run_dir
        self.log = log
        root = config.tracker_path
        grid, _, cell = config.tracker_group.partition("/")
        self.labels = {"run-name": config.run_name, "algorithm": config.algorithm,
                       "dataset": config.dataset, "seed": str(config.seed)}
        if grid:
            self.labels.update(grid=grid, cell=cell)
        tb_dir = (root / "tensorboard" / grid / cell / f"seed{config.seed}" if grid
                  else root / "tensorboard" / config.run_name)
        make: dict[str, Callable[[], Tracker]] = {
            "tensorboard": lambda: TensorBoardTracker(tb_dir),
            "wandb": lambda: WandbTracker(root),
            "mlflow": lambda: MlflowTracker(root),
        }
        assert set(make) == set(TRACKERS)
        self.trackers = [make[name]() for name in config.tracker_names]
        self.seconds = {t.name: {"start": 0.0, "rounds": 0.0, "finish": 0.0} for t in self.trackers}
        # per tracker, the last step it holds (-1: none, not even the precompute's step 0)
        self.logged = {t.name: -1 for t in self.trackers}

    @property
    def state_path(self) -> Path:
        """``trackers.json`` in the run folder."""
        return self.run_dir / STATE_FILE

    @property
    def logged_round(self) -> int:
        """The last round every tracker holds."""
        return min(self.logged.values(), default=0)

    def start(self, config: Mapping[str, Any], first_round: int) -> None:
        """Start every tracker; after round 1 (a resume) continue the runs named in
        ``trackers.json``, and give a tracker new at the resume the rounds before. Writes
        that file."""
        saved: dict[str, Any] = {}
        if first_round > 1 and self.state_path.is_file():
            saved = json.loads(self.state_path.read_text())
        state = {}
        for tracker in self.trackers:
            t0 = time.perf_counter()
            state[tracker.name] = tracker.start(saved.get(tracker.name, {}), config, first_round,
                                                self.labels)
            self.seconds[tracker.name]["start"] += time.perf_counter() - t0
            if tracker.name in saved:
                self.logged[tracker.name] = first_round - 1
        self.run_dir.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(state, indent=1).encode()
        atomic_write(self.state_path, lambda fh: fh.write(payload))
        self.log(f"trackers: {', '.join(f'{n} {where}' for n, where in self.places(state).items())}")

    def places(self, state: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        """Where each tracker's run is, in words (the run's log says it once)."""
        root = self.config.tracker_path
        words = {"tensorboard": lambda s: f"in {s['logdir']}",
                 "wandb": lambda s: f"run {s['id']} under {root / 'wandb'}",
                 "mlflow": lambda s: f"run {s['run_id']} at {s['tracking_uri']}"}
        return {n: words[n](s) for n, s in state.items()}

    def log_rounds(self, entries: list[dict[str, Any]], diagnostics: Mapping[str, list[np.ndarray]],
                   precompute: Mapping[str, Any]) -> None:
        """To each tracker, every round of ``entries`` (results.json's) it does not hold
        yet, after the precompute phases' costs as step 0."""
        if precompute:
            self._log({f"precompute/{phase}/{k}": float(c[k]) for phase, c in precompute.items()
                       for k in ("seconds", "bytes_sent", "bytes_received")}, 0)
        mixing_name = next((n for n in MIXING_DIAGNOSTICS if n in diagnostics), None)
        history = diagnostics[mixing_name] if mixing_name else []
        for entry in entries:
            step = int(entry["round"])
            if step > self.logged_round:
                self._log(round_scalars(entry, history[step - 1] if len(history) >= step else None),
                          step)
        for name in self.logged:  # a tracker without rounds yet still holds step 0
            self.logged[name] = max(self.logged[name], 0)

    def _log(self, scalars: Mapping[str, float], step: int) -> None:
        for tracker in self.trackers:
            if self.logged[tracker.name] >= step:
                continue
            t0 = time.perf_counter()
            tracker.log(scalars, step)
            self.seconds[tracker.name]["rounds"] += time.perf_counter() - t0
            self.logged[tracker.name] = step

    def finish(self, final: Mapping[str, Any], failed: bool) -> None:
        """The final figures and table; every tracker run ended (as failed when ``failed``)."""
        scalars, table = final_scalars(final), final_table(final)
        for tracker in self.trackers:
            t0 = time.perf_counter()
            tracker.finish(scalars, table, max(self.logged[tracker.name], 0), failed)
            self.seconds[tracker.name]["finish"] += time.perf_counter() - t0
