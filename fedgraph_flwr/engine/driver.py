"""The round driver: the one loop that runs a federation, over any :class:`~.transport.Transport`.

Why not a Flower ``Strategy``: a Strategy's round is one train and one evaluate
exchange of a single global ``ArrayRecord``; ours is the algorithm's ordered phases
(:mod:`fedgraph_flwr.core.bases`), each sending every client its own arrays, and
it must run the same way without Flower (in process). So the ServerApp's ``main``
hands its ``Grid`` to a transport and this driver runs over it: Flower's public
``Grid`` and ``Message`` API is all the server side uses.

One run: connect (wait for the clients, handshake) -> set up the federation (or
resume it) -> the ``before-first-round`` phases -> per round, each ``every-round``
phase in order, the train phase last (aggregate, record) -> checkpoint and
``progress.json`` -> results.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..core.phases import AggregateResult, Phase
from .federation import Federation
from .recorder import nbytes
from .trackers import RunTrackers, check_installed
from .transport import ClientReply, Exchange, RunAborted, Transport

#: In a failure's reason: the client's memory guard refused (client_runtime.MemoryGuardError).
MEMORY_GUARD = "MemoryGuardError"


def out_of_memory(failures: dict[int, str]) -> bool:
    """Whether a client's memory guard refused a phase (the run then stops)."""
    return any(MEMORY_GUARD in reason for reason in failures.values())


