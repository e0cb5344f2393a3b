"""FedProx (Li et al., MLSys 2020): FedAvg plus a proximal term on the client.

Each local step minimises ``CE + (μ/2) ||θ - θ_anchor||²`` where the anchor is
the model the client received this round (the server's payload). With μ = 0 it
is FedAvg exactly. The server is plain FedAvg (:class:`FedAvgAggregator`).

Knob: ``fedprox-mu`` (μ). Default 0.01: the middle of FedProx's own grid
{0.001, 0.01, 0.1, 1}, and the value the GCFL code (Xie et al. 2021, the graph
FL baseline suite FedAux compares against) runs FedProx with. FedAux does not
state its FedProx settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.options import Options, option
from ..core.phases import Arrays
from ..core.registry import Algorithm
from .fedavg import FedAvgAggregator, GCNTrainer


@dataclass(frozen=True)
class FedProxOptions(Options, prefix="fedprox"):
    """FedProx's knob (``fedprox-*``)."""

    mu: float = option(0.01, "proximal weight μ of (μ/2)·||θ - θ_received||² (0 = FedAvg)", low=0.0)


class FedProxTrainer(GCNTrainer):
    """Plain GCN whose local objective is pulled toward the received model."""

    options_class = FedProxOptions
    options: FedProxOptions

    anchor: dict[str, torch.Tensor] | None = None

    def load_payload(self, arrays: Arrays) -> None:
        """The server's arrays, also kept as the proximal anchor θ_received."""
        super().load_payload(arrays)
        # The anchor is exactly what was applied: the shared parameters of this round's payload.
        state = self.model.state_dict()
        self.anchor = {
            name: state[name].detach().clone()
            for name in arrays if name in state and not self.is_local(name)
        }

    def extra_loss(self) -> torch.Tensor | float:
        """(μ/2)·||θ - θ_received||²."""
        mu = self.options.mu
        if mu == 0.0 or not self.anchor:
            return 0.0  # identical to FedAvg, bit for bit
        prox = sum(
            (param - self.anchor[name]).pow(2).sum()
            for name, param in self.model.named_parameters() if name in self.anchor
        )
        return 0.5 * mu * prox


class FedProxAggregator(FedAvgAggregator):
    """The FedProx server is FedAvg; a named subclass keeps logs and registry readable."""

    options_class = FedProxOptions


ALGORITHM = Algorithm("fedprox", FedProxTrainer, FedProxAggregator, FedProxOptions)
