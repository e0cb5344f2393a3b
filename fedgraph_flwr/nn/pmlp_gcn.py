"""FGGP's official backbone ``PMLP_GCN`` and its second-view augmenter.

Shapes: n nodes, d features, h hidden, C classes, L layers (``fcs``: L linears)::

    x_0 = x                                               [n, d]
    x_k = dropout(relu(BN(P_k (x_{k-1} W_k^T) + b_k)))    k = 1 .. L-1   [n, h]
    out = Â (x_{L-1} W_L^T) + b_L                          [n, C]   (logits)

P_k is Â = D^-1/2 (A + I) D^-1/2 (degrees of targets), or a dense [n, n] matrix given
for the hidden layers (the second view); the classifier always propagates over a
graph's Â. BN is a batch norm without affine parameters or running statistics: batch
statistics in train and eval mode alike. ``features`` is the same stack whose last
hidden layer has neither BN nor dropout (``relu(P x W^T + b)``), as the official
``features()``.

Official code: GuanchengWan/FGGP @ fedced9, ``Code/backbone/gnn/pmlp.py`` (``PMLP_GCN``,
``gcn_conv``, ``Augmentor``, ``GCNLayer``). Its unused ``proj_head`` is not built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.utils import add_self_loops, degree, remove_self_loops


def gcn_propagation(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Â as a sparse COO [n, n], row = target: the official ``gcn_conv``'s matrix
    (self-loops removed then one added per node, D from target degrees)."""
    edge_index, _ = remove_self_loops(edge_index)
    edge_index, _ = add_self_loops(edge_index, num_nodes=num_nodes)
    src, dst = edge_index
    deg_inv_sqrt = degree(dst, num_nodes=num_nodes).pow(-0.5)
    deg_inv_sqrt.masked_fill_(torch.isinf(deg_inv_sqrt), 0.0)
    weight = deg_inv_sqrt[src] * deg_inv_sqrt[dst]
    return torch.sparse_coo_tensor(torch.stack([dst, src]), weight,
                                   (num_nodes, num_nodes), check_invariants=False).coalesce()


