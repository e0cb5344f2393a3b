"""OpenFGL's FGGP backbone: a Kipf-style GCN over the raw adjacency.

Shapes: n nodes, d features, h hidden, C classes::

    x_k = dropout(relu(A (x_{k-1} W_k) + b_k))     k < L    [n, h]
    out = A (x_{L-1} W_L) + b_L                            [n, C]

A is the raw 0/1 adjacency (no self-loops, no normalisation; sparse) or, for FGGP's
second view, a dense [n, n] matrix. W is uniform(±1/√out), b is 0. ``forward`` returns
(the last hidden layer after dropout, logits), as OpenFGL's ``FedGCN``.

Source: OpenFGL @ 5483768, ``openfgl/flcore/fggp/models.py`` (``GraphConvolution``,
``FedGCN``); its ``aug`` is :func:`gumbel_row_softmax` here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def raw_adjacency(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """A[row, col] = 1 as a sparse COO [n, n] (OpenFGL's ``to_torch_csc_tensor``)."""
    ones = torch.ones(edge_index.size(1), device=edge_index.device)
    return torch.sparse_coo_tensor(edge_index, ones, (num_nodes, num_nodes),
                                   check_invariants=False).coalesce()


def gumbel_row_softmax(logits: torch.Tensor, tau: float) -> torch.Tensor:
    """softmax((logits + Gumbel noise) / τ) over each row (OpenFGL's ``gumbel_softmax``)."""
    gumbel = -torch.log(-torch.log(torch.rand_like(logits)))
    return F.softmax((logits + gumbel) / tau, dim=-1)


class GraphConvolution(nn.Module):
    """A x W + b, x [n, d_in] -> [n, d_out]."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """uniform(±1/√d_out) weights, zero bias."""
        bound = 1.0 / math.sqrt(self.weight.size(1))
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
        """x [n, d_in], adjacency [n, n] (sparse or dense) -> [n, d_out]."""
        return adjacency @ (x @ self.weight) + self.bias


class DenseAdjacencyGCN(nn.Module):
    """OpenFGL's FGGP ``FedGCN`` (module docstring)."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, dropout: float = 0.5) -> None:
        super().__init__()
        if min(in_channels, hidden_channels, out_channels) < 1 or num_layers < 2:
            raise ValueError("channels must be >= 1 and num_layers >= 2")
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.layers = nn.ModuleList(GraphConvolution(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout

    def reset_parameters(self) -> None:
        """Re-initialise every layer as at construction."""
        for layer in self.layers:
            layer.reset_parameters()

    def forward(self, x: torch.Tensor, adjacency: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, d], adjacency [n, n] -> (hidden after dropout [n, h], logits [n, C])."""
        for layer in self.layers[:-1]:
            x = F.dropout(F.relu(layer(x, adjacency)), p=self.dropout, training=self.training)
        return x, self.layers[-1](x, adjacency)
