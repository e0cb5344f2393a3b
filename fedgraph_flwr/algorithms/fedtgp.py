"""FedTGP (Zhang et al., AAAI 2024): trainable global prototypes with an adaptive-margin contrastive loss.

The clients are FedProto's (each keeps its own GCN, sends per-class prototypes, trains
on CE + λ·MSE(z_i, p̄_{y_i})). The server, instead of averaging prototypes, trains a
small network TGP (a class embedding, Linear → ReLU → Linear) whose outputs P_c are the
global prototypes: on the round's uploaded prototypes (p, y) it minimises
``CE(−(‖p − P‖ + m·onehot(y)), y)``, with the margin m = min(max_c gap_c, threshold),
gap_c the distance from class c's mean prototype to the nearest other class's. TGP
persists across rounds.

Leaves the client each round: ``prototypes`` [C, hidden], one mean vector per class over
its training nodes (a zero row for a class it lacks): nothing per node.

Official code: TsingZ0/FedTGP @ c77cbbb (``system/flcore/servers/servertgp.py``,
``clients/clienttgp.py``; ``--lamda 1 --margin_threthold 100 --server_epochs 1000``,
server SGD at the clients' learning rate, batches of 10 prototypes). Also read: OpenFGL's
``flcore/fedtgp`` (openfgl-lib 1.1.0). ``fedtgp-flavour``:

- ``official`` (default): the client reads z before dropout, takes its prototypes in eval
  mode after training and sends only the classes it has; the regulariser is FedProto's
  mean over training nodes; the server's gaps come from per-class means over the clients
  that have the class; TGP trains ``fedtgp-server-epochs`` epochs of SGD (lr = ``lr``) on
  shuffled batches of ``fedtgp-server-batch`` prototypes; clients predict by the nearest
  global prototype (squared distance), as the official ``test_metrics``, and with their
  head in round 1, before any global prototype exists (where the official code scores 0).
- ``openfgl``: OpenFGL's FedProto client (z after dropout, zero rows sent and trained on);
  the server trains 10 full-batch Adam epochs (lr 0.01, the run's weight decay) with a
  persisting optimizer, and its gaps come from class means divided by every class's
  count in turn (its ``avg_proto /= ...`` loop, kept as the code runs); clients predict
  with their GCN's head.

``fedtgp-predict`` overrides the flavour's prediction rule alone (``prototype``: the
nearest global prototype; ``head``: the GCN's head), to separate its effect from the rest
of the flavour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from .base import Aggregator
from .fedproto import PROTOTYPES_KEY, FedProtoTrainer
from .supervised import evaluation_metrics

if TYPE_CHECKING:
    from ..config import RunConfig

FLAVOURS = ("official", "openfgl")
PREDICTIONS = ("auto", "prototype", "head")
OPENFGL_SERVER_EPOCHS, OPENFGL_SERVER_LR = 10, 0.01


# `fedtgp-reproduce`: the profiles, the default first (docs/methods/fedtgp.md).
PUBLISHED = (
    "`openfgl` is the one compared with OpenFGL on its Cora METIS-10 files (this page)."
)
PROFILES: dict[str, dict[str, Any]] = {
    "official": {"flavour": "official"},
    "openfgl": {"flavour": "openfgl"},
}


@dataclass(frozen=True)
class FedTGPOptions(Options, prefix="fedtgp", profiles=PROFILES, published=PUBLISHED):
    """FedTGP's knobs (``fedtgp-*``), the official code's defaults."""

    weight: float = option(1.0, "weight λ of the prototype regulariser (official --lamda)", low=0.0)
    margin_threshold: float = option(100.0, "upper bound of the adaptive margin", low=0.0)
    server_epochs: int = option(1000, "official flavour: TGP's epochs per round", low=1)
    server_batch: int = option(10, "official flavour: prototypes per TGP batch", low=1)
    flavour: str = option("official", "official (TsingZ0/FedTGP) | openfgl (OpenFGL's "
                          "flcore/fedtgp): see the module docstring", choices=FLAVOURS)
    predict: str = option("auto", "the clients' prediction: auto (the flavour's) | prototype "
                          "(nearest global prototype, official) | head (the GCN's head, OpenFGL)",
                          choices=PREDICTIONS)


class TrainableGlobalPrototypes(nn.Module):
    """Class id -> prototype: an embedding, then Linear → ReLU → Linear (all of width d).

    class_ids [B] (int) -> [B, d].
    """

    def __init__(self, num_classes: int, dim: int) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(num_classes, dim)
        self.middle = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        self.fc = nn.Linear(dim, dim)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for module in self.modules():
            if isinstance(module, (nn.Embedding, nn.Linear)):
                module.reset_parameters()

    def forward(self, class_ids: torch.Tensor) -> torch.Tensor:
        """The prototypes of ``class_ids``."""
        return self.fc(self.middle(self.embeddings(class_ids)))


def margin_loss(prototypes: torch.Tensor, labels: torch.Tensor, centres: torch.Tensor,
                margin: float) -> torch.Tensor:
    """CE(−(dist + margin·onehot), y): prototypes [B, d], labels [B], centres [C, d]."""
    dist = torch.cdist(prototypes, centres)  # [B, C] Euclidean
    dist = dist + margin * F.one_hot(labels, centres.size(0)).to(dist.dtype)
    return F.cross_entropy(-dist, labels)


def class_gaps(means: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """gap_c: distance from class c's mean to the nearest other present class's; classes
    with no other present class get the smallest gap. means [C, d], present [C] -> [C]."""
    dist = torch.cdist(means, means)
    valid = present[:, None] & present[None, :] & ~torch.eye(len(means), dtype=torch.bool)
    gap = torch.where(valid, dist, torch.full_like(dist, float("inf"))).min(1).values
    finite = torch.isfinite(gap)
    return torch.where(finite, gap, gap[finite].min() if finite.any() else torch.zeros(()))


class FedTGPTrainer(FedProtoTrainer):
    """FedProto's client under FedTGP's flavours; predicts by the nearest prototype (official)."""

    options_class = FedTGPOptions
    options: FedTGPOptions  # type: ignore[assignment]

    # z's place and the regulariser follow the flavour as in FedProto (same option names);
    # only the prototypes' timing differs from official FedProto.
    @property
    def prototypes_after_training(self) -> bool:
        """Both codes take the prototypes in an eval-mode pass after training."""
        return True

    def prediction_rule(self) -> str:
        """``prototype`` or ``head``: ``fedtgp-predict``, or under ``auto`` the flavour's."""
        if self.options.predict != "auto":
            return self.options.predict
        return "head" if self.options.flavour == "openfgl" else "prototype"

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """prototype: −‖z − P_c‖² as the logits (nearest global prototype); head: the GCN's."""
        if self.prediction_rule() == "head" or not bool(self.global_prototypes.abs().sum() > 0):
            return super().evaluate()
        self.model.eval()
        z, _ = self.hidden(training=False)
        logits = -torch.cdist(z, self.global_prototypes).pow(2)
        return evaluation_metrics(logits, self.data, self.metric)


