"""The contract between the engine and an algorithm.

An algorithm is a :class:`ClientTrainer` (runs where the data lives; plain torch)
plus an :class:`Aggregator` (runs on the server; plain numpy/torch) plus its typed
options, registered by name in :mod:`.registry`. Neither touches Flower: only
:mod:`fedgraph_flwr.engine` converts these objects to and from messages. A method
subclasses them as ``fedgraph_flwr.algorithms.base`` binds them to the typed run
configuration (``ClientTrainer[ClientConfig]``, ``Aggregator[RunConfig]``): the
configuration sits above this package, so here it is a type parameter.

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
Other phases' replies are held to what the trainer declares for them
(``ClientTrainer.phase_reply_spec``, from the request the server sent that client):
exactly those arrays, each of its shape, dtype and range, finite, and the numbers its
step reads, each in range; their
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

import contextlib
import contextvars
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from .mixing import MixingPlan
from .options import ConfigError, Options
from .phases import (
    TRAIN_PHASE,
    AggregateResult,
    Arrays,
    ClientUpdate,
    Phase,
    PhaseReply,
    ReplySpec,
)

if TYPE_CHECKING:  # type-only: the engine loads this module without torch or PyG
    import torch
    from torch_geometric.data import Data


class TrainerConfig(Protocol):
    """What the bases read of a client's config (``fedgraph_flwr.config.ClientConfig``)."""

    @property
    def options(self) -> Options:
        """The method's typed options."""
        ...


class AggregatorConfig(TrainerConfig, Protocol):
    """What the bases read of the server's config (``fedgraph_flwr.config.RunConfig``)."""

    @property
    def server_mix_dtype(self) -> str:
        """``server-mix-dtype``: the dtype of personalized mixing."""
        ...


ClientConfigT = TypeVar("ClientConfigT", bound=TrainerConfig)
RunConfigT = TypeVar("RunConfigT", bound=AggregatorConfig)

# Set while a trainer is built only to receive a saved state (:func:`state_follows`).
_STATE_FOLLOWS = contextvars.ContextVar("fedgraph_state_follows", default=False)


@contextlib.contextmanager
def state_follows() -> Iterator[None]:
    """Within: the trainers built are about to receive a saved state (the engine restoring
    a client's trainer), so their model's random initial values would be overwritten at
    once; trainers that allow it allocate the model uninitialised instead."""
    token = _STATE_FOLLOWS.set(True)
    try:
        yield
    finally:
        _STATE_FOLLOWS.reset(token)


def state_will_follow() -> bool:
    """Whether a trainer built now is about to receive a saved state (:func:`state_follows`)."""
    return _STATE_FOLLOWS.get()


class ClientTrainer(ABC, Generic[ClientConfigT]):
    """Client side of an algorithm: local model(s), local training, evaluation.

    ``self.config`` is the typed client config, ``ClientConfigT``
    (:class:`~fedgraph_flwr.config.ClientConfig`: common keys such as ``hidden``, ``lr``;
    this round's facts); ``self.options`` its algorithm's options (``options_class``, the
    class the algorithm is registered with).
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
        self, data: Data, config: ClientConfigT, num_classes: int, device: torch.device
    ) -> None:
        self.options = _own_options(type(self), config.options)
        self.data = data.to(device)
        self.config = config
        self.num_classes = num_classes
        self.device = device

    @classmethod
    @abstractmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfigT) -> Arrays:
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
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfigT
                         ) -> dict[str, tuple[int, ...]]:
        """The names and shapes of :meth:`signature`'s arrays under ``config``: the server
        holds every train reply's signature to exactly these (engine/replies.py), never
        to what some client sent first. A trainer that overrides :meth:`signature`
        declares it here (a test compares the two for every registered algorithm)."""
        return {}

    @classmethod
    def phase_reply_spec(cls, phase: Phase, request: Arrays, num_features: int,
                         num_classes: int, config: ClientConfigT) -> ReplySpec:
        """What a reply to the non-train ``phase`` carries, given ``request`` (what the server
        sent that client) and ``config`` (the round's): the server rejects any other layout
        before its step (engine/replies.py), so no client can end a run by a reply's
        shape. A trainer whose phase replies carry arrays, or numbers its aggregator reads,
        declares them here (a test holds every registered algorithm's real replies to it)."""
        return ReplySpec()

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


class Aggregator(ABC, Generic[RunConfigT]):
    """Server side of an algorithm: turns client updates into personalized payloads.

    ``self.config``: the typed run config, ``RunConfigT``
    (:class:`~fedgraph_flwr.config.RunConfig`); ``self.options`` its algorithm's options,
    as in :class:`ClientTrainer`.
    """

    options_class: ClassVar[type[Options]] = Options

    def __init__(self, config: RunConfigT, client_ids: list[int], initial: Arrays) -> None:
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