class RoundDriver:
    """Runs one federation from handshake to results files."""

    def __init__(self, config: RunConfig, transport: Transport,
                 log: Callable[[str], None] | None = None, *, write: bool = True,
                 write_report: Callable[[dict[str, Any], Path], Path] | None = None) -> None:
        self.config = config.replace(run_name=config.resolved_run_name)
        self.transport = transport
        self.log = log or (lambda msg: None)
        self.write = write
        self.write_report = write_report  # report.html from the results (the product's page)
        self.federation: Federation | None = None
        self.trackers: RunTrackers | None = None  # ``trackers``: started once the first round is known

    def run(self) -> Federation:
        """Connect, run every round, write the results; return the federation."""
        self.log(f"fedgraph-flwr: algorithm={self.config.algorithm} "
                 f"dataset={self.config.dataset} clients={self.config.num_clients} "
                 f"rounds={self.config.rounds}")
        tracked = self.write and bool(self.config.tracker_names)
        if tracked:  # a missing package fails here, before any client is contacted
            check_installed(self.config.tracker_names)
        if self.write:  # progress.json names the clients not seen while they are awaited
            from .run_recorder import write_waiting

            def on_waiting(waiting: dict[str, Any]) -> None:
                write_waiting(self.config, waiting)

            self.transport.on_waiting = on_waiting
        roster = self.transport.connect(self.config)
        # A ConfigError here (a federation that cannot run, a checkpoint of another run)
        # reaches the caller as it is: one line.
        fed = self.federation = Federation(self.config, roster, log=self.log,
                                           write_report=self.write_report)
        first = fed.first_round()
        if tracked:
            self.trackers = RunTrackers(fed.config, fed.record.out_dir, self.log)
            self.trackers.start(fed.config.to_config(), first)  # common keys + its own options
        failed = True
        try:
            if first == 1:
                self.precompute(fed)
                self.track(fed)  # its costs as step 0, before round 1 (wandb's steps only rise)
            for server_round in range(first, self.config.rounds + 1):
                stop = fed.privacy_stop(server_round)
                if stop:  # a clean stop: what the run has is written below
                    self.log(stop)
                    fed.record.stop_reason = stop
                    if self.write:
                        fed.write_progress()
                    break
                self.run_round(fed, server_round)
                if self.write:
                    # Written while the next round's clients train; joined before the
                    # next save, the results, and on the way out of a failed run.
                    fed.save_checkpoint(background=True)
                    fed.write_progress()  # what `watch` and dashboards read during the run
                self.track(fed)
            failed = False
        finally:
            fed.wait_for_checkpoint()
            if self.trackers is not None:
                self.finish_trackers(fed, failed)
        if self.write:
            out = fed.write_results()
            from ..summary import format_summary

            self.log(format_summary(fed.results()))
            self.log(f"results written to {out.resolve()}")
        return fed

    # --- trackers -------------------------------------------------------------------
    def track(self, fed: Federation) -> None:
        """The rounds the trackers have not logged yet (results.json's entries)."""
        if self.trackers is None:
            return
        record = fed.record
        held = record.held_means()
        self.trackers.log_rounds(
            [record.round_entry(r, held) for r in record.rounds if r.round > self.trackers.logged_round],
            record.diagnostics, record.precompute)

    def finish_trackers(self, fed: Federation, failed: bool) -> None:
        """The rounds left (an aborted round), the final table; a failed run's tracker
        errors are logged, not raised over the run's own error."""
        assert self.trackers is not None
        try:
            self.track(fed)
            self.trackers.finish(fed.final(), failed)
        except Exception as exc:
            if not failed:
                raise
            self.log(f"trackers: could not close after the run failed: {type(exc).__name__}: {exc}")

    # --- phases ---------------------------------------------------------------------
    def send(self, fed: Federation, phase: Phase, server_round: int, clients: list[int],
             deadline: float | None = None) -> tuple[Exchange, dict[int, int]]:
        """One phase's exchange; returns it and the bytes sent to each client.

        ``deadline`` (``time.monotonic()``): the round's, shared by all of its phases;
        without one the phase gets a whole ``round-timeout`` (the precompute phases)."""
        requests = fed.requests(phase, server_round, clients)
        timeout = self.config.round_timeout
        if deadline is not None:
            timeout = max(0.0, deadline - time.monotonic())
        exchange = self.transport.exchange(phase, requests, timeout)
        fed.note_saved_states(phase, server_round, list(exchange.replies))
        fed.spend_privacy(phase, clients, exchange.replies)
        for cid in clients:
            if cid not in exchange.replies and cid not in exchange.failures:
                exchange.failures[cid] = "missing: no reply before round-timeout"
        for cid, reason in sorted(exchange.failures.items()):
            where = "" if phase.name == "train" else f" in phase {phase.name}"
            self.log(f"round {server_round}: client {cid} failed{where}: {reason}")
        return exchange, {c: nbytes(r.arrays) for c, r in requests.items()}

    def precompute(self, fed: Federation) -> None:
        """The ``before-first-round`` phases, on every client, as round 0."""
        for phase in fed.phases_when("before-first-round"):
            t0 = time.perf_counter()
            exchange, sent = self.send(fed, phase, 0, list(fed.client_ids))
            self.check_fail_fast(fed, 0, exchange.failures, None)
            failures = dict(exchange.failures)
            result = fed.phase_step(phase, 0, exchange.replies, failures)
            fed.record_precompute(phase.name, {
                "bytes_sent": sum(sent.values()),
                "bytes_received": sum(r.bytes_received for r in exchange.replies.values()),
                "failures": {str(c): r for c, r in sorted(failures.items())},
                "metrics": dict(result.metrics) if result else {},
                "seconds": time.perf_counter() - t0,
            })

    def run_round(self, fed: Federation, server_round: int) -> None:
        """One round: (re)joins, then each ``every-round`` phase, the train phase last.

        One deadline, fixed now, bounds the whole round (``round-timeout``): every
        phase's pushes and waits share it, so a dead client costs the round at most
        ``round-timeout`` (plus the aggregation), however many phases it has."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.config.round_timeout
        self.transport.refresh(self.config, deadline)
        sampled = fed.sample(server_round)
        sent: dict[int, int] = {}
        failures: dict[int, str] = {}
        earlier: list[tuple[Phase, dict[int, ClientReply], AggregateResult | None]] = []
        active = list(sampled)
        for phase in fed.round_phases(server_round):
            exchange, phase_sent = self.send(fed, phase, server_round, active, deadline)
            for cid, b in phase_sent.items():
                sent[cid] = sent.get(cid, 0) + b
            if phase.name == "train":
                break
            failures.update({c: f"{r} (phase {phase.name})" for c, r in exchange.failures.items()})
            self.check_fail_fast(fed, server_round, failures, (sampled, sent, t0))
            result = fed.phase_step(phase, server_round, exchange.replies, failures)
            earlier.append((phase, exchange.replies, result))
            active = [c for c in active if c not in failures]  # a failed client sits out the rest
        t_wait = time.perf_counter()
        failures.update(exchange.failures)
        abort = bool(exchange.failures) and (self.config.fail_fast
                                             or out_of_memory(exchange.failures))
        record = fed.complete_round(
            server_round, sampled, exchange.replies, failures, sent,
            times={"round": time.perf_counter() - t0, "wait": t_wait - t0},
            waits=exchange.waits, aggregate=not abort, earlier=earlier,
        )
        record.times["round"] = time.perf_counter() - t0  # with aggregation
        if abort:
            self.abort(fed, server_round, failures)
        if self.config.min_clients and len(record.clients) < self.config.min_clients:
            self.stop_below_floor(fed, server_round, len(record.clients), record.failures)
        self.log(
            f"round {server_round}/{self.config.rounds}: mean val "
            f"{100 * record.mean('val_metric'):.2f} test {100 * record.mean('test_metric'):.2f} "
            f"loss {record.mean('train_loss'):.4f} ({len(record.clients)}/{len(sampled)} "
            f"clients, {record.times['round']:.2f}s)"
            + (f" ε={record.aggregate['dp-epsilon']:.3g}" if "dp-epsilon" in record.aggregate
               else "")
        )

    # --- failures -------------------------------------------------------------------
    def check_fail_fast(self, fed: Federation, server_round: int, failures: dict[int, str],
                        partial: tuple[list[int], dict[int, int], float] | None) -> None:
        """Under ``fail-fast`` a failure in any phase ends the run (the round recorded void);
        so does a client's memory guard, always: the next phase would be killed."""
        if not failures or not (self.config.fail_fast or out_of_memory(failures)):
            return
        if partial is not None:
            sampled, sent, t0 = partial
            fed.complete_round(server_round, sampled, {}, failures, sent,
                               times={"round": time.perf_counter() - t0}, aggregate=False)
        self.abort(fed, server_round, failures)

    def stop_below_floor(self, fed: Federation, server_round: int, valid: int,
                         failures: dict[int, str]) -> None:
        """``min-clients``: a round left with fewer valid replies ends the run, with what
        it has written and why (each failed client's first reason)."""
        out = fed.write_results()
        why = "; ".join(f"client {c}: {r}" for c, r in sorted(failures.items())[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        raise RunAborted(f"min-clients: round {server_round} had {valid} valid replies, fewer "
                         f"than min-clients={self.config.min_clients} ({why}{more}); results in "
                         f"{(out / 'results.json').resolve()}")

    def abort(self, fed: Federation, server_round: int, failures: dict[int, str]) -> None:
        """Write what the run has and stop it with a one-line reason (:class:`RunAborted`)."""
        guarded = {c: r for c, r in failures.items() if MEMORY_GUARD in r}
        cid, reason = sorted((guarded or failures).items())[0]
        if reason.startswith("missing"):
            what = (f"client {cid} sent no reply in round {server_round} within "
                    f"round-timeout={self.config.round_timeout} s")
        else:
            what = f"client {cid} failed in round {server_round} with {reason}"
        out = fed.write_results()
        why = "memory guard" if guarded else "fail-fast"
        raise RunAborted(f"{why}: {what} (round recorded in {(out / 'results.json').resolve()})")

