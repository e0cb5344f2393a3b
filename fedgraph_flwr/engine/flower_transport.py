"""The round driver's transport over Flower's ``Grid`` (simulation and deployment).

Each client gets its own message per phase: its arrays and ``config`` (the keys it
needs); its reply carries its arrays and ``metrics`` (with the signature), laid out by
:mod:`.records` (arrays packed inline in the one record, or beside it when large).
Server-side state is keyed by the
client's logical id (its partition id, learnt in the handshake), not by the
transient node id, so a SuperNode that reconnects gets its own model back.
Only Flower's public API is used here (``flwr.app``, ``flwr.serverapp``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol, cast

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from ..config import RunConfig
from ..core.phases import Phase
from .accelerate import bound_reply_pulls
from .contract import ERROR_DATA_ROOT, missing_dataset
from .recorder import nbytes
from .records import (
    content_arrays,
    content_scalars,
    from_metric_record,
    request_content,
    signature_floats,
    to_config_record,
)
from .roster import fact_problem
from .transport import ClientReply, ClientRequest, Exchange, RunAborted, Transport

#: In simulation, seconds the SuperNode count must hold still before it is taken as final.
SIMULATION_SETTLE_S = 3.0
#: A node reporting a heartbeat interval of at least this many seconds never sends one
#: (:func:`is_simulation`).
NEVER_BEATS_S = 1e12

#: The first poll for replies waits this fraction of the last exchange's fastest reply,
#: and never longer than FIRST_POLL_MAX seconds.
FIRST_POLL_FRACTION = 0.7
FIRST_POLL_MAX = 1.0

#: While a deployment waits for its SuperNodes: seconds until the first report naming the
#: clients not seen yet (log and progress.json; SuperNodes already up connect within a
#: second or two), then between reports.
WAIT_FIRST_REPORT_S = 10.0
WAIT_REPORT_S = 20.0

#: Seconds a round's refresh waits for new nodes' answers (later ones: next round).
REJOIN_WAIT_S = 1.0
#: Seconds past the round's deadline that a reply already announced may take to
#: finish arriving (its objects still uploading); within the round's fixed margin.
REPLY_GRACE_S = 2.0


def is_simulation(grid: Grid) -> bool:
    """Whether ``grid``'s SuperNodes are a simulation's: every node never heartbeats.

    Read through the public ``Grid.get_nodes()``: Flower's simulation registers its
    SuperNodes with an endless heartbeat interval (1e300 s in 1.41-1.43), a deployed
    SuperNode reports its own (30 s by default). No class name or private module is
    looked at. False while no node is connected, and for a grid that cannot say."""
    try:
        nodes = list(grid.get_nodes())
        return bool(nodes) and all(float(getattr(node, "heartbeat_interval", 0.0) or 0.0)
                                   >= NEVER_BEATS_S for node in nodes)
    except Exception:  # noqa: BLE001 - a grid without get_nodes, a failed request: deployment
        return False


def _collapse(reason: str, nodes: list[int], total: int) -> str:
    """One line for every node that failed with the same reason."""
    if len(nodes) == 1:
        return f"node {nodes[0]}: {reason}"
    if len(nodes) == total:
        return f"all {total} clients: {reason}"
    shown = ", ".join(str(n) for n in sorted(nodes)[:5]) + (", ..." if len(nodes) > 5 else "")
    return f"{len(nodes)} of {total} clients (nodes {shown}): {reason}"


def data_root_hint(config: RunConfig, simulated: bool) -> str:
    """What to do when the clients did not find the dataset under their data root."""
    if config.data_root:
        return ""  # an explicit data-root: the clients' reason names it
    fix = "--run-config \"data-root='/path/to/datasets'\""
    if not simulated:
        return (f". Each SuperNode looks in its own FEDGRAPH_DATA_ROOT (set before it starts), "
                f"else ~/.cache/fedgraph-flwr. Fix: flwr run . {fix}, or start the SuperNodes "
                f"with FEDGRAPH_DATA_ROOT set")
    if os.environ.get("FEDGRAPH_DATA_ROOT"):
        return ""  # the clients saw the variable (the reason says where they looked)
    return (f". A local simulation runs with the environment the local SuperLink had when it "
            f"started: a FEDGRAPH_DATA_ROOT exported since is not seen. Fix: flwr run . {fix} "
            f"(fedgraph-run passes $FEDGRAPH_DATA_ROOT on by itself), or restart the local "
            f"SuperLink with the variable set (find yours: pgrep -u \"$(id -u)\" -a -f "
            f"\"[f]lower-superlink .*${{FLWR_HOME:-$HOME/.flwr}}/local-superlink/\"; kill that "
            f"PID; export FEDGRAPH_DATA_ROOT=/path/to/datasets; flwr run .)")


def nodes_note(resources: list[dict[str, Any]]) -> str | None:
    """One line when the handshake's ClientApps ran on more than one Ray node (a
    simulation attached to a Ray cluster, docs/running.md); None otherwise."""
    nodes = sorted({r["ray-node"] for r in resources if r.get("ray-node")})
    if len(nodes) < 2:
        return None
    actors = {r["ray-actor"] for r in resources if r.get("ray-actor")}
    return (f"fedgraph-flwr: the handshake's {len(resources)} ClientApps ran in {len(actors)} "
            f"actors on {len(nodes)} Ray nodes: {', '.join(n[:12] for n in nodes)}")


def serialised_note(resources: list[dict[str, Any]], num_clients: int) -> str | None:
    """One line when a simulation runs its ClientApps one after another although the
    machine has CPUs for more; None otherwise (a deployment, or nothing to gain).

    ``resources`` are the ``ray-*`` facts of the clients' handshakes
    (:func:`.client_runtime.ray_resources`). Flower keeps ``total // per-client CPUs``
    ClientApp actors (2 CPUs each unless ``client-resources-num-cpus`` says otherwise),
    so on a 2-core machine the default runs one client at a time.
    """
    cpus = [r["ray-cpus"] for r in resources if r.get("ray-cpus")]
    totals = [r["ray-cpus-total"] for r in resources if r.get("ray-cpus-total")]
    actors = {r["ray-actor"] for r in resources if r.get("ray-actor")}
    if num_clients < 2 or not cpus or not totals or len(actors) > 1:
        return None  # not a simulation, one client, or the clients ran in several actors
    per_client, total = max(cpus), max(totals)
    if total // per_client > 1 or total < 2:
        return None  # in parallel already, or a single CPU: nothing to gain
    fix = int(max(1, total // min(num_clients, total)))
    return (f"fedgraph-flwr: note: the simulation runs its {num_clients} ClientApps one after "
            f"another (Flower gives each {per_client:g} of the {total:g} CPUs); to run them in "
            f"parallel: flwr run . --federation-config \"client-resources-num-cpus={fix}\" "
            f"(or, until the local SuperLink restarts: "
            f"flwr federation simulation-config @none/default local "
            f"--client-resources-num-cpus {fix})")


class FederationShape(Protocol):
    """What :meth:`FlowerTransport.wait_for_nodes` reads of a run: a :class:`RunConfig`, or
    the ServerApp's :class:`~fedgraph_flwr.config.FederationPreview` before it is resolved."""

    @property
    def num_clients(self) -> int:
        """``num-clients``: the SuperNodes wanted."""

    @property
    def handshake_timeout(self) -> float:
        """``handshake-timeout``: seconds to wait for them."""

    def run_config_text(self, **changes: Any) -> str:
        """The ``--run-config`` text of the run, ``changes`` applied (for the printed fix)."""


