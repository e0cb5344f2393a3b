"""Local: every client trains alone; nothing is uploaded or mixed."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.options import Options
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from .base import Aggregator
from .fedavg import GCNTrainer


@dataclass(frozen=True)
class LocalOptions(Options, prefix="local"):
    """Local has no options of its own."""


class LocalTrainer(GCNTrainer):
    """A GCN whose parameters never leave the client (kept in its local state)."""

    options_class = LocalOptions

    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config) -> Arrays:
        """Nothing: Local shares no model."""
        return {}

    def upload(self) -> Arrays:
        """Nothing: Local shares no model."""
        return {}

    def load_payload(self, arrays: Arrays) -> None:
        """Nothing to apply: Local receives nothing."""
        # Round 1 carries the common initial model, which the trainer already built.
        return None


class LocalAggregator(Aggregator):
    """Returns nothing: the client's own model lives in its local state."""

    options_class = LocalOptions

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """An empty payload for every client."""
        return AggregateResult(payloads={c: {} for c in updates})


ALGORITHM = Algorithm("local", LocalTrainer, LocalAggregator, LocalOptions)
