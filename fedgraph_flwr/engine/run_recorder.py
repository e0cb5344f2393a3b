"""A run's record and what is written from it: the rounds (:class:`~.recorder.Recorder`),
the costs of the phases before round 1, ``results.json`` and the files beside it,
``progress.json`` after every round, and the checkpoint.

The report page is the product's, not the engine's: whoever builds the run hands its
writer in (``write_report``), so the engine imports no report module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..config import RunConfig
from . import protocols
from .checkpoint import Checkpointer
from .contract import peak_rss_mib
from .recorder import Recorder, RoundLog


def write_waiting(config: RunConfig, waiting: dict[str, Any]) -> Path:
    """progress.json while the handshake waits for clients (before any round): who is
    connected, which clients are not seen yet (:meth:`.FlowerTransport.waiting`)."""
    path = Path(config.output_dir).expanduser() / config.run_name / "progress.json"
    payload = json.dumps({"run-name": config.run_name, "algorithm": config.algorithm,
                          "dataset": config.dataset, "round": 0, "rounds": config.rounds,
                          "finished": False, "waiting_for_clients": waiting}, indent=1).encode()
    atomic_write(path, lambda fh: fh.write(payload))
    return path


class RunRecorder:
    """Records one run and writes its files under ``<output-dir>/<run-name>``."""

    def __init__(self, config: RunConfig, client_facts: dict[int, dict[str, Any]],
                 num_features: int, num_classes: int,
                 write_report: Callable[[dict[str, Any], Path], Path] | None = None) -> None:
        self.config = config
        self.client_facts = client_facts
        self.client_ids = list(client_facts)
        self.num_features = num_features
        self.num_classes = num_classes
        self.recorder = Recorder(self.client_ids, write_report=write_report)
        self.precompute: dict[str, Any] = {}  # costs of the before-first-round phases
        self.started = time.time()
        self.elapsed_before_resume = 0.0
        self.out_dir = Path(config.output_dir).expanduser() / config.run_name
        self.checkpointer = Checkpointer(self.out_dir)
        # Set by the federation: the dp guarantee so far (None: dp=off).
        self.privacy_summary: Callable[[], dict[str, Any]] | None = None
        self.stop_reason: str | None = None  # why the run ended before its last round
        # Each resume from the checkpoint (by hand, or fedgraph-run's restart of a run
        # whose ServerApp died): after which round, when, and the seconds run before it.
        self.resumes: list[dict[str, Any]] = []

    @property
    def rounds(self) -> list[RoundLog]:
        """The rounds recorded so far."""
        return self.recorder.rounds

    @property
    def diagnostics(self) -> dict[str, list[np.ndarray]]:
        """The K×K diagnostics per round, by name."""
        return self.recorder.diagnostics

    def record_precompute(self, phase: str, costs: dict[str, Any]) -> None:
        """What a ``before-first-round`` phase cost (bytes, failures, metrics, seconds)."""
        self.precompute[phase] = costs

    # --- summaries and files --------------------------------------------------------
    def held_means(self) -> dict[int, tuple[float, float]]:
        """Per round, the mean val and test of every client's held model."""
        return protocols.held_means(self.rounds, self.client_ids)

    def final(self) -> dict[str, Any]:
        """The run's headline figures under every evaluation protocol."""
        return protocols.final(self.rounds, self.client_ids, self.config.metric, self.num_classes)

    def wall_time(self) -> float:
        """Seconds the run has taken, across resumes."""
        return self.elapsed_before_resume + (time.time() - self.started)

    def results(self) -> dict[str, Any]:
        """What results.json holds."""
        held = self.held_means()
        out = {
            "config": self.config.all_keys(),
            "clients": {str(c): f for c, f in self.client_facts.items()},
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "rounds": [self.round_entry(r, held) for r in self.rounds],
            "wall_time_s": self.wall_time(),
            "server_peak_rss_mib": peak_rss_mib(),
            "final": self.final(),
            # The root actually read: the config's data-root is "" when it came from
            # FEDGRAPH_DATA_ROOT or the default (report.html shows this).
            "data_root": {"path": str(self.config.data_root_path), "source": self.config.data_root_source},
        }
        if self.precompute:
            out["precompute"] = self.precompute
        out.update(self.ending())
        return out

    @staticmethod
    def round_entry(record: RoundLog, held: dict[int, tuple[float, float]]) -> dict[str, Any]:
        """A round's entry of results.json (``held``: :meth:`held_means`)."""
        return {**record.to_json(), "held_mean_val": held[record.round][0],
                "held_mean_test": held[record.round][1]}

    def ending(self) -> dict[str, Any]:
        """The dp guarantee, an early stop's reason and the resumes, where there are any."""
        out: dict[str, Any] = {}
        if self.resumes:
            out["resumes"] = self.resumes
        if self.privacy_summary is not None:
            out["dp"] = self.privacy_summary()
        if self.stop_reason:
            out["stopped"] = self.stop_reason
        return out

    def write_results(self) -> Path:
        """results.json, history.csv, costs.png, diagnostics.npz and heatmaps under ``out_dir``
        (after the last checkpoint is on disk)."""
        self.checkpointer.wait()
        return self.recorder.write(self.results(), self.out_dir)

    def progress(self) -> dict[str, Any]:
        """A live run's state in a few hundred bytes (``progress.json``, rewritten after
        every round): where it is, the last round's means and failures, each client's
        failures since the start, the best so far."""
        last = self.rounds[-1] if self.rounds else None
        held = self.held_means()
        best = protocols.best_held_round(self.rounds, held)
        elapsed = self.wall_time()
        done = len(self.rounds)
        total = self.config.rounds
        return {
            "run-name": self.config.run_name, "algorithm": self.config.algorithm,
            "dataset": self.config.dataset, "round": last.round if last else 0,
            "rounds": total,
            "finished": (last is not None and last.round == total) or bool(self.stop_reason),
            "elapsed_s": elapsed,
            "eta_s": elapsed / done * (total - last.round) if last else None,
            "last_round": None if last is None else {
                "mean_val": last.mean("val_metric"), "mean_test": last.mean("test_metric"),
                "mean_train_loss": last.mean("train_loss"), "void": last.void,
                "clients": len(last.clients), "sampled": len(last.sampled),
                "failures": {str(c): r for c, r in sorted(last.failures.items())},
                "robust": {str(c): r for c, r in sorted(last.robust.items())},
                "seconds": last.times.get("round"),
            },
            "failures_since_start": self.failures_since_start(),
            "best_so_far": None if best is None else {
                "round": best.round, "val": 100 * held[best.round][0],
                "test": 100 * held[best.round][1]},
            **self.ending(),
        }

    def failures_since_start(self) -> dict[str, dict[str, Any]]:
        """Per client that missed a round: how many, the first and the last, and the last
        reason (a client that missed seven rounds is visible after it is back)."""
        out: dict[str, dict[str, Any]] = {}
        for record in self.rounds:
            for client, reason in record.failures.items():
                entry = out.setdefault(str(client), {"rounds": 0, "first_round": record.round})
                entry.update(rounds=entry["rounds"] + 1, last_round=record.round,
                             last_reason=reason)
        return dict(sorted(out.items(), key=lambda kv: int(kv[0])))

    def write_progress(self) -> Path:
        """Rewrite progress.json atomically; return its path."""
        path = self.out_dir / "progress.json"
        payload = json.dumps(self.progress(), indent=1, default=float).encode()
        atomic_write(path, lambda fh: fh.write(payload))
        return path

    # --- checkpoint -----------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any], *, background: bool = False) -> None:
        """The record's part of a checkpoint plus ``state`` (the server's other parts)
        (atomic; written in a thread when ``background``, see :meth:`Checkpointer.save`)."""
        self.checkpointer.save(self.config, {
            **state,
            "round": self.rounds[-1].round if self.rounds else 0,
            "rounds_json": json.dumps([r.to_json() for r in self.rounds], default=float),
            "diagnostics": {n: list(v) for n, v in self.diagnostics.items()},
            "precompute_json": json.dumps(self.precompute, default=float),
            "elapsed": self.wall_time(),
            "resumes_json": json.dumps(self.resumes),
        }, background=background)

    def load_checkpoint(self) -> dict[str, Any]:
        """Restore the record from the checkpoint; return the whole saved state."""
        state = self.checkpointer.load(self.config)
        self.recorder.rounds = [RoundLog.from_json(d) for d in json.loads(state["rounds_json"])]
        self.recorder.diagnostics = state["diagnostics"]
        self.precompute = json.loads(state.get("precompute_json", "{}"))
        self.elapsed_before_resume = float(state["elapsed"])
        self.started = time.time()
        self.resumes = json.loads(state.get("resumes_json", "[]")) + [{
            "after_round": int(state["round"]),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "elapsed_before_s": self.elapsed_before_resume}]
        return state

    def wait(self) -> None:
        """Until the last checkpoint is on disk (re-raises its write's error)."""
        self.checkpointer.wait()
