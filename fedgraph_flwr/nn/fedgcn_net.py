"""FedGraph's ``AggreGCN``: a linear layer on pre-aggregated neighbour features, then GCN layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv


class AggreGCN(nn.Module):
    """Linear(d, h) → ReLU → dropout → [GCNConv(h, h) → ReLU → dropout] × (L − 2) → GCNConv(h, C).

    features [m, d] (FedGCN's neighbour sums A·X of the client's own and halo nodes),
    edge_index [2, e] over those m nodes -> logits [m, C]. The first layer reads the sums
    as they are (no self term, no normalisation), as FedGraph's; the convolutions normalise
    with self-loops and are uncached (FedGraph's ``cached=False``).
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, dropout: float = 0.5) -> None:
        super().__init__()
        if num_layers < 2:
            raise ValueError("AggreGCN needs num_layers >= 2 (a linear layer and a convolution)")
        self.lin = nn.Linear(in_channels, hidden_channels)
        dims = [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = nn.ModuleList(GCNConv(a, b, cached=False) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        self.lin.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()

    def forward(self, features: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Logits [m, C]."""
        x = F.dropout(F.relu(self.lin(features)), p=self.dropout, training=self.training)
        for conv in self.convs[:-1]:
            x = F.dropout(F.relu(conv(x, edge_index)), p=self.dropout, training=self.training)
        return self.convs[-1](x, edge_index)
