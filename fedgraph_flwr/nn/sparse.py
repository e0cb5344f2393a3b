"""Sparse [n, n] matrices from edge lists, for fixed-graph propagation (CSR @ dense)."""

from __future__ import annotations

import warnings

import torch


def csr_matrix(row: torch.Tensor, col: torch.Tensor, values: torch.Tensor,
               num_nodes: int) -> torch.Tensor:
    """The [n, n] CSR matrix with ``values`` [m] at (``row``, ``col``) [m]; duplicate
    entries are summed. ``torch.sparse.mm(result, x)`` is then Σ_col values · x[col] per row."""
    coo = torch.sparse_coo_tensor(torch.stack([row, col]), values, (num_nodes, num_nodes),
                                  check_invariants=False).coalesce()
    with warnings.catch_warnings():  # "sparse CSR support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return coo.to_sparse_csr()
