"""Per-factor edge operations for neighbourhood routing, as sparse CSR kernels.

Routing needs two edge operations per iteration, for every edge (v → u) and
factor k:

- dots: ``<c_u^k, z_v^k>`` (an SDDMM);
- aggregation: ``Σ_v p_vk z_v^k`` into u (an SpMM with per-edge weights).

Written with ``z[src]`` gathers they materialise several [m, K, d_k] tensors per
iteration (and keep them for backward), which dominated FedIIH's round time.
Here node u's factor k is row ``u·K + k`` of a block-diagonal "factor graph" with
m·K entries, so both operations become one sparse CSR call on [n·K, d_k]
matrices (``torch.sparse.sampled_addmm`` and CSR @ dense), each with a
hand-written backward expressed in the other. Per-row sums run in one fixed
order, so results are deterministic on CPU.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass

import torch
from torch.autograd import Function


@dataclass(frozen=True)
class FactorGraph:
    """The edge list with every node split into K factor rows (u, k) → ``u·K + k``.

    Unique edges are kept once with their multiplicity ``count`` [m'], so
    duplicates still count as often as they occur. Entries are laid out "flat"
    as [m', K] (edge-major, as the softmax over factors wants) and reordered
    into CSR order with ``order`` (rows = targets) or ``t_order`` (the
    transpose, rows = sources).
    """

    num_rows: int  # n·K
    num_factors: int
    count: torch.Tensor  # [m'] float, multiplicity of each unique edge
    order: torch.Tensor  # [m'·K] flat index of each CSR entry
    inv_order: torch.Tensor  # [m'·K] CSR position of each flat entry
    crow: torch.Tensor
    col: torch.Tensor
    t_order: torch.Tensor  # [m'·K] flat index of each transposed-CSR entry
    t_crow: torch.Tensor
    t_col: torch.Tensor

    @property
    def num_edges(self) -> int:
        """Number of edges."""
        return int(self.count.numel())

    def csr(self, flat_values: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        """The [n·K, n·K] CSR matrix with ``flat_values`` [m'·K] at the entries."""
        if transpose:
            return self._compressed(self.t_crow, self.t_col, flat_values[self.t_order])
        return self._compressed(self.crow, self.col, flat_values[self.order])

    def _compressed(self, crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():  # "sparse CSR support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(crow, col, values, (self.num_rows, self.num_rows),
                                           check_invariants=False)

    def dots(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """[m', K]: entry (e, k) = <rows[u·K+k], cols[v·K+k]> for edge e = (v → u)."""
        # The sparsity pattern only: all-ones values need no reordering into CSR order.
        pattern = self._compressed(self.crow, self.col, rows.new_ones(self.col.numel()))
        values = torch.sparse.sampled_addmm(pattern, rows, cols.T, beta=0.0).values()
        return values[self.inv_order].view(self.num_edges, self.num_factors)

    def aggregate(self, weights: torch.Tensor, x: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        """[n·K, d]: row u·K+k = Σ_{(v→u)} weights[e, k] · x[v·K+k] (sources ↔ targets if transpose)."""
        return self.csr(weights.reshape(-1), transpose) @ x


def build_factor_graph(edge_index: torch.Tensor, num_nodes: int, num_factors: int) -> FactorGraph:
    """The factor graph of ``edge_index`` [2, m] (row 0 = sources v, row 1 = targets u)."""
    device = edge_index.device
    n, k = int(num_nodes), int(num_factors)
    key, count = torch.unique(edge_index[1] * n + edge_index[0], return_counts=True)
    trg, src = key // n, key % n
    factor = torch.arange(k, device=device)
    rows = (trg[:, None] * k + factor).reshape(-1)  # flat [m'·K]
    cols = (src[:, None] * k + factor).reshape(-1)
    num_rows = n * k

    def compressed(major: torch.Tensor, minor: torch.Tensor):
        order = torch.argsort(major * num_rows + minor)
        crow = torch.zeros(num_rows + 1, dtype=torch.long, device=device)
        crow[1:] = torch.cumsum(torch.bincount(major, minlength=num_rows), 0)
        return order, crow, minor[order]

    order, crow, col = compressed(rows, cols)
    t_order, t_crow, t_col = compressed(cols, rows)
    inv_order = torch.empty_like(order)
    inv_order[order] = torch.arange(order.numel(), device=device)
    return FactorGraph(num_rows, k, count.to(torch.get_default_dtype()), order, inv_order,
                       crow, col, t_order, t_crow, t_col)


# One graph per live edge_index tensor (every routing layer of a model reuses it). An
# entry is dropped when its edge_index is freed, so memory follows the clients' data,
# and an id can never be reused while its entry exists.
_CACHE: dict[int, tuple[int, int, int, FactorGraph]] = {}


def factor_graph(edge_index: torch.Tensor, num_nodes: int, num_factors: int) -> FactorGraph:
    """``build_factor_graph``, cached on the identity and version of ``edge_index``."""
    key = id(edge_index)
    hit = _CACHE.get(key)
    if hit is not None and hit[:3] == (edge_index._version, num_nodes, num_factors):
        return hit[3]
    graph = build_factor_graph(edge_index, num_nodes, num_factors)
    if hit is None:
        weakref.finalize(edge_index, _CACHE.pop, key, None)
    _CACHE[key] = (edge_index._version, num_nodes, num_factors, graph)
    return graph


class EdgeDots(Function):
    """dots[e, k] = <c[u·K+k], z[v·K+k]>; c, z [n·K, d] -> [m', K]."""

    @staticmethod
    def forward(ctx, c: torch.Tensor, z: torch.Tensor, graph: FactorGraph) -> torch.Tensor:  # type: ignore[override]
        """Per-edge dot products of ``c`` and ``z``."""
        ctx.save_for_backward(c, z)
        ctx.graph = graph
        return graph.dots(c, z)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        """Gradients w.r.t. ``c`` and ``z``."""
        c, z = ctx.saved_tensors
        graph: FactorGraph = ctx.graph
        grad = grad.contiguous()
        grad_c = graph.aggregate(grad, z) if ctx.needs_input_grad[0] else None
        grad_z = graph.aggregate(grad, c, transpose=True) if ctx.needs_input_grad[1] else None
        return grad_c, grad_z, None


class EdgeAggregate(Function):
    """out[u·K+k] = Σ_{(v→u)} w[e, k] · z[v·K+k]; w [m', K], z [n·K, d] -> [n·K, d]."""

    @staticmethod
    def forward(ctx, weights: torch.Tensor, z: torch.Tensor, graph: FactorGraph) -> torch.Tensor:  # type: ignore[override]
        """Per-node sums of the edges' ``weights``-scaled ``z``."""
        ctx.save_for_backward(weights, z)
        ctx.graph = graph
        return graph.aggregate(weights, z)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        """Gradients w.r.t. ``weights`` and ``z``."""
        weights, z = ctx.saved_tensors
        graph: FactorGraph = ctx.graph
        grad = grad.contiguous()
        grad_w = graph.dots(grad, z) if ctx.needs_input_grad[0] else None
        grad_z = graph.aggregate(weights, grad, transpose=True) if ctx.needs_input_grad[1] else None
        return grad_w, grad_z, None


__all__ = ["EdgeAggregate", "EdgeDots", "FactorGraph", "build_factor_graph", "factor_graph"]
