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
* ``fast``      proven error bound, O(N·p·d') time and O(N·(p + d')) memory:
                boxes of width σ/2 on the score axis, a p-term Chebyshev
                interpolant of κ per pair of nearby boxes, far boxes dropped
                (below). ``auto`` takes it above ``dense_max_nodes`` nodes.

The ``fast`` kernel and its error bound
---------------------------------------
Cover [min s, max s] by B boxes of width w = σ/2 (half-width r = σ/4), centres
c_b. A score in box b is s = c_b + r·t with t ∈ [−1, 1]. For a target in box a
and a source in box b = a − o the kernel depends only on the offset o::

    κ = f_o(t, u) = exp(−(o·w/σ + ρ(t − u))²),   ρ = r/σ = 1/4.

Two approximations, applied to disjoint pairs (i, j):

1. Far field: pairs with |o| > m are dropped. Their scores are at least m·w
   apart, so each dropped κ_ij ≤ exp(−(m/2)²) (and σ|∂κ/∂s| ≤ m·exp(−(m/2)²)
   once m/2 ≥ 1/√2).
2. Near field: f_o is replaced by its tensor Chebyshev interpolant I_p f_o
   of p×p terms (coefficients C_o from the values at p×p Chebyshev points;
   C_o does not depend on σ or on the data). f_o is entire; on the product of
   Bernstein ellipses E_R × E_R, |Im t|, |Im u| ≤ (R − 1/R)/2, so with
   ζ = o·w/σ + ρ(t − u), |f_o| = exp(−Re ζ²) = exp((Im ζ)² − (Re ζ)²)
   ≤ M_R := exp(ρ²(R − 1/R)²),
   and the 2-D Chebyshev coefficients obey |c_kl| ≤ 4·M_R·R^{−k−l}.
   Interpolation aliases every coefficient with max(k, l) ≥ p onto one with
   k, l < p, and |T_k| ≤ 1, so for every t, u ∈ [−1, 1]::

       |f_o − I_p f_o| ≤ Σ_{max(k,l)≥p} 2|c_kl| ≤ 8·M_R·(S² − S_p²),
       S = Σ_{k≥0} R^{−k},  S_p = Σ_{k<p} R^{−k};

   and, with |T_k'| ≤ k² (Markov), for the derivative in t (σ∂/∂s = ∂/∂t / ρ)::

       |∂_t(f_o − I_p f_o)| ≤ 8·M_R·Σ_{max(k,l)≥p} k²·R^{−k−l}.

   Both are minimised over R numerically (``fast_kernel_parameters``).

So every kernel entry carries an absolute error |Δκ_ij| ≤ ε (and σ|Δ∂κ_ij/∂s_i|
≤ ε) once m and p are chosen for ε. Numerator and denominator of Eq. 6 are sums
of N entries: per feature column c, with H_c = max_j |h_jc|,

    |ΔM_i| ≤ N·ε,      |Δ(Σ_j κ_ij h_jc)| ≤ N·ε·H_c.

Since κ_ii = 1, M_i ≥ 1, and |z_ic| ≤ H_c (z_i is a convex combination), so

    |z̃_ic − z_ic| = |Δnum − z_ic·ΔM_i| / |M_i + ΔM_i| ≤ 2Nε·H_c / (1 − Nε) =: η·H_c.

``fast_kernel_parameters(N, tol)`` sets ε = η/(N(2 + η)) for η = ``tol``
(default ``FAST_TOL`` = 1e-9, four orders below the 1e-5 target so the bound
holds relative to max|z| even when max|z| ≪ max|h|), then the smallest m and p
that meet ε. For N = 169,343 that is m = 12 offsets each side and p = 21 terms.
The gradients are exact derivatives (custom backward of the box operations, the row
permutation and the final normalisation, autograd elsewhere) of the approximate kernel,
whose entries and s-derivatives are within ε of the exact ones (both bounds above);
∂L/∂h = Σ_i β_ij G_i and ∂L/∂s are again sums of N such entries over M_i ≥ 1, so the
same argument bounds their errors by O(N·ε) times max|G|·max|h| (and 1/σ for ∂s).
We do not state that constant; the gradient errors are measured instead (tests/test_apv_kernel.py,
benchmarks/apv_kernel_fast.py: ≤ 1e-11 relative in float64).
The bound is for exact arithmetic; float32 inputs are expanded in float64 by
default and z is rounded back, so float32 results differ from the float64 exact
kernel by about float32 rounding (measured ≤ 1e-7; the exact kernel run in
float32 is off by up to ~1e-5 in ∂L/∂s). Box assignment and the grid are
detached (piecewise-constant in s). Rows are sorted by box and each box is one
matmul with its [n_box, p] Chebyshev basis; above ``FAST_SEGMENT_MAX_BOXES``
boxes the same sums are scatter/gather loops over the p terms.
If the grid would hold more box-offset pairs than N nodes (σ tiny next to the
score range), ``fast`` falls back to the exact chunked kernel.

