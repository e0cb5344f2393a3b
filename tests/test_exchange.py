"""FlowerTransport.push_and_pull: how often it asks the SuperLink, not what it trains.

Against a real SuperLink each push, poll and object is one request to one process (the
deployment's bottleneck on small graphs), so the loop pushes each message on its own and
holds its first poll until 70% of the last exchange's fastest reply. The grid below
answers like Flower's: push_messages returns ids, pull_messages the replies that are in
(the loop reads only a reply's ``metadata.reply_to_message_id`` and ``src_node_id``).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from fedgraph_flwr.config import ClientConfig
from fedgraph_flwr.engine import flower_transport
from fedgraph_flwr.engine.flower_transport import FlowerTransport
from fedgraph_flwr.engine.transport import ClientRequest


class TimedGrid:
    """Replies to message ``i`` become available ``delays[i]`` s after it was pushed."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.pushed: list[list[str]] = []
        self.due: dict[str, float] = {}
        self.polls: list[float] = []
        self.t0 = time.perf_counter()

    def push_messages(self, messages):
        ids = []
        for _ in messages:
            mid = f"m{len(self.due)}"
            self.due[mid] = time.perf_counter() + self.delays[len(self.due)]
            ids.append(mid)
        self.pushed.append(ids)
        return ids

    def pull_messages(self, message_ids):
        now = time.perf_counter()
        self.polls.append(now - self.t0)
        out = []
        for mid in message_ids:
            if self.due[mid] <= now:
                out.append(SimpleNamespace(metadata=SimpleNamespace(
                    reply_to_message_id=mid, src_node_id=int(mid[1:]) + 1)))
        return out


def _messages(n: int) -> list[object]:
    return [object() for _ in range(n)]


def _exchange(transport: FlowerTransport, grid: TimedGrid, messages, timeout: float):
    transport.grid = grid
    return transport.push_and_pull(messages, timeout)


def test_each_message_is_pushed_alone_and_first_polls_wait():
    transport = FlowerTransport(None, log=lambda _: None)
    first = TimedGrid([0.30, 0.35, 0.40])
    replies, pending = _exchange(transport, first, _messages(3), timeout=10)
    assert len(replies) == 3 and not pending
    assert first.pushed == [["m0"], ["m1"], ["m2"]]
    assert first.polls[0] < 0.05  # nothing learnt yet: poll at once
    assert 0.28 <= transport._fastest_reply < 0.45

    second = TimedGrid([0.30, 0.35, 0.40])
    replies, pending = _exchange(transport, second, _messages(3), timeout=10)
    assert len(replies) == 3 and not pending
    assert second.polls[0] >= 0.7 * 0.28  # held back: no reply could be in yet
    assert len(second.polls) < len(first.polls)


def test_timeout_still_bounds_the_first_wait():
    transport = FlowerTransport(None, log=lambda _: None)
    transport._fastest_reply = 30.0
    grid = TimedGrid([100.0])
    t0 = time.perf_counter()
    replies, pending = _exchange(transport, grid, _messages(1), timeout=0.2)
    assert not replies and pending == {"m0"}
    assert time.perf_counter() - t0 < 2.0


def test_a_slow_round_does_not_hold_back_the_next_ones():
    """After a slow exchange (say round 1, with the clients' data loading) the first poll
    waits at most FIRST_POLL_MAX; replies already in at that poll halve the next wait."""
    transport = FlowerTransport(None, log=lambda _: None)
    transport._fastest_reply = 20.0
    grid = TimedGrid([0.05, 0.05])
    replies, pending = _exchange(transport, grid, _messages(2), timeout=10)
    assert len(replies) == 2 and not pending
    assert flower_transport.FIRST_POLL_MAX <= grid.polls[0] < flower_transport.FIRST_POLL_MAX + 0.5
    assert len(grid.polls) == 1
    assert transport._fastest_reply < 0.6 * grid.polls[0]

    grid = TimedGrid([0.05, 0.05])
    _exchange(transport, grid, _messages(2), timeout=10)
    assert grid.polls[0] < 0.45  # 0.7 x the halved estimate, not another full second


class UnavailableGrid:
    """Node 12 replies; node 13 is dead: the SuperLink answers for it with Flower's
    ``Node Unavailable`` error, sent from the SuperLink's own node id (0), as
    flwr.server.superlink.linkstate.utils.create_message_error_unavailable_res_message does."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}

    def push_messages(self, messages):
        ids = []
        for message in messages:
            mid = f"m{len(self.sent)}"
            self.sent[mid] = message.metadata.dst_node_id
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        from flwr.common.constant import ErrorCode

        out = []
        for mid in message_ids:
            dst = self.sent[mid]
            if dst == 13:
                out.append(SimpleNamespace(
                    metadata=SimpleNamespace(reply_to_message_id=mid, src_node_id=0),
                    has_error=lambda: True,
                    error=SimpleNamespace(code=ErrorCode.NODE_UNAVAILABLE,
                                          reason="Error: Node Unavailable — heartbeat missed")))
            else:
                out.append(SimpleNamespace(
                    metadata=SimpleNamespace(reply_to_message_id=mid, src_node_id=dst),
                    has_error=lambda: True,
                    error=SimpleNamespace(code=0, reason="the client's own error")))
        return out


def test_a_superlink_error_reply_is_recorded_for_the_node_it_is_about(monkeypatch):
    """``Node Unavailable`` replies come from node 0, not from the dead node: the failure
    is still that client's, with Flower's reason, not ``missing`` nor an unknown node."""
    import numpy as np

    # A Flower Message needs a run (TaskIdentity); the transport reads only its dst node.
    monkeypatch.setattr(flower_transport, "Message", lambda content, dst, *a, **k: SimpleNamespace(
        metadata=SimpleNamespace(dst_node_id=dst)))
    logged: list[str] = []
    transport = FlowerTransport(UnavailableGrid(), log=logged.append)
    transport.node_of = {0: 12, 1: 13}
    transport.client_of = {12: 0, 13: 1}
    phase = SimpleNamespace(name="train", message_type="train")
    config = ClientConfig(server_round=3)
    requests = {c: ClientRequest({"w": np.zeros(2)}, config) for c in (0, 1)}
    out = transport.exchange(phase, requests, timeout=2.0)
    assert out.failures[1].startswith("error 5: Error: Node Unavailable")
    assert out.failures[0] == "error 0: the client's own error"
    assert not any("unknown node" in line for line in logged)
