"""FedAux's auxiliary projection: APV scores and Gaussian-kernel soft sorting.

Given node embeddings ``h`` [N, d'] and the client's auxiliary projection
vector (APV) ``a`` [d'], every node gets a 1-D score ``s_i`` (its coordinate on
the a-axis) and a smoothed embedding (Eq. 6 of the paper)::

    κ(s_i, s_j) = exp(-(s_i - s_j)² / σ²)
    z_i = Σ_j κ(s_i, s_j) h_j / Σ_j κ(s_i, s_j)        (sum over ALL N nodes)

Implementations of the smoother (all take ``s`` [N], ``h`` [N, d'] -> ``z`` [N, d']):

* ``dense``     the paper's formula with an N×N kernel; the reference, small N only.
* ``chunked``   exact; a custom autograd function that walks row blocks in the
                forward and recomputes them in the backward, so peak memory is
                O(N·d' + block·N), linear in N.
* ``chebyshev`` bounded error, O(N·r·d'): the kernel is smooth in 1-D, so a
                degree-r Chebyshev expansion on [min s, max s]² gives a rank-r
                factorisation ``K ≈ U C Uᵀ`` (U [N, r]); plain autograd.

Numerical stability: the largest exponent of row i is exactly 0 (at j = i, as
every query is also a key), so ``M_i = Σ_j κ_ij ≥ 1``; terms that underflow
(large score gaps with max-norm scores) are negligible next to κ_ii = 1. So the
usual "subtract the row max" is a no-op here and is not done.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

SCORE_MODES = ("cosine", "maxnorm")
KERNEL_IMPLS = ("auto", "dense", "chunked", "chebyshev")

# Kernel tiles hold at most this many entries (fp32: 16 MiB per temporary).
DEFAULT_BLOCK_ELEMS = 1 << 22
# Chebyshev path: coefficients below this are dropped; at most this many terms.
CHEBYSHEV_TOL = 1e-10
CHEBYSHEV_MAX_TERMS = 512


def apv_scores(h: torch.Tensor, apv: torch.Tensor, mode: str = "cosine") -> torch.Tensor:
    """Scores s [N] of embeddings h [N, d'] on the APV a [d'].

    ``cosine``: s_i = <h_i/‖h_i‖, a/‖a‖> ∈ [-1, 1] (reference code; zero rows score 0).
    ``maxnorm``: s_i = <h_i / max_j ‖h_j‖, a> (paper, Eq. 1: one scalar per client).
    """
    if mode == "cosine":
        return F.normalize(h, dim=1) @ F.normalize(apv, dim=0)
    if mode == "maxnorm":
        scale = h.norm(dim=1).max().clamp_min(1e-12)
        return (h @ apv) / scale
    raise ValueError(f"unknown score mode {mode!r}; valid: {', '.join(SCORE_MODES)}")


def kernel_weights_dense(s: torch.Tensor, sigma: float) -> torch.Tensor:
    """Row-normalised kernel β [N, N], β_ij = κ_ij / M_i (dense: small N only)."""
    kernel = torch.exp(-((s[:, None] - s[None, :]) ** 2) / sigma**2)
    return kernel / kernel.sum(dim=1, keepdim=True)


def kernel_smooth_dense(s: torch.Tensor, h: torch.Tensor, sigma: float) -> torch.Tensor:
    """Reference Eq. 6 with an explicit N×N kernel: s [N], h [N, d'] -> z [N, d']."""
    return kernel_weights_dense(s, sigma) @ h


def _block_rows(n: int, block_elems: int) -> int:
    return max(1, min(n, block_elems // max(n, 1)))


class _ChunkedKernelSmooth(torch.autograd.Function):
    """Exact Eq. 6 in row blocks; the backward recomputes each block's kernel.

    With β_ij = κ_ij / M_i, G = ∂L/∂z and D_ij = s_i − s_j:
      ∂L/∂h_j = Σ_i β_ij G_i
      ∂L/∂D_ij = β_ij ⟨G_i, h_j − z_i⟩ · (−2 D_ij / σ²)   (=: T_ij)
      ∂L/∂s_i = Σ_j T_ij − Σ_j T_ji
    """

    @staticmethod
    def forward(ctx, s: torch.Tensor, h: torch.Tensor, sigma: float, block_elems: int) -> torch.Tensor:
        n = s.numel()
        inv_var = 1.0 / float(sigma) ** 2
        rows = _block_rows(n, block_elems)
        z = torch.empty_like(h)
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            kernel = torch.exp((s[start:stop, None] - s[None, :]).square_().mul_(-inv_var))
            norm = kernel.sum(dim=1, keepdim=True)
            torch.mm(kernel, h, out=z[start:stop])
            z[start:stop].div_(norm)
        ctx.save_for_backward(s, h, z)
        ctx.inv_var = inv_var
        ctx.rows = rows
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_z: torch.Tensor):
        s, h, z = ctx.saved_tensors
        inv_var, rows = ctx.inv_var, ctx.rows
        need_s, need_h = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n = s.numel()
        grad_s = torch.zeros_like(s) if need_s else None
        grad_h = torch.zeros_like(h) if need_h else None
        grad_z = grad_z.contiguous()
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            diff = s[start:stop, None] - s[None, :]  # D [b, N]
            beta = torch.exp(diff.square().mul_(-inv_var))
            beta.div_(beta.sum(dim=1, keepdim=True))
            g_block = grad_z[start:stop]
            if need_h:
                grad_h.addmm_(beta.t(), g_block)
            if need_s:
                # T = β ⊙ (G hᵀ − <G_i, z_i>) ⊙ (−2 D / σ²), built in place to cap temporaries.
                t = torch.mm(g_block, h.t())
                t.sub_((g_block * z[start:stop]).sum(dim=1, keepdim=True))
                t.mul_(beta).mul_(diff).mul_(-2.0 * inv_var)
                grad_s[start:stop] += t.sum(dim=1)
                grad_s -= t.sum(dim=0)
        return grad_s, grad_h, None, None


def kernel_smooth_chunked(
    s: torch.Tensor, h: torch.Tensor, sigma: float, block_elems: int = DEFAULT_BLOCK_ELEMS
) -> torch.Tensor:
    """Exact Eq. 6 with peak memory linear in N: s [N], h [N, d'] -> z [N, d']."""
    return _ChunkedKernelSmooth.apply(s, h, float(sigma), int(block_elems))


def _chebyshev_coefficients(mid: float, half: float, sigma: float, r: int,
                            device: torch.device) -> torch.Tensor:
    """2-D Chebyshev coefficients c [r, r] of κ on [mid ± half]² (float64, a DCT of κ at the nodes)."""
    m = torch.arange(r, dtype=torch.float64, device=device)
    theta = math.pi * (m + 0.5) / r
    nodes = mid + half * torch.cos(theta)
    k_nodes = torch.exp(-((nodes[:, None] - nodes[None, :]) ** 2) / sigma**2)
    basis = torch.cos(m[None, :] * theta[:, None])  # T_p(t_m) [r, r]
    coef = (basis.t() @ k_nodes @ basis) * (4.0 / r**2)
    coef[0, :] /= 2
    coef[:, 0] /= 2
    return coef


def chebyshev_degree(score_range: float, sigma: float, tol: float = CHEBYSHEV_TOL) -> int:
    """Smallest number of terms r after which every coefficient of κ is below ``tol``.

    Found from the coefficients themselves (κ on a square of side ``score_range``,
    computed with a generous r), so the truncation error is controlled directly;
    r grows like e·range/σ plus a log(1/tol) term.
    """
    ratio = score_range / sigma
    r_max = min(CHEBYSHEV_MAX_TERMS, int(math.ceil(2 * math.e * ratio + 2 * math.log(1 / tol))) + 8)
    coef = _chebyshev_coefficients(0.0, score_range / 2, sigma, r_max, torch.device("cpu")).abs()
    tail = torch.maximum(coef.amax(dim=1), coef.amax(dim=0))  # per index p: max over the other index
    # suffix max: the largest coefficient at an index ≥ p
    suffix = torch.flip(torch.cummax(torch.flip(tail, [0]), 0).values, [0])
    above = (suffix >= tol).nonzero()
    return int(above.max()) + 2 if above.numel() else 2


def kernel_smooth_chebyshev(
    s: torch.Tensor, h: torch.Tensor, sigma: float, degree: int | None = None
) -> torch.Tensor:
    """Eq. 6 via a rank-r Chebyshev expansion of κ: s [N], h [N, d'] -> z [N, d'].

    κ(x, y) ≈ Σ_{p,q<r} c_pq T_p(u(x)) T_q(u(y)) on [lo, hi]² with u mapping the
    score range to [−1, 1], so z = U C (Uᵀ h) / U C (Uᵀ 1) with U [N, r].
    Cost O(N r d'), memory O(N r); exact autograd through U. The range ends are
    detached: they only move the approximation error, not the function.
    Every dropped coefficient is below ``CHEBYSHEV_TOL`` and M_i ≥ 1, so the
    relative error of z is about r²·tol (measured in benchmarks/apv_kernel.py).
    """
    lo, hi = float(s.detach().min()), float(s.detach().max())
    half = (hi - lo) / 2
    if half < 1e-12:  # all scores equal: every weight is 1, z_i = mean(h)
        return h.mean(dim=0, keepdim=True).expand_as(h)
    r = degree or chebyshev_degree(2 * half, sigma)
    if r > CHEBYSHEV_MAX_TERMS:  # score range ≫ σ: the expansion would not converge cheaply
        return kernel_smooth_chunked(s, h, sigma)
    mid = (lo + hi) / 2
    coef = _chebyshev_coefficients(mid, half, sigma, r, s.device).to(s.dtype)
    # T_p(u_i) by the three-term recurrence (differentiable in s).
    u = (s - mid) / half
    polys = [torch.ones_like(u), u]
    for _ in range(2, r):
        polys.append(2 * u * polys[-1] - polys[-2])
    basis_s = torch.stack(polys[:r], dim=1)  # U [N, r]
    ones = torch.ones(h.size(0), 1, dtype=h.dtype, device=h.device)
    projected = basis_s.t() @ torch.cat([h, ones], dim=1)  # Uᵀ[h ‖ 1]  [r, d'+1]
    smoothed = basis_s @ (coef @ projected)  # [N, d'+1]
    return smoothed[:, :-1] / smoothed[:, -1:]


def kernel_smooth(
    s: torch.Tensor,
    h: torch.Tensor,
    sigma: float,
    impl: str = "auto",
    dense_max_nodes: int = 4096,
    block_elems: int = DEFAULT_BLOCK_ELEMS,
) -> torch.Tensor:
    """Gaussian-kernel soft sorting (Eq. 6): s [N], h [N, d'] -> z [N, d'].

    ``auto`` uses the dense reference up to ``dense_max_nodes`` nodes and the
    exact chunked function above it.
    """
    if impl == "auto":
        impl = "dense" if s.numel() <= dense_max_nodes else "chunked"
    if impl == "dense":
        return kernel_smooth_dense(s, h, sigma)
    if impl == "chunked":
        return kernel_smooth_chunked(s, h, sigma, block_elems)
    if impl == "chebyshev":
        return kernel_smooth_chebyshev(s, h, sigma)
    raise ValueError(f"unknown kernel implementation {impl!r}; valid: {', '.join(KERNEL_IMPLS)}")


class HardSortConv1d(nn.Module):
    """FedAux_hard ablation (Eqs. 2–4): weight, hard-sort, Conv1D, unsort.

    h [N, d'], s [N] -> z [N, d']: the rows ``s_i · h_i`` are sorted by score,
    convolved along the sorted sequence (kernel ``kernel_size``, zero padding,
    W_τ ∈ ℝ^{d'×d'}), and put back in node order. The permutation carries no
    gradient; the APV learns through the ``s_i ·`` factor.
    """

    def __init__(self, channels: int, kernel_size: int = 3) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError("fedaux-hard-kernel must be a positive odd number")
        self.conv = nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2)

    def reset_parameters(self) -> None:
        self.conv.reset_parameters()

    def forward(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(s.detach(), stable=True)
        sequence = (h * s[:, None])[order]  # [N, d'] in score order
        out = self.conv(sequence.t().unsqueeze(0)).squeeze(0).t()
        unsort = torch.empty_like(order)
        unsort[order] = torch.arange(order.numel(), device=order.device)
        return out[unsort]
