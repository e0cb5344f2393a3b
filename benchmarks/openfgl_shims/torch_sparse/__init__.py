"""A minimal pure-torch stand-in for ``torch_sparse`` (no wheels for torch 2.13).

It provides only what PyG 2.8.1's legacy ``torch_geometric.loader.NeighborSampler`` needs
(OpenFGL 1.1.0's FedDEP uses it): ``SparseTensor(row=, col=, value=, sparse_sizes=)``,
``.t()``, ``.storage.rowptr()/.value()``, ``.nnz()``, ``.sparse_size(i)``, ``.sparse_sizes()``,
``.set_value(_)``, ``.coo()``, ``.csr()``, ``.to()`` and ``.sample_adj()`` with
torch_sparse's semantics (``torch_sparse/sample.py`` + ``csrc/cpu/sample_cpu.cpp``):

* for each node of ``subset``, in order, up to ``num_neighbors`` of its columns are drawn
  uniformly without replacement (all of them if it has fewer; ``-1``: all);
* ``n_id`` = ``subset`` followed by the newly seen column ids, in order of first appearance;
* the returned ``adj_t`` has size ``[len(subset), len(n_id)]``, rows = positions in
  ``subset``, cols = positions in ``n_id``, sorted by row then col, value = the sampled
  entries' values (NeighborSampler's edge ids).

The draws come from a private ``torch.Generator`` seeded from ``torch.initial_seed()`` on
first use: torch_sparse draws with C ``rand()`` and never touches torch's global RNG, so
neither does this (and a seeded run is reproducible, which torch_sparse's is not). The
within-row draw order differs from torch_sparse's (an ``unordered_set``), so the order of
new ids in ``n_id`` can differ; the sampled distribution is the same.

Anything else of torch_sparse's API (matmul, fill_diag, ...) is absent on purpose: a caller
needing it fails loudly instead of running on a partial emulation.
"""

from __future__ import annotations

import torch
from torch import Tensor

__version__ = "0.6.18+shim"

_generator: torch.Generator | None = None


def _rng() -> torch.Generator:
    global _generator
    if _generator is None:
        _generator = torch.Generator().manual_seed(torch.initial_seed())
    return _generator


def _ptr(row: Tensor, n: int) -> Tensor:
    out = torch.zeros(n + 1, dtype=torch.long, device=row.device)
    out[1:] = torch.cumsum(torch.bincount(row, minlength=n), 0)
    return out


class SparseStorage:
    def __init__(self, row: Tensor | None = None, rowptr: Tensor | None = None,
                 col: Tensor | None = None, value: Tensor | None = None,
                 sparse_sizes: tuple[int | None, int | None] | None = None,
                 is_sorted: bool = False, trust_data: bool = False, **_ignored):
        assert col is not None and (row is not None or rowptr is not None)
        col = col.long()
        if row is None:
            row = torch.repeat_interleave(torch.arange(rowptr.numel() - 1, device=col.device),
                                          rowptr.diff())
        row = row.long()
        m, n = sparse_sizes if sparse_sizes is not None else (None, None)
        if m is None:
            m = rowptr.numel() - 1 if rowptr is not None else (int(row.max()) + 1 if row.numel() else 0)
        if n is None:
            n = int(col.max()) + 1 if col.numel() else 0
        if not is_sorted:  # torch_sparse sorts by (row, col)
            perm = torch.argsort(row * max(n, 1) + col, stable=True)
            row, col = row[perm], col[perm]
            value = value[perm] if value is not None else None
        self._row, self._col, self._value = row, col, value
        self._sizes = (int(m), int(n))
        self._rowptr = _ptr(row, int(m))

    def row(self) -> Tensor:
        return self._row

    def col(self) -> Tensor:
        return self._col

    def rowptr(self) -> Tensor:
        return self._rowptr

    def value(self) -> Tensor | None:
        return self._value

    def has_value(self) -> bool:
        return self._value is not None

    def sparse_sizes(self) -> tuple[int, int]:
        return self._sizes

    def sparse_size(self, dim: int) -> int:
        return self._sizes[dim]

    def rowcount(self) -> Tensor:
        return self._rowptr.diff()

    def set_value_(self, value: Tensor | None, layout: str | None = None) -> SparseStorage:
        assert layout in (None, "coo"), "only coo-ordered values are supported"
        self._value = value
        return self

    def set_value(self, value: Tensor | None, layout: str | None = None) -> SparseStorage:
        return SparseStorage(row=self._row, col=self._col, value=value,
                             sparse_sizes=self._sizes, is_sorted=True).set_value_(value, layout)


