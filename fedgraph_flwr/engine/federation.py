"""The server's side of a personalized federation, free of Flower.

:class:`Federation` holds what a run remembers between rounds and puts the parts
together: the :class:`~.roster.Roster` (who takes part, each round's sample), the
algorithm's aggregator and each client's personalized payload, the
:class:`~.recorder.Recorder` (rounds, diagnostics, files), the
:class:`~.checkpoint.Checkpointer`, and the evaluation protocols
(:mod:`~.protocols`). It validates every reply before the aggregator sees it. The
round driver (:mod:`~.driver`) moves the messages.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..algorithms import get_algorithm
from ..algorithms.base import AggregateResult, Arrays, ClientUpdate, Phase
from ..atomic import atomic_write
from ..config import ClientConfig, RunConfig
from ..report import write_run_report
from . import protocols
from .checkpoint import Checkpointer
from .contract import peak_rss_mib, state_position, state_position_tag
from .recorder import Recorder, RoundLog, nbytes
from .roster import Roster

__all__ = ["ClientReply", "ClientRequest", "Federation", "RoundLog", "nbytes"]


@dataclass
class ClientReply:
    """A decoded, not yet validated reply of one client in one phase."""

    upload: Arrays
    signature: Arrays
    metrics: dict[str, float]
    bytes_received: int = 0


@dataclass
class ClientRequest:
    """What the server sends one client for one phase: its arrays and its config."""

    arrays: Arrays
    config: ClientConfig


class Federation:
    """Server-side state and bookkeeping of one run.

    ``roster`` maps each logical client id to the facts it reported in the
    handshake (``num-features``, ``num-classes``, ``num-train``, ...).
    """

    def __init__(self, config: RunConfig, roster: dict[int, dict[str, Any]], log=print) -> None:
        self.config = config.replace(run_name=config.resolved_run_name)
        self.log = log
        self.roster = Roster(self.config, roster)
        self.client_ids = self.roster.client_ids
        self.num_features = self.roster.num_features
        self.num_classes = self.roster.num_classes
        self.algo = get_algorithm(config.algorithm)
        self.phases: tuple[Phase, ...] = self.algo.trainer.phases
        self.initial = self.algo.trainer.initial_arrays(self.num_features, self.num_classes,
                                                        self.config.client_config())
        self.schema = {k: (v.shape, v.dtype) for k, v in self.initial.items()}
        self.signature_schema: dict[str, tuple[int, ...]] = {}
        self.aggregator = self.algo.aggregator(self.config, self.client_ids, self.initial)
        self.payloads: dict[int, Arrays] = {}
        self.recorder = Recorder(self.client_ids, write_report=write_run_report)
        self.precompute: dict[str, Any] = {}  # costs of the before-first-round phases
        self.started = time.time()
        self.elapsed_before_resume = 0.0
        # Names this run's client state files (client-state=file); kept across resume.
        self.state_token = uuid.uuid4().hex[:12]
        # client-state=file: where each client's last state is, as far as the server
        # knows (a reply came back); each client is told its own, to refuse an older one.
        self.saved_state_at: dict[int, tuple[int, int]] = {}
        self.out_dir = Path(config.output_dir).expanduser() / self.config.run_name
        self.checkpointer = Checkpointer(self.out_dir)

    @property
    def rounds(self) -> list[RoundLog]:
        return self.recorder.rounds

    @property
    def diagnostics(self) -> dict[str, list[np.ndarray]]:
        return self.recorder.diagnostics

    def phases_when(self, when: str) -> list[Phase]:
        return [p for p in self.phases if p.when == when]

    # --- what the server sends ----------------------------------------------------
    def client_config(self, server_round: int) -> ClientConfig:
        """What a client is told: the keys it and its algorithm read, plus what the
        handshake settled and this round's number."""
        return self.config.client_config(
            server_round=server_round, num_classes_global=self.num_classes,
            num_features_global=self.num_features, client_state_token=self.state_token)

    def client_requests(self, requests: dict[int, Arrays], server_round: int
                        ) -> dict[int, ClientRequest]:
        """Each client's arrays with its config: the round's, plus under
        ``client-state=file`` where the server knows its last state to be."""
        config = self.client_config(server_round)
        out = {}
        for cid, arrays in requests.items():
            own = config
            if self.config.client_state == "file" and cid in self.saved_state_at:
                own = config.with_round(
                    client_state_expected=state_position_tag(self.saved_state_at[cid]))
            out[cid] = ClientRequest(arrays, own)
        return out

    def note_saved_states(self, phase: Phase, server_round: int, replied: list[int]) -> None:
        """A client that replied to ``phase`` saved its state after it first."""
        if self.config.client_state == "file":
            here = state_position(self.config, server_round, phase)
            self.saved_state_at.update({c: here for c in replied})

    def sample(self, server_round: int) -> list[int]:
        return self.roster.sample(server_round)

    def payload_for(self, client_id: int) -> Arrays:
        """The client's personalized arrays, or the global initial model before it has any."""
        return self.payloads.get(client_id, self.initial)

    def requests(self, phase: Phase, server_round: int, clients: list[int]) -> dict[int, Arrays]:
        """Each client's arrays for ``phase``: its payload for train, else the aggregator's."""
        if phase.name == "train":
            return {c: self.payload_for(c) for c in clients}
        requests = self.aggregator.configure(phase, server_round, clients)
        if set(requests) != set(clients):
            raise RuntimeError(f"{type(self.aggregator).__name__}.configure({phase.name!r}) "
                               f"answered for {sorted(requests)}, asked for {clients}")
        return requests

    # --- what comes back ------------------------------------------------------------
    def check_reply(self, client_id: int, reply: ClientReply, phase: str = "train") -> str | None:
        """Why a reply must be rejected, or None. Guards the aggregate against poison.

        Train replies must match the initial model's schema and carry the metric
        contract (:mod:`~.protocols`); every reply is bounded and finite."""
        upload = reply.upload
        limit = self.config.max_array_bytes
        if phase == "train" and set(upload) != set(self.schema):
            missing = sorted(set(self.schema) - set(upload))
            extra = sorted(set(upload) - set(self.schema))
            return f"wrong array names (missing {missing[:3]}, unexpected {extra[:3]})"
        for name, arr in upload.items():
            if phase == "train" and arr.shape != self.schema[name][0]:
                return f"array {name!r} has shape {arr.shape}, expected {self.schema[name][0]}"
            if arr.nbytes > limit:
                return f"array {name!r} is {arr.nbytes} bytes, over max-array-bytes={limit}"
            if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
                return f"array {name!r} holds NaN or Inf"
        for name, arr in reply.signature.items():
            if not np.isfinite(arr).all():
                return f"signature {name!r} holds NaN or Inf"
            expected = self.signature_schema.get(name)
            if phase == "train" and expected is not None and arr.shape != expected:
                return f"signature {name!r} has shape {arr.shape}, expected {expected}"
        if "train_loss" in reply.metrics and not math.isfinite(reply.metrics["train_loss"]):
            return "train loss is NaN or Inf"
        if phase == "train":
            missing = protocols.missing_metrics(reply.metrics)
            if missing:
                return (f"metrics {missing[:4]} missing (every train reply carries the "
                        f"engine's metric contract, engine/protocols.py)")
        return None

    def min_replies(self, sampled: list[int]) -> int:
        return self.config.min_clients or 1

    def valid_updates(self, phase: Phase, server_round: int, replies: dict[int, ClientReply],
                      failures: dict[int, str]) -> dict[int, ClientUpdate]:
        """The replies that pass :meth:`check_reply`; the others go into ``failures``."""
        updates: dict[int, ClientUpdate] = {}
        for cid, reply in sorted(replies.items()):
            reason = self.check_reply(cid, reply, phase.name)
            if reason is not None:
                failures[cid] = f"rejected: {reason}" + ("" if phase.name == "train"
                                                         else f" (phase {phase.name})")
                self.log(f"round {server_round}: client {cid} reply rejected: {reason}")
                continue
            updates[cid] = ClientUpdate(reply.upload, reply.signature,
                                        int(reply.metrics.get("num-train", 0)), reply.metrics)
        return updates

    def phase_step(self, phase: Phase, server_round: int, replies: dict[int, ClientReply],
                   failures: dict[int, str]) -> AggregateResult | None:
        """A non-train phase's server step over its valid replies."""
        updates = self.valid_updates(phase, server_round, replies, failures)
        return self.aggregator.step(phase, server_round, updates)

    def complete_round(
        self,
        server_round: int,
        sampled: list[int],
        replies: dict[int, ClientReply],
        failures: dict[int, str],
        bytes_sent: dict[int, int],
        times: dict[str, float] | None = None,
        waits: dict[int, float] | None = None,
        aggregate: bool = True,
        earlier: list[tuple[Phase, dict[int, ClientReply], AggregateResult | None]] = (),
    ) -> RoundLog:
        """Validate the train replies, aggregate, store the personalized payloads, record
        the round.

        ``waits``: per client, server-side seconds until its reply arrived. ``earlier``:
        the round's non-train phases (their replies count towards the bytes received,
        their steps' metrics and diagnostics are recorded under the phase's name).
        ``aggregate=False`` records the round as void without touching any payload
        (fail-fast: the run stops here).
        """
        record = RoundLog(round=server_round, sampled=list(sampled), failures=dict(failures),
                          bytes_sent=dict(bytes_sent), times=dict(times or {}))
        for cid, wait in sorted((waits or {}).items()):
            record.client_times.setdefault(cid, {})["wait"] = float(wait)
        for phase, phase_replies, result in earlier:
            for cid, reply in phase_replies.items():
                record.bytes_received[cid] = record.bytes_received.get(cid, 0) + reply.bytes_received
            if result is not None:
                self._record_result(record, result, sorted(phase_replies), server_round,
                                    prefix=f"{phase.name}.")
        updates = self.valid_updates(Phase("train"), server_round, replies, record.failures)
        for cid, update in updates.items():
            for name, arr in update.signature.items():
                self.signature_schema.setdefault(name, arr.shape)
            record.clients[cid] = dict(update.metrics)
            record.bytes_received[cid] = record.bytes_received.get(cid, 0) + replies[cid].bytes_received
            record.client_times.setdefault(cid, {})["train"] = float(
                update.metrics.get("time-train", float("nan")))
        record.bytes_received = dict(sorted(record.bytes_received.items()))
        record.times["aggregate"] = 0.0
        if not aggregate:
            record.void = True
        elif len(updates) < self.min_replies(sampled):
            record.void = True
            self.log(f"round {server_round}: void, {len(updates)} valid replies "
                     f"< min-clients {self.min_replies(sampled)}")
        else:
            t0 = time.perf_counter()
            result = self.aggregator.aggregate(server_round, updates)
            record.times["aggregate"] = time.perf_counter() - t0
            self.payloads.update(result.payloads)
            self._record_result(record, result, sorted(updates), server_round)
        self.rounds.append(record)
        return record

    def _record_result(self, record: RoundLog, result: AggregateResult, ids: list[int],
                       server_round: int, prefix: str = "") -> None:
        record.aggregate.update({prefix + k: float(v) for k, v in result.metrics.items()})
        for name, matrix in result.diagnostics.items():
            self.recorder.store_diagnostic(prefix + name, matrix, ids, server_round)

    # --- summaries and files --------------------------------------------------------
    def held_means(self) -> dict[int, tuple[float, float]]:
        return protocols.held_means(self.rounds, self.client_ids)

    def final(self) -> dict[str, Any]:
        return protocols.final(self.rounds, self.client_ids, self.config.metric, self.num_classes)

    def wall_time(self) -> float:
        return self.elapsed_before_resume + (time.time() - self.started)

    def results(self) -> dict[str, Any]:
        held = self.held_means()
        out = {
            "config": self.config.all_keys(),
            "clients": {str(c): f for c, f in self.roster.facts.items()},
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "rounds": [{**r.to_json(), "held_mean_val": held[r.round][0],
                        "held_mean_test": held[r.round][1]} for r in self.rounds],
            "wall_time_s": self.wall_time(),
            "server_peak_rss_mib": peak_rss_mib(),
            "final": self.final(),
        }
        if self.precompute:
            out["precompute"] = self.precompute
        return out

    def write_results(self) -> Path:
        """results.json, history.csv, costs.png, diagnostics.npz and heatmaps under ``out_dir``
        (after the last checkpoint is on disk)."""
        self.checkpointer.wait()
        return self.recorder.write(self.results(), self.out_dir)

    def progress(self) -> dict[str, Any]:
        """A live run's state in a few hundred bytes (``progress.json``, rewritten after
        every round): where it is, the last round's means and failures, the best so far."""
        last = self.rounds[-1] if self.rounds else None
        held = self.held_means()
        best = protocols.best_held_round(self.rounds, held)
        elapsed = self.wall_time()
        done = len(self.rounds)
        total = self.config.rounds
        return {
            "run-name": self.config.run_name, "algorithm": self.config.algorithm,
            "dataset": self.config.dataset, "round": last.round if last else 0,
            "rounds": total, "finished": bool(last) and last.round == total,
            "elapsed_s": elapsed,
            "eta_s": elapsed / done * (total - last.round) if last else None,
            "last_round": None if last is None else {
                "mean_val": last.mean("val_metric"), "mean_test": last.mean("test_metric"),
                "mean_train_loss": last.mean("train_loss"), "void": last.void,
                "clients": len(last.clients), "sampled": len(last.sampled),
                "failures": {str(c): r for c, r in sorted(last.failures.items())},
                "seconds": last.times.get("round"),
            },
            "best_so_far": None if best is None else {
                "round": best.round, "val": 100 * held[best.round][0],
                "test": 100 * held[best.round][1]},
        }

    def write_progress(self) -> Path:
        path = self.out_dir / "progress.json"
        payload = json.dumps(self.progress(), indent=1, default=float).encode()
        atomic_write(path, lambda fh: fh.write(payload))
        return path

    # --- checkpoint / resume --------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.checkpointer.path

    def save_checkpoint(self, *, background: bool = False) -> None:
        """Everything needed to continue after the last completed round (atomic; written
        in a thread when ``background``, see :meth:`Checkpointer.save`)."""
        self.checkpointer.save(self.config, {
            "round": self.rounds[-1].round if self.rounds else 0,
            "state_token": self.state_token,
            "saved_state_at": {int(c): list(p) for c, p in self.saved_state_at.items()},
            "payloads": {int(c): p for c, p in self.payloads.items()},  # numpy: stored as tensors
            "aggregator": self.aggregator.state_dict(),
            "rounds_json": json.dumps([r.to_json() for r in self.rounds], default=float),
            "diagnostics": {n: list(v) for n, v in self.diagnostics.items()},
            "signature_schema": {k: list(v) for k, v in self.signature_schema.items()},
            "precompute_json": json.dumps(self.precompute, default=float),
            "elapsed": self.wall_time(),
        }, background=background)

    def load_checkpoint(self) -> int:
        """Restore a checkpoint; return the last completed round (0 if none)."""
        state = self.checkpointer.load(self.config)
        self.state_token = str(state.get("state_token", self.state_token))
        self.saved_state_at = {int(c): (int(p[0]), int(p[1]))
                               for c, p in state.get("saved_state_at", {}).items()}
        self.payloads = {int(c): p for c, p in state["payloads"].items()}
        self.aggregator.load_state_dict(state["aggregator"])
        self.recorder.rounds = [RoundLog.from_json(d) for d in json.loads(state["rounds_json"])]
        self.recorder.diagnostics = state["diagnostics"]
        self.signature_schema = {k: tuple(v) for k, v in state["signature_schema"].items()}
        self.precompute = json.loads(state.get("precompute_json", "{}"))
        self.elapsed_before_resume = float(state["elapsed"])
        self.started = time.time()
        return int(state["round"])

    def first_round(self) -> int:
        """The round to start with: 1, or after the checkpoint's last round if ``resume``."""
        if not self.config.resume:
            return 1
        done = self.load_checkpoint()
        self.log(f"resumed from {self.checkpoint_path} after round {done} "
                 f"({len(self.rounds)} rounds of history)")
        if self.config.client_state == "context":
            self.log("warning: resume=true with client-state=context: clients restart their "
                     "local state (optimiser moments, local-only layers) from scratch, so "
                     "results will differ from an uninterrupted run; use client-state=file "
                     "(state files under client-state-dir survive the restart) to resume exactly")
        return done + 1
