"""FedPer (Arivazhagan et al. 2019): shared body, personal classifier head.

On the plain GCN backbone the head is the last convolution ``convs.{L-1}``
(for the 2-layer GCN, ``convs.1``): it never leaves the client and the server
never overwrites it. The body (``convs.0`` ... ``convs.{L-2}``) is averaged with
FedAvg over the shared keys only. The head fraction of the model is the paper's
only design knob; here it is fixed by the backbone (the last layer), so FedPer
has no algorithm-specific config key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch_geometric.data import Data

from ..core.options import Options
from ..core.phases import Arrays
from ..core.registry import Algorithm
from .fedavg import FedAvgAggregator, GCNTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig


@dataclass(frozen=True)
class FedPerOptions(Options, prefix="fedper"):
    """FedPer has no options of its own (the head is the backbone's last layer)."""


def head_prefix(config: ClientConfig) -> str:
    """Parameter-name prefix of the personal head: the last GCN layer (trailing dot: convs.1 ≠ convs.10)."""
    return f"convs.{config.num_layers - 1}."


class FedPerTrainer(GCNTrainer):
    """GCN whose last layer is personal (kept in local state, never uploaded)."""

    options_class = FedPerOptions

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        self.local_keys = (head_prefix(config),)

    def is_local(self, name: str) -> bool:
        """Whether ``name`` belongs to the personal head."""
        return name.startswith(self.local_keys[0])

    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """The shared body of the initial model (the head stays local)."""
        head = head_prefix(config)
        full = super().initial_arrays(num_features, num_classes, config)
        return {k: v for k, v in full.items() if not k.startswith(head)}


class FedPerAggregator(FedAvgAggregator):
    """FedAvg over the uploaded (body) arrays; heads never reach the server."""

    options_class = FedPerOptions


ALGORITHM = Algorithm("fedper", FedPerTrainer, FedPerAggregator, FedPerOptions)
