"""FedSage+'s missing-neighbour generator NeighGen (Zhang et al., NeurIPS 2021).

Shapes: n nodes, d features, P = ``num_pred`` generated slots per node, latent width L::

    z      = encoder(x, edge_index)                          [n, L]   2 GNN layers, d -> h -> L
    n̂      = dGen(z) = relu(Linear(L -> 1)(z))               [n]      missing-neighbour count
    ĝ      = fGen(z + ε), ε ~ N(0, I)                        [n, P, d]
           = tanh(FC(2048 -> P·d)(dropout(relu(FC(256 -> 2048)(relu(FC(L -> 256)(z + ε)))))))
    logits = classifier(x_mended, edge_index_mended)         [n', C]  2 GNN layers, d -> h -> C

The noise ε is drawn on every forward (training and evaluation), as both official codes do.

``conv`` picks the GNN layers of the encoder and of the inner classifier:

- ``gcn`` (the official code ``zkhku/fedsage``, ``src/models/models.py`` ``GNN``):
  :class:`RowNormGCNLayer`, Â X W + b with Â = D̃⁻¹(A + I) (row-normalised, self-loops),
  weights and biases U(−1/√out, 1/√out); ReLU after *both* layers (the code's ``GNN``
  ends in a ReLU, also on the inner classifier's logits).
- ``sage`` (the paper; OpenFGL's ``locsage_plus.py``): PyG ``SAGEConv`` (mean aggregation
  with a root weight), ReLU between the layers only.

Dropout (``dropout``) follows the first layer of each GNN and the 2048-wide layer of fGen.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import SAGEConv

from .gamlp import normalized_adjacency

CONVS = ("gcn", "sage")


class RowNormGCNLayer(nn.Module):
    """y = D̃⁻¹(A + I) x W + b: x [n, in], edge_index [2, m] -> [n, out] (official ``GraphConvolution``)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"channels must be >= 1, got {in_channels} -> {out_channels}")
        self.weight = nn.Parameter(torch.empty(in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        bound = 1.0 / math.sqrt(self.weight.size(1))
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """D⁻¹A·x W + b."""
        adjacency = normalized_adjacency(edge_index, x.size(0), r=0.0)  # D̃⁻¹ Ã, CSR [n, n]
        return torch.sparse.mm(adjacency, x @ self.weight) + self.bias


class TwoLayerGNN(nn.Module):
    """conv(d -> h) -> ReLU -> dropout -> conv(h -> out) [-> ReLU for ``gcn``, as the code]."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 conv: str, dropout: float) -> None:
        super().__init__()
        if conv not in CONVS:
            raise ValueError(f"conv {conv!r}; valid: {', '.join(CONVS)}")
        layer = RowNormGCNLayer if conv == "gcn" else SAGEConv
        self.conv1 = layer(in_channels, hidden_channels)
        self.conv2 = layer(hidden_channels, out_channels)
        self.final_relu = conv == "gcn"
        self.dropout = dropout

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        self.conv1.reset_parameters()
        self.conv2.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Two layers (ReLU between, and after with ``final_relu``)."""
        h = F.dropout(F.relu(self.conv1(x, edge_index)), self.dropout, training=self.training)
        out = self.conv2(h, edge_index)
        return F.relu(out) if self.final_relu else out


class FeatureGenerator(nn.Module):
    """fGen: z [n, L] -> generated neighbour features [n, P, d] in (−1, 1)."""

    def __init__(self, latent_dim: int, num_pred: int, num_features: int, dropout: float,
                 hidden: int = 256, width: int = 2048) -> None:
        super().__init__()
        if num_pred < 1 or num_features < 1:
            raise ValueError(f"num_pred and num_features must be >= 1, got {num_pred}, {num_features}")
        self.num_pred, self.num_features, self.dropout = num_pred, num_features, dropout
        self.fc1 = nn.Linear(latent_dim, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.fc_flat = nn.Linear(width, num_pred * num_features)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for fc in (self.fc1, self.fc2, self.fc_flat):
            fc.reset_parameters()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Generated neighbour features [n, num_pred, F] from latents ``z``."""
        h = z + torch.randn_like(z)  # the codes' Sampling: noise in training and evaluation
        h = F.relu(self.fc2(F.relu(self.fc1(h))))
        h = F.dropout(h, self.dropout, training=self.training)
        return torch.tanh(self.fc_flat(h)).view(-1, self.num_pred, self.num_features)


class NeighGen(nn.Module):
    """Encoder + dGen + fGen, and the inner classifier that scores the mended graph.

    Parameter names: ``encoder.*``, ``dgen.*``, ``fgen.*``, ``classifier.*``.
    """

    def __init__(self, num_features: int, num_classes: int, hidden: int = 32,
                 latent_dim: int = 128, num_pred: int = 5, dropout: float = 0.5,
                 conv: str = "sage", fgen_hidden: int = 256, fgen_width: int = 2048) -> None:
        super().__init__()
        if min(num_features, num_classes, hidden, latent_dim) < 1:
            raise ValueError("num_features, num_classes, hidden and latent_dim must be >= 1")
        self.num_pred = num_pred
        self.encoder = TwoLayerGNN(num_features, hidden, latent_dim, conv, dropout)
        self.dgen = nn.Linear(latent_dim, 1)
        self.fgen = FeatureGenerator(latent_dim, num_pred, num_features, dropout,
                                     fgen_hidden, fgen_width)
        self.classifier = TwoLayerGNN(num_features, hidden, num_classes, conv, dropout)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for module in (self.encoder, self.dgen, self.fgen, self.classifier):
            module.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                rows: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [n, d], edge_index [2, m] -> (n̂ [n] >= 0, node ids r [k], ĝ [k, P, d]).

        fGen, by far the largest part, runs on the nodes ``rows(n̂)`` picks (ids [k]; all
        n when None): those whose generated features are used.
        """
        z = self.encoder(x, edge_index)
        degree = F.relu(self.dgen(z)).view(-1)
        ids = (torch.arange(x.size(0), device=x.device) if rows is None
               else rows(degree.detach()))
        return degree, ids, self.fgen(z[ids])
