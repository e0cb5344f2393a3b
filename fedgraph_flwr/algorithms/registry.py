"""Algorithms registered by name: a client trainer plus a server aggregator, with typed options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import Aggregator, ClientTrainer, check_phases
from .options import Options


@dataclass(frozen=True)
class Algorithm:
    """A named pair of trainer and aggregator and the :class:`Options` class of its own keys.

    ``legacy_values`` names keys added later whose default is not what runs made before
    the key existed did: the value those runs used, or a function of their filled config
    that gives it, so their saved results are read as what they were
    (``fedgraph_flwr.experiments.saved_config``).
    """

    name: str
    trainer: type[ClientTrainer]
    aggregator: type[Aggregator]
    options: type[Options]
    legacy_values: dict[str, Any] = field(default_factory=dict)

    @property
    def config_defaults(self) -> dict[str, Any]:
        """``{key: default}`` of the algorithm's own keys (from :attr:`options`)."""
        return self.options.defaults()


ALGORITHMS: dict[str, Algorithm] = {}


def register(
    name: str,
    trainer: type[ClientTrainer],
    aggregator: type[Aggregator],
    options: type[Options],
    legacy_values: dict[str, Any] | None = None,
) -> Algorithm:
    """Register an algorithm under a lower-case name.

    ``trainer`` and ``aggregator`` must build ``self.options`` from ``options`` (their
    ``options_class``), whose keys are ``<name>-*`` and no other algorithm's.
    """
    if name != name.lower():
        raise ValueError(f"algorithm names are lower-case, got {name!r}")
    if name in ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is already registered")
    check_phases(trainer.phases)
    for part in (trainer, aggregator):
        if part.options_class is not options:
            raise ValueError(f"{name}: {part.__name__}.options_class is "
                             f"{part.options_class.__name__}, not {options.__name__}")
    defaults = options.defaults()  # also checks every field and that the defaults are valid
    foreign = sorted(k for k in defaults if not k.startswith(f"{name}-"))
    if foreign:
        raise ValueError(f"{name}: option keys must start with '{name}-': {foreign}")
    legacy = dict(legacy_values or {})
    undefaulted = sorted(set(legacy) - set(defaults))
    if undefaulted:
        raise ValueError(f"{name}: legacy_values for keys it has no default for: {undefaulted}")
    algo = Algorithm(name, trainer, aggregator, options, legacy)
    ALGORITHMS[name] = algo
    return algo


def get_algorithm(name: str) -> Algorithm:
    """Look up an algorithm; the error lists the valid names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        valid = ", ".join(sorted(ALGORITHMS))
        raise ValueError(f"unknown algorithm {name!r}; valid: {valid}") from None