Numerical stability: the largest exponent of row i is exactly 0 (at j = i, as
every query is also a key), so ``M_i = Σ_j κ_ij ≥ 1``; terms that underflow
(large score gaps with max-norm scores) are negligible next to κ_ii = 1. So the
usual "subtract the row max" is a no-op here and is not done.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

SCORE_MODES = ("cosine", "maxnorm")
KERNEL_IMPLS = ("auto", "dense", "chunked", "chebyshev", "fast")

# Kernel tiles hold at most this many entries (fp32: 16 MiB per temporary).
DEFAULT_BLOCK_ELEMS = 1 << 22
# Chebyshev path: coefficients below this are dropped; at most this many terms.
CHEBYSHEV_TOL = 1e-10
CHEBYSHEV_MAX_TERMS = 512
# Fast path: bound η on max|z̃ − z| / max|h| per column; box width in units of σ.
FAST_TOL = 1e-9
FAST_BOX_WIDTH = 0.5
# Up to this many boxes, rows are sorted by box and each box is one matmul; above, scatter/gather.
FAST_SEGMENT_MAX_BOXES = 512


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


# --- the fast kernel: boxes on the score axis + Chebyshev interpolation per box pair ----------
def _interp_bounds(p: int, r_ell: float, rho: float) -> tuple[float, float]:
    """(value, t-derivative) bounds on |f_o − I_p f_o| for Bernstein parameter ``r_ell``."""
    m_r = math.exp(rho**2 * (r_ell - 1.0 / r_ell) ** 2)
    q = 1.0 / r_ell
    s_all = 1.0 / (1.0 - q)
    # written without cancellation: S² − S_p² = S²·q^p·(2 − q^p)
    value = 8.0 * m_r * s_all**2 * q**p * (2.0 - q**p)
    # Σ_{max(k,l)≥p} k² q^{k+l} = Σ_{k≥p} k² q^k · S + Σ_{k<p} k² q^k · q^p·S
    # Σ_{k≥p} k² q^k = q^p Σ_j (p + j)² q^j
    tail = q**p * (p * p * s_all + 2 * p * q / (1 - q) ** 2 + q * (1 + q) / (1 - q) ** 3)
    head = sum(k * k * q**k for k in range(p))
    deriv = 8.0 * m_r * (tail * s_all + head * q**p * s_all)
    return value, deriv


@functools.lru_cache(maxsize=256)
def fast_kernel_parameters(n: int, tol: float = FAST_TOL) -> tuple[int, int, float]:
    """(p terms, m offsets each side, per-entry ε) so that max|z̃ − z| ≤ tol·max|h| (exact arithmetic)."""
    eps = tol / (max(n, 1) * (2.0 + tol))
    half = FAST_BOX_WIDTH / 2.0
    m = 1
    while True:
        gap = m * FAST_BOX_WIDTH
        if gap >= 1 / math.sqrt(2) and math.exp(-gap**2) <= eps and 2 * gap * math.exp(-gap**2) <= eps:
            break
        m += 1
    rs = [1.5 + 0.25 * i for i in range(200)]
    for p in range(2, 64):
        best = min(max(v, d / half) for v, d in (_interp_bounds(p, r, half) for r in rs))
        if best <= eps:
            return p, m, eps
    raise ValueError(f"fast kernel: no expansion order meets tol={tol} for N={n}")


