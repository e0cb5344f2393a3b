"""ChebNet as AdaFGL's official code runs it (``models/gcn.py``: ``ChebNet``, ``ChebNetConv``).

Each layer expands its input in K Chebyshev terms of the normalised adjacency and maps
the concatenation with one linear layer::

    T_0 = h,  T_1 = Â h,  T_k = 2 Â T_(k−1) − T_(k−2)           each [n, d_in]
    layer(h) = Linear(K·d_in -> d_out)([T_0 ‖ T_1 ‖ … ‖ T_(K−1)])

    logits = layer_1(dropout(relu(layer_0(x))))                 x [n, d] -> [n, C]

Â is the r-normalised adjacency with self-loops
(:func:`~fedgraph_flwr.nn.gamlp.normalized_adjacency`), which the code passes under the
name "laplacian": the code's recursion runs on Â itself, not on the scaled Laplacian of
Defferrard et al. (nor PyG's ``ChebConv``); K = 2 (the code's default) uses X and ÂX only.
The code interleaves the K terms feature by feature before its linear map; we concatenate
them term by term, which is the same family of maps with the weight's columns permuted.
Weights keep ``nn.Linear``'s initialisation, as in the code. No dropout on the input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def chebyshev_terms(x: torch.Tensor, adjacency: torch.Tensor, k: int) -> torch.Tensor:
    """[T_0 x ‖ … ‖ T_(k−1) x]: x [n, d], Â sparse [n, n] -> [n, k·d]."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    terms = [x]
    if k > 1:
        terms.append(torch.sparse.mm(adjacency, x))
    for _ in range(2, k):
        terms.append(2.0 * torch.sparse.mm(adjacency, terms[-1]) - terms[-2])
    return torch.cat(terms, dim=1)


class ChebNet(nn.Module):
    """x [n, d], Â sparse [n, n] -> logits [n, C]; ``num_layers`` Chebyshev layers.

    Parameters: ``layers.{l}.{weight [d_out, k·d_in], bias [d_out]}``.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 k: int = 2, num_layers: int = 2, dropout: float = 0.5) -> None:
        super().__init__()
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.k = k
        self.dropout = dropout
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.layers = nn.ModuleList(nn.Linear(k * a, b) for a, b in zip(dims[:-1], dims[1:]))

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for layer in self.layers:
            layer.reset_parameters()

    def forward(self, x: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
        """Logits [n, C] of the Chebyshev layers on ``adjacency``."""
        h = x
        for layer in self.layers[:-1]:
            h = F.relu(layer(chebyshev_terms(h, adjacency, self.k)))  # [n, hidden]
            h = F.dropout(h, p=self.dropout, training=self.training)
        return self.layers[-1](chebyshev_terms(h, adjacency, self.k))  # [n, C]
