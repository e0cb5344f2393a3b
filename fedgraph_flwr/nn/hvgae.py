"""FedIIH's hierarchical variational graph autoencoder (HVGAE), docs/reading/fediih.md §3.

Pieces, each usable alone:

- :class:`VariationalRoutingBranches`: the parameter-free μ- and σ-branches
  (routing layers on the DisenGCN trunk output); the σ-branch output is read as a
  log-variance (released code, docs/reading/fediih.md §9.7).
- :func:`reparameterize`: H̃ = μ + ε ⊙ exp(ℓ/2).
- :func:`reconstruction_loss`: mean over all n² pairs of
  BCEWithLogits(r_iᵀ r_j, A_ij) (inner-product decoder, diagonal included, no
  pos_weight), computed ``"dense"`` (n×n, small graphs only), ``"blockwise"``
  (exact, O(block·n) memory, custom backward) or ``"sampled"`` (unbiased
  estimate from uniformly sampled columns; edges exact).
- :func:`hvgae_loss`: the released code's loss (docs/reading/fediih.md §3.7) with the learnable
  local factor means α̂ [K, d_k] and the server's global means α̃ [K, d_k].
- :func:`standard_prior_loss` and :func:`graph_autoencoder_loss`: the ablations'
  losses without the hierarchical prior ("w/o HM") and without variational
  inference ("w/o VI"), docs/reading/fediih.md §9.18.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.utils import coalesce, to_dense_adj

from .disengcn import NeighbourhoodRouting, activation, uses_fused_routing

SIGMA2_H = 0.25  # prior variance of p(H̃^k | α^k) and of the α̂/α̃ KL (released code)
SIGMA2_ALPHA = 1.0  # prior variance of p(α^k)
RECON_METHODS = ("dense", "blockwise", "sampled")
_BLOCK_ELEMENTS = 1 << 24  # auto block size: ~16M logits (64 MB fp32) per block


class VariationalRoutingBranches(nn.Module):
    """μ- and σ-branches: two separate stacks of routing layers, no parameters.

    h [n, K·d_k] (trunk output), edge_index [2, m] -> (μ, ℓ), each [n, K, d_k];
    every routing layer is followed by LeakyReLU → dropout, as in the trunk.
    """

    def __init__(self, num_factors: int, num_layers: int, iterations: int,
                 dropout: float = 0.0, routing_tau: float = 1.0,
                 routing_kernel: str = "auto") -> None:
        super().__init__()
        self.num_factors = num_factors
        self.dropout = dropout
        self.routing_kernel = routing_kernel
        self.mu_layers = nn.ModuleList(
            NeighbourhoodRouting(num_factors, iterations, routing_tau, routing_kernel)
            for _ in range(num_layers))
        self.logvar_layers = nn.ModuleList(
            NeighbourhoodRouting(num_factors, iterations, routing_tau, routing_kernel)
            for _ in range(num_layers))

    def reset_parameters(self) -> None:
        """Nothing to reset: routing has no parameters."""

    def _branch(self, layers: nn.ModuleList, h: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        fused = uses_fused_routing(self.routing_kernel, h)
        for layer in layers:
            h = activation(layer(h, edge_index), self.dropout, self.training, fused)
        return h.view(h.size(0), self.num_factors, -1)

    def forward(self, h: torch.Tensor, edge_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(μ, log σ²) of the latent factors."""
        return self._branch(self.mu_layers, h, edge_index), self._branch(self.logvar_layers, h, edge_index)

    def mean(self, h: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """μ [n, K, d_k] alone: the deterministic encoder of the "w/o VI" ablation."""
        return self._branch(self.mu_layers, h, edge_index)


def reparameterize(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """H̃ = μ + ε ⊙ exp(ℓ/2), ε ~ N(0, I); any shape (torch's global RNG)."""
    return mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)


def kl_diag_to_isotropic(mu: torch.Tensor, logvar: torch.Tensor, prior_mean: torch.Tensor,
                         prior_var: float = SIGMA2_H) -> torch.Tensor:
    """Elementwise KL(N(μ, e^ℓ) ‖ N(a, s²)) = −½(1 + ℓ − log s² − ((μ−a)² + e^ℓ)/s²).

    Shapes broadcast (e.g. μ, ℓ [n, K, d_k] against a [K, d_k]).
    """
    return -0.5 * (1.0 + logvar - math.log(prior_var)
                   - ((mu - prior_mean) ** 2 + logvar.exp()) / prior_var)


def log_standard_normal(x: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; 0, 1)."""
    return -0.5 * math.log(2 * math.pi) - 0.5 * x ** 2


def unique_edges(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """The support of A as a de-duplicated [2, m'] edge list (self-loops kept)."""
    return coalesce(edge_index, num_nodes=num_nodes)


def _softplus(logits: torch.Tensor) -> torch.Tensor:
    """softplus(l) = BCEWithLogits(l, 0), in the same stable form torch's BCE uses."""
    return logits.clamp(min=0) + torch.log1p(torch.exp(-logits.abs()))


def edge_logit_sum(h: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Σ_{(i,j)∈A} h_iᵀ h_j = Σ_i h_iᵀ (A h)_i via a sparse matmul (no [m, D] gather).

    h [n, D], edges [2, m'] de-duplicated -> scalar.
    """
    n = h.size(0)
    adj = torch.sparse_coo_tensor(edges, h.new_ones(edges.size(1)), (n, n),
                                  is_coalesced=True, check_invariants=False)
    return (h * torch.sparse.mm(adj, h)).sum()


def _block_rows(n: int, block_rows: int) -> int:
    return block_rows if block_rows > 0 else max(1, min(n, _BLOCK_ELEMENTS // max(n, 1)))


class _PairwiseSoftplusSum(torch.autograd.Function):
    """Σ_{i,j} softplus(h_iᵀ h_j) over all n² pairs without an n×n tensor.

    Forward and backward both walk row blocks [B, n]; the gradient uses the
    symmetry of the logits: ∂/∂h_a = 2 Σ_j σ(h_aᵀ h_j) h_j.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, block_rows: int) -> torch.Tensor:  # type: ignore[override]
        n = h.size(0)
        total = h.new_zeros(())
        for start in range(0, n, block_rows):
            total = total + _softplus(h[start:start + block_rows] @ h.T).sum()
        ctx.save_for_backward(h)
        ctx.block_rows = block_rows
        return total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        (h,) = ctx.saved_tensors
        grad = torch.empty_like(h)
        for start in range(0, h.size(0), ctx.block_rows):
            stop = start + ctx.block_rows
            grad[start:stop] = torch.sigmoid(h[start:stop] @ h.T) @ h
        return 2.0 * grad_out * grad, None


def pairwise_softplus_sum(h: torch.Tensor, block_rows: int = 0) -> torch.Tensor:
    """Σ_{i,j∈[n]} softplus(h_iᵀ h_j), exact, O(block_rows·n) memory; h [n, D] -> scalar."""
    return _PairwiseSoftplusSum.apply(h, _block_rows(h.size(0), block_rows))


def reconstruction_loss(
    h: torch.Tensor,
    edge_index: torch.Tensor,
    method: str = "dense",
    num_columns: int = 256,
    block_rows: int = 0,
) -> torch.Tensor:
    """mean_{i,j∈[n]} BCEWithLogits(h_iᵀ h_j, A_ij); h [n, D], edge_index [2, m] -> scalar.

    Uses BCE(l, a) = softplus(l) − a·l, so the loss is
    (Σ_{all pairs} softplus(l_ij) − Σ_{(i,j)∈A} l_ij) / n². The edge sum is always
    exact (sparse matmul); the all-pairs sum is:

    - ``"dense"``: the released code's form (n×n logits and target): small graphs only.
    - ``"blockwise"``: exact, row blocks of ``block_rows`` (0 = ~16M logits per block).
    - ``"sampled"``: estimated from ``num_columns`` uniformly drawn columns (all
      rows), scaled by n/c: unbiased, O(n·c) memory; exact when ``num_columns >= n``.
    """
    n = h.size(0)
    if method == "dense":
        target = to_dense_adj(edge_index, max_num_nodes=n)[0].clamp(max=1.0).to(h.dtype)
        return F.binary_cross_entropy_with_logits(h @ h.T, target)
    edge_sum = edge_logit_sum(h, unique_edges(edge_index, n))
    if method == "blockwise":
        return (pairwise_softplus_sum(h, block_rows) - edge_sum) / (n * n)
    if method == "sampled":
        # Uniform random subset C of c columns (no replacement), shared by all rows:
        # Σ_{i,j} softplus(l_ij) ≈ n/c Σ_i Σ_{j∈C} softplus(l_ij) (unbiased); one [n, c]
        # matmul instead of n² logits, memory O(n·c) independent of D.
        c = min(n, max(1, num_columns))
        cols = torch.randperm(n, device=h.device)[:c]
        sampled_sum = _softplus(h @ h[cols].T).sum() * (n / c)
        return (sampled_sum - edge_sum) / (n * n)
    raise ValueError(f"unknown reconstruction method {method!r}; valid: {', '.join(RECON_METHODS)}")


def resolve_recon_method(method: str, num_nodes: int, dense_max_nodes: int,
                         needs_gradient: bool = True) -> str:
    """``"auto"``: dense up to ``dense_max_nodes`` nodes; above, blockwise (exact) when the
    term's gradient trains something, else sampled (it is then only a logged value)."""
    if method == "auto":
        if num_nodes <= dense_max_nodes:
            return "dense"
        return "blockwise" if needs_gradient else "sampled"
    if method not in RECON_METHODS:
        raise ValueError(f"unknown fediih-recon {method!r}; valid: auto, {', '.join(RECON_METHODS)}")
    return method


def hvgae_loss(
    mu: torch.Tensor,
    logvar: torch.Tensor,
    alpha_local: torch.Tensor,
    alpha_global: torch.Tensor,
    edge_index: torch.Tensor,
    recon_method: str = "dense",
    num_columns: int = 256,
    block_rows: int = 0,
) -> dict[str, torch.Tensor]:
    """The released code's L_HVGAE (docs/reading/fediih.md §3.7); every term has weight 1.

    mu, logvar [n, K, d_k]; alpha_local α̂ [K, d_k] (learnable); alpha_global α̃
    [K, d_k] (from the server). Returns the terms and ``"loss"``:

    - ``log_prior``: Σ_k mean_j log N(α̂^k_j; 0, 1), *added* as the code does (docs/reading/fediih.md §9.9);
    - ``kl_alpha``: Σ_k mean_j KL(N(α̂, s²) ‖ N(α̃, s²)) = Σ_k mean 2(α̂−α̃)²;
    - ``kl_data``: Σ_k mean_{i,j} KL(N(μ^k_ij, e^ℓ) ‖ N(α̂^k_j, s²)) (α̂ as prior mean,
      docs/reading/fediih.md §3.7);
    - ``recon``: mean over n² pairs of BCE(H̃_i ᵀ H̃_j, A_ij), H̃ reparameterised.
    """
    log_prior = log_standard_normal(alpha_local).mean(-1).sum()
    kl_alpha = kl_diag_to_isotropic(alpha_local, torch.full_like(alpha_local, math.log(SIGMA2_H)),
                                    alpha_global).mean(-1).sum()
    kl_data = kl_diag_to_isotropic(mu, logvar, alpha_local).mean(dim=(0, 2)).sum()
    sample = reparameterize(mu, logvar).reshape(mu.size(0), -1)  # r_i = concat_k H̃_i^k
    recon = reconstruction_loss(sample, edge_index, recon_method, num_columns, block_rows)
    loss = log_prior + kl_alpha + kl_data + recon
    return {"loss": loss, "log_prior": log_prior, "kl_alpha": kl_alpha,
            "kl_data": kl_data, "recon": recon}


def standard_prior_loss(
    mu: torch.Tensor,
    logvar: torch.Tensor,
    edge_index: torch.Tensor,
    recon_method: str = "dense",
    num_columns: int = 256,
    block_rows: int = 0,
) -> dict[str, torch.Tensor]:
    """"w/o HM": :func:`hvgae_loss` with the prior N(0, I) in place of N(α̂, s²), no α̂, α̃.

    ``kl_data`` = Σ_k mean_{i,j} KL(N(μ^k_ij, e^ℓ) ‖ N(0, 1)); ``recon`` as in
    :func:`hvgae_loss`, from the same reparameterised sample (same RNG draws).
    """
    kl_data = kl_diag_to_isotropic(mu, logvar, mu.new_zeros(()), prior_var=1.0).mean(dim=(0, 2)).sum()
    sample = reparameterize(mu, logvar).reshape(mu.size(0), -1)
    recon = reconstruction_loss(sample, edge_index, recon_method, num_columns, block_rows)
    return {"loss": kl_data + recon, "kl_data": kl_data, "recon": recon}


def graph_autoencoder_loss(
    mu: torch.Tensor,
    edge_index: torch.Tensor,
    recon_method: str = "dense",
    num_columns: int = 256,
    block_rows: int = 0,
) -> dict[str, torch.Tensor]:
    """"w/o VI": the reconstruction term on μ [n, K, d_k] itself: no σ, no sample, no KL."""
    recon = reconstruction_loss(mu.reshape(mu.size(0), -1), edge_index, recon_method,
                                num_columns, block_rows)
    return {"loss": recon, "recon": recon}


__all__ = [
    "RECON_METHODS", "SIGMA2_ALPHA", "SIGMA2_H", "VariationalRoutingBranches", "hvgae_loss",
    "graph_autoencoder_loss", "standard_prior_loss",
    "edge_logit_sum", "kl_diag_to_isotropic", "log_standard_normal", "pairwise_softplus_sum",
    "reconstruction_loss", "reparameterize", "resolve_recon_method",
    "unique_edges",
]