class SparseTensor:
    def __init__(self, row: Tensor | None = None, rowptr: Tensor | None = None,
                 col: Tensor | None = None, value: Tensor | None = None,
                 sparse_sizes: tuple[int | None, int | None] | None = None,
                 is_sorted: bool = False, trust_data: bool = False):
        self.storage = SparseStorage(row=row, rowptr=rowptr, col=col, value=value,
                                     sparse_sizes=sparse_sizes, is_sorted=is_sorted)

    @classmethod
    def from_storage(cls, storage: SparseStorage) -> SparseTensor:
        out = cls.__new__(cls)
        out.storage = storage
        return out

    @classmethod
    def from_edge_index(cls, edge_index: Tensor, edge_attr: Tensor | None = None,
                        sparse_sizes=None, is_sorted: bool = False,
                        trust_data: bool = False) -> SparseTensor:
        return cls(row=edge_index[0], col=edge_index[1], value=edge_attr,
                   sparse_sizes=sparse_sizes, is_sorted=is_sorted)

    # -- sizes ------------------------------------------------------------------------------
    def nnz(self) -> int:
        return self.storage.col().numel()

    def sparse_sizes(self) -> tuple[int, int]:
        return self.storage.sparse_sizes()

    def sparse_size(self, dim: int) -> int:
        return self.storage.sparse_size(dim)

    def size(self, dim: int) -> int:
        return self.sparse_sizes()[dim]

    def sizes(self):
        return list(self.sparse_sizes())

    def dim(self) -> int:
        return 2

    def has_value(self) -> bool:
        return self.storage.has_value()

    def is_cuda(self) -> bool:
        return self.storage.col().is_cuda

    def device(self):
        return self.storage.col().device

    def requires_grad(self) -> bool:
        value = self.storage.value()
        return value is not None and value.requires_grad

    # -- layouts ----------------------------------------------------------------------------
    def coo(self) -> tuple[Tensor, Tensor, Tensor | None]:
        return self.storage.row(), self.storage.col(), self.storage.value()

    def csr(self) -> tuple[Tensor, Tensor, Tensor | None]:
        return self.storage.rowptr(), self.storage.col(), self.storage.value()

    def set_value(self, value: Tensor | None, layout: str | None = None) -> SparseTensor:
        return SparseTensor.from_storage(self.storage.set_value(value, layout))

    def set_value_(self, value: Tensor | None, layout: str | None = None) -> SparseTensor:
        self.storage.set_value_(value, layout)
        return self

    def t(self) -> SparseTensor:
        row, col, value = self.coo()
        m, n = self.sparse_sizes()
        return SparseTensor(row=col, col=row, value=value, sparse_sizes=(n, m))

    def to(self, *args, **kwargs) -> SparseTensor:
        row, col, value = self.coo()
        device_only = [a for a in args if not isinstance(a, torch.dtype)]
        row, col = row.to(*device_only, **{k: v for k, v in kwargs.items() if k != "dtype"}), \
            col.to(*device_only, **{k: v for k, v in kwargs.items() if k != "dtype"})
        if value is not None:
            value = value.to(*args, **kwargs)
        return SparseTensor(row=row, col=col, value=value, sparse_sizes=self.sparse_sizes(),
                            is_sorted=True)

    def cpu(self) -> SparseTensor:
        return self.to("cpu")

    # -- sampling ---------------------------------------------------------------------------
    def sample_adj(self, subset: Tensor, num_neighbors: int,
                   replace: bool = False) -> tuple[SparseTensor, Tensor]:
        if replace:
            raise NotImplementedError("torch_sparse shim: sample_adj(replace=True)")
        rowptr, col, value = self.csr()
        subset = subset.long().view(-1)
        num_rows = subset.numel()
        start = rowptr[subset]
        deg = rowptr[subset + 1] - start
        total = int(deg.sum())
        local_row = torch.repeat_interleave(torch.arange(num_rows), deg)
        offset = torch.arange(total) - torch.repeat_interleave(torch.cumsum(deg, 0) - deg, deg)
        e_id = torch.repeat_interleave(start, deg) + offset  # candidate entries, by row
        if 0 <= num_neighbors and bool((deg > num_neighbors).any()):
            # uniform without replacement: random keys, keep each row's num_neighbors lowest
            keys = torch.rand(total, generator=_rng(), dtype=torch.float64)
            order = torch.argsort(local_row.double() + keys, stable=True)
            rank = torch.empty(total, dtype=torch.long)
            rank[order] = offset  # order keeps rows contiguous, so position-in-row = offset
            keep = rank < num_neighbors
            local_row, e_id = local_row[keep], e_id[keep]
        cols = col[e_id]
        # n_id: subset, then the new column ids in order of first appearance (row by row)
        num_global = max(self.sparse_size(1), int(subset.max()) + 1 if num_rows else 0)
        local = torch.full((num_global,), -1, dtype=torch.long)
        local[subset] = torch.arange(num_rows)
        new_mask = local[cols] < 0
        new_cols = cols[new_mask]
        if new_cols.numel():
            uniq, inverse = torch.unique(new_cols, return_inverse=True)
            first = torch.full((uniq.numel(),), new_cols.numel(), dtype=torch.long)
            first.scatter_reduce_(0, inverse, torch.arange(new_cols.numel()), reduce="amin")
            new_ids = uniq[torch.argsort(first)]
        else:
            new_ids = new_cols
        local[new_ids] = torch.arange(num_rows, num_rows + new_ids.numel())
        n_id = torch.cat([subset, new_ids])
        out_col = local[cols]
        out_value = value[e_id] if value is not None else None
        out = SparseTensor(row=local_row, col=out_col, value=out_value,
                           sparse_sizes=(num_rows, n_id.numel()))  # sorts by (row, col)
        return out, n_id

    def __repr__(self) -> str:
        return (f"SparseTensor(shim, sparse_sizes={self.sparse_sizes()}, nnz={self.nnz()}, "
                f"has_value={self.has_value()})")


__all__ = ["SparseStorage", "SparseTensor", "__version__"]
