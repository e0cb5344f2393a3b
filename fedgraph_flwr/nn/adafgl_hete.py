"""AdaFGL's heterophilous module (official ``HetePropagateModel``).

Three branches, each a 3-layer PReLU MLP (:class:`~fedgraph_flwr.nn.prelu_mlp.PReLUMLP`)::

    z_o = MLP_local(X)            [n, C]   raw features
    z_s = MLP_smooth(X_s)         [n, C]   smoothed features [X ‖ ÂX ‖ … ‖ Â^K X]
    z_p = SignedPropagation(X_s)  [n, C]   learnable signed message passing

MLP_local and MLP_smooth share one PReLU (the code's ``self.prelu``); the propagation
head has its own. Training loss: CE(z_o) + CE(z_s) + CE(z_p) on the training nodes;
prediction: the mean of the three softmaxes.
"""

from __future__ import annotations

import torch
from torch import nn

from .prelu_mlp import PReLUMLP
from .signed_propagation import SignedPropagation


class HeteroPropagation(nn.Module):
    """(X [n, d], X_s [n, D], pairs) -> (z_o, z_s, z_p), each [n, C]."""

    def __init__(self, in_channels: int, smooth_channels: int, hidden_channels: int,
                 out_channels: int, num_layers: int = 3, dropout: float = 0.5,
                 beta: float = 0.2) -> None:
        super().__init__()
        if smooth_channels < in_channels:
            raise ValueError(f"smooth_channels ({smooth_channels}) < in_channels ({in_channels})")
        self.local = PReLUMLP(in_channels, hidden_channels, out_channels, num_layers, dropout)
        self.smooth = PReLUMLP(smooth_channels, hidden_channels, out_channels, num_layers, dropout)
        self.prelu = nn.PReLU()
        self.propagation = SignedPropagation(smooth_channels, hidden_channels, out_channels,
                                             num_layers, dropout, beta)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        self.local.reset_parameters()
        self.smooth.reset_parameters()
        self.prelu.reset_parameters()
        self.propagation.reset_parameters()

    def forward(self, x: torch.Tensor, x_smooth: torch.Tensor, row: torch.Tensor,
                col: torch.Tensor, prior: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The three heads' logits: local, smoothed and signed-propagation."""
        z_smooth = self.smooth(x_smooth, self.prelu)
        z_local = self.local(x, self.prelu)
        z_prop = self.propagation(x_smooth, row, col, prior)
        return z_local, z_smooth, z_prop
