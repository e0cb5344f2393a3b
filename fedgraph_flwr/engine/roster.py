"""Who takes part: the clients' handshake facts, checked, and each round's sample."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import ConfigError, RunConfig


class Roster:
    """The logical clients (partition ids) and what they reported in the handshake
    (``num-features``, ``num-classes``, ``num-train``, ...). Raises :class:`ConfigError`
    for a federation that cannot run: ids not 0..K-1, disagreeing feature widths, a
    client without training nodes."""

    def __init__(self, config: RunConfig, facts: dict[int, dict[str, Any]]) -> None:
        self.facts = dict(sorted(facts.items()))
        self.client_ids = list(self.facts)
        self.seed = config.seed
        self.fraction = config.fraction
        expected = list(range(config.num_clients))
        if self.client_ids != expected:
            raise ConfigError(
                f"clients reported partition ids {self.client_ids}, expected 0..{expected[-1]}"
            )
        widths = {f["num-features"] for f in self.facts.values()}
        if len(widths) != 1:
            detail = ", ".join(f"client {c}: {f['num-features']}" for c, f in self.facts.items())
            raise ConfigError(f"clients disagree on the feature width ({detail})")
        self.num_features = widths.pop()
        self.num_classes = max(f["num-classes"] for f in self.facts.values())
        for c, f in self.facts.items():
            # Under dp=client the count is withheld: the client's own loader refuses a
            # subgraph without training nodes (data/partition.py, data/files.py).
            if f.get("num-train") == 0:
                raise ConfigError(f"client {c} has no training node")

    def sample(self, server_round: int) -> list[int]:
        """The round's participants: all, or a seeded ``fraction`` of them."""
        if self.fraction >= 1.0:
            return list(self.client_ids)
        # The FedIIH reference's rule (spec fediih.md §10.6):
        # np.random.seed(seed + r); choice(M, round(M * frac), replace=False).
        k = max(1, round(self.fraction * len(self.client_ids)))
        rng = np.random.RandomState(self.seed + server_round)
        chosen = rng.choice(len(self.client_ids), k, replace=False)
        return sorted(self.client_ids[int(i)] for i in chosen)
