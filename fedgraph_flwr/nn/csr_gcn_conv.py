"""GCNConv whose CSR propagation keeps the adjacency's transpose for the backward.

On a sparse CSR ``adj_t`` PyG's GCNConv propagates with ``torch.sparse.mm``, whose
backward transposes the CSR matrix again at every step. A large FedAux client (issue
#29) passes a CSR adjacency that does not change while it trains, and GCN's symmetric
normalisation of an undirected graph is its own transpose, so the transpose is worked
out once per adjacency (the adjacency itself when it is symmetric) and the backward is
one more sparse product. Same products, same sums: the results are bit-identical to
GCNConv's (``tests/test_fedaux.py``). ``edge_index`` inputs take GCNConv's path unchanged.
"""

from __future__ import annotations

import warnings

import torch
from torch.autograd.function import once_differentiable
from torch_geometric.nn import GCNConv


class _ConstantAdjacencySpmm(torch.autograd.Function):
    """adj [n, n] (constant) @ x [n, d] -> [n, d]; backward adjᵀ @ grad with adjᵀ given."""

    @staticmethod
    def forward(ctx, adj, adj_transposed, x):
        ctx.adj_transposed = adj_transposed
        return torch.sparse.mm(adj, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return None, None, torch.sparse.mm(ctx.adj_transposed, grad)


def csr_transpose(adj: torch.Tensor) -> torch.Tensor:
    """adjᵀ as a CSR matrix: ``adj`` itself when it is symmetric, entry for entry."""
    with warnings.catch_warnings():  # torch: "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        transposed = adj.t().to_sparse_csr()
    if (torch.equal(transposed.crow_indices(), adj.crow_indices())
            and torch.equal(transposed.col_indices(), adj.col_indices())
            and torch.equal(transposed.values(), adj.values())):
        return adj
    return transposed


class CSRGCNConv(GCNConv):
    """:class:`~torch_geometric.nn.GCNConv`, x [n, in_channels], edge_index [2, m] or a
    CSR ``adj_t`` [n, n] -> [n, out_channels]; for a CSR ``adj_t`` the backward of the
    propagation reuses a transpose kept per adjacency (``_cached_transpose``, cleared
    with GCNConv's own caches)."""

    _cached_transpose: tuple[torch.Tensor, torch.Tensor] | None = None

    def reset_parameters(self) -> None:  # GCNConv's __init__ calls it
        """GCNConv's initialisation; drops the cached transpose."""
        super().reset_parameters()
        self._cached_transpose = None

    def message_and_aggregate(self, adj_t, x: torch.Tensor) -> torch.Tensor:
        """Â·x with the cached CSR transpose for the backward pass."""
        if (not isinstance(adj_t, torch.Tensor) or adj_t.layout != torch.sparse_csr
                or adj_t.requires_grad):
            return super().message_and_aggregate(adj_t, x)
        cached = self._cached_transpose
        if cached is None or cached[0] is not adj_t:
            cached = self._cached_transpose = (adj_t, csr_transpose(adj_t))
        return _ConstantAdjacencySpmm.apply(adj_t, cached[1], x)