def row_normalised(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """D^-1/2 A D^-1/2 as a sparse COO [n, n] with A[row, col] = 1 and D its row sums
    (the official ``get_norm_and_orig``'s ``adj_norm``; no self-loops added)."""
    row, col = edge_index
    deg_inv_sqrt = degree(row, num_nodes=num_nodes).pow(-0.5)
    deg_inv_sqrt.masked_fill_(torch.isinf(deg_inv_sqrt), 0.0)
    weight = deg_inv_sqrt[row] * deg_inv_sqrt[col]
    return torch.sparse_coo_tensor(edge_index, weight,
                                   (num_nodes, num_nodes), check_invariants=False).coalesce()


def straight_through_bernoulli(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """pyro's ``RelaxedBernoulliStraightThrough(temperature, probs).rsample()``: a relaxed
    Bernoulli sample rounded to 0/1 in the forward pass, its soft gradient passed back."""
    soft = torch.distributions.RelaxedBernoulli(torch.tensor(temperature, device=probs.device),
                                                probs=probs).rsample()
    soft = soft.clamp(torch.finfo(soft.dtype).eps, 1 - torch.finfo(soft.dtype).eps)
    return soft + (soft.round() - soft).detach()


class GraphAugmenter(nn.Module):
    """The official ``Augmentor``: a learned dense resampling of a graph.

    ::

        h = relu(Ân ((Ân x W1) W2))              [n, h]   (no biases, no dropout)
        L = h hᵀ                                  [n, n]   edge logits
        P = α L / (max L + 1e-6) + (1 − α) A      [n, n]   edge probabilities
        S ~ straight-through Bernoulli(P) at temperature t
        S ← triu(S, 1) + triu(S, 1)ᵀ, diag(S) = 1, S ← D_S^-1/2 S D_S^-1/2

    Every pair is an independent draw and P > 0 off the edges, so S is dense by design:
    this module allocates [n, n] matrices (FGGP's named memory exemption).
    """

    def __init__(self, in_channels: int, hidden_channels: int, alpha: float = 0.5,
                 temperature: float = 1.0) -> None:
        super().__init__()
        if min(in_channels, hidden_channels) < 1:
            raise ValueError("channels must be >= 1")
        if not 0.0 <= alpha <= 1.0 or temperature <= 0.0:
            raise ValueError(f"alpha in [0, 1] and temperature > 0, got {alpha}, {temperature}")
        self.gcn1 = nn.Linear(in_channels, hidden_channels, bias=False)
        self.gcn2 = nn.Linear(hidden_channels, hidden_channels, bias=False)
        self.alpha, self.temperature = alpha, temperature

    def reset_parameters(self) -> None:
        """Re-initialise both layers as at construction."""
        self.gcn1.reset_parameters()
        self.gcn2.reset_parameters()

    def forward(self, x: torch.Tensor, norm_adjacency: torch.Tensor,
                adjacency: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, d], norm_adjacency Ân (sparse [n, n]), adjacency A (dense 0/1 [n, n])
        -> (S [n, n], the sampled normalised graph; L [n, n], the edge logits)."""
        h = norm_adjacency @ self.gcn1(x)
        h = F.relu(norm_adjacency @ self.gcn2(h))
        logits = h @ h.t()
        probs = self.alpha * logits / (logits.max() + 1e-6) + (1 - self.alpha) * adjacency
        sampled = straight_through_bernoulli(probs, self.temperature).triu(1)
        sampled = sampled + sampled.t()
        sampled = sampled.fill_diagonal_(1.0)
        deg_inv_sqrt = sampled.sum(1).pow(-0.5)
        return deg_inv_sqrt[:, None] * sampled * deg_inv_sqrt[None, :], logits


class PMLPGCN(nn.Module):
    """PMLP_GCN (module docstring) with its augmenter ``aug`` (trained and averaged with it)."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 3, dropout: float = 0.5, aug_alpha: float = 0.5,
                 aug_temperature: float = 1.0) -> None:
        super().__init__()
        if min(in_channels, hidden_channels, out_channels) < 1 or num_layers < 2:
            raise ValueError("channels must be >= 1 and num_layers >= 2")
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.bn = nn.BatchNorm1d(hidden_channels, affine=False, track_running_stats=False)
        self.dropout = dropout
        self.reset_parameters()
        self.aug = GraphAugmenter(in_channels, hidden_channels, aug_alpha, aug_temperature)

    def reset_parameters(self) -> None:
        """Xavier-uniform weights (gain 1.414) and zero biases, as the official code."""
        for lin in self.fcs:
            nn.init.xavier_uniform_(lin.weight, gain=1.414)
            nn.init.zeros_(lin.bias)

    def _hidden(self, x: torch.Tensor, propagation: torch.Tensor, last_plain: bool) -> torch.Tensor:
        for i, lin in enumerate(self.fcs[:-1]):
            x = propagation @ (x @ lin.weight.t()) + lin.bias
            if last_plain and i == len(self.fcs) - 2:
                return F.relu(x)
            x = F.dropout(F.relu(self.bn(x)), p=self.dropout, training=self.training)
        return x

    def forward(self, x: torch.Tensor, propagation: torch.Tensor,
                hidden_propagation: torch.Tensor | None = None) -> torch.Tensor:
        """x [n, d], propagation Â (sparse [n, n]; the classifier's), hidden_propagation
        (the hidden layers', default Â; a dense [n, n] for the second view) -> logits [n, C]."""
        h = self._hidden(x, propagation if hidden_propagation is None else hidden_propagation,
                         last_plain=False)
        last = self.fcs[-1]
        return propagation @ (h @ last.weight.t()) + last.bias

    def features(self, x: torch.Tensor, propagation: torch.Tensor) -> torch.Tensor:
        """The last hidden layer without BN and dropout [n, h] (the official ``features``)."""
        return self._hidden(x, propagation, last_plain=True)
