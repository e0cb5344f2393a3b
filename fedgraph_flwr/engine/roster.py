"""Who takes part: the clients' handshake facts, checked, and each round's sample."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..config import ConfigError, RunConfig

#: The handshake facts the server needs, each a whole number at least this.
REQUIRED_FACTS = {"partition-id": 0, "num-features": 1, "num-classes": 1}
#: The counts a client declares unless ``dp=client`` withholds them (privacy/counts.py).
COUNT_FACTS = {"num-nodes": 1, "num-train": 1, "num-val": 0, "num-test": 0}


def fact_problem(facts: dict[str, Any]) -> str | None:
    """Why a client's handshake facts cannot be taken (one line), or None: each is a whole
    number in range, and its train, val and test nodes fit in its nodes."""
    for key, least in {**REQUIRED_FACTS, **COUNT_FACTS}.items():
        value = facts.get(key)
        if value is None and key in COUNT_FACTS:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value != int(value) or value < least:
            return f"handshake fact {key}={value!r} is not a whole number >= {least}"
    if all(k in facts for k in COUNT_FACTS) and \
            facts["num-train"] + facts["num-val"] + facts["num-test"] > facts["num-nodes"]:
        return (f"handshake facts: num-train + num-val + num-test = "
                f"{facts['num-train'] + facts['num-val'] + facts['num-test']} > "
                f"num-nodes={facts['num-nodes']}")
    return None


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
        for c, f in self.facts.items():
            problem = fact_problem({**f, "partition-id": c})
            if problem:
                raise ConfigError(f"client {c}: {problem}")
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

    def sample(self, server_round: int) -> list[int]:
        """The round's participants: all, or a seeded ``fraction`` of them."""
        if self.fraction >= 1.0:
            return list(self.client_ids)
        # The FedIIH reference's rule (docs/reading/fediih.md §10.6):
        # np.random.seed(seed + r); choice(M, round(M * frac), replace=False).
        k = max(1, round(self.fraction * len(self.client_ids)))
        rng = np.random.RandomState(self.seed + server_round)
        chosen = rng.choice(len(self.client_ids), k, replace=False)
        return sorted(self.client_ids[int(i)] for i in chosen)
