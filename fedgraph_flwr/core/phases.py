"""A round as phases, and what crosses between a client and the server in one.

The contract these serve is in :mod:`.bases` (its module docstring: the round-phase
contract). Plain dataclasses over numpy arrays: neither Flower nor torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Phase:
    """One exchange of a round (:mod:`.bases`' docstring: the round-phase contract)."""

    name: str  # "train", or a custom action name: lower-case letters, digits, "_"
    when: str = "every-round"  # "every-round" | "before-first-round"

    WHEN = ("every-round", "before-first-round")

    def __post_init__(self) -> None:
        if not self.name or not all(c.islower() or c.isdigit() or c == "_" for c in self.name):
            raise ValueError(f"phase name {self.name!r}: use lower-case letters, digits and _")
        if self.when not in self.WHEN:
            raise ValueError(f"phase {self.name!r}: when={self.when!r}; valid: {', '.join(self.WHEN)}")
        if self.name == TRAIN and self.when != "every-round":
            raise ValueError("the train phase runs every round")

    @property
    def message_type(self) -> str:
        """Flower's message type: ``train``, or the custom action ``train.<name>``."""
        return TRAIN if self.name == TRAIN else f"{TRAIN}.{self.name}"


#: The standard phase every algorithm ends its round with.
TRAIN = "train"
TRAIN_PHASE = Phase(TRAIN)


def check_phases(phases: tuple[Phase, ...]) -> None:
    """An algorithm's phases: unique names, ending with the train phase."""
    names = [p.name for p in phases]
    if len(set(names)) != len(names):
        raise ValueError(f"phase names repeat: {names}")
    if not phases or phases[-1] != TRAIN_PHASE:
        raise ValueError(f"the last phase must be Phase('train'), got {names}")


@dataclass(frozen=True)
class ArraySpec:
    """One array of a reply to a non-train phase.

    ``shape``: an int is that length; a str is a length the server cannot know (the
    client's node or edge count), shared by every array of the same reply that names it.
    ``dtype``: numpy's name. ``low``/``high``: the inclusive range of an integer array.
    """

    shape: tuple[int | str, ...]
    dtype: str
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class MetricSpec:
    """One number a reply to a non-train phase must carry: in [``low``, ``high``], NaN
    only where ``nan``; ``fact``: a handshake fact of the same client that bounds it."""

    low: float = -math.inf
    high: float = math.inf
    nan: bool = False
    fact: str | None = None


@dataclass(frozen=True)
class ReplySpec:
    """What a reply to a non-train phase carries (``ClientTrainer.phase_reply_spec``):
    exactly ``arrays`` (none when empty), and at least ``metrics``."""

    arrays: dict[str, ArraySpec] = field(default_factory=dict)
    metrics: dict[str, MetricSpec] = field(default_factory=dict)


@dataclass
class PhaseReply:
    """What a client's handler of a non-train phase returns."""

    arrays: Arrays = field(default_factory=dict)
    signature: Arrays = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """What one client reported in one round, as the aggregator sees it."""

    arrays: Arrays  # the uploaded parameters, by name
    signature: Arrays  # compact per-client summary (APV, posteriors, proxies)
    num_train: int  # number of training nodes (FedAvg-style weights)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class AggregateResult:
    """The server's answer to one round.

    ``payloads[c]`` is what client ``c`` receives next round (its personalized
    arrays; the same dict object for every client under FedAvg is fine).
    ``diagnostics`` holds round-level matrices the engine saves and plots, e.g.
    ``"similarity"``: a K×K array whose rows/cols follow ``sorted(updates)``.
    ``metrics`` are scalars logged in the round's record.
    """

    payloads: dict[int, Arrays]
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
