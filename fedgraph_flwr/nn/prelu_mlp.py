"""The MLP of AdaFGL's step-2 modules (official ``models/my_model.py``).

``num_layers`` linear maps d -> h -> … -> h -> C; after every hidden one a PReLU and
dropout (none on the input, none after the last). The PReLU is *not* the MLP's own: the
code shares one PReLU between several MLPs of a module (and, in the heterophilous head,
with its signed propagation), so the owner passes it to :meth:`PReLUMLP.forward`.
Xavier-uniform weights with ReLU gain and zero biases, as the code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PReLUMLP(nn.Module):
    """x [n, in_channels] -> [n, out_channels]; parameters ``layers.{l}.{weight, bias}``."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, dropout: float = 0.5) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        gain = nn.init.calculate_gain("relu")
        for layer in self.layers:
            nn.init.xavier_uniform_(layer.weight, gain=gain)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, prelu: nn.PReLU) -> torch.Tensor:
        """The MLP's output, ``prelu`` between layers."""
        for layer in self.layers[:-1]:
            x = F.dropout(prelu(layer(x)), p=self.dropout, training=self.training)  # [n, h]
        return self.layers[-1](x)
