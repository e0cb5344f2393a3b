"""The contract between the engine and an algorithm.

An algorithm is a :class:`ClientTrainer` (runs where the data lives; plain torch)
plus an :class:`Aggregator` (runs on the server; plain numpy/torch) plus its typed
options, registered by name in :mod:`fedgraph_flwr.algorithms`. Neither touches
Flower: only :mod:`fedgraph_flwr.engine` converts these objects to and from messages.

The round-phase contract
------------------------
An algorithm declares its round as an ordered tuple of :class:`Phase` objects
(``ClientTrainer.phases``; default: one ``train`` phase). A phase is one exchange:
the server sends some clients a message, each client's handler answers, and the
server's step sees that phase's replies. For each phase the engine does::

    requests = aggregator.configure(phase, server_round, clients)  # {client: arrays}
    # on each client, in order, restoring and saving its local state around it:
    trainer.load_local_state(state)           # if it has run any phase before
    reply = trainer.run_phase(phase, arrays)  # -> PhaseReply(arrays, signature, metrics)
    aggregator.step(phase, server_round, {client: ClientUpdate})

``when="before-first-round"`` phases run once, before round 1 (as round 0), on every
client; ``"every-round"`` phases run each round, in declaration order, on the round's
sampled clients, except in rounds where ``aggregator.runs_phase(phase, server_round)``
says the phase has nothing to do (a finished stage: no message is sent). The ``train``
phase is special in three ways: it is always last, its request is the client's
personalized payload from the last aggregation (the initial model before), and its
client handler is the standard one::

    trainer.load_payload(payload)             # the server's personalized arrays
    metrics = trainer.train(local_epochs) | trainer.evaluate()
    reply = trainer.upload(), trainer.signature(), metrics

whose metrics are the round's record (the evaluation protocols read them) and
whose uploads are checked against the initial model's schema before ``aggregate``.
Other phases' replies are checked for finiteness and size only; their
server step keeps what it needs in the aggregator (and its ``state_dict`` for resume).
Flower carries phase ``p`` as message type ``train.<p>`` (``train`` for the train
phase): a ClientApp action, so Flower's own routing picks the handler.

Privacy invariant: nothing a client sends in any phase may scale with its node count
(no embeddings, scores or per-node values), except where a baseline's own published
design does so: the trainer names those arrays in ``per_node_arrays`` (with the paper's
reason in its docstring), and ``tests/test_privacy_and_replies.py`` allows that only for
those, and only where README's algorithm table discloses it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch_geometric.data import Data

from .options import ConfigError, Options

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Phase:
    """One exchange of a round (module docstring: the round-phase contract)."""

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


@dataclass
class MixingPlan:
    """The train phase's mixing, as weights only: what ``aggregate`` computes, given
    before any weight is seen (``secure-aggregation=ckks`` applies it to ciphertexts).

    Client ``client_ids[i]`` receives, for every float array ``name`` it uploaded,
    ``Σ_j matrices[g, i, j] · (client_ids[j]'s name)`` where ``g = groups.get(name, 0)``:
    one matrix for the whole array, or an int array of the array's shape picking a
    matrix per element (FedIIH's factor blocks). ``clear[c]`` are arrays sent to client
    ``c`` beside its mixture, computed from signatures only (FedIIH's prior α̃).
    ``diagnostics`` and ``metrics`` as in :class:`AggregateResult`.
    """

    client_ids: list[int]  # rows and columns of every matrix, sorted
    matrices: np.ndarray  # [G, K, K] float64, each row sums to 1
    groups: dict[str, int | np.ndarray] = field(default_factory=dict)
    clear: dict[int, Arrays] = field(default_factory=dict)
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def group_of(self, name: str) -> int | np.ndarray:
        """The matrix index of array ``name``: an int, or an int array of its shape."""
        return self.groups.get(name, 0)


class ClientTrainer(ABC):
    """Client side of an algorithm: local model(s), local training, evaluation.

    ``self.config`` is the typed :class:`~fedgraph_flwr.config.ClientConfig` (common keys
    such as ``hidden``, ``lr``; this round's facts); ``self.options`` its algorithm's
    options (``options_class``, the class the algorithm is registered with).
    """

    options_class: ClassVar[type[Options]] = Options

    #: The round, as phases (module docstring); most algorithms need only ``train``.
    phases: tuple[Phase, ...] = (TRAIN_PHASE,)

    #: Names of the arrays (any phase's upload or signature) whose size follows the
    #: client's node count *by the method's own published design* (the privacy
    #: invariant's exemption, module docstring). Empty for every method of ours.
    per_node_arrays: ClassVar[frozenset[str]] = frozenset()

    #: Whether the trainer allocates dense [n, n] matrices (n: the client's nodes) by the
    #: method's own published design: the memory rule's named exemption, with a size guard.
    #: False for every method but FGGP.
    dense_nodes: ClassVar[bool] = False

    #: Whether the trainer reads the client's 1-hop halo (``data.halo_global_id``,
    #: ``data.halo_edge_index``: global ids of other clients' nodes); other trainers' data
    #: comes without it.
    reads_halo: ClassVar[bool] = False

    def __init__(
        self, data: Data, config: ClientConfig, num_classes: int, device: torch.device
    ) -> None:
        self.options = _own_options(type(self), config.options)
        self.data = data.to(device)
        self.config = config
        self.num_classes = num_classes
        self.device = device

    @classmethod
    @abstractmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """The global initial model the server broadcasts in round 1.

        Must equal ``upload()`` of a freshly built trainer under the same seed.
        """

    @abstractmethod
    def load_payload(self, arrays: Arrays) -> None:
        """Apply the server's arrays for this client (local-only keys are skipped)."""

    @abstractmethod
    def train(self, epochs: int) -> dict[str, float]:
        """Run local training; return at least ``{"train_loss": float}``."""

    @abstractmethod
    def evaluate(self) -> dict[str, float]:
        """Score the current model: ``val_loss``, ``val_metric``, ``test_metric`` (+ extras)."""

    @abstractmethod
    def upload(self) -> Arrays:
        """Parameters sent to the server (may be empty, e.g. Local)."""

    def signature(self) -> Arrays:
        """Compact per-client summary sent as metrics (size independent of node count)."""
        return {}

    @classmethod
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfig
                         ) -> dict[str, tuple[int, ...]]:
        """The names and shapes of :meth:`signature`'s arrays under ``config``: the server
        holds every train reply's signature to exactly these (engine/replies.py), never
        to what some client sent first. A trainer that overrides :meth:`signature`
        declares it here (a test compares the two for every registered algorithm)."""
        return {}

    def run_phase(self, phase: Phase, arrays: Arrays) -> PhaseReply:
        """Handle a non-train phase's request (``arrays`` from ``Aggregator.configure``)."""
        raise NotImplementedError(f"{type(self).__name__} declares no phase {phase.name!r}")

    @abstractmethod
    def local_state(self) -> dict[str, Any]:
        """What persists between rounds on this client (torch-saveable tensors/dicts)."""

    @abstractmethod
    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""

    def release(self) -> None:
        """Called once the caller is done with this trainer (its state saved): what it
        held may serve the next trainer restored in this process."""
        return None  # nothing to hand on by default


class Aggregator(ABC):
    """Server side of an algorithm: turns client updates into personalized payloads.

    ``self.config``: the typed :class:`~fedgraph_flwr.config.RunConfig`; ``self.options``
    its algorithm's options, as in :class:`ClientTrainer`.
    """

    options_class: ClassVar[type[Options]] = Options

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        self.options = _own_options(type(self), config.options)
        self.config = config
        self.client_ids = list(client_ids)
        self.initial = initial

    @abstractmethod
    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """The train phase's step: combine this round's updates (keyed by logical client id)."""

    def mixing_plan(self, server_round: int, updates: dict[int, ClientUpdate]) -> MixingPlan:
        """The weights ``aggregate`` mixes with, from signatures and ``num_train`` only
        (never ``update.arrays``, which are ciphertexts under ``secure-aggregation=ckks``).
        Only methods whose payloads are such mixtures define it."""
        raise NotImplementedError(f"{type(self).__name__} has no mixing plan")

    def clear_mixing_plan(self, server_round: int, updates: dict[int, ClientUpdate]) -> MixingPlan:
        """The weights ``aggregate`` mixes with when the uploads are in the clear (robust
        aggregation combines each row robustly, engine/robust.py). The same as
        :meth:`mixing_plan` unless ``aggregate`` reads its weights from the uploads
        (FedAux's APV, FED-PUB's functional embedding)."""
        return self.mixing_plan(server_round, updates)

    @classmethod
    def has_mixing_plan(cls) -> bool:
        """Whether :meth:`mixing_plan` describes this class's own ``aggregate``: defined
        by the class that defines ``aggregate``, or by one below it (a subclass that
        overrides ``aggregate`` alone keeps no plan)."""
        def owner(attr: str) -> type:
            return next(k for k in cls.__mro__ if attr in vars(k))
        plan_owner = owner("mixing_plan")
        return plan_owner is not Aggregator and issubclass(plan_owner, owner("aggregate"))

    def runs_phase(self, phase: Phase, server_round: int) -> bool:
        """Whether the every-round, non-train ``phase`` is exchanged in ``server_round``.
        An algorithm whose phase is a no-op in some rounds (a stage that is over) says so
        here, and the engine sends no message for it: a round trip to every client saved."""
        return True

    def configure(self, phase: Phase, server_round: int, clients: list[int]) -> dict[int, Arrays]:
        """A non-train phase's request to each of ``clients`` (default: nothing)."""
        return {c: {} for c in clients}

    def step(self, phase: Phase, server_round: int, updates: dict[int, ClientUpdate]
             ) -> AggregateResult | None:
        """A non-train phase's server step over its valid replies; keep what the next
        phase needs in ``self`` (and in :meth:`state_dict`). Metrics and diagnostics of
        the result are recorded with the round; its payloads are ignored."""
        return None

    @property
    def mix_dtype(self) -> np.dtype:
        """dtype of personalized mixing (``server-mix-dtype``); weights are float64 either way."""
        return np.dtype(self.config.server_mix_dtype)

    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the payloads, for checkpoint/resume."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore :meth:`state_dict`."""


def _own_options(part: type[ClientTrainer] | type[Aggregator], options: Options) -> Options:
    """``options`` if they are ``part``'s own kind (a trainer or aggregator reused by another
    algorithm, as FedProx's server is FedAvg's, takes that algorithm's options)."""
    if isinstance(options, part.options_class):
        return options
    raise ConfigError(f"{part.__name__} takes {part.options_class.__name__}, "
                      f"not {type(options).__name__}")
