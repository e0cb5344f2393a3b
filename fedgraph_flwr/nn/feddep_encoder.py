"""FedDEP's node-embedding encoder (``Encoder`` of both codes) and per-hop neighbour sampling.

Shapes: n nodes, d features, h = embedding width, C classes::

    h_1 = dropout(relu(SAGE_1(x)))              [n, h]
    emb = tanh(SAGE_2(h_1))                     [n, h]   what the prototypes are made of
    p   = softmax(dropout(Linear(dropout(emb))))  [n, C]   training only

The codes train it with ``F.cross_entropy`` on the softmax output (a double softmax, kept)
and GraphSAGE's per-hop sampling: each layer sees at most ``k`` random in-neighbours of
every node (PyG's ``NeighborSampler(sizes=[k, k])``; :func:`sample_in_edges` draws one
such edge set per layer over the whole graph, the same distribution for every target).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import SAGEConv


def sample_in_edges(edge_index: torch.Tensor, num_nodes: int, k: int) -> torch.Tensor:
    """At most ``k`` in-edges of every target, uniformly without replacement [2, m'] (all of
    them when k <= 0 or the in-degree is <= k). Global torch RNG; no loop over nodes."""
    if k <= 0 or edge_index.size(1) == 0:
        return edge_index
    dst = edge_index[1]
    key = torch.rand(dst.numel(), device=dst.device)
    order = torch.argsort(key)
    order = order[torch.argsort(dst[order], stable=True)]  # by target, random within
    count = torch.bincount(dst, minlength=num_nodes)
    start = torch.cumsum(count, 0) - count
    rank = torch.arange(order.numel(), device=dst.device) - start[dst[order]]
    return edge_index[:, order[rank < k]]


class EmbeddingEncoder(nn.Module):
    """Two SAGEConv layers (ReLU, then tanh) and a linear softmax head for training."""

    def __init__(self, in_channels: int, hidden_channels: int, num_classes: int,
                 dropout: float = 0.5) -> None:
        super().__init__()
        if min(in_channels, hidden_channels, num_classes) < 1:
            raise ValueError("channels must be >= 1")
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, hidden_channels)
        self.head = nn.Linear(hidden_channels, num_classes)
        self.dropout = dropout

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for module in (self.conv1, self.conv2, self.head):
            module.reset_parameters()

    def embed(self, x: torch.Tensor, edges: Sequence[torch.Tensor]) -> torch.Tensor:
        """The tanh embeddings [n, h]; ``edges`` holds one edge set per layer."""
        h = F.dropout(F.relu(self.conv1(x, edges[0])), self.dropout, training=self.training)
        return torch.tanh(self.conv2(h, edges[1]))

    def forward(self, x: torch.Tensor, edges: Sequence[torch.Tensor]) -> torch.Tensor:
        """Class probabilities [n, C] (the codes' softmax output)."""
        emb = F.dropout(self.embed(x, edges), self.dropout, training=self.training)
        return F.softmax(F.dropout(self.head(emb), self.dropout, training=self.training), dim=-1)