_FAST_COEF_CACHE: dict = {}


def _fast_offset_coefficients(p: int, m: int) -> torch.Tensor:
    """C [2m+1, p, p] (float64): Chebyshev coefficients of f_o(t, u), o = −m..m (t: rows)."""
    key = (p, m)
    if key not in _FAST_COEF_CACHE:
        k = torch.arange(p, dtype=torch.float64)
        theta = math.pi * (k + 0.5) / p
        nodes = torch.cos(theta)
        basis = torch.cos(k[None, :] * theta[:, None])  # T_k(x_m) [p nodes, p]
        rho = FAST_BOX_WIDTH / 2.0
        coefs = []
        for o in range(-m, m + 1):
            f = torch.exp(-(o * FAST_BOX_WIDTH + rho * (nodes[:, None] - nodes[None, :])) ** 2)
            c = (basis.t() @ f @ basis) * (4.0 / p**2)
            c[0, :] /= 2
            c[:, 0] /= 2
            coefs.append(c)
        _FAST_COEF_CACHE[key] = torch.stack(coefs)
    return _FAST_COEF_CACHE[key]


class _BoxMoments(torch.autograd.Function):
    """A[k, b] = Σ_{j in box b} U[j, k] · V[j]  (U [N, p], V [N, c] -> A [p, B, c])."""

    @staticmethod
    def forward(ctx, basis, values, box, nbox: int):
        p = basis.size(1)
        out = values.new_zeros(p, nbox, values.size(1))
        for k in range(p):
            out[k].index_add_(0, box, values * basis[:, k : k + 1])
        ctx.save_for_backward(basis, values, box)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        basis, values, box = ctx.saved_tensors
        need_b, need_v = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_b = torch.empty_like(basis) if need_b else None
        grad_v = torch.zeros_like(values) if need_v else None
        for k in range(basis.size(1)):
            g = grad_out[k].index_select(0, box)  # [N, c]
            if need_b:
                grad_b[:, k] = (g * values).sum(dim=1)
            if need_v:
                grad_v.addcmul_(g, basis[:, k : k + 1])
        return grad_b, grad_v, None, None


class _BoxEval(torch.autograd.Function):
    """Z[i] = Σ_k U[i, k] · L[k, box_i]  (U [N, p], L [p, B, c] -> Z [N, c])."""

    @staticmethod
    def forward(ctx, basis, local, box):
        z = local.new_zeros(basis.size(0), local.size(2))
        for k in range(basis.size(1)):
            z.addcmul_(local[k].index_select(0, box), basis[:, k : k + 1])
        ctx.save_for_backward(basis, local, box)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_z):
        basis, local, box = ctx.saved_tensors
        need_b, need_l = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_b = torch.empty_like(basis) if need_b else None
        grad_l = torch.zeros_like(local) if need_l else None
        grad_z = grad_z.contiguous()
        for k in range(basis.size(1)):
            if need_b:
                grad_b[:, k] = (grad_z * local[k].index_select(0, box)).sum(dim=1)
            if need_l:
                grad_l[k].index_add_(0, box, grad_z * basis[:, k : k + 1])
        return grad_b, grad_l, None


class _SegmentMoments(torch.autograd.Function):
    """As _BoxMoments, rows sorted by box: one matmul per non-empty box (A[:, b] = U_bᵀ V_b)."""

    @staticmethod
    def forward(ctx, basis, values, segments, nbox: int):
        out = values.new_zeros(basis.size(1), nbox, values.size(1))
        for b, lo, hi in segments:
            out[:, b] = basis[lo:hi].t() @ values[lo:hi]
        ctx.save_for_backward(basis, values)
        ctx.segments = segments
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        basis, values = ctx.saved_tensors
        need_b, need_v = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_b = torch.empty_like(basis) if need_b else None
        grad_v = torch.empty_like(values) if need_v else None
        for b, lo, hi in ctx.segments:
            g = grad_out[:, b]  # [p, c]
            if need_b:
                torch.mm(values[lo:hi], g.t(), out=grad_b[lo:hi])
            if need_v:
                torch.mm(basis[lo:hi], g, out=grad_v[lo:hi])
        return grad_b, grad_v, None, None


