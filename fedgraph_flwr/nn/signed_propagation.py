"""AdaFGL's learnable signed message passing (official ``HetePropagateLayer``), on a sparse support.

Input: smoothed features X_s [n, D] and a fixed set Ω of ordered off-diagonal node pairs
(i, j), each once, holding every prior edge, with a prior S_ij ∈ {0, 1} on each (the
thresholded similarity graph of the global model's predictions). Per forward::

    e     = MLP(X_s)                                        [n, C]   (3 layers, PReLU)
    u_i   = softmax(e_i) / ‖softmax(e_i)‖                   cosine form of getre(e)
    R_ij  = β·S_ij + (1−β)·u_i·u_j      (i ≠ j; R_ii = 0)
    μ     = mean of R over all n² entries, M = its maximum (the diagonal's 0 included)
    R'_ij = (R_ij − μ)/(M − μ)  if R_ij > μ,   else  −R_ij/μ         (the code's rescale)
    R'_ii = 1                                                         (the code's add_diag)
    pos_i = Σ_j PReLU(R'_ij)·e_j,   neg_i = Σ_j PReLU(−R'_ij)·e_j     (j over Ω_i ∪ {i})
    z_p   = ½·(softmax(pos) − softmax(neg) + e)             [n, C]

The code builds R densely over all n² pairs. Here the sums run over Ω only (pairs outside
Ω contribute nothing): with Ω = every off-diagonal pair this *is* the code's computation,
while a sparse Ω (AdaFGL's trainer: top-k similar pairs plus random pairs) keeps memory
linear in the graph. μ is exact either way, computed in closed form from
Σ_{i≠j} u_i·u_j = ‖Σ_i u_i‖² − Σ_i ‖u_i‖² and the number of prior edges over all pairs;
M is the maximum over Ω (and 0). The negative branch is the code's literal formula: it
maps R ∈ [0, μ] to [0, −1] (R = 0 -> 0, R just below μ -> −1), not a linear map of
[min, μ] onto [−1, 0]. One PReLU serves the MLP's hidden layers and both signals, as in
the code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .prelu_mlp import PReLUMLP

EPS = 1e-12  # floors μ and M − μ (the code divides by them unguarded)


def signed_relation(e: torch.Tensor, row: torch.Tensor, col: torch.Tensor, prior: torch.Tensor,
                    beta: float) -> torch.Tensor:
    """R'_ij on the pairs (row, col) [m] (off-diagonal, each once), from logits e [n, C] -> [m].

    ``prior`` [m]: S on those pairs; Ω must hold every prior edge (S is 0 elsewhere).
    """
    n = e.size(0)
    probs = F.softmax(e, dim=1)
    u = probs / probs.norm(dim=1, keepdim=True).clamp_min(1e-9)  # [n, C]
    cos = (u[row] * u[col]).sum(dim=1)  # [m]
    relation = beta * prior + (1.0 - beta) * cos
    total_cos = u.sum(dim=0).square().sum() - u.square().sum()  # Σ_{i≠j} u_i·u_j
    mean = (beta * prior.sum() + (1.0 - beta) * total_cos) / (n * n)
    peak = relation.max().clamp_min(0.0) if relation.numel() else relation.new_zeros(())
    centred = relation - mean
    return torch.where(centred > 0, centred / (peak - mean).clamp_min(EPS),
                       -relation / mean.clamp_min(EPS))


def signed_propagate(e: torch.Tensor, row: torch.Tensor, col: torch.Tensor,
                     relation: torch.Tensor, prelu: nn.PReLU) -> torch.Tensor:
    """z_p = ½(softmax(pos) − softmax(neg) + e): e [n, C], R' [m] on (row, col) -> [n, C]."""
    pos_w = prelu(relation)  # [m]
    neg_w = prelu(-relation)
    one = torch.ones(1, dtype=e.dtype, device=e.device)
    # The diagonal R'_ii = 1: PReLU(1) = 1 in pos, PReLU(−1) = −a in neg.
    pos = e * prelu(one) + torch.zeros_like(e).index_add(0, row, pos_w[:, None] * e[col])
    neg = e * prelu(-one) + torch.zeros_like(e).index_add(0, row, neg_w[:, None] * e[col])
    return 0.5 * (F.softmax(pos, dim=1) - F.softmax(neg, dim=1) + e)


class SignedPropagation(nn.Module):
    """X_s [n, D] + pairs -> z_p [n, C]. Parameters ``mlp.layers.*``, ``prelu.weight`` [1]."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 3, dropout: float = 0.5, beta: float = 0.2) -> None:
        super().__init__()
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.beta = beta
        self.mlp = PReLUMLP(in_channels, hidden_channels, out_channels, num_layers, dropout)
        self.prelu = nn.PReLU()

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        self.mlp.reset_parameters()
        self.prelu.reset_parameters()

    def forward(self, x_smooth: torch.Tensor, row: torch.Tensor, col: torch.Tensor,
                prior: torch.Tensor) -> torch.Tensor:
        """Logits [n, C] propagated with signed edge relations."""
        e = self.mlp(x_smooth, self.prelu)  # [n, C]
        relation = signed_relation(e, row, col, prior, self.beta)  # [m]
        return signed_propagate(e, row, col, relation, self.prelu)
