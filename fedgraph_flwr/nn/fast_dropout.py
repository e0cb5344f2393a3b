"""Dropout from one uniform draw per entry: the large-client path's dropout (issue #29).

``F.dropout`` on CPU draws its mask with ``bernoulli_``, which this project's CPU runs
at 12–15 ns an entry (MKL's Bernoulli through many small streams): 0.13 s for one
[35k, 256] activation, the largest single cost of a 35k-node FedAux client's epoch after
the matrix products. ``torch.rand`` draws the same distribution (keep with probability
1 − p, scale 1/(1 − p)) about three times faster. It is a different random stream, so
it is used only where the CSR adjacency is (clients of at least
``SPARSE_ADJACENCY_MIN_NODES`` nodes), from which no published figure but the
ogbn-arxiv-size benchmark comes; the same seed still gives the same numbers.
"""

from __future__ import annotations

import torch


class _UniformMaskDropout(torch.autograd.Function):
    """h [..] -> h ⊙ m with m = 1/(1 − p) where U ≥ p, 0 elsewhere (U ~ U[0, 1))."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, p: float) -> torch.Tensor:
        mask = torch.rand_like(h).ge_(p).mul_(1.0 / (1.0 - p))
        ctx.save_for_backward(mask)
        return h * mask

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def uniform_mask_dropout(h: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout with probability ``p`` (0 ≤ p < 1), the mask drawn with ``torch.rand``."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return h
    return _UniformMaskDropout.apply(h, p)
