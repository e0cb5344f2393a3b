"""Neighbourhood routing as one fused CPU kernel per iteration (large clients).

The same maths as :class:`fedgraph_flwr.nn.disengcn.NeighbourhoodRouting`'s sparse
path (:mod:`fedgraph_flwr.nn.factor_graph`): T times, for every edge (v → u) with
multiplicity w_e,

    p_ek = softmax_k(<c_u^k, z_v^k> / τ_p),   c_u^k = normalise(z_u^k + Σ_e w_e p_ek z_v^k).

The sparse path makes a dot pass (SDDMM), a softmax over an [m, K] tensor, an
aggregation pass (SpMM), an add and a normalisation: five sweeps over [n·K, d_k]
or [m, K] tensors per iteration, each a fresh allocation, and autograd's saved
intermediates on top. Here one pass per target node u does all of it: each
neighbour row z_v is read once for its K dots and, still in cache, for its K
weighted additions, then u's K blocks are normalised in place. The backward pass
(hand-written, :class:`FusedRouting`) is two passes per iteration: one over
targets (gradients of the dots and of c_u's previous value), one over sources
along the transposed CSR (the gradient reaching z_v), so every row is written by
one loop iteration only, with no scatter. The kernels are single-threaded (see
below). Timings: ``benchmarks/fediih_routing.py`` and docs/performance.md.

Sums run in another order than the sparse path's (dot products are vectorised),
so results agree to rounding, not bit for bit; that is why the sparse path stays
the default on small clients, where every published figure was made
(``fediih-routing-kernel``). Deterministic: the same inputs give the same
outputs on the same machine.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit
from torch.autograd import Function

EPS = 1e-12  # F.normalize's eps: blocks are divided by max(‖·‖, EPS)
# Sums may be reassociated (vectorised) and fused; sums run in the arrays' own dtype
# (``zero`` carries it), as the sparse path's kernels do.
_FASTMATH = True


@dataclass(frozen=True)
class RoutingGraph:
    """Unique edges (v → u) in target-major CSR order, plus the source-major order.

    ``crow`` [n+1] / ``src`` [m]: edges into u are ``crow[u]:crow[u+1]``, sorted by
    source; ``count`` [m]: multiplicity of each unique edge. Source-major: edges out of
    v are positions ``t_crow[v]:t_crow[v+1]`` with targets ``t_trg``; ``t_pos`` [m] is
    each target-major edge's source-major position (the backward pass writes per-edge
    values there, so its source pass reads them in order).
    """

    num_nodes: int
    crow: np.ndarray
    src: np.ndarray
    count: np.ndarray
    t_crow: np.ndarray
    t_trg: np.ndarray
    t_pos: np.ndarray

    @property
    def num_edges(self) -> int:
        """Number of edges."""
        return int(self.src.shape[0])


def build_routing_graph(edge_index: torch.Tensor, num_nodes: int) -> RoutingGraph:
    """The routing graph of ``edge_index`` [2, m] (row 0 = sources v, row 1 = targets u)."""
    n = int(num_nodes)
    key, count = torch.unique(edge_index[1].cpu() * n + edge_index[0].cpu(), return_counts=True)
    trg, src = key // n, key % n
    crow = torch.zeros(n + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(torch.bincount(trg, minlength=n), 0)
    t_edge = torch.argsort(src * n + trg)
    t_crow = torch.zeros(n + 1, dtype=torch.long)
    t_crow[1:] = torch.cumsum(torch.bincount(src, minlength=n), 0)
    t_pos = torch.empty_like(t_edge)
    t_pos[t_edge] = torch.arange(t_edge.numel())
    return RoutingGraph(n, crow.numpy(), src.numpy(), count.to(torch.float64).numpy(),
                        t_crow.numpy(), trg[t_edge].numpy(), t_pos.numpy())


# One graph per live edge_index tensor (every routing layer of a model reuses it); an
# entry goes when its edge_index is freed, so an id cannot be reused while it exists.
_CACHE: dict[int, tuple[int, int, RoutingGraph]] = {}


def routing_graph(edge_index: torch.Tensor, num_nodes: int) -> RoutingGraph:
    """``build_routing_graph``, cached on the identity and version of ``edge_index``."""
    key = id(edge_index)
    hit = _CACHE.get(key)
    if hit is not None and hit[:2] == (edge_index._version, num_nodes):
        return hit[2]
    graph = build_routing_graph(edge_index, num_nodes)
    if hit is None:
        weakref.finalize(edge_index, _CACHE.pop, key, None)
    _CACHE[key] = (edge_index._version, num_nodes, graph)
    return graph


# --------------------------------------------------------------------------------------
# Kernels. Arrays are [n, K, d] (node-major, as DisenGCN's [n, K·d] output), [m, K] per
# edge, [n, K] per node block. Single-threaded: a simulated ClientApp has one CPU, and
# numba's OpenMP workers spin on a second core between kernels (measured: two such
# processes on two cores took 2.4x as long each as one alone).
# --------------------------------------------------------------------------------------
@njit(cache=True, fastmath=_FASTMATH)
def _normalize_blocks(x, out, norms, zero):  # pragma: no cover - compiled
    n, k_, d = x.shape
    for u in range(n):
        for k in range(k_):
            s = zero
            for j in range(d):
                s += x[u, k, j] * x[u, k, j]
            nrm = math.sqrt(s)
            norms[u, k] = nrm
            den = max(nrm, EPS)
            for j in range(d):
                out[u, k, j] = x[u, k, j] / den


@njit(cache=True, fastmath=_FASTMATH)
def _route_forward(c, z, crow, src, count, tau, p, out, norms, zero):  # pragma: no cover - compiled
    n, k_, d = z.shape
    for u in range(n):
        logits = np.empty(k_, dtype=z.dtype)
        for k in range(k_):
            for j in range(d):
                out[u, k, j] = zero
        for e in range(crow[u], crow[u + 1]):
            v = src[e]
            for k in range(k_):
                s = zero
                for j in range(d):
                    s += c[u, k, j] * z[v, k, j]
                logits[k] = s / tau
            top = logits[0]
            for k in range(1, k_):
                top = max(top, logits[k])
            total = zero
            for k in range(k_):
                logits[k] = math.exp(logits[k] - top)
                total += logits[k]
            for k in range(k_):
                pk = logits[k] / total
                p[e, k] = pk
                w = count[e] * pk
                for j in range(d):
                    out[u, k, j] += w * z[v, k, j]
        for k in range(k_):
            s = zero
            for j in range(d):
                out[u, k, j] += z[u, k, j]
                s += out[u, k, j] * out[u, k, j]
            nrm = math.sqrt(s)
            norms[u, k] = nrm
            den = max(nrm, EPS)
            for j in range(d):
                out[u, k, j] /= den


@njit(cache=True, fastmath=_FASTMATH)
def _normalize_backward(grad, out, norms, grad_in, zero):  # pragma: no cover - compiled
    """grad_in = ∂L/∂x for out = x / max(‖x‖, EPS), per [k] block."""
    n, k_, d = out.shape
    for u in range(n):
        for k in range(k_):
            nrm = norms[u, k]
            if nrm > EPS:
                s = zero
                for j in range(d):
                    s += out[u, k, j] * grad[u, k, j]
                for j in range(d):
                    grad_in[u, k, j] = (grad[u, k, j] - out[u, k, j] * s) / nrm
            else:
                for j in range(d):
                    grad_in[u, k, j] = grad[u, k, j] / EPS


@njit(cache=True, fastmath=_FASTMATH)
def _route_backward_targets(grad_s, z, crow, src, count, tau, p, t_pos, t_weight, t_grad_logit,
                            grad_c, zero):  # pragma: no cover - compiled
    """Per target u: ∂L/∂c_u (c = the iteration's input); each edge's weight w·p and
    ∂L/∂logit stored at its source-major position for the source pass."""
    n, k_, d = z.shape
    for u in range(n):
        grad_p = np.empty(k_, dtype=z.dtype)
        for k in range(k_):
            for j in range(d):
                grad_c[u, k, j] = zero
        for e in range(crow[u], crow[u + 1]):
            v = src[e]
            mean = zero
            for k in range(k_):
                s = zero
                for j in range(d):
                    s += grad_s[u, k, j] * z[v, k, j]
                grad_p[k] = count[e] * s
                mean += p[e, k] * grad_p[k]
            t = t_pos[e]
            for k in range(k_):
                g = p[e, k] * (grad_p[k] - mean) / tau
                t_grad_logit[t, k] = g
                t_weight[t, k] = count[e] * p[e, k]
                for j in range(d):
                    grad_c[u, k, j] += g * z[v, k, j]


@njit(cache=True, fastmath=_FASTMATH)
def _route_backward_sources(grad_s, c, t_crow, t_trg, t_weight, t_grad_logit, grad_z):  # pragma: no cover
    """Per source v: grad_z[v] += Σ_(v→u) w p ∂L/∂s_u + ∂L/∂logit c_u, plus ∂L/∂s_v (self)."""
    n, k_, d = grad_s.shape
    for v in range(n):
        for k in range(k_):
            for j in range(d):
                grad_z[v, k, j] += grad_s[v, k, j]
        for t in range(t_crow[v], t_crow[v + 1]):
            u = t_trg[t]
            for k in range(k_):
                w = t_weight[t, k]
                g = t_grad_logit[t, k]
                for j in range(d):
                    grad_z[v, k, j] += w * grad_s[u, k, j] + g * c[u, k, j]


def _route(x: torch.Tensor, graph: RoutingGraph, num_factors: int, iterations: int, tau: float,
           keep: bool):
    """Run the T iterations on x [n, K·d]. Returns (the routed [n, K, d] array, what the
    backward pass needs or None). ``keep=False`` (no gradient wanted) reuses two buffers
    instead of keeping every iteration's output: large arrays are costly to allocate."""
    n, width = x.shape
    xs = x.detach().contiguous().view(n, num_factors, width // num_factors).numpy()
    scalar = xs.dtype.type  # kernels sum in the input's dtype
    count = graph.count.astype(xs.dtype, copy=False)
    z = np.empty_like(xs)
    x_norms = np.empty((n, num_factors), dtype=xs.dtype)
    _normalize_blocks(xs, z, x_norms, scalar(0))
    states, norms, weights = [z], [], []
    spare = None
    for _ in range(iterations):
        out = np.empty_like(z) if keep or spare is None else spare
        p = np.empty((graph.num_edges, num_factors), dtype=xs.dtype) if keep or not weights else weights[-1]
        nrm = np.empty((n, num_factors), dtype=xs.dtype) if keep or not norms else norms[-1]
        _route_forward(states[-1], z, graph.crow, graph.src, count, scalar(tau), p, out, nrm,
                       scalar(0))
        if keep:
            states.append(out)
            norms.append(nrm)
            weights.append(p)
        else:  # ping-pong: the previous output becomes the next spare buffer
            spare = states[-1] if len(states) > 1 else None
            states = [z, out]
            norms, weights = [nrm], [p]
    saved = (x_norms, states, norms, weights, count, scalar(tau)) if keep else None
    return states[-1], saved


class FusedRouting(Function):
    """x [n, K·d] -> routed [n, K·d] (unit-norm blocks); T iterations in fused kernels.

    Saves every iteration's output c [n, K, d], block norms and edge weights p [m, K]:
    T·n·K·d + T·m·K numbers, about what the sparse path's autograd keeps.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, graph: RoutingGraph, num_factors: int,  # type: ignore[override]
                iterations: int, tau: float) -> torch.Tensor:
        """The fused CPU routing kernel's output [n, K·d]."""
        out, ctx.saved = _route(x, graph, num_factors, iterations, tau, keep=True)
        ctx.graph = graph
        # A view of the last saved state; torch refuses in-place changes to a custom
        # Function's view output, so the state stays what backward expects.
        return torch.from_numpy(out).view(x.shape)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        """Gradient w.r.t. ``x``."""
        graph: RoutingGraph = ctx.graph
        x_norms, states, norms, weights, count, tau = ctx.saved
        z = states[0]
        n, num_factors, d = z.shape
        zero = z.dtype.type(0)
        grad = grad_out.detach().to(torch.from_numpy(z).dtype).contiguous().view(n, num_factors, d).numpy()
        grad_z = np.zeros_like(z)
        grad_s = np.empty_like(z)
        grad_c, owned = np.empty_like(z), False  # owned: ``grad`` is our buffer, not grad_out
        t_weight = np.empty((graph.num_edges, num_factors), dtype=z.dtype)
        t_grad_logit = np.empty_like(t_weight)
        for i in reversed(range(len(weights))):
            _normalize_backward(grad, states[i + 1], norms[i], grad_s, zero)
            _route_backward_targets(grad_s, z, graph.crow, graph.src, count, tau, weights[i],
                                    graph.t_pos, t_weight, t_grad_logit, grad_c, zero)
            _route_backward_sources(grad_s, states[i], graph.t_crow, graph.t_trg, t_weight,
                                    t_grad_logit, grad_z)
            # ∂L/∂(the iteration's input c) is the next step's upstream gradient; the
            # buffer of this step's (unless it is grad_out's) takes the next one's.
            grad, grad_c = grad_c, (grad if owned else np.empty_like(z))
            owned = True
        grad_z += grad  # the first iteration's input c is z itself
        grad_x = grad_s  # free by now
        _normalize_backward(grad_z, z, x_norms, grad_x, zero)
        return torch.from_numpy(grad_x).view(n, num_factors * d), None, None, None, None


def fused_routing(x: torch.Tensor, edge_index: torch.Tensor, num_factors: int, iterations: int,
                  tau: float) -> torch.Tensor:
    """Route x [n, K·d] over ``edge_index`` [2, m]; see :class:`FusedRouting`."""
    if x.device.type != "cpu":
        raise ValueError("the fused routing kernel runs on CPU; use fediih-routing-kernel=sparse "
                         "on a GPU")
    graph = routing_graph(edge_index, x.size(0))
    if torch.is_grad_enabled() and x.requires_grad:
        return FusedRouting.apply(x, graph, num_factors, iterations, tau)
    out, _ = _route(x, graph, num_factors, iterations, tau, keep=False)
    return torch.from_numpy(out).view(x.shape)


__all__ = ["FusedRouting", "RoutingGraph", "build_routing_graph", "fused_routing", "routing_graph"]
