"""phase-demo: the round-phase contract by example (no paper; a test fixture, not a method).

A FedAvg variant whose round has three exchanges, so the engine's multi-phase path
is exercised the way FedSage+ or AdaFGL use it:

- ``label_counts`` (before round 1, every client): each client sends its training
  label counts (C numbers); the server keeps each client's training-set size.
- ``probe`` (every round): the server sends the current global model; each client
  reports its training loss under it (one number), without training.
- ``train``: the clients train from the global model; the server averages the
  uploads with weights ∝ n_k · exp(−probe loss_k), so a client the global model
  fits badly counts less, and sends everyone the average.

What leaves a client: C label counts once, one loss per round, the model's
parameters: nothing scales with its node count.

It is not in the product's registry: tests register it for their duration
(:func:`registered`), and a Flower simulation's ClientApps, which import the package
afresh in Ray's workers, through the mod :func:`register_in_client_app`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedgraph_flwr.algorithms import Options, unregister
from fedgraph_flwr.algorithms.base import Aggregator
from fedgraph_flwr.algorithms.fedavg import GCNTrainer
from fedgraph_flwr.core.phases import (
    TRAIN_PHASE,
    AggregateResult,
    Arrays,
    ArraySpec,
    ClientUpdate,
    Phase,
    PhaseReply,
    ReplySpec,
)

NAME = "phase-demo"

LABEL_COUNTS = Phase("label_counts", when="before-first-round")
PROBE = Phase("probe")


@dataclass(frozen=True)
class PhaseDemoOptions(Options, prefix="phase-demo"):
    """phase-demo has no options of its own."""


class PhaseDemoTrainer(GCNTrainer):
    options_class = PhaseDemoOptions
    phases = (LABEL_COUNTS, PROBE, TRAIN_PHASE)

    @classmethod
    def phase_reply_spec(cls, phase: Phase, request: Arrays, num_features: int,
                         num_classes: int, config) -> ReplySpec:
        """label_counts: the training labels' counts [C]; probe: nothing."""
        if phase == LABEL_COUNTS:
            return ReplySpec({"counts": ArraySpec((num_classes,), "int64", low=0)})
        return ReplySpec()

    def run_phase(self, phase: Phase, arrays: Arrays) -> PhaseReply:
        data = self.data
        if phase == LABEL_COUNTS:
            counts = torch.bincount(data.y[data.train_mask], minlength=self.num_classes)
            return PhaseReply(arrays={"counts": counts.cpu().numpy().astype(np.int64)})
        if phase == PROBE:
            self.load_payload(arrays)
            self.model.eval()
            with torch.no_grad():
                logits = self.forward()
                loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            return PhaseReply(metrics={"probe_loss": float(loss)})
        return super().run_phase(phase, arrays)


class PhaseDemoAggregator(Aggregator):
    options_class = PhaseDemoOptions

    def __init__(self, config, client_ids, initial) -> None:
        super().__init__(config, client_ids, initial)
        self.global_arrays: Arrays = initial
        self.train_sizes: dict[int, float] = {}
        self.probe_losses: dict[int, float] = {}

    def configure(self, phase: Phase, server_round: int, clients: list[int]) -> dict[int, Arrays]:
        if phase == PROBE:
            return {c: self.global_arrays for c in clients}
        return super().configure(phase, server_round, clients)

    def step(self, phase: Phase, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        if phase == LABEL_COUNTS:
            self.train_sizes = {c: float(u.arrays["counts"].sum()) for c, u in updates.items()}
            return AggregateResult(payloads={}, metrics={"train_nodes": sum(self.train_sizes.values())})
        self.probe_losses = {c: float(u.metrics["probe_loss"]) for c, u in updates.items()}
        return AggregateResult(payloads={}, metrics={
            "mean_probe_loss": float(np.mean(list(self.probe_losses.values())))})

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        ids = sorted(updates)
        w = np.array([self.train_sizes.get(c, updates[c].num_train)
                      * np.exp(-self.probe_losses.get(c, 0.0)) for c in ids], dtype=np.float64)
        w = w / w.sum()
        self.global_arrays = {
            name: np.tensordot(w, np.stack([updates[c].arrays[name] for c in ids]), axes=1)
            .astype(updates[ids[0]].arrays[name].dtype)
            for name in updates[ids[0]].arrays
        }
        return AggregateResult(payloads={c: self.global_arrays for c in self.client_ids},
                               metrics={"max_weight": float(w.max())})

    def state_dict(self) -> dict[str, Any]:
        return {"global": self.global_arrays,
                "train_sizes": {str(c): v for c, v in self.train_sizes.items()},
                "probe_losses": {str(c): v for c, v in self.probe_losses.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_arrays = dict(state["global"])
        self.train_sizes = {int(c): float(v) for c, v in state["train_sizes"].items()}
        self.probe_losses = {int(c): float(v) for c, v in state["probe_losses"].items()}


def register_phase_demo() -> None:
    """Register phase-demo in this process unless it already is."""
    # The registry is looked up at call time, in the process that runs this (a Ray worker).
    from fedgraph_flwr.algorithms import ALGORITHMS, register

    if NAME not in ALGORITHMS:
        register(NAME, PhaseDemoTrainer, PhaseDemoAggregator, PhaseDemoOptions)


@contextmanager
def registered() -> Iterator[None]:
    """phase-demo registered for the ``with`` block only, so tests that walk the
    registry never see it."""
    register_phase_demo()
    try:
        yield
    finally:
        unregister(NAME)


def register_in_client_app(message, context, call_next):
    """A Flower mod: registers phase-demo in the ClientApp's process before the
    message is handled (a simulated ClientApp runs in a Ray worker that never ran the
    tests' registration). Ray's workers cannot import this file (tests/ is not on
    their path), so a test sends it by value: ``ray.cloudpickle.register_pickle_by_value``."""
    register_phase_demo()
    return call_next(message, context)

