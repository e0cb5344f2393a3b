"""FedSage's downstream GraphSAGE classifier (the official code's stellargraph model).

x [n, d], edge_index [2, m] -> logits [n, C]::

    h¹ = dropout(relu(SAGE(x)))          [n, s₁]      (every layer but the last: ReLU)
    h^L = SAGE(h^(L−1))                  [n, s_L]     (the last: linear, as stellargraph)
    e  = h^L / ‖h^L‖₂                    [n, s_L]     (stellargraph's normalize="l2")
    logits = head(e)                     [n, C]       (the code's Dense(C, softmax), as logits)

``sizes`` are the layer sizes (the code's ``classifier_layer_sizes`` = [64, 32]). The
layers are PyG ``SAGEConv`` (mean aggregation; the neighbour and root terms summed, where
stellargraph concatenates two halves) on the whole graph (the code samples [5, 5]
neighbours per mini-batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import SAGEConv


class SageClassifier(nn.Module):
    """Parameter names: ``convs.{l}.*`` and ``head.*``."""

    def __init__(self, in_channels: int, sizes: tuple[int, ...], out_channels: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if not sizes or min(sizes) < 1:
            raise ValueError(f"sizes must be a non-empty tuple of positive widths, got {sizes}")
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"channels must be >= 1, got {in_channels} -> {out_channels}")
        dims = (in_channels, *sizes)
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(sizes[-1], out_channels)
        self.dropout = dropout

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for conv in self.convs:
            conv.reset_parameters()
        self.head.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Logits [n, C] of the GraphSAGE layers and head."""
        h = x
        for conv in self.convs[:-1]:
            h = F.dropout(F.relu(conv(h, edge_index)), self.dropout, training=self.training)
        h = F.normalize(self.convs[-1](h, edge_index), p=2.0, dim=-1)
        return self.head(h)
