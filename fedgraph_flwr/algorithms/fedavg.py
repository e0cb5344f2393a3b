"""FedAvg (McMahan et al. 2017) with a plain GCN: one global model for everyone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from numpy.typing import DTypeLike
from torch import nn

from ..core.mixing import MixingPlan, average
from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.gcn import GCN
from ..nn.personal_gnn import PersonalGNN
from .base import Aggregator
from .supervised import SupervisedTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig

WEIGHTINGS = ("train", "uniform")


@dataclass(frozen=True)
class FedAvgOptions(Options, prefix="fedavg"):
    """FedAvg's knob (``fedavg-*``)."""

    weighting: str = option("train", "client weights: train (∝ training nodes) | uniform (1/K)",
                            choices=WEIGHTINGS)


class GCNTrainer(SupervisedTrainer):
    """A plain GNN trained with cross-entropy; the whole model is shared.

    ``gnn`` picks the backbone: gcn (default), or sgc / sage as in FedSpray's table,
    where Local and FedAvg run on each of FedSpray's personalized backbones.
    """

    options_class: ClassVar[type[Options]] = FedAvgOptions  # subclasses bring their own

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """The ``gnn`` backbone (gcn, sgc or sage) as a PersonalGNN."""
        backbone = config.gnn
        if backbone == "gcn":
            return GCN(num_features, config.hidden, num_classes,
                       num_layers=config.num_layers, dropout=config.dropout)
        return PersonalGNN(num_features, config.hidden, num_classes, backbone=backbone,
                           num_layers=config.num_layers, dropout=config.dropout)


def client_weights(updates: dict[int, ClientUpdate], weighting: str) -> np.ndarray:
    """w [K] over ``sorted(updates)``, summing to 1: ∝ training nodes, or 1/K."""
    ids = sorted(updates)
    if weighting == "train":
        w = np.array([updates[c].num_train for c in ids], dtype=np.float64)
    elif weighting == "uniform":
        w = np.ones(len(ids))
    else:
        raise ValueError(f"unknown fedavg-weighting {weighting!r}; valid: train, uniform")
    return w / w.sum()


def weighted_average(updates: dict[int, ClientUpdate], weighting: str,
                     dtype: DTypeLike = np.float64) -> Arrays:
    """The global model: every uploaded float array averaged over clients, by train-node
    count or uniformly, in ``dtype``; non-float arrays stay with each client."""
    ids = sorted(updates)
    return average(client_weights(updates, weighting), [updates[c].arrays for c in ids], dtype)


class FedAvgAggregator(Aggregator):
    """θ = Σ_k w_k θ_k with w_k ∝ training nodes (``fedavg-weighting=train``) or 1/K."""

    options_class: ClassVar[type[Options]] = FedAvgOptions  # subclasses bring their own

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """One weighted average of the updates, sent to every client."""
        global_arrays = weighted_average(updates, self.weighting(), self.mix_dtype)
        return AggregateResult(payloads={c: global_arrays for c in updates})

    def mixing_plan(self, server_round: int, updates: dict[int, ClientUpdate]) -> MixingPlan:
        """Every client's row is the same sample weights: one global model."""
        w = client_weights(updates, self.weighting())
        return MixingPlan(sorted(updates), np.tile(w, (len(w), 1))[None])

    def weighting(self) -> str:
        """``fedavg-weighting``; the methods that reuse this server (FedProx, FedPer, APFL)
        have no such option and weight by training nodes."""
        return self.options.weighting if isinstance(self.options, FedAvgOptions) else "train"


ALGORITHM = Algorithm("fedavg", GCNTrainer, FedAvgAggregator, FedAvgOptions)
