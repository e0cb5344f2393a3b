"""The contract between the strategy engine and an algorithm.

An algorithm is a :class:`ClientTrainer` (runs where the data lives; plain torch)
plus an :class:`Aggregator` (runs on the server; plain numpy/torch), registered
by name in :mod:`fedgraph_flwr.algorithms.registry`. Neither touches Flower:
only :mod:`fedgraph_flwr.engine` converts these objects to and from records.

One client round, as the engine drives it::

    trainer = Trainer(data, config, num_classes, device)   # under the model seed
    trainer.load_local_state(state)      # if the client has trained before
    trainer.load_payload(payload)        # the server's personalized arrays
    metrics = trainer.train(local_epochs) | trainer.evaluate()
    reply = trainer.upload(), trainer.signature(), metrics
    state = trainer.local_state()        # persisted until the next round

Privacy invariant: nothing in ``upload()`` or ``signature()`` may scale with the
client's node count (no embeddings, scores or per-node values).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch_geometric.data import Data

from .options import Options

Arrays = dict[str, np.ndarray]
Config = dict[str, Any]


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


class ClientTrainer(ABC):
    """Client side of an algorithm: local model(s), local training, evaluation.

    ``self.options`` holds the algorithm's own keys of ``config``, typed and validated
    (``options_class``, the class the algorithm is registered with); the common keys
    (``hidden``, ``lr``, ...) are read from ``self.config``.
    """

    options_class: ClassVar[type[Options]] = Options

    def __init__(
        self, data: Data, config: Config, num_classes: int, device: torch.device
    ) -> None:
        self.options = self.options_class.from_config(config)
        self.data = data.to(device)
        self.config = config
        self.num_classes = num_classes
        self.device = device

    @classmethod
    @abstractmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: Config) -> Arrays:
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

    @abstractmethod
    def local_state(self) -> dict[str, Any]:
        """What persists between rounds on this client (torch-saveable tensors/dicts)."""

    @abstractmethod
    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""


class Aggregator(ABC):
    """Server side of an algorithm: turns client updates into personalized payloads.

    ``self.options``: the algorithm's typed options, as in :class:`ClientTrainer`.
    """

    options_class: ClassVar[type[Options]] = Options

    def __init__(self, config: Config, client_ids: list[int], initial: Arrays) -> None:
        self.options = self.options_class.from_config(config)
        self.config = config
        self.client_ids = list(client_ids)
        self.initial = initial

    @abstractmethod
    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Combine this round's updates (keyed by logical client id)."""

    @property
    def mix_dtype(self) -> np.dtype:
        """dtype of personalized mixing (``server-mix-dtype``); weights are float64 either way."""
        return np.dtype(str(self.config.get("server-mix-dtype", "float64")))

    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the payloads, for checkpoint/resume."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
