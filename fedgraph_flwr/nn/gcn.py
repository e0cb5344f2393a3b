"""Plain GCN backbone used by FedAvg, FedProx, Local and friends."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv


def cached_gcn_conv(in_channels: int, out_channels: int) -> GCNConv:
    """A GCNConv that caches its normalised adjacency."""
    # cached=True: a trainer only ever sees its own fixed subgraph.
    return GCNConv(in_channels, out_channels, cached=True)


class GCN(nn.Module):
    """``num_layers`` GCN convolutions; ReLU + dropout between them.

    x [n, in_channels], edge_index [2, m] -> logits [n, out_channels].
    The last convolution is the classifier (named ``convs.{L-1}``), which is
    the "head" FedPer keeps local. ``conv`` builds each layer from (in, out)
    (default: a cached GCNConv; FedSpray's GraphSAGE backbone passes SAGEConv).
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        num_layers: int = 2,
        dropout: float = 0.5,
        conv: Callable[[int, int], nn.Module] = cached_gcn_conv,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = nn.ModuleList(conv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for conv in self.convs:
            conv.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [n, C] of the convolutions; ``edge_weight`` [m] only for convolutions
        that take one (GCNConv; SAGEConv's third argument is something else)."""
        args = (edge_index,) if edge_weight is None else (edge_index, edge_weight)
        for conv in self.convs[:-1]:
            x = F.relu(conv(x, *args))
            x = F.dropout(x, p=self.dropout, training=self.training)
        return self.convs[-1](x, *args)
