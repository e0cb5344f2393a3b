"""AdaFGL's homophilous module (official ``HomoPropagateModel``).

A 2-layer PReLU MLP on the smoothed features X_s = [X ‖ ÂX ‖ … ‖ Â^K X] (Â from the
rewired graph)::

    z_s = MLP(X_s)                                          [n, C]

The trainer adds the knowledge-preservation term: loss = CE(z_s[train]) + MSE(z_s, P_g),
prediction = ½(softmax(z_s) + softmax(P_g)) with P_g the global model's probabilities
(softmaxed a second time, as the code does).
"""

from __future__ import annotations

import torch
from torch import nn

from .prelu_mlp import PReLUMLP


class HomoPropagation(nn.Module):
    """X_s [n, D] -> z_s [n, C]; parameters ``mlp.layers.*``, ``prelu.weight`` [1]."""

    def __init__(self, smooth_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, dropout: float = 0.5) -> None:
        super().__init__()
        self.mlp = PReLUMLP(smooth_channels, hidden_channels, out_channels, num_layers, dropout)
        self.prelu = nn.PReLU()

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        self.mlp.reset_parameters()
        self.prelu.reset_parameters()

    def forward(self, x_smooth: torch.Tensor) -> torch.Tensor:
        """Logits [n, C] of the MLP on the smoothed features."""
        return self.mlp(x_smooth, self.prelu)