class FedTGPAggregator(Aggregator):
    """Trains TGP on the round's prototypes; its outputs are every client's global prototypes."""

    options_class = FedTGPOptions
    options: FedTGPOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        num_classes, dim = initial[PROTOTYPES_KEY].shape
        self.num_classes = num_classes
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.tgp = TrainableGlobalPrototypes(num_classes, dim)
        # OpenFGL keeps one Adam for the run; the official code makes a fresh SGD per round.
        self.adam = torch.optim.Adam(self.tgp.parameters(), lr=OPENFGL_SERVER_LR,
                                     weight_decay=config.weight_decay)

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Margin from the class gaps, TGP trained on the prototypes, P_c sent to all."""
        ids = sorted(updates)
        uploads = torch.as_tensor(np.stack([updates[c].arrays[PROTOTYPES_KEY] for c in ids]),
                                  dtype=torch.float32)  # [K, C, d]
        present = uploads.abs().sum(-1) > 0  # [K, C]
        labels = torch.arange(self.num_classes).expand(len(ids), -1)
        official = self.options.flavour == "official"
        if official:  # only the classes each client has
            prototypes, y = uploads[present], labels[present]
            counts = present.sum(0)
            means = (uploads * present[..., None]).sum(0) / counts.clamp(min=1)[:, None]
            gaps = class_gaps(means, counts > 0)
        else:  # every row, zero rows included; OpenFGL's class means as its loop leaves them
            prototypes, y = uploads.reshape(-1, uploads.size(-1)), labels.reshape(-1)
            means = uploads.sum(0)
            for _ in range(self.num_classes):
                means = means / len(ids)  # y_list.count(c) = K for every class
            gaps = class_gaps(means, torch.ones(self.num_classes, dtype=torch.bool))
        margin = min(float(gaps.max()), self.options.margin_threshold)
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + server_round)
        self.tgp.train()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # thousands of [10, d] steps: more threads only add overhead
        try:
            loss = self._train_tgp(prototypes, y, margin, generator)
        finally:
            torch.set_num_threads(threads)
        self.tgp.eval()
        with torch.no_grad():
            global_prototypes = self.tgp(torch.arange(self.num_classes)).numpy().astype(np.float32)
        payload = {PROTOTYPES_KEY: global_prototypes}
        return AggregateResult(payloads={c: payload for c in self.client_ids},
                               metrics={"tgp-loss": float(loss.detach()), "margin": margin})

    def _train_tgp(self, prototypes: torch.Tensor, y: torch.Tensor, margin: float,
                   generator: torch.Generator) -> torch.Tensor:
        """One round of TGP training (the flavour's optimiser and schedule); the last loss."""
        class_ids = torch.arange(self.num_classes)
        loss = torch.zeros(())
        if self.options.flavour == "official":
            sgd = torch.optim.SGD(self.tgp.parameters(), lr=self.config.lr)
            batch = self.options.server_batch
            for _ in range(self.options.server_epochs):
                order = torch.randperm(len(y), generator=generator)
                for start in range(0, len(y), batch):
                    rows = order[start:start + batch]
                    loss = margin_loss(prototypes[rows], y[rows], self.tgp(class_ids), margin)
                    sgd.zero_grad()
                    loss.backward()
                    sgd.step()
        else:
            for _ in range(OPENFGL_SERVER_EPOCHS):
                self.adam.zero_grad()
                loss = margin_loss(prototypes, y, self.tgp(class_ids), margin)
                loss.backward()
                self.adam.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        """TGP and OpenFGL's persisting Adam."""
        return {"tgp": self.tgp.state_dict(), "adam": self.adam.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.tgp.load_state_dict(state["tgp"])
        self.adam.load_state_dict(state["adam"])


ALGORITHM = Algorithm("fedtgp", FedTGPTrainer, FedTGPAggregator, FedTGPOptions)
