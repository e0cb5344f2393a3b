"""A round's mixing as weights (:class:`MixingPlan`), and the server maths shared by the
aggregators: similarity, softmax weights, mixing.

Pure numpy. ``K`` is the number of clients; ``per_client`` is a sequence of K
dicts name -> array (the clients' uploads, all with the same names and shapes),
in the order of the weights' rows and columns.

- :func:`cosine_similarity`: S [K, K] between the rows of a [K, d] matrix.
- :func:`row_softmax`: W = softmax(scale · S) along the last axis.
- :func:`mix`: personalized mixing, client k gets Σ_l W_kl · (client l's arrays).
- :func:`average`: one global model, Σ_l w_l · (client l's arrays) (FedAvg).
- :func:`apply_plan`: an aggregator's :class:`MixingPlan` applied in the clear
  (what ``secure-aggregation=ckks`` computes on ciphertexts; tests compare the two).

Floating arrays are mixed in ``dtype`` (``server-mix-dtype``: float64, or float32 for
speed) and returned in their upload's dtype. Non-float arrays (counters, integer or
boolean buffers) are never averaged: each client keeps its own. :func:`mix` hands
every client its own array back; :func:`average` leaves them out of the global
model, and the trainers' ``load_payload`` leaves arrays it is not sent as they are.

Some aggregators compute the same maths in a different order of operations. Where
that is so, a keyword keeps each one's order, so their float64 numbers stay the same
bits as before this module existed (see ``normalise_first``, ``clip``, ``rowwise``
and ``weights=None``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import DTypeLike

from .phases import Arrays

# Norms (GCFL's order: products of norms) are floored at this, so that a zero vector
# has cosine 0 with everything instead of NaN.
NORM_FLOOR = 1e-12


@dataclass
class MixingPlan:
    """The train phase's mixing, as weights only: what ``aggregate`` computes, given
    before any weight is seen (``secure-aggregation=ckks`` applies it to ciphertexts).

    Client ``client_ids[i]`` receives, for every float array ``name`` it uploaded,
    ``Σ_j matrices[g, i, j] · (client_ids[j]'s name)`` where ``g = groups.get(name, 0)``:
    one matrix for the whole array, or an int array of the array's shape picking a
    matrix per element (FedIIH's factor blocks). ``clear[c]`` are arrays sent to client
    ``c`` beside its mixture, computed from signatures only (FedIIH's prior α̃).
    ``diagnostics`` and ``metrics`` as in :class:`~.phases.AggregateResult`.
    """

    client_ids: list[int]  # rows and columns of every matrix, sorted
    matrices: np.ndarray  # [G, K, K] float64, each row sums to 1
    groups: dict[str, int | np.ndarray] = field(default_factory=dict)
    clear: dict[int, Arrays] = field(default_factory=dict)
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def group_of(self, name: str) -> int | np.ndarray:
        """The matrix index of array ``name``: an int, or an int array of its shape."""
        return self.groups.get(name, 0)


def cosine_similarity(vectors: np.ndarray, *, clip: bool = True,
                      normalise_first: bool = True) -> np.ndarray:
    """S_kl = cos(v_k, v_l) between the rows of ``vectors`` [K, d] -> [K, K] float64.

    ``normalise_first``: scale the rows to unit length, then take their dot products
    (FedAux, FED-PUB); False: divide the dot products by the products of the norms
    (GCFL's ``pairwise_angles``). Same maths, different rounding.
    ``clip``: clamp to [-1, 1] (rounding can leave a diagonal at 1 + 2⁻⁵²); FED-PUB
    and GCFL never clipped, so they pass False to keep their weights' bits.
    """
    vectors = np.asarray(vectors, dtype=np.float64)
    if normalise_first:
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), NORM_FLOOR)
        sim = unit @ unit.T
    else:
        norms = np.linalg.norm(vectors, axis=1)
        sim = vectors @ vectors.T / np.maximum(np.outer(norms, norms), NORM_FLOOR)
    return np.clip(sim, -1.0, 1.0) if clip else sim


def row_softmax(scores: np.ndarray, scale: float) -> np.ndarray:
    """softmax(scale · scores) along the last axis, in float64; every row sums to 1.

    ``scale`` is an inverse temperature (FedAux's α, FED-PUB's and FedIIH's τ): 0
    gives uniform rows, → ∞ puts all of a row's weight on its largest score.
    ``scores`` may have leading axes ([K, K] or FedIIH's per-factor [F, K, K]).
    """
    logits = scale * np.asarray(scores, dtype=np.float64)
    logits = logits - logits.max(axis=-1, keepdims=True)  # exp cannot overflow
    weights = np.exp(logits)
    return weights / weights.sum(axis=-1, keepdims=True)


def mix(weights: np.ndarray, per_client: Sequence[Arrays], dtype: DTypeLike = np.float64,
        *, rowwise: bool = False) -> list[Arrays]:
    """Personalized mixing: result[k][name] = Σ_l weights[k, l] · per_client[l][name].

    ``weights`` [K, K] (float64; cast to ``dtype`` for the products, as the arrays).
    Returns K dicts, in ``per_client``'s order, each with every name: the floating
    arrays mixed (in their upload's dtype), the non-float arrays client k's own.

    ``rowwise``: one vector-matrix product per client instead of one matrix product
    for all. BLAS sums a matrix product in another order than a vector product, so
    the two differ in the last bits; FED-PUB always mixed row by row and keeps that.
    """
    mix_weights = np.asarray(weights, dtype=np.float64).astype(dtype)

    def combine(stacked: np.ndarray) -> np.ndarray:
        if rowwise:
            return np.stack([np.tensordot(row, stacked, axes=1) for row in mix_weights])
        return np.tensordot(mix_weights, stacked, axes=1)

    mixed = _mix_floats(per_client, dtype, combine)
    return [{name: mixed[name][k] if name in mixed else own[name] for name in own}
            for k, own in enumerate(per_client)]


def average(weights: np.ndarray | None, per_client: Sequence[Arrays],
            dtype: DTypeLike = np.float64) -> Arrays:
    """One global model: result[name] = Σ_l weights[l] · per_client[l][name].

    ``weights`` [K] (FedAvg's, summing to 1), or None for the plain mean over clients
    (numpy's sum-then-divide order, which FedIIH's shared arrays always used; it is
    not bit-equal to uniform weights). Only the floating arrays, in their upload's
    dtype: the non-float ones are left out, so every client keeps its own.

    The same sum as :func:`mix` with every row of W equal to ``weights``, computed
    once as a vector-matrix product.
    """
    if weights is None:
        def combine(stacked: np.ndarray) -> np.ndarray:
            return stacked.mean(axis=0)
    else:
        w = np.asarray(weights, dtype=np.float64).astype(dtype)

        def combine(stacked: np.ndarray) -> np.ndarray:
            return np.tensordot(w, stacked, axes=1)
    return _mix_floats(per_client, dtype, combine)


def apply_plan(plan: MixingPlan, per_client: Sequence[Arrays], dtype: DTypeLike = np.float64
               ) -> list[Arrays]:
    """``plan`` on plaintext uploads (in ``plan.client_ids``' order): client k's float
    arrays mixed with their group's matrix (per element where the group is an array),
    plus ``plan.clear``; non-float arrays are left out (each client keeps its own)."""
    out: list[Arrays] = [{} for _ in per_client]
    for name, first in per_client[0].items():
        if not _is_mixed(first):
            continue
        group = plan.group_of(name)
        groups = [int(group)] if np.ndim(group) == 0 else sorted(set(np.unique(group).tolist()))
        for g in groups:
            mixed = mix(plan.matrices[g], [{name: a[name]} for a in per_client], dtype)
            for k, arrays in enumerate(mixed):
                if np.ndim(group) == 0:
                    out[k][name] = arrays[name]
                else:
                    target = out[k].setdefault(name, np.zeros_like(first))
                    target[group == g] = arrays[name][group == g]
    for k, cid in enumerate(plan.client_ids):
        out[k].update(plan.clear.get(cid, {}))
    return out


def _is_mixed(array: np.ndarray) -> bool:
    """Only floating arrays are mixed; integer and boolean ones stay per client."""
    return np.issubdtype(array.dtype, np.floating)


def _mix_floats(per_client: Sequence[Arrays], dtype: DTypeLike,
                combine: Callable[[np.ndarray], np.ndarray]) -> Arrays:
    """``combine`` applied to each floating array stacked over clients [K, ...] in
    ``dtype``, cast back to the upload's dtype."""
    out: Arrays = {}
    for name, first in per_client[0].items():
        if _is_mixed(first):
            stacked = np.stack([arrays[name] for arrays in per_client]).astype(dtype, copy=False)
            out[name] = combine(stacked).astype(first.dtype, copy=False)
    return out
