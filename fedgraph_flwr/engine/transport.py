"""How the round driver reaches clients: one small interface, two implementations.

- :class:`~.flower_transport.FlowerTransport`: Flower's ``Grid`` (simulation and
  deployment); the only server-side code that touches Flower.
- :class:`~.loop.InProcessTransport`: the clients' code called directly, in turn, in
  this process (``fedgraph-experiments``, tests, overhead measurements).

Both run the same client code (:mod:`~.client_runtime`), so a config and seed give the
same numbers through either.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import ClientConfig, RunConfig
from ..core.phases import Arrays, Phase


class RunAborted(RuntimeError):
    """The run stopped on purpose (fail-fast, or an invalid federation); one-line reason.

    Defined here, not in the driver, so that the ServerApp can check the federation
    (:meth:`.flower_transport.FlowerTransport.wait_for_nodes`) before torch is imported."""


@dataclass
class ClientRequest:
    """What the server sends one client for one phase: its arrays and its config."""

    arrays: Arrays
    config: ClientConfig


@dataclass
class ClientReply:
    """A decoded, not yet validated reply of one client in one phase."""

    upload: Arrays
    signature: Arrays
    metrics: dict[str, float]
    bytes_received: int = 0


@dataclass
class Exchange:
    """One phase's outcome: the decoded replies, why the others failed, and per client
    the seconds from the phase's send to its reply."""

    replies: dict[int, ClientReply] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    waits: dict[int, float] = field(default_factory=dict)


class Transport(ABC):
    """Moves one phase's requests to clients and their replies back."""

    #: Called, where the transport can tell, with who the handshake still waits for (a
    #: dict with a one-line ``line``); the driver writes it to progress.json.
    on_waiting: Callable[[dict[str, Any]], None] | None = None

    @abstractmethod
    def connect(self, config: RunConfig) -> dict[int, dict[str, Any]]:
        """Wait for the federation's clients and return each one's handshake facts
        (:func:`~.client_runtime.describe`), keyed by logical client id."""

    def refresh(self, config: RunConfig, deadline: float | None = None  # noqa: B027 - optional hook
                ) -> None:
        """Between rounds: take in clients that (re)joined since the handshake, waiting
        for them no later than ``deadline`` (``time.monotonic()``; the round's)."""

    @abstractmethod
    def exchange(self, phase: Phase, requests: dict[int, ClientRequest], timeout: float
                 ) -> Exchange:
        """Send each client its request (arrays and config) for ``phase``; collect replies
        until all are in or ``timeout`` seconds, counted from the call (sending included),
        pass (the rest fail as missing)."""
