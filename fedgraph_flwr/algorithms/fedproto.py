"""FedProto (Tan et al., AAAI 2022): federated prototype learning; clients share class prototypes, not models.

Each client keeps its whole GCN. Per class c it computes a prototype, the mean
representation z of its training nodes of class c, and sends the [C, hidden] matrix
(a zero row for a class it has no training node of). The server averages each class's
prototypes over the clients into global prototypes p̄_c and sends them back; a client
then trains on ``CE + λ · MSE(z_i, p̄_{y_i})`` over its training nodes. In the first
round there are no global prototypes and the loss is the cross-entropy alone. z is the
GCN's last hidden layer. Evaluation scores each client's own model.

Leaves the client each round: ``prototypes`` [C, hidden], one mean vector per class
over its training nodes: nothing per node (a class with one training node is that
node's representation; the mean is over whatever the client has).

Official code: yuetan031/FedProto @ 97e42e2 (``lib/update.py`` ``update_weights_het``,
``lib/utils.py`` ``agg_func`` / ``proto_aggregation``; ``--ld 1``). Also read: OpenFGL's
``flcore/fedproto`` (openfgl-lib 1.1.0). ``fedproto-flavour`` picks between them:

- ``official`` (default): z is the hidden layer after ReLU and before dropout (the
  official CNNs return ``x1 = relu(fc1(x))``); a client's prototypes are the class
  means of z from its last local epoch's forward pass (train mode); the server's p̄_c is
  the unweighted mean over the clients that have class c; the regulariser is the MSE
  over all training nodes and dimensions (a node whose class has no global prototype
  adds 0).
- ``openfgl``: z is the hidden layer after dropout (in training); prototypes are the class
  means of z in eval mode after training; the server's p̄_c is the sample-weighted sum
  over all clients, zero rows included (training nodes here; OpenFGL weights by node
  count); the regulariser is Σ_c MSE over class c's training nodes.

A class counts as present at a client when its row is not all zero (so under ``dp=client``,
whose noise makes every row non-zero, ``official`` averages over all clients).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.gcn import GCN
from .base import Aggregator
from .supervised import SupervisedTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig

PROTOTYPES_KEY = "prototypes"
FLAVOURS = ("official", "openfgl")


# `fedproto-reproduce`: the profiles, the default first (docs/methods/fedproto.md).
PUBLISHED = (
    "`openfgl` is the one compared with OpenFGL on its Cora METIS-10 files (this page); "
    "configs/paper/openfgl-side-by-side-cora.yaml runs `official` beside it."
)
PROFILES: dict[str, dict[str, Any]] = {
    "official": {"flavour": "official"},
    "openfgl": {"flavour": "openfgl"},
}


@dataclass(frozen=True)
class FedProtoOptions(Options, prefix="fedproto", profiles=PROFILES, published=PUBLISHED):
    """FedProto's knobs (``fedproto-*``)."""

    weight: float = option(1.0, "weight λ of the prototype regulariser (official --ld)", low=0.0)
    flavour: str = option("official", "official (yuetan031/FedProto) | openfgl (OpenFGL's "
                          "flcore/fedproto): see the module docstring", choices=FLAVOURS)


