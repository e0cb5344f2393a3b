"""Train/val/test splits.

- :func:`random_split`: FedAux/FedIIH (FED-PUB code): ONE global permutation before
  partitioning; train = first round(train·N), test = next round(test·N), val = the rest.
  ``torch.Generator().manual_seed(s)`` gives the same permutation as the reference's
  ``torch.manual_seed(s); torch.randperm(N)``. The reference generator script seeds
  once and then builds K = 5, 10, 20 in turn, so its K=10 split is the *second*
  permutation drawn (``skip=1``; checked against the shipped Cora-10 files: all nodes agree).
- :func:`per_client_split`: FedSpray: shuffle each client's nodes with a seeded NumPy
  RNG; train = first 40 %, val = next 30 %, test = the rest.
"""

from __future__ import annotations

import numpy as np
import torch

Masks = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _masks(num_nodes: int, train_idx: torch.Tensor, val_idx: torch.Tensor, test_idx: torch.Tensor) -> Masks:
    out = []
    for idx in (train_idx, val_idx, test_idx):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[idx] = True
        out.append(mask)
    return out[0], out[1], out[2]


def random_split(num_nodes: int, train: float = 0.2, test: float = 0.4, seed: int = 1234,
                 skip: int = 0) -> Masks:
    """Global split masks (train, val, test), each bool [num_nodes], disjoint and covering.

    ogbn-arxiv uses ``train=0.05, test=(1-0.05)/2``. ``skip``: permutations drawn and
    discarded first (to reproduce the reference's later draws, see module docstring).
    """
    if not (0 <= train and 0 <= test and train + test <= 1):
        raise ValueError(f"bad split ratios train={train}, test={test}")
    generator = torch.Generator().manual_seed(int(seed))
    for _ in range(int(skip)):
        torch.randperm(num_nodes, generator=generator)
    perm = torch.randperm(num_nodes, generator=generator)
    # Python's round(), as in the reference code (banker's rounding at .5).
    n_train = round(num_nodes * train)
    n_test = round(num_nodes * test)
    return _masks(num_nodes, perm[:n_train], perm[n_train + n_test:], perm[n_train:n_train + n_test])


def split_ratios(train: float) -> tuple[float, float]:
    """(train, test) of the FED-PUB protocol: test = (1 − train) / 2, val = the rest."""
    return train, (1.0 - train) / 2.0


def per_client_split(n: int, train: float = 0.4, val: float = 0.3, seed: int = 1234) -> Masks:
    """FedSpray's per-client split of ``n`` local nodes: (train, val, test) bool [n].

    Counts are ``int(train·n)`` and ``int(val·n)`` (floor); test takes the rest.
    """
    if not (0 <= train and 0 <= val and train + val <= 1):
        raise ValueError(f"bad split ratios train={train}, val={val}")
    perm = torch.from_numpy(np.random.RandomState(int(seed) % (2**32)).permutation(n))
    n_train = int(train * n)
    n_val = int(val * n)
    return _masks(n, perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:])
