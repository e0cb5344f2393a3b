"""The server's side of a personalized federation, free of Flower.

:class:`Federation` holds what a run remembers between rounds: who takes part
(:class:`~.roster.Roster`), the algorithm's aggregator and each client's personalized
payload. It puts the parts with one job each together: :class:`~.replies.ReplyValidator`
checks every reply before the aggregator sees it, :class:`~.ledger.ClientStateLedger`
keeps the ``client-state=file`` bookkeeping, and :class:`~.run_recorder.RunRecorder`
records the rounds and writes results, progress, checkpoint and report. The round
driver (:mod:`~.driver`) moves the messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ClientConfig, RunConfig
from ..core.phases import AggregateResult, Arrays, ClientUpdate, Phase, ReplySpec
from ..core.registry import get_algorithm
from ..privacy import counts as privacy_counts
from ..secure_aggregation import load_public_context, public_context_path
from .ckks_mixing import CiphertextMixer
from .ledger import ClientStateLedger
from .privacy_budget import PrivacyBudget
from .recorder import RoundLog
from .replies import ReplyValidator
from .robust import RobustAggregation, finite_rows, non_finite_payloads, outlier_notes
from .roster import Roster
from .run_recorder import RunRecorder
from .transport import ClientReply, ClientRequest


class Federation:
    """Server-side state of one run.

    ``roster`` maps each logical client id to the facts it reported in the
    handshake (``num-features``, ``num-classes``, ``num-train``, ...); ``write_report``
    writes report.html from the results (none: no report).
    """

    def __init__(self, config: RunConfig, roster: dict[int, dict[str, Any]],
                 log: Callable[[str], None] = print,
                 write_report: Callable[[dict[str, Any], Path], Path] | None = None) -> None:
        self.config = config.replace(run_name=config.resolved_run_name)
        self.log = log
        self.roster = Roster(self.config, roster)
        self.client_ids = self.roster.client_ids
        self.num_features = self.roster.num_features
        self.num_classes = self.roster.num_classes
        self.algo = get_algorithm(config.algorithm)
        self.phases: tuple[Phase, ...] = self.algo.trainer.phases
        self.privacy: PrivacyBudget | None = None
        if self.config.dp != "off":
            self.privacy = PrivacyBudget(self.config, self.algo.trainer, self.phases,
                                         self.roster.sample, self.client_ids)
        self.noise_keyed: bool | None = None  # whether every DP reply's noise was keyed
        self.initial = self.algo.trainer.initial_arrays(self.num_features, self.num_classes,
                                                        self.config.client_config())
        # The aggregator sees the calibrated noise multiplier (its mixing may weigh the noise).
        self.aggregator = self.algo.aggregator(
            self.config if self.privacy is None else self.privacy.config, self.client_ids,
            self.initial)
        self.payloads: dict[int, Arrays] = {}
        self.phase_requests: dict[str, dict[int, Arrays]] = {}  # each phase's last requests
        self.mixer = self._ciphertext_mixer()
        # --- secure-aggregation=ckks-threshold (fedgraph_flwr/threshold_ckks/server.py) ---
        self.threshold = None
        if self.config.secure_aggregation == "ckks-threshold":
            from ..threshold_ckks.server import ThresholdAggregator

            self.threshold = ThresholdAggregator(self.aggregator, self.client_ids, self.initial,
                                                 self.payloads)
            self.aggregator = self.threshold  # type: ignore[assignment]
            self.phases = self.threshold.phases + self.phases
        # --- end ckks-threshold ---
        self.validator = ReplyValidator(
            self.initial, self.algo.trainer.signature_shapes(
                self.num_features, self.num_classes, self.config.client_config()),
            self.roster.facts, self.config.max_array_bytes, log,
            self.mixer.check if self.mixer else
            self.threshold.check_upload if self.threshold else None,
            withheld=privacy_counts.withheld(self.config.dp))
        self.robust = (None if self.config.robust == "none" else RobustAggregation(
            self.config.robust, self.config.robust_malicious, self.config.robust_trim_beta, log))
        self.ledger = ClientStateLedger(self.config)
        self.record = RunRecorder(self.config, self.roster.facts, self.num_features,
                                  self.num_classes, write_report)
        if self.privacy is not None:
            self.record.privacy_summary = self.privacy_summary

    def _ciphertext_mixer(self) -> CiphertextMixer | None:
        """secure-aggregation=ckks: the public context (never a secret one) and the mixer."""
        if self.config.secure_aggregation != "ckks":
            return None
        return CiphertextMixer(load_public_context(public_context_path(self.config)),
                               self.initial)

    @property
    def rounds(self) -> list[RoundLog]:
        """The rounds recorded so far."""
        return self.record.rounds

    @property
    def diagnostics(self) -> dict[str, list[np.ndarray]]:
        """The K×K diagnostics per round (similarity, mixing weights), by name."""
        return self.record.diagnostics

    def phases_when(self, when: str) -> list[Phase]:
        """The algorithm's phases that run ``when`` (every-round or before-first-round)."""
        return [p for p in self.phases if p.when == when]

    def round_phases(self, server_round: int) -> list[Phase]:
        """The every-round phases exchanged in ``server_round``: those the aggregator
        does not skip there, and the train phase (always, last)."""
        return [p for p in self.phases_when("every-round")
                if p.name == "train" or self.aggregator.runs_phase(p, server_round)]

    # --- what the server sends ----------------------------------------------------
    def client_config(self, server_round: int) -> ClientConfig:
        """What a client is told: the keys it and its algorithm read, plus what the
        handshake settled and this round's number."""
        # dp: the clients are sent the noise multiplier in use (calibrated where the run
        # asked for a budget only); the run's own config keeps what was asked for.
        base = self.config if self.privacy is None else self.privacy.config
        return base.client_config(
            server_round=server_round, num_classes_global=self.num_classes,
            num_features_global=self.num_features, client_state_token=self.ledger.token)

    def sample(self, server_round: int) -> list[int]:
        """The clients taking part in ``server_round``."""
        return self.roster.sample(server_round)

    def payload_for(self, client_id: int) -> Arrays:
        """The client's personalized arrays, or the global initial model before it has any."""
        return self.payloads.get(client_id, self.initial)

    def requests(self, phase: Phase, server_round: int, clients: list[int]
                 ) -> dict[int, ClientRequest]:
        """Each client's request for ``phase``: its payload for train, else the aggregator's
        arrays; with the round's config (and where the ledger knows its state to be)."""
        if phase.name == "train":
            arrays = {c: self.payload_for(c) for c in clients}
        else:
            arrays = self.aggregator.configure(phase, server_round, clients)
            if set(arrays) != set(clients):
                raise RuntimeError(f"{type(self.aggregator).__name__}.configure({phase.name!r}) "
                                   f"answered for {sorted(arrays)}, asked for {clients}")
            self.phase_requests[phase.name] = arrays  # what its replies are checked against
        config = self.client_config(server_round)
        return {c: ClientRequest(a, self.ledger.config_for(c, config)) for c, a in arrays.items()}

    def note_saved_states(self, phase: Phase, server_round: int, replied: list[int]) -> None:
        """A client that replied to ``phase`` saved its state after it first."""
        self.ledger.note(phase, server_round, replied)

    # --- differential privacy --------------------------------------------------------
    def privacy_stop(self, server_round: int) -> str | None:
        """Why the run stops before ``server_round`` (its dp budget), or None."""
        if self.privacy is None:
            return None
        return self.privacy.stop_reason(server_round, self.sample(server_round))

    def spend_privacy(self, phase: Phase, sent: list[int], replies: dict[int, ClientReply]
                      ) -> None:
        """Count what ``phase``'s replies released (dp) and whether their noise was keyed."""
        if self.privacy is None:
            return
        self.privacy.spend(phase, sent, replies)
        for reply in replies.values():
            keyed = bool(reply.metrics.get("dp-noise-keyed", 0.0))
            self.noise_keyed = keyed if self.noise_keyed is None else self.noise_keyed and keyed

    def privacy_summary(self) -> dict[str, Any]:
        """The run's dp guarantee so far (results.json, progress.json, report)."""
        assert self.privacy is not None
        return self.privacy.summary(self.noise_keyed)

    # --- what comes back ------------------------------------------------------------
    def min_replies(self) -> int:
        """The fewest valid train replies that make a round count (``min-clients``, at least 1)."""
        return self.config.min_clients or 1

    def phase_step(self, phase: Phase, server_round: int, replies: dict[int, ClientReply],
                   failures: dict[int, str]) -> AggregateResult | None:
        """A non-train phase's server step over its valid replies."""
        updates = self.validator.valid_updates(phase, server_round, replies, failures,
                                               self._phase_specs(phase, server_round))
        if self.threshold is not None:  # ckks-threshold: its own phases' deeper checks
            updates = self.threshold.check_phase(phase, updates, failures)
        return self.aggregator.step(phase, server_round, updates)

    def _phase_specs(self, phase: Phase, server_round: int) -> Callable[[int], ReplySpec] | None:
        """Each client's declared reply to one of the algorithm's phases, from what it was
        sent (None for the engine's own ckks-threshold phases, which their step checks)."""
        if phase not in self.algo.trainer.phases:
            return None
        sent = self.phase_requests.get(phase.name, {})
        trainer, client = self.algo.trainer, self.client_config(server_round)
        return lambda cid: trainer.phase_reply_spec(phase, sent.get(cid, {}), self.num_features,
                                                    self.num_classes, client)

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
        earlier: list[tuple[Phase, dict[int, ClientReply], AggregateResult | None]] | None = None,
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
        for phase, phase_replies, result in earlier or []:
            for cid, reply in phase_replies.items():
                record.bytes_received[cid] = record.bytes_received.get(cid, 0) + reply.bytes_received
            if result is not None:
                self._record_result(record, result, sorted(phase_replies), server_round,
                                    prefix=f"{phase.name}.")
        updates = self.validator.valid_updates(Phase("train"), server_round, replies,
                                               record.failures)
        for cid, update in updates.items():
            record.clients[cid] = dict(update.metrics)
            record.bytes_received[cid] = record.bytes_received.get(cid, 0) + replies[cid].bytes_received
            record.client_times.setdefault(cid, {})["train"] = float(
                update.metrics.get("time-train", float("nan")))
        record.bytes_received = dict(sorted(record.bytes_received.items()))
        record.times["aggregate"] = 0.0
        if self.privacy is not None:
            record.aggregate["dp-epsilon"] = self.privacy.epsilon()
        if not aggregate:
            record.void = True
        elif len(updates) < self.min_replies():
            record.void = True
            self.log(f"round {server_round}: void, {len(updates)} valid replies "
                     f"< min-clients {self.min_replies()}")
        else:
            self._aggregate(record, server_round, updates)
        self.rounds.append(record)
        return record

    def _aggregate(self, record: RoundLog, server_round: int,
                   updates: dict[int, ClientUpdate]) -> None:
        t0 = time.perf_counter()
        if self.mixer is not None:  # ckks: the weights in the clear, the models encrypted
            plan = self.aggregator.mixing_plan(server_round, updates)
            result = AggregateResult(self.mixer.mix(plan, updates), plan.diagnostics,
                                     plan.metrics)
        elif self.robust is not None:
            result = self._robust_aggregate(record, server_round, updates)
        else:
            result = self.aggregator.aggregate(server_round, updates)
            record.robust = outlier_notes(updates, {c: self.payload_for(c) for c in updates},
                                          self.initial)
        record.times["aggregate"] = time.perf_counter() - t0
        for cid in non_finite_payloads(result.payloads):
            # Finite uploads can still mix into an overflow (a model scaled ×10 a round):
            # that client keeps last round's model rather than train on NaN.
            del result.payloads[cid]
            record.robust[cid] = _join(record.robust.get(cid),
                                       "its new model was not finite: it keeps last round's")
            self.log(f"round {server_round}: client {cid}: {record.robust[cid]}")
        self.payloads.update(result.payloads)
        self._record_result(record, result, sorted(updates), server_round)

    def _robust_aggregate(self, record: RoundLog, server_round: int,
                          updates: dict[int, ClientUpdate]) -> AggregateResult:
        """``robust``: the updates screened against the cohort, then each client's row of
        the mixing plan made robust, or (an algorithm without a plan) its own aggregation
        of the screened updates (engine/robust.py)."""
        assert self.robust is not None
        sent = {c: self.payload_for(c) for c in updates}
        screened = self.robust.screen(updates, sent, self.initial)
        record.robust = dict(sorted(screened.notes.items()))
        for cid, note in record.robust.items():
            self.log(f"round {server_round}: client {cid}: {note}")
        if self.algo.aggregator.has_mixing_plan():
            plan = finite_rows(self.aggregator.clear_mixing_plan(server_round, screened.updates))
            result = AggregateResult(self.robust.combine(plan, screened), plan.diagnostics,
                                     plan.metrics)
        else:
            result = self.aggregator.aggregate(
                server_round, {c: screened.updates[c] for c in screened.selected})
        result.metrics = {**result.metrics, **screened.metrics}
        return result

    def _record_result(self, record: RoundLog, result: AggregateResult, ids: list[int],
                       server_round: int, prefix: str = "") -> None:
        record.aggregate.update({prefix + k: float(v) for k, v in result.metrics.items()})
        for name, matrix in result.diagnostics.items():
            self.record.recorder.store_diagnostic(prefix + name, matrix, ids, server_round)

    # --- the record ------------------------------------------------------------------
    def record_precompute(self, phase: str, costs: dict[str, Any]) -> None:
        """Record what a before-first-round phase cost."""
        self.record.record_precompute(phase, costs)

    def final(self) -> dict[str, Any]:
        """The run's headline figures under every evaluation protocol."""
        return self.record.final()

    def results(self) -> dict[str, Any]:
        """What results.json holds."""
        return self.record.results()

    def write_results(self) -> Path:
        """Write results.json and the files beside it; return their folder."""
        return self.record.write_results()

    def write_progress(self) -> Path:
        """Rewrite progress.json; return its path."""
        return self.record.write_progress()

    # --- checkpoint / resume --------------------------------------------------------
    def save_checkpoint(self, *, background: bool = False) -> None:
        """Everything needed to continue after the last completed round (atomic; written
        in a thread when ``background``, see :meth:`~.checkpoint.Checkpointer.save`)."""
        self.record.save_checkpoint({
            **self.ledger.state_dict(),
            "payloads": {int(c): p for c, p in self.payloads.items()},  # numpy: stored as tensors
            "aggregator": self.aggregator.state_dict(),
            **(self.privacy.state_dict() if self.privacy is not None else {}),
        }, background=background)

    def wait_for_checkpoint(self) -> None:
        """Until the last checkpoint is on disk (re-raises its write's error)."""
        self.record.wait()

    def load_checkpoint(self) -> int:
        """Restore a checkpoint; return the last completed round (0 if none)."""
        state = self.record.load_checkpoint()
        self.ledger.load_state_dict(state)
        self.payloads = {int(c): p for c, p in state["payloads"].items()}
        self.aggregator.load_state_dict(state["aggregator"])
        if self.privacy is not None:
            self.privacy.load_state_dict(state)
        return int(state["round"])

    def first_round(self) -> int:
        """The round to start with: 1, or after the checkpoint's last round if ``resume``."""
        if not self.config.resume:
            return 1
        done = self.load_checkpoint()
        self.log(f"resumed from {self.record.checkpointer.path} after round {done} "
                 f"({len(self.rounds)} rounds of history)")
        if self.config.client_state == "context":
            self.log("warning: resume=true with client-state=context: clients restart their "
                     "local state (optimiser moments, local-only layers) from scratch, so "
                     "results will differ from an uninterrupted run; use client-state=file "
                     "(state files under client-state-dir survive the restart) to resume exactly")
        return done + 1


def _join(first: str | None, second: str) -> str:
    return second if first is None else f"{first}; {second}"
