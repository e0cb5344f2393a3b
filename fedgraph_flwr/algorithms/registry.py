"""Algorithms registered by name: a client trainer plus a server aggregator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import Aggregator, ClientTrainer


@dataclass(frozen=True)
class Algorithm:
    """A named pair of trainer and aggregator, with its own config defaults.

    ``legacy_values`` names keys added later whose default is not what runs made before
    the key existed did: the value those runs used, so their saved results are read as
    what they were (``fedgraph_flwr.experiments.saved_config``).
    """

    name: str
    trainer: type[ClientTrainer]
    aggregator: type[Aggregator]
    config_defaults: dict[str, Any] = field(default_factory=dict)
    legacy_values: dict[str, Any] = field(default_factory=dict)


ALGORITHMS: dict[str, Algorithm] = {}


def register(
    name: str,
    trainer: type[ClientTrainer],
    aggregator: type[Aggregator],
    config_defaults: dict[str, Any] | None = None,
    legacy_values: dict[str, Any] | None = None,
) -> Algorithm:
    """Register an algorithm under a lower-case name."""
    if name != name.lower():
        raise ValueError(f"algorithm names are lower-case, got {name!r}")
    if name in ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is already registered")
    legacy = dict(legacy_values or {})
    undefaulted = sorted(set(legacy) - set(config_defaults or {}))
    if undefaulted:
        raise ValueError(f"{name}: legacy_values for keys it has no default for: {undefaulted}")
    algo = Algorithm(name, trainer, aggregator, dict(config_defaults or {}), legacy)
    ALGORITHMS[name] = algo
    return algo


def get_algorithm(name: str) -> Algorithm:
    """Look up an algorithm; the error lists the valid names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        valid = ", ".join(sorted(ALGORITHMS))
        raise ValueError(f"unknown algorithm {name!r}; valid: {valid}") from None