class _SegmentEval(torch.autograd.Function):
    """As _BoxEval, rows sorted by box: Z_b = U_b · L[:, b], one matmul per non-empty box."""

    @staticmethod
    def forward(ctx, basis, local, segments):
        z = local.new_empty(basis.size(0), local.size(2))
        for b, lo, hi in segments:
            torch.mm(basis[lo:hi], local[:, b], out=z[lo:hi])
        ctx.save_for_backward(basis, local)
        ctx.segments = segments
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_z):
        basis, local = ctx.saved_tensors
        need_b, need_l = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_b = torch.empty_like(basis) if need_b else None
        grad_l = torch.zeros_like(local) if need_l else None
        grad_z = grad_z.contiguous()
        for b, lo, hi in ctx.segments:
            if need_b:
                torch.mm(grad_z[lo:hi], local[:, b].t(), out=grad_b[lo:hi])
            if need_l:
                grad_l[:, b] = basis[lo:hi].t() @ grad_z[lo:hi]
        return grad_b, grad_l, None


class _PermutedValues(torch.autograd.Function):
    """[h[order] ‖ 1] in ``work`` dtype: h [N, d'] -> [N, d'+1] (numerator and denominator
    columns together). The backward gathers through the inverse permutation ``unsort``
    where autograd's indexing would zero-fill an [N, d'] gradient and scatter into it."""

    @staticmethod
    def forward(ctx, h, order, unsort, work):
        n, d = h.shape
        values = h.new_empty(n, d + 1, dtype=work)
        values[:, :d] = h if order is None else h.index_select(0, order)
        values[:, d] = 1
        ctx.save_for_backward(unsort)
        ctx.h_dtype = h.dtype
        return values

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_values):
        (unsort,) = ctx.saved_tensors
        grad_h = grad_values[:, :-1].to(ctx.h_dtype)
        if unsort is not None:
            grad_h = grad_h.index_select(0, unsort)
        return grad_h, None, None, None


class _Normalise(torch.autograd.Function):
    """z = out[:, :-1] / out[:, -1:] cast to ``dtype``, rows back in input order:
    out [N, d'+1] -> z [N, d']. One custom step where autograd's slices, division,
    cast and indexing each wrote another [N, d'] tensor (a third of a 35k-node
    client's kernel time)."""

    @staticmethod
    def forward(ctx, out, order, unsort, dtype):
        den = out[:, -1:]
        z = out[:, :-1] / den
        ctx.save_for_backward(z, den, order)
        z_cast = z.to(dtype)
        return z_cast if unsort is None else z_cast.index_select(0, unsort)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_z):
        z, den, order = ctx.saved_tensors
        g = grad_z if order is None else grad_z.index_select(0, order)
        g = g.to(z.dtype)
        grad_out = torch.empty(z.size(0), z.size(1) + 1, dtype=z.dtype, device=z.device)
        torch.div(g, den, out=grad_out[:, :-1])
        # ∂z_ic/∂den_i = −z_ic / den_i
        grad_out[:, -1:] = -(g * z).sum(dim=1, keepdim=True) / den
        return grad_out, None, None, None


def _chebyshev_basis(t: torch.Tensor, p: int) -> torch.Tensor:
    polys = [torch.ones_like(t), t]
    for _ in range(2, p):
        polys.append(2 * t * polys[-1] - polys[-2])
    return torch.stack(polys[:p], dim=1)


