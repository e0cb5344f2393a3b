"""FED-PUB's GCN (2 GCN layers + a linear classifier) with FedGNN's virtual neighbours.

FED-PUB's ``models/nets.py`` ``GCN`` (hidden width h, dropout 0.5)::

    h¹ = relu(conv1(x, A))                      [n, h]   (the embedding FedGNN exchanges)
    h² = relu(conv2(dropout(h¹), A))            [n, h]
    logits = clsif(dropout(h²))                 [n, C]

FedGNN's expansion (docs/reading/fedgnn.md §2 [I]) adds m *virtual* nodes at the second
layer: feature-less nodes whose layer-2 input is a received embedding ``virtual`` [m, h]
(another client's h¹ of a node this client does not hold), linked to the real nodes
they neighbour by ``virtual_edges`` [2, k] (row 0: virtual index in 0..m-1, row 1: real
node in 0..n-1). conv2 then runs on the expanded graph of n + m nodes, whose edges are
A plus each virtual link in both directions, with the usual GCN normalisation
D̂^-1/2 (Â + I) D̂^-1/2 over that graph (a virtual node's degree is 1 + its real
neighbours); the virtual rows' outputs are discarded. Dropout treats the virtual rows as
it treats h¹. The virtual embeddings are constants: no gradient reaches them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv


class FedGNNNet(nn.Module):
    """x [n, d], edge_index [2, e] (+ virtual [m, h], virtual_edges [2, k]) -> logits [n, C].

    Parameter names (FED-PUB's): ``conv1.*`` [h, d], ``conv2.*`` [h, h], ``clsif.*`` [C, h].
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 dropout: float = 0.5) -> None:
        super().__init__()
        if min(in_channels, hidden_channels, out_channels) < 1:
            raise ValueError(f"channels must be >= 1, got {in_channels}, {hidden_channels}, "
                             f"{out_channels}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.hidden_channels = hidden_channels
        self.dropout = dropout
        # conv1 sees the client's own fixed subgraph only: its normalisation is cached.
        self.conv1 = GCNConv(in_channels, hidden_channels, cached=True)
        # conv2's graph changes with the expansion (each round may bring other neighbours).
        self.conv2 = GCNConv(hidden_channels, hidden_channels, cached=False)
        self.clsif = nn.Linear(hidden_channels, out_channels)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for module in (self.conv1, self.conv2, self.clsif):
            module.reset_parameters()

    def embed(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """h¹ = relu(conv1(x)) [n, h]: the first layer's output, before dropout."""
        return F.relu(self.conv1(x, edge_index))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                virtual: torch.Tensor | None = None,
                virtual_edges: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [n, C]; ``virtual`` [m, h] and ``virtual_edges`` [2, k] as in the module doc."""
        n = x.size(0)
        h = self.embed(x, edge_index)  # [n, h]
        edges = edge_index
        if virtual is not None and virtual.size(0) > 0:
            if virtual_edges is None:
                raise ValueError("virtual embeddings without virtual_edges")
            if virtual.dim() != 2 or virtual.size(1) != self.hidden_channels:
                raise ValueError(f"virtual embeddings must be [m, {self.hidden_channels}], "
                                 f"got {tuple(virtual.shape)}")
            if virtual_edges.dim() != 2 or virtual_edges.size(0) != 2:
                raise ValueError(f"virtual_edges must be [2, k], got {tuple(virtual_edges.shape)}")
            source = virtual_edges[0] + n  # virtual node ids follow the real ones
            target = virtual_edges[1]
            h = torch.cat([h, virtual.detach().to(h.dtype)], dim=0)  # [n + m, h]
            edges = torch.cat([edge_index, torch.stack([source, target]),
                               torch.stack([target, source])], dim=1)
        h = F.dropout(h, p=self.dropout, training=self.training)
        h = F.relu(self.conv2(h, edges))[:n]  # [n, h]: real nodes only
        h = F.dropout(h, p=self.dropout, training=self.training)
        return self.clsif(h)
