"""The server's side of ``dp``: the noise the run needs, what each client spends, and
when the budget ends the run.

The clients clip and noise (:mod:`fedgraph_flwr.privacy.mechanism`); here the server
counts each client's releases (a covered phase's request it was sent, unless its reply
came back carrying nothing), reports ε(δ) after every round and stops the run before a
round that would exceed ``dp-epsilon``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import ConfigError, RunConfig
from ..core.bases import ClientTrainer
from ..core.phases import Phase
from ..privacy import scope
from ..privacy.accountant import BudgetError, PrivacyAccountant, calibrate
from .transport import ClientReply


class PrivacyBudget:
    """One run's accountant and the rules of its scope."""

    def __init__(self, config: RunConfig, trainer: type[ClientTrainer], phases: tuple[Phase, ...],
                 sample: Callable[[int], list[int]], client_ids: list[int]) -> None:
        self.scope = config.dp
        self.trainer = trainer
        self.covered = [p for p in phases if scope.releases(trainer, self.scope, p)]
        # Releases per client: once before round 1, and in each round it is sampled.
        self.before_first = sum(1 for p in self.covered if p.when == "before-first-round")
        self.every_round = sum(1 for p in self.covered if p.when == "every-round")
        self.sample = sample
        self.client_ids = client_ids
        self.config = config
        sigma = config.dp_noise_multiplier
        if not sigma:  # met by calibration: the planned run spends at most dp-epsilon
            planned = self.planned_releases(config.rounds)
            try:
                sigma = calibrate(config.dp_epsilon, planned, config.dp_delta)
            except BudgetError as exc:
                raise ConfigError(str(exc)) from None
            self.config = config.replace(dp_noise_multiplier=sigma)
        self.accountant = PrivacyAccountant(sigma, config.dp_delta, config.dp_epsilon)

    def planned_releases(self, rounds: int) -> int:
        """The most releases any client makes in a run of ``rounds`` rounds (the seeded
        sample decides who takes part in each)."""
        counts = dict.fromkeys(self.client_ids, self.before_first)
        for server_round in range(1, rounds + 1):
            for cid in self.sample(server_round):
                counts[cid] += self.every_round
        return max(counts.values(), default=0)

    def round_plan(self, sampled: list[int]) -> list[int]:
        """A client per release the round would make (each sampled client per covered phase)."""
        return [c for c in sampled for _ in range(self.every_round)]

    def stop_reason(self, server_round: int, sampled: list[int]) -> str | None:
        """Why the run must stop before ``server_round`` (its budget), or None."""
        over = self.accountant.exceeds_budget(self.round_plan(sampled))
        if over is None:
            return None
        return (f"dp budget: round {server_round} would bring ε to {over:.3g} > "
                f"dp-epsilon={self.config.dp_epsilon:g} (δ={self.config.dp_delta:g}, "
                f"σ={self.accountant.noise_multiplier:.4g}); the run stops after round "
                f"{server_round - 1}")

    def spend(self, phase: Phase, sent: list[int], replies: dict[int, ClientReply]) -> None:
        """Count ``phase``'s releases: every client sent the request, unless its reply
        came back empty (nothing released: Local, a phase with nothing to send)."""
        if phase not in self.covered:
            return
        cover_upload = scope.covers_upload(self.scope, phase)
        self.accountant.spend(
            c for c in sent
            if c not in replies or replies[c].signature or (cover_upload and replies[c].upload))

    def epsilon(self) -> float:
        """The run's ε so far."""
        return self.accountant.epsilon()

    def summary(self, keyed: bool | None) -> dict[str, Any]:
        """results.json's and progress.json's ``dp``: the guarantee so far and what it covers."""
        if self.scope == "client":
            covers = "everything the clients send"
        elif self.config.secure_aggregation == "ckks":
            covers = "the signatures and non-train phases' arrays; the weights are encrypted"
        else:
            covers = "the signatures and non-train phases' arrays; the weights go in the clear"
        return {"scope": self.scope, **self.accountant.summary(), "clip": self.config.dp_clip,
                "budget": self.config.dp_epsilon or None, "covers": covers,
                "noise_keyed": keyed}

    def state_dict(self) -> dict[str, Any]:
        """The accountant's counts, for the checkpoint."""
        return self.accountant.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.accountant.load_state_dict(state)