def _run_config_option(config: FederationShape, **changes: Any) -> str:
    """`` --run-config "..."`` giving this run's settings (``changes`` applied), or ''."""
    text = config.run_config_text(**changes)
    return f' --run-config "{text}"' if text else ""


def decode_reply(content: RecordDict, cid: int) -> ClientReply | str:
    """Client ``cid``'s reply decoded, or why it cannot be (one line): a reply is a
    stranger's bytes, so a malformed one costs its sender the round, never the run."""
    try:
        metrics, signature = from_metric_record(content_scalars(content, "metrics"))
        upload = content_arrays(content)
    except Exception as exc:  # noqa: BLE001 - whatever the bytes make the decoders raise
        return f"malformed reply: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    reported = metrics.get("partition-id", -1.0)
    if reported != cid:
        return f"reply claims client {reported:g}, sent to client {cid}"
    return ClientReply(upload, signature, metrics, nbytes(upload) + 4 * signature_floats(signature))


class FlowerTransport(Transport):
    """Phases as Flower messages: ``train`` and ``train.<phase>`` actions of the ClientApp."""

    def __init__(self, grid: Grid, log=print) -> None:
        self.grid = grid
        self.log = log
        self.node_of: dict[int, int] = {}  # logical client id -> current node id
        self.client_of: dict[int, int] = {}  # node id -> logical client id
        self._fastest_reply = 0.0  # seconds until the first reply of the last exchange
        self._rejoining: dict[str, int] = {}  # rejoin query's message id -> node asked
        self._sent_to: dict[str, int] = {}  # last exchange: message id -> the node it went to
        self._reply_wait: dict[int, float] = {}  # last exchange: node id -> seconds to its reply
        # The handshake sent to nodes while the others were awaited: message id -> node,
        # and the answers in so far by message id (wait_for_nodes, connect).
        self._early_asked: dict[str, int] = {}
        self._early_replies: dict[str, Message] = {}
        self._data_checked = False  # a simulation's dataset was found (check_simulated_data)

    # --- joining ----------------------------------------------------------------------
    def wait_for_nodes(self, config: FederationShape) -> list[int]:
        """Wait until ``num-clients`` SuperNodes are connected; fail with the fix otherwise.

        A deployment's SuperNodes may join over minutes (``handshake-timeout``): each is
        asked who it is as soon as it connects, and after ``WAIT_FIRST_REPORT_S`` seconds,
        then every ``WAIT_REPORT_S``, the clients not seen yet are named (log and
        ``on_waiting``, i.e. progress.json); a run that times out stops with that list.
        A simulation registers all of its SuperNodes at start, so once some are there and
        their number has not changed for ``SIMULATION_SETTLE_S`` no more will come: a
        federation of the wrong size fails within seconds, not after the timeout.
        """
        want = config.num_clients
        start = time.time()
        deadline = start + config.handshake_timeout
        next_report = start + WAIT_FIRST_REPORT_S
        nodes = list(self.grid.get_node_ids())
        simulated = bool(nodes) and is_simulation(self.grid)  # asked again when nodes join
        changed = time.time()
        while len(nodes) < want and time.time() < deadline:
            if simulated and nodes and time.time() - changed > SIMULATION_SETTLE_S:
                break
            if not simulated and isinstance(config, RunConfig):  # a deployment's nodes
                self._ask_early(config, nodes)
                if time.time() >= next_report:
                    self._report_waiting(config, nodes, time.time() - start)
                    next_report += WAIT_REPORT_S
            time.sleep(0.2)
            current = list(self.grid.get_node_ids())
            if len(current) != len(nodes):
                changed = time.time()
                simulated = bool(current) and is_simulation(self.grid)
            nodes = current
        if len(nodes) != want:
            if not simulated and isinstance(config, RunConfig):
                self._ask_early(config, nodes)
            waiting = self.waiting(config, nodes, time.time() - start)
            raise RunAborted(
                f"the federation has {len(nodes)} SuperNodes but num-clients={want}"
                + (f" ({waiting['line']})" if not simulated else "") + "; "
                f"in simulation run: flwr run .{_run_config_option(config)} "
                f"--federation-config \"num-supernodes={want}\" (plus any other federation "
                f"settings you passed, e.g. client-resources-num-cpus; or, until the local "
                f"SuperLink restarts: flwr federation simulation-config @none/default local "
                f"--num-supernodes {want}), or pass"
                f"{_run_config_option(config, **{'num-clients': len(nodes)})}; "
                f"in deployment start {want} SuperNodes"
            )
        return nodes

    def _ask_early(self, config: RunConfig, nodes: list[int]) -> None:
        """Send the handshake to the nodes connected since the last call and take in the
        answers already there (no waiting): who is connected is known by client id
        while the others are awaited. ``connect`` uses these answers as its own."""
        asked = set(self._early_asked.values())
        new = [n for n in nodes if n not in asked]
        if new:
            record = to_config_record(config.client_config().to_config())
            messages = [Message(RecordDict({"config": record}), n, "query", group_id="handshake")
                        for n in new]
            self._early_asked.update(self._push(messages, time.monotonic() + 30.0))
        pending = set(self._early_asked) - set(self._early_replies)
        if pending:
            for reply in self.grid.pull_messages(pending):
                self._early_replies[reply.metadata.reply_to_message_id] = reply

    def waiting(self, config: FederationShape, nodes: list[int], elapsed: float
                ) -> dict[str, Any]:
        """Who the handshake waits for: the connected nodes, the client ids they answered
        with, the clients not seen (``missing``: never connected, refused, or connected
        and not answered yet) and one line saying so."""
        seen: dict[int, int] = {}  # client id -> node
        failed: dict[int, str] = {}  # node -> why its handshake failed (said in full later)
        for mid, reply in self._early_replies.items():
            node = self._early_asked[mid]
            if node not in nodes:
                continue
            info = {} if reply.has_error() else dict(reply.content.get("info", {}))
            if "partition-id" in info:
                seen[int(cast(int, info["partition-id"]))] = node
            else:
                failed[node] = str(reply.error.reason) if reply.has_error() else "no client id"
        unanswered = sorted(set(nodes) - set(seen.values()) - set(failed))
        missing = [c for c in range(config.num_clients) if c not in seen]
        names = ", ".join(str(c) for c in missing[:20]) + (", ..." if len(missing) > 20 else "")
        line = (f"{len(nodes)} of {config.num_clients} SuperNodes connected after "
                f"{elapsed:.0f} s (handshake-timeout {config.handshake_timeout:g} s); "
                f"client{'s' if len(missing) != 1 else ''} {names} not seen"
                + (f" ({len(unanswered)} connected node(s) not answered yet: "
                   f"{', '.join(str(n) for n in unanswered[:5])})" if unanswered else "")
                + (f" ({len(failed)} node(s) failed the handshake: node {min(failed)}: "
                   f"{failed[min(failed)].splitlines()[0][:200]})" if failed else "")
                + "; a client's SuperNode that never connects: check it runs, its TLS "
                  "(--root-certificates, the SuperLink's address) and that its public key "
                  "is registered (fedgraph-preflight --superlink ...)")
        return {"elapsed_s": round(elapsed, 1), "timeout_s": config.handshake_timeout,
                "connected": len(nodes), "want": config.num_clients,
                "answered": {str(c): n for c, n in sorted(seen.items())},
                "missing": missing, "unanswered_nodes": unanswered,
                "failed_nodes": {str(n): r for n, r in sorted(failed.items())}, "line": line}

    def _report_waiting(self, config: FederationShape, nodes: list[int], elapsed: float
                        ) -> None:
        waiting = self.waiting(config, nodes, elapsed)
        self.log(f"fedgraph-flwr: waiting for clients: {waiting['line']}")
        if self.on_waiting is not None:
            self.on_waiting(waiting)

    def check_simulated_data(self, config: RunConfig, clients: int) -> None:
        """A simulation's ClientApps run with this process's environment and files: a
        dataset missing here is missing for all of them, said now rather than after Ray
        has started them all (fetched first where ``download`` is on). Checked once."""
        if self._data_checked:
            return
        reason = missing_dataset(config, fetch=True)
        if reason:
            raise RunAborted(f"the {clients} simulated clients cannot load their data: "
                             f"{reason}{data_root_hint(config, True)}")
        self._data_checked = True

    def connect(self, config: RunConfig) -> dict[int, dict[str, Any]]:
        """Ask each node who it is; every client loads and validates its subgraph here.

        Sent as soon as the nodes are there. Failures are collapsed: one line per
        distinct reason (``all 10 clients: ...``), then what fixes a data root that
        did not reach the clients. A simulation that runs its ClientApps one at a time
        says so once (:func:`serialised_note`).
        """
        nodes = self.wait_for_nodes(config)
        simulated = is_simulation(self.grid)
        if simulated:
            self.check_simulated_data(config, len(nodes))
        record = to_config_record(config.client_config().to_config())
        early = {mid: n for mid, n in self._early_asked.items() if n in nodes}
        messages = [Message(RecordDict({"config": record}), node, "query", group_id="handshake")
                    for node in nodes if node not in early.values()]
        replies, missing = self.push_and_pull(messages, config.handshake_timeout, early=early)
        roster: dict[int, dict[str, Any]] = {}
        failed: dict[str, list[int]] = {}  # reason -> nodes
        codes: set[int] = set()
        resources: list[dict[str, Any]] = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():  # named by the node asked, even when the SuperLink answered
                failed.setdefault(str(reply.error.reason), []).append(self._replying_node(reply))
                codes.add(int(reply.error.code))
                continue
            info = dict(cast(ConfigRecord, reply.content["info"]))
            # Ray's resources are a diagnostic of this transport, not a fact of the client.
            resources.append({k: info.pop(k) for k in list(info) if k.startswith("ray-")})
            problem = fact_problem(info)
            if problem:
                failed.setdefault(problem, []).append(node)
                continue
            cid = int(cast(int, info["partition-id"]))
            if cid in roster:
                failed.setdefault(f"partition-id {cid} is already taken by another node",
                                  []).append(node)
                continue
            roster[cid] = info
            self.node_of[cid] = node
            self.client_of[node] = cid
        # The most common reason first, then by node: the same failures read the same way.
        problems = [_collapse(reason, found, len(nodes)) for reason, found in
                    sorted(failed.items(), key=lambda item: (-len(item[1]), min(item[1])))]
        if missing:
            problems.append(f"{len(missing)} node(s) did not answer the handshake in time")
        if problems:
            hint = data_root_hint(config, simulated) if ERROR_DATA_ROOT in codes else ""
            raise RunAborted("handshake failed: " + "; ".join(problems) + hint)
        for note in (nodes_note(resources), serialised_note(resources, config.num_clients)):
            if note:
                self.log(note)
        return roster

    def refresh(self, config: RunConfig, deadline: float | None = None) -> None:
        """Map nodes that (re)connected since the handshake, so a returning client
        gets its personalized model back under its new node id.

        A new node is asked who it is once; its answer is waited for at most
        ``REJOIN_WAIT_S`` (and never past ``deadline``, the round's) and otherwise
        picked up at a later round's refresh: a node whose ClientApp executor is still
        starting does not hold up the round."""
        if deadline is None:
            deadline = time.monotonic() + config.round_timeout
        online = set(self.grid.get_node_ids())
        asked = set(self._rejoining.values())
        unknown = online - set(self.client_of) - asked
        if unknown:
            record = to_config_record(config.client_config().to_config())
            messages = [Message(RecordDict({"config": record}), n, "query", group_id="rejoin")
                        for n in sorted(unknown)]
            self._rejoining.update(self._push(messages, deadline))
        if not self._rejoining:
            return
        wait = min(deadline, time.monotonic() + REJOIN_WAIT_S)
        replies = self._pull(set(self._rejoining), wait, first_poll=0.0)
        for reply in replies:
            node = self._rejoining.pop(reply.metadata.reply_to_message_id, None)
            if reply.has_error() or node is None:
                continue  # asked again at the next refresh if it is still online
            info = dict(cast(ConfigRecord, reply.content.get("info", ConfigRecord())))
            problem = fact_problem(info)
            if problem:
                self.log(f"node {reply.metadata.src_node_id} (re)joined with {problem}; ignored")
                continue
            cid = int(cast(int, info["partition-id"]))
            old = self.node_of.get(cid)
            if cid >= config.num_clients or (old is not None and old in online):
                # Out of range, or a client whose node is still connected: another node
                # claiming it would be sent that client's personalized model.
                self.log(f"node {reply.metadata.src_node_id} claims client {cid}, "
                         f"{'out of range' if old is None else f'held by node {old}, online'}; "
                         f"ignored")
                continue
            if old is not None:
                self.client_of.pop(old, None)
            self.node_of[cid] = reply.metadata.src_node_id
            self.client_of[reply.metadata.src_node_id] = cid
            self.log(f"client {cid} (re)joined as node {reply.metadata.src_node_id}")
        # A node that went away again before answering: forget its question.
        self._rejoining = {m: n for m, n in self._rejoining.items() if n in online}

    # --- one phase --------------------------------------------------------------------
    def exchange(self, phase: Phase, requests: dict[int, ClientRequest], timeout: float
                 ) -> Exchange:
        """Send each request as a Flower message and collect the replies until ``timeout``."""
        records: dict[int, ConfigRecord] = {}  # one record per config object: most share one

        def record_of(request: ClientRequest) -> ConfigRecord:
            if id(request.config) not in records:
                records[id(request.config)] = to_config_record(request.config.to_config())
            return records[id(request.config)]

        server_round = next(iter(requests.values())).config.server_round if requests else 0
        group = f"{server_round}" + ("" if phase.name == "train" else f".{phase.name}")
        messages = [Message(request_content(request.arrays, record_of(request)),
                            self.node_of[cid], phase.message_type, group_id=group)
                    for cid, request in requests.items()]
        replies, _ = self.push_and_pull(messages, timeout)
        out = Exchange()
        for reply in replies:
            node = self._replying_node(reply)
            cid = self.client_of.get(node)
            if cid is not None and node in self._reply_wait:
                out.waits[cid] = self._reply_wait[node]
            if reply.has_error():
                reason = f"error {reply.error.code}: {reply.error.reason}"
                if cid is None:
                    self.log(f"round {server_round}: unknown node {node} failed: {reason}")
                else:
                    out.failures[cid] = reason
                continue
            if cid is None:
                self.log(f"round {server_round}: reply from unknown node {node}; ignored")
                continue
            decoded = decode_reply(reply.content, cid)
            if isinstance(decoded, str):
                out.failures[cid] = f"rejected: {decoded}"
                continue
            out.replies[cid] = decoded
        return out

    def _replying_node(self, reply: Message) -> int:
        """The node a reply is about: its sender, or, for an error reply the SuperLink
        wrote itself (``Node Unavailable`` once a node missed its heartbeats, an expired
        reply; ``src_node_id`` is then the SuperLink's own id, 0), the node the message it
        answers was sent to. So a dead node's failure is recorded with Flower's reason
        instead of as ``missing``."""
        node = reply.metadata.src_node_id
        if node in self.client_of:
            return node
        return self._sent_to.get(reply.metadata.reply_to_message_id, node)

    def push_and_pull(self, messages: list[Message], timeout: float,
                      early: dict[str, int] | None = None) -> tuple[list[Message], set[str]]:
        """Push, then pull with a short poll interval until all replies are in or
        ``timeout`` seconds have passed since the call (the pushes count too); returns
        the replies and the ids of the messages left without one.

        Flower's ``send_and_receive`` sleeps 0.1-3 s between polls, which would
        dominate a round on small graphs; this loop starts at 2 ms and backs off.
        Against a real SuperLink every push, poll and object is one request to a
        single process, so: each message is pushed on its own (a SuperNode fetches its
        model while the next one uploads, instead of all of them retrying until the
        last upload ends), and the first poll waits for 70% of the last exchange's
        fastest reply, at most 1 s (no reply comes much sooner; earlier polls only add
        requests). A message not pushed before the deadline is not pushed at all.
        ``early``: messages pushed before (the handshake's, by :meth:`_ask_early`), message
        id -> node, whose replies are collected with the rest.
        """
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        early = early or {}
        answered = [self._early_replies[mid] for mid in early if mid in self._early_replies]
        self._sent_to = {**early, **self._push(messages, deadline)}  # message id -> its node
        pending = set(self._sent_to) - {m.metadata.reply_to_message_id for m in answered}
        first_poll = min(FIRST_POLL_FRACTION * self._fastest_reply, FIRST_POLL_MAX, timeout)
        self._reply_wait = {}  # node id -> seconds until its reply came
        replies = answered + self._pull(pending, deadline, first_poll, t0)
        pending -= {msg.metadata.reply_to_message_id for msg in replies}
        unsent = len(messages) + len(early) - len(self._sent_to)
        pending |= {f"unsent-{i}" for i in range(unsent)}
        return replies, pending

    def _push(self, messages: list[Message], deadline: float) -> dict[str, int]:
        """Push each message on its own until ``deadline``; message id -> its node."""
        sent: dict[str, int] = {}
        for message in messages:
            if time.monotonic() >= deadline:
                break
            ids = list(self.grid.push_messages([message]))
            metadata = getattr(message, "metadata", None)
            sent.update((mid, metadata.dst_node_id if metadata is not None else 0)
                        for mid in ids if mid)
        return sent

    def _pull(self, pending: set[str], deadline: float, first_poll: float,
              t0: float | None = None) -> list[Message]:
        """Poll for the replies to ``pending`` until all are in or ``deadline``; with
        ``t0``, records each reply's wait (since ``t0``) and the fastest one."""
        pending = set(pending)
        start = time.perf_counter() if t0 is None else t0
        if pending and first_poll > time.perf_counter() - start:
            time.sleep(max(0.0, min(first_poll - (time.perf_counter() - start),
                                    deadline - time.monotonic())))
        replies: list[Message] = []
        pause = 0.002
        polls = 0
        in_at_first_poll = False
        while pending and time.monotonic() < deadline:
            # A reply's objects still uploading are waited for until the deadline (plus
            # a grace), never Flower's default of two hours.
            bound_reply_pulls(deadline - time.monotonic() + REPLY_GRACE_S)
            got = list(self.grid.pull_messages(pending))
            polls += 1
            in_at_first_poll |= polls == 1 and bool(got)
            now = time.perf_counter() - start
            for msg in got:
                pending.discard(msg.metadata.reply_to_message_id)
                if t0 is not None:
                    self._reply_wait[self._replying_node(msg)] = now
            replies.extend(got)
            if pending and not got:
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                pause = min(pause * 1.5, 0.05)
        if t0 is not None and self._reply_wait:
            # A reply already in at the first poll came at an unknown time before it (a
            # slow round, e.g. the first with its data loading, must not hold back the
            # next ones): aim lower next time.
            fastest = min(self._reply_wait.values())
            self._fastest_reply = fastest / 2 if in_at_first_poll else fastest
        return replies
