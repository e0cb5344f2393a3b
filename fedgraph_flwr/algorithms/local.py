"""Local: every client trains alone; nothing is uploaded or mixed."""

from __future__ import annotations

from .base import AggregateResult, Aggregator, Arrays, ClientUpdate
from .fedavg import GCNTrainer


class LocalTrainer(GCNTrainer):
    """A GCN whose parameters never leave the client (kept in its local state)."""

    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config) -> Arrays:
        return {}

    def upload(self) -> Arrays:
        return {}

    def load_payload(self, arrays: Arrays) -> None:
        # Round 1 carries the common initial model, which the trainer already built.
        return None


class LocalAggregator(Aggregator):
    """Returns nothing: the client's own model lives in its local state."""

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        return AggregateResult(payloads={c: {} for c in updates})