def class_means(z: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Row c: the mean of z's rows labelled c, or 0 where none; z [n, d] -> [C, d]."""
    sums = torch.zeros(num_classes, z.size(1), dtype=z.dtype, device=z.device)
    sums.index_add_(0, labels, z)
    counts = torch.bincount(labels, minlength=num_classes).to(z.dtype)
    return sums / counts.clamp(min=1).unsqueeze(1)


def aggregate_prototypes(prototypes: np.ndarray, weights: np.ndarray, flavour: str) -> np.ndarray:
    """Global prototypes [C, d] from the clients' [K, C, d].

    ``official``: per class the unweighted mean over the clients whose row is non-zero
    (a zero row where no client has the class); ``openfgl``: Σ_k w_k · row_k, w summing to 1.
    """
    prototypes = np.asarray(prototypes, np.float64)
    if flavour == "openfgl":
        return np.tensordot(np.asarray(weights, np.float64), prototypes, axes=1)
    present = np.abs(prototypes).sum(-1) > 0  # [K, C]
    counts = present.sum(0)  # [C]
    sums = (prototypes * present[..., None]).sum(0)
    return sums / np.maximum(counts, 1)[:, None]


class FedProtoTrainer(SupervisedTrainer):
    """A personal GCN trained with CE + λ·(distance to the global class prototypes)."""

    options_class: ClassVar[type[Options]] = FedProtoOptions
    options: FedProtoOptions
    model: GCN

    # The flavour's three client choices (module docstring); FedTGP's client reuses them
    # (its options carry the same ``flavour`` and ``weight``).
    @property
    def z_after_dropout(self) -> bool:
        """Whether z is read after dropout (OpenFGL) or before (the official code)."""
        return self.options.flavour == "openfgl"

    @property
    def prototypes_after_training(self) -> bool:
        """Whether prototypes come from an eval-mode pass after training."""
        return self.options.flavour == "openfgl"

    @property
    def class_sum_loss(self) -> bool:
        """Whether the regulariser sums per-class MSEs (OpenFGL) or averages over nodes."""
        return self.options.flavour == "openfgl"

    def __init__(self, data: Any, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        hidden = config.hidden
        self.global_prototypes = torch.zeros(num_classes, hidden, device=device)
        self.local_prototypes = torch.zeros(num_classes, hidden, device=device)

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """A GCN of ``num-layers`` (>= 2: z is its last hidden layer)."""
        if config.num_layers < 2:
            raise ValueError("fedproto: num-layers must be >= 2 (z is the last hidden layer)")
        return GCN(num_features, config.hidden, num_classes, num_layers=config.num_layers,
                   dropout=config.dropout)

    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """No model is shared: the zero prototypes a fresh client has."""
        return {PROTOTYPES_KEY: np.zeros((num_classes, config.hidden), np.float32)}

    def hidden(self, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(z before dropout, z after dropout) of the last hidden layer, each [n, hidden]."""
        x, edge_index = self.data.x, self.message_graph()
        convs = self.model.convs
        dropped = x
        for conv in convs[:-1]:
            x = F.relu(conv(dropped, edge_index))
            dropped = F.dropout(x, p=self.model.dropout, training=training)
        return x, dropped

    def load_payload(self, arrays: Arrays) -> None:
        """The global prototypes (the model stays the client's own)."""
        self.global_prototypes = torch.as_tensor(
            np.asarray(arrays[PROTOTYPES_KEY]), dtype=torch.float32, device=self.device).clone()

    def prototype_loss(self, z: torch.Tensor) -> torch.Tensor:
        """The regulariser over the training nodes (0 while no global prototype exists)."""
        data = self.data
        mask = data.train_mask
        z_train, y_train = z[mask], data.y[mask]
        targets = self.global_prototypes[y_train]  # [n_train, d]
        if self.class_sum_loss:
            return sum((F.mse_loss(z_train[y_train == c], targets[y_train == c])
                        for c in torch.unique(y_train).tolist()), torch.zeros((), device=z.device))
        has_target = self.global_prototypes.abs().sum(1)[y_train] > 0
        # Nodes without a global prototype are their own target (diff 0) but still counted.
        targets = torch.where(has_target[:, None], targets, z_train.detach())
        return F.mse_loss(z_train, targets)

    def train(self, epochs: int) -> dict[str, float]:
        """Full-batch Adam on CE + λ·prototype loss; then this round's local prototypes."""
        data = self.data
        lam = self.options.weight
        regularise = bool(self.global_prototypes.abs().sum() > 0) and lam > 0
        self.model.train()
        loss_value, proto_value = float("nan"), 0.0
        z = None
        for _ in range(epochs):
            self.optimizer.zero_grad()
            z, dropped = self.hidden(training=True)
            logits = self.model.convs[-1](dropped, self.message_graph())
            loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            if regularise:
                proto = self.prototype_loss(dropped if self.z_after_dropout else z)
                loss = loss + lam * proto
                proto_value = float(proto.detach())
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.detach())
        with torch.no_grad():
            if self.prototypes_after_training or z is None:
                self.model.eval()
                z, _ = self.hidden(training=False)
            mask = data.train_mask
            self.local_prototypes = class_means(z.detach()[mask], data.y[mask], self.num_classes)
        return {"train_loss": loss_value, "prototype_loss": proto_value}

    def upload(self) -> Arrays:
        """The [C, hidden] class prototypes."""
        return {PROTOTYPES_KEY: self.local_prototypes.cpu().numpy().astype(np.float32)}

    def local_state(self) -> dict[str, Any]:
        """The base state plus the prototypes."""
        return {**super().local_state(), "global_prototypes": self.global_prototypes,
                "local_prototypes": self.local_prototypes}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.global_prototypes = state["global_prototypes"].to(self.device)
        self.local_prototypes = state["local_prototypes"].to(self.device)


class FedProtoAggregator(Aggregator):
    """Global class prototypes from the clients' (see :func:`aggregate_prototypes`)."""

    options_class = FedProtoOptions
    options: FedProtoOptions

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """One prototype matrix for every client."""
        ids = sorted(updates)
        weights = np.array([updates[c].num_train for c in ids], np.float64)
        weights = weights / weights.sum()
        prototypes = np.stack([updates[c].arrays[PROTOTYPES_KEY] for c in ids])
        global_prototypes = aggregate_prototypes(prototypes, weights, self.options.flavour)
        payload = {PROTOTYPES_KEY: global_prototypes.astype(np.float32)}
        return AggregateResult(payloads={c: payload for c in self.client_ids},
                               metrics={"prototype-norm": float(np.linalg.norm(global_prototypes))})


ALGORITHM = Algorithm("fedproto", FedProtoTrainer, FedProtoAggregator, FedProtoOptions)
