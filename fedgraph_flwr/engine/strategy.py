"""PersonalizedStrategy: one Flower Strategy for every personalized algorithm.

Each client gets its own ArrayRecord; server-side state is keyed by the client's
logical id (its partition id, learnt in a handshake), not by the transient node
id. The round's phases are small methods a subclass may override:

``wait_for_nodes`` -> ``handshake`` -> per round: ``configure_train`` ->
``exchange`` (push, then a tight pull loop) -> ``aggregate_train`` -> checkpoint;
finally ``finish`` writes results.json, history.csv, costs.png (bytes and seconds per
round) and the heatmaps. With ``resume=true`` the run continues after the checkpoint's
last round (:meth:`Federation.first_round`).

The maths lives in the algorithm's aggregator; the bookkeeping in
:class:`~fedgraph_flwr.engine.federation.Federation`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.result import Result
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from ..algorithms.base import Config
from ..config import ConfigError, default_run_name
from .federation import ClientReply, Federation, nbytes
from .records import (
    from_array_record, from_metric_record, signature_floats, to_array_record, to_config_record,
)

logger = logging.getLogger("fedgraph_flwr")


class RunAborted(RuntimeError):
    """The run stopped on purpose (fail-fast, or an invalid federation); one-line reason."""


#: In simulation, seconds the SuperNode count must hold still before it is taken as final.
SIMULATION_SETTLE_S = 3.0

#: The first poll for replies waits this fraction of the last exchange's fastest reply,
#: and never longer than FIRST_POLL_MAX seconds.
FIRST_POLL_FRACTION = 0.7
FIRST_POLL_MAX = 1.0

class PersonalizedStrategy(Strategy):
    """Sends each client its own model; delegates the maths to a registered aggregator."""

    def __init__(self, config: Config, log: Callable[[str], None] | None = None) -> None:
        self.config = dict(config)
        if not self.config.get("run-name"):
            self.config["run-name"] = default_run_name(self.config)
        self.log = log or (lambda msg: logger.info(msg))
        self.federation: Federation | None = None
        self.node_of: dict[int, int] = {}  # logical client id -> current node id
        self.client_of: dict[int, int] = {}  # node id -> logical client id
        self._round_started = 0.0
        self._round_wait = float("nan")
        self._sent_bytes: dict[int, int] = {}
        self._reply_wait: dict[int, float] = {}  # node id -> seconds until its reply came
        self._fastest_reply = 0.0  # seconds until the first reply of the last exchange

    # --- phases ---------------------------------------------------------------------
    def wait_for_nodes(self, grid: Grid) -> list[int]:
        """Wait until ``num-clients`` SuperNodes are connected; fail with the fix otherwise.

        A deployment's SuperNodes may join over minutes (``handshake-timeout``). A
        simulation registers all of its SuperNodes at start, so once some are there and
        their number has not changed for ``SIMULATION_SETTLE_S`` no more will come: a
        federation of the wrong size fails within seconds, not after the timeout.
        """
        want = int(self.config["num-clients"])
        deadline = time.time() + float(self.config["handshake-timeout"])
        simulated = isinstance(grid, InMemoryGrid)
        nodes = list(grid.get_node_ids())
        changed = time.time()
        while len(nodes) < want and time.time() < deadline:
            if simulated and nodes and time.time() - changed > SIMULATION_SETTLE_S:
                break
            time.sleep(0.2)
            current = list(grid.get_node_ids())
            if len(current) != len(nodes):
                changed = time.time()
            nodes = current
        if len(nodes) != want:
            raise RunAborted(
                f"the federation has {len(nodes)} SuperNodes but num-clients={want}; "
                f"in simulation run: flwr run . --federation-config \"num-supernodes={want}\" "
                f"(once: flwr federation simulation-config @none/default local "
                f"--num-supernodes {want}), or pass --run-config \"num-clients={len(nodes)}\"; "
                f"in deployment start {want} SuperNodes"
            )
        return nodes

    def handshake(self, grid: Grid, node_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Ask each node who it is; every client loads and validates its subgraph here."""
        config = to_config_record(self.config)
        messages = [
            Message(RecordDict({"config": config}), node_id, "query", group_id="handshake")
            for node_id in node_ids
        ]
        replies, missing = self.exchange(grid, messages, float(self.config["handshake-timeout"]))
        roster: dict[int, dict[str, Any]] = {}
        problems = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                problems.append(f"node {node}: {reply.error.reason}")
                continue
            info = dict(reply.content["info"])
            cid = int(info["partition-id"])
            if cid in roster:
                problems.append(f"node {node}: partition-id {cid} is already taken by another node")
                continue
            roster[cid] = info
            self.node_of[cid] = node
            self.client_of[node] = cid
        if missing:
            problems.append(f"{len(missing)} node(s) did not answer the handshake in time")
        if problems:
            raise RunAborted("handshake failed: " + "; ".join(problems))
        return roster

    def refresh_nodes(self, grid: Grid) -> None:
        """Map nodes that (re)connected since the handshake, so a returning client
        gets its personalized model back under its new node id."""
        current = set(grid.get_node_ids())
        unknown = current - set(self.client_of)
        if not unknown:
            return
        config = to_config_record(self.config)
        messages = [Message(RecordDict({"config": config}), n, "query", group_id="rejoin")
                    for n in unknown]
        replies, _ = self.exchange(grid, messages, float(self.config["round-timeout"]))
        for reply in replies:
            if reply.has_error():
                continue
            cid = int(reply.content["info"]["partition-id"])
            old = self.node_of.get(cid)
            if old is not None:
                self.client_of.pop(old, None)
            self.node_of[cid] = reply.metadata.src_node_id
            self.client_of[reply.metadata.src_node_id] = cid
            self.log(f"client {cid} (re)joined as node {reply.metadata.src_node_id}")

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per sampled client: ``arrays`` = its payload, ``config`` = run config.

        The ``arrays``/``config`` arguments of Flower's signature are unused: every
        client's payload comes from the federation's per-client state.
        """
        fed = self._fed()
        cfg = to_config_record(fed.client_config(server_round))
        messages = []
        self._sent_bytes = {}
        for cid in fed.sample(server_round):
            payload = fed.payload_for(cid)
            self._sent_bytes[cid] = nbytes(payload)
            messages.append(Message(
                RecordDict({"arrays": to_array_record(payload), "config": cfg}),
                self.node_of[cid], "train", group_id=str(server_round),
            ))
        return messages

    def exchange(
        self, grid: Grid, messages: list[Message], timeout: float
    ) -> tuple[list[Message], set[str]]:
        """Push, then pull with a short poll interval until all replies or the timeout.

        Flower's ``send_and_receive`` sleeps 0.1-3 s between polls, which would
        dominate a round on small graphs; this loop starts at 2 ms and backs off.
        Against a real SuperLink every push, poll and object is one request to a
        single process, so: each message is pushed on its own (a SuperNode fetches its
        model while the next one uploads, instead of all of them retrying until the
        last upload ends), and the first poll waits for 70% of the last exchange's
        fastest reply, at most 1 s (no reply comes much sooner; earlier polls only add
        requests).
        """
        t0 = time.perf_counter()
        pending: set[str] = set()
        for message in messages:
            pending.update(grid.push_messages([message]))
        replies: list[Message] = []
        self._reply_wait = {}
        deadline = time.time() + timeout
        first_poll = min(FIRST_POLL_FRACTION * self._fastest_reply, FIRST_POLL_MAX, timeout)
        if pending and first_poll > time.perf_counter() - t0:
            time.sleep(first_poll - (time.perf_counter() - t0))
        pause = 0.002
        polls = 0
        in_at_first_poll = False
        while pending and time.time() < deadline:
            got = list(grid.pull_messages(pending))
            polls += 1
            in_at_first_poll |= polls == 1 and bool(got)
            now = time.perf_counter() - t0
            for msg in got:
                pending.discard(msg.metadata.reply_to_message_id)
                self._reply_wait[msg.metadata.src_node_id] = now
            replies.extend(got)
            if pending and not got:
                time.sleep(pause)
                pause = min(pause * 1.5, 0.05)
        if self._reply_wait:
            # A reply already in at the first poll came at an unknown time before it (a
            # slow round, e.g. the first with its data loading, must not hold back the
            # next ones): aim lower next time.
            fastest = min(self._reply_wait.values())
            self._fastest_reply = fastest / 2 if in_at_first_poll else fastest
        return replies, pending

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Decode replies, report failures at once, and let the federation aggregate.

        Under ``fail-fast`` a client's error reply, or no reply within ``round-timeout``,
        ends the run: the round is recorded (void, with the failure) and results.json
        written before :class:`RunAborted`.
        """
        fed = self._fed()
        sampled = fed.sample(server_round)
        decoded: dict[int, ClientReply] = {}
        failures: dict[int, str] = {}
        errors: list[str] = []
        waits: dict[int, float] = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            cid = self.client_of.get(node)
            if cid is not None and node in self._reply_wait:
                waits[cid] = self._reply_wait[node]
            if reply.has_error():
                reason = f"error {reply.error.code}: {reply.error.reason}"
                if cid is None:
                    self.log(f"round {server_round}: unknown node {node} failed: {reason}")
                    continue
                failures[cid] = reason
                errors.append(f"client {cid} failed in round {server_round} with {reason}")
                self.log(f"round {server_round}: client {cid} failed with {reason}")
                continue
            metrics, signature = from_metric_record(reply.content["metrics"])
            upload = from_array_record(reply.content["arrays"])
            reported = int(metrics.get("partition-id", -1))
            if cid is None or reported != cid:
                self.log(f"round {server_round}: reply from node {node} claims client "
                         f"{reported}, expected {cid}; ignored")
                continue
            decoded[cid] = ClientReply(upload, signature, metrics,
                                       nbytes(upload) + 4 * signature_floats(signature))
        for cid in sampled:
            if cid not in decoded and cid not in failures:
                failures[cid] = "missing: no reply before round-timeout"
                errors.append(f"client {cid} sent no reply in round {server_round} within "
                              f"round-timeout={self.config['round-timeout']} s")
                self.log(f"round {server_round}: client {cid} missing (no reply in time)")
        abort = bool(errors) and bool(self.config["fail-fast"])
        record = fed.complete_round(
            server_round, sampled, decoded, failures, self._sent_bytes,
            times={"round": time.perf_counter() - self._round_started, "wait": self._round_wait},
            waits=waits, aggregate=not abort,
        )
        record.times["round"] = time.perf_counter() - self._round_started  # with aggregation
        if abort:
            out = fed.write_results()
            raise RunAborted(f"fail-fast: {errors[0]} (round recorded in "
                             f"{(out / 'results.json').resolve()})")
        self.log(
            f"round {server_round}/{self.config['rounds']}: mean val {100 * record.mean('val_metric'):.2f} "
            f"test {100 * record.mean('test_metric'):.2f} loss {record.mean('train_loss'):.4f} "
            f"({len(record.clients)}/{len(sampled)} clients, {record.times['round']:.2f}s)"
        )
        return None, MetricRecord({"mean_val": record.mean("val_metric"),
                                   "mean_test": record.mean("test_metric")})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No separate evaluate phase: the papers evaluate inside the train reply."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        self.log(f"PersonalizedStrategy: algorithm={self.config['algorithm']} "
                 f"dataset={self.config['dataset']} clients={self.config['num-clients']} "
                 f"rounds={self.config['rounds']}")

    # --- the run ----------------------------------------------------------------------
    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None,
              num_rounds: int | None = None, timeout: float | None = None,
              **_: Any) -> Result:
        """Run the whole federation; returns Flower's Result (metrics per round)."""
        self.summary()
        nodes = self.wait_for_nodes(grid)
        roster = self.handshake(grid, nodes)
        try:
            self.federation = Federation(self.config, roster, log=self.log)
        except ConfigError as exc:
            raise RunAborted(str(exc)) from None
        fed = self.federation
        try:
            first = fed.first_round()
        except ConfigError as exc:
            raise RunAborted(str(exc)) from None
        result = Result()
        rounds = int(num_rounds or self.config["rounds"])
        round_timeout = float(timeout or self.config["round-timeout"])
        for server_round in range(first, rounds + 1):
            self._round_started = time.perf_counter()
            self.refresh_nodes(grid)
            messages = list(self.configure_train(server_round, ArrayRecord(), ConfigRecord(), grid))
            t_send = time.perf_counter()
            replies, _ = self.exchange(grid, messages, round_timeout)
            self._round_wait = time.perf_counter() - t_send
            _, metrics = self.aggregate_train(server_round, replies)
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
            fed.save_checkpoint()
        self.finish()
        return result

    def finish(self) -> None:
        """Write the results files and print the final summary."""
        fed = self._fed()
        out = fed.write_results()
        from ..summary import format_summary

        self.log(format_summary(fed.results()))
        self.log(f"results written to {out.resolve()}")

    def _fed(self) -> Federation:
        if self.federation is None:
            raise RuntimeError("the federation is not set up yet (handshake first)")
        return self.federation