def kernel_smooth_fast(s: torch.Tensor, h: torch.Tensor, sigma: float, tol: float = FAST_TOL,
                       block_elems: int = DEFAULT_BLOCK_ELEMS, inner_float64: bool = True) -> torch.Tensor:
    """Eq. 6 with max|z̃ − z| ≤ tol·max|h| per column (see the module docstring): s [N], h [N, d'] -> z.

    O(N·p·d') time, O(N·(p + d') + B·p·d') memory, B = number of boxes of width σ/2.
    ``inner_float64``: float32 inputs are expanded in float64 and z is rounded back
    (the p-term sums lose a few bits in float32, enough to put ∂L/∂s near 1e-5;
    in float64 the float32 result is within its own rounding of the exact kernel).
    """
    work = torch.float64 if inner_float64 else s.dtype
    n = s.numel()
    p, m, _ = fast_kernel_parameters(n, tol)
    width = FAST_BOX_WIDTH * float(sigma)
    sd = s.detach()
    lo, hi = float(sd.min()), float(sd.max())
    nbox = max(1, math.ceil((hi - lo) / width))
    m = min(m, nbox - 1)
    if nbox * (2 * m + 1) > max(n, 64):  # σ tiny next to the score range: no gain, stay exact
        return kernel_smooth_chunked(s, h, sigma, block_elems)
    start = (lo + hi) / 2 - nbox * width / 2
    box = ((sd - start) / width).floor_().clamp_(0, nbox - 1).long()
    order = unsort = None
    if nbox <= FAST_SEGMENT_MAX_BOXES:  # sort rows by box: each box is a contiguous block
        box, order = torch.sort(box, stable=True)
        s = s[order]
        unsort = torch.empty_like(order)
        unsort[order] = torch.arange(n, device=order.device)
        counts = torch.bincount(box, minlength=nbox).tolist()
        ends = list(itertools.accumulate(counts))
        segments = [(b, e - c, e) for b, (c, e) in enumerate(zip(counts, ends)) if c]
    s = s.to(work)
    centre = start + (box.to(work) + 0.5) * width
    t = ((s - centre) / (width / 2)).clamp(-1.0, 1.0)  # clamp only trims rounding
    basis = _chebyshev_basis(t, p)  # [N, p]
    values = _PermutedValues.apply(h, order, unsort, work)  # [N, d'+1]
    if order is None:
        moments = _BoxMoments.apply(basis, values, box, nbox)  # [p, B, c]
    else:
        moments = _SegmentMoments.apply(basis, values, segments, nbox)
    coefs = _fast_offset_coefficients(p, m).to(device=s.device, dtype=work)  # [2m+1, p, p]
    padded = F.pad(moments, (0, 0, m, m))  # [p, B + 2m, c]
    local = None
    for o in range(-m, m + 1):
        # target box a takes source box a − o: padded index a − o + m
        term = torch.tensordot(coefs[o + m], padded[:, m - o : m - o + nbox], dims=1)
        local = term if local is None else local + term
    if order is None:
        out = _BoxEval.apply(basis, local, box)  # [N, d'+1]
    else:
        out = _SegmentEval.apply(basis, local, segments)
    return _Normalise.apply(out, order, unsort, h.dtype)


def kernel_smooth(
    s: torch.Tensor,
    h: torch.Tensor,
    sigma: float,
    impl: str = "auto",
    dense_max_nodes: int = 4096,
    block_elems: int = DEFAULT_BLOCK_ELEMS,
) -> torch.Tensor:
    """Gaussian-kernel soft sorting (Eq. 6): s [N], h [N, d'] -> z [N, d'].

    ``auto`` uses the exact dense reference up to ``dense_max_nodes`` nodes (every
    published FedAux number) and the ``fast`` kernel (error ≤ FAST_TOL·max|h|)
    above it; ``chunked`` is the exact kernel at any size.
    """
    if impl == "auto":
        impl = "dense" if s.numel() <= dense_max_nodes else "fast"
    if impl == "dense":
        return kernel_smooth_dense(s, h, sigma)
    if impl == "chunked":
        return kernel_smooth_chunked(s, h, sigma, block_elems)
    if impl == "chebyshev":
        return kernel_smooth_chebyshev(s, h, sigma)
    if impl == "fast":
        return kernel_smooth_fast(s, h, sigma, block_elems=block_elems)
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
        """Re-initialise every parameter as at construction."""
        self.conv.reset_parameters()

    def forward(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """FedAux_hard: Conv1D over the nodes sorted by score ``s``, in the original order."""
        order = torch.argsort(s.detach(), stable=True)
        sequence = (h * s[:, None])[order]  # [N, d'] in score order
        out = self.conv(sequence.t().unsqueeze(0)).squeeze(0).t()
        unsort = torch.empty_like(order)
        unsort[order] = torch.arange(order.numel(), device=order.device)
        return out[unsort]
