"""Robust aggregation (``robust``): no client can take the federation's models over.

Without it the server mixes uploads linearly, so one client's update scaled ×100, or a
training-node count of 10⁹, is most of everyone's next model. With ``robust`` set the
train step runs in three parts, all bounded against the round's cohort, never against
what a client claims of itself (its signature, its count):

1. **Counts capped** (every rule): a client's ``num-train`` weighs at most
   :data:`COUNT_CAP` × the cohort's median.
2. **Updates screened**, on each client's update Δ = upload − what it was sent:
   - ``norm-bound``: Δ clipped to the cohort's median norm (FLAME's bound, Nguyen et
     al., USENIX Security 2022), then mixed as usual;
   - ``krum`` / ``multi-krum``: the 1 / n − f clients of lowest Krum score (the sum of
     squared distances to their n − f − 2 nearest updates) are the only columns mixed;
   - ``bulyan``: multi-krum's n − 2f clients, then the rows' Bulyan average (below).
3. **Each client's row made robust.** The algorithm's mixing plan (the weights its
   ``aggregate`` would use: FedAvg's sample weights, FedAux's APV softmax, FedIIH's
   per-factor β, ...) gives client i the row w_i; client i receives, per coordinate,
   - ``median``: the w_i-weighted median of the uploads;
   - ``trimmed-mean``: the w_i-weighted mean after ⌊βn⌋/n of the row's weight is cut
     from each end (β: ``robust-trim-beta``, n: the clients the row weighs);
   - ``bulyan``: the w_i-weighted mean of the (n − 4f)/(n − 2f) of the row's weight
     closest to its weighted median, over multi-krum's selection;
   - the others: the w_i-weighted mean over the clients that passed step 2.

   A personalized plan (rows that differ) keeps each client's own weight on its own
   update: client i receives w_ii·θ_i + (1 − w_ii)·R_i, where R_i is the rule applied to
   the others' uploads with their share of the row. The rules bound what the others
   contribute; a hostile client's own row only gives it its own model back.

With uniform rows (FedAvg with equal counts) these are Flower 1.42's ``FedMedian``,
``FedTrimmedAvg``, ``Krum``, ``MultiKrum`` and ``Bulyan`` (tests compare them with
Flower's own functions); weighting by the row is what carries them to personalized
mixing. The rules that change a row (median, trimmed-mean, bulyan) need the plan, so
they refuse algorithms without one; norm-bound and the krum selection screen the
updates before any algorithm's own ``aggregate``.

Every client whose update is ≥ :data:`OUTLIER_RATIO` × the cohort's median norm, was
clipped, left out or had its count capped is named in the round's record with one line
(results.json, progress.json, report.html).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..config import ROBUST_ROW_RULES, ROBUST_RULES, robust_min_clients
from ..core.mixing import MixingPlan
from ..core.phases import Arrays, ClientUpdate

#: A client's ``num-train`` weighs at most this many times the cohort's median.
COUNT_CAP = 3.0
#: An update this many times the cohort's median norm is named in the round's record.
OUTLIER_RATIO = 3.0
#: The rules that choose which clients' updates are mixed.
SELECTION_RULES = ("krum", "multi-krum", "bulyan")
#: Cumulative weights within this of a boundary count as on it (0.1 · 5 is 0.5).
EPS = 1e-9


@dataclass
class ScreenedRound:
    """A round's updates after steps 1-2: what gets mixed, from which clients, and why."""

    updates: dict[int, ClientUpdate]  # every valid update, counts capped (norm-bound: clipped)
    selected: list[int]  # the clients whose updates may be mixed (all but krum's rejects)
    malicious: int  # f used this round (lowered when too few replied)
    notes: dict[int, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def outlier_notes(updates: dict[int, ClientUpdate], sent: dict[int, Arrays],
                  initial: Arrays) -> dict[int, str]:
    """Without ``robust``: the clients whose update is ≥ :data:`OUTLIER_RATIO` × the
    cohort's median norm, named (nothing is changed: the record shows an attack that
    robust aggregation would have bounded)."""
    ids = sorted(updates)
    if len(ids) < 3:
        return {}
    ratios = _norm_ratios(updates, sent, initial, ids)[0]
    return {c: f"update norm {r:.3g}× the cohort median (not bounded: robust=none)"
            for c, r in zip(ids, ratios) if r >= OUTLIER_RATIO}


def _norm_ratios(updates: dict[int, ClientUpdate], sent: dict[int, Arrays], initial: Arrays,
                 ids: list[int]) -> tuple[np.ndarray, np.ndarray, float, list[str],
                                          dict[int, Arrays], np.ndarray]:
    """Each update's norm over the cohort's median: (ratios, norms, median, the float
    names, each client's origins, the flattened updates [n, P])."""
    names = _float_names(updates[ids[0]].arrays)
    origins = {c: {n: _origin(n, updates[c].arrays[n], sent.get(c, {}), initial)
                   for n in names} for c in ids}
    deltas = np.stack([_flat({n: updates[c].arrays[n] - origins[c][n] for n in names})
                       for c in ids]) if names else np.zeros((len(ids), 0))
    norms = np.linalg.norm(deltas, axis=1)
    median_norm = float(np.median(norms))
    return norms / max(median_norm, 1e-300), norms, median_norm, names, origins, deltas


class RobustAggregation:
    """One run's robust rule: :meth:`screen` the updates, then :meth:`combine` a plan's rows."""

    def __init__(self, rule: str, malicious: int, trim_beta: float,
                 log: Callable[[str], None] = print) -> None:
        if rule not in ROBUST_RULES or rule == "none":
            raise ValueError(f"robust rule {rule!r}; valid: {', '.join(ROBUST_RULES[1:])}")
        if malicious < 0 or not 0.0 <= trim_beta < 0.5:
            raise ValueError(f"robust-malicious={malicious} (>= 0), robust-trim-beta="
                             f"{trim_beta} (in [0, 0.5))")
        self.rule = rule
        self.malicious = malicious
        self.trim_beta = trim_beta
        self.log = log

    # --- steps 1 and 2 --------------------------------------------------------------
    def screen(self, updates: dict[int, ClientUpdate], sent: dict[int, Arrays],
               initial: Arrays) -> ScreenedRound:
        """Counts capped, update norms compared, norm-bound's clipping and the krum
        family's selection. ``sent``: what each client was sent this round (its update's
        origin); ``initial``: the origin of an array it was not sent."""
        ids = sorted(updates)
        notes: dict[int, str] = {}
        updates = self._cap_counts(updates, notes)
        ratios, norms, median_norm, names, origins, deltas = _norm_ratios(
            updates, sent, initial, ids)
        for c, ratio in zip(ids, ratios):
            if ratio >= OUTLIER_RATIO:
                notes[c] = _join(notes.get(c), f"update norm {ratio:.3g}× the cohort median")
        metrics = {"robust-median-norm": median_norm, "robust-max-norm-ratio": float(ratios.max())}
        malicious = self.malicious
        selected = list(ids)
        if self.rule == "norm-bound":
            updates = self._clip(updates, ids, names, origins, norms, median_norm, notes)
            metrics["robust-clipped"] = float(np.sum(norms > median_norm))
        elif self.rule in SELECTION_RULES:
            malicious = self._fitting_malicious(len(ids))
            keep = {"krum": 1, "multi-krum": len(ids) - malicious,
                    "bulyan": len(ids) - 2 * malicious}[self.rule]
            chosen = krum_select(deltas, malicious, keep)
            selected = [ids[i] for i in sorted(chosen)]
            for c in ids:
                if c not in selected:
                    notes[c] = _join(notes.get(c), f"left out by {self.rule} (f={malicious})")
            metrics["robust-selected"] = float(len(selected))
        metrics["robust-f"] = float(malicious)
        return ScreenedRound(updates, selected, malicious, notes, metrics)

    def _cap_counts(self, updates: dict[int, ClientUpdate], notes: dict[int, str]
                    ) -> dict[int, ClientUpdate]:
        """Each ``num_train`` at most :data:`COUNT_CAP` × the cohort's median."""
        cap = int(COUNT_CAP * float(np.median([u.num_train for u in updates.values()])))
        out = {}
        for c, u in updates.items():
            if u.num_train > cap:
                notes[c] = _join(notes.get(c), f"num-train {u.num_train} capped at {cap} "
                                               f"({COUNT_CAP:g}× the cohort median)")
                u = replace(u, num_train=cap)
            out[c] = u
        return out

    def _clip(self, updates: dict[int, ClientUpdate], ids: list[int], names: list[str],
              origins: dict[int, Arrays], norms: np.ndarray, bound: float,
              notes: dict[int, str]) -> dict[int, ClientUpdate]:
        """norm-bound: origin + Δ · min(1, bound / ‖Δ‖), in the upload's dtype."""
        out = dict(updates)
        for c, norm in zip(ids, norms):
            if norm <= bound:
                continue
            scale = bound / norm
            arrays = dict(updates[c].arrays)
            for n in names:
                origin = origins[c][n].astype(np.float64)
                arrays[n] = (origin + scale * (arrays[n] - origin)).astype(arrays[n].dtype)
            out[c] = replace(updates[c], arrays=arrays)
            if norm >= OUTLIER_RATIO * bound:
                notes[c] = _join(notes.get(c), f"clipped ×{scale:.3g} to the cohort median norm")
        return out

    def _fitting_malicious(self, n: int) -> int:
        """f, lowered until ``n`` replies satisfy the rule's bound (a round with fewer
        valid replies than the run planned for)."""
        f = self.malicious
        while f > 0 and n < robust_min_clients(self.rule, f):
            f -= 1
        return f

    # --- step 3 -----------------------------------------------------------------------
    def combine(self, plan: MixingPlan, screened: ScreenedRound) -> dict[int, Arrays]:
        """Each client's payload: its row of ``plan`` made robust (module docstring)."""
        ids, f = plan.client_ids, screened.malicious
        columns = np.array([c in screened.selected for c in ids])
        uploads = [screened.updates[c].arrays for c in ids]
        payloads: dict[int, Arrays] = {c: {} for c in ids}
        for name in _float_names(uploads[0]):
            stacked = np.stack([a[name] for a in uploads]).astype(np.float64)
            flat = stacked.reshape(len(ids), -1)
            group = plan.group_of(name)
            if np.ndim(group) == 0:
                combined = self._rows(plan.matrices[int(group)], columns, flat, f)
            else:
                mask = np.asarray(group).reshape(-1)
                combined = np.empty_like(flat)
                for g in np.unique(mask):
                    part = mask == g
                    combined[:, part] = self._rows(plan.matrices[int(g)], columns, flat[:, part], f)
            dtype = uploads[0][name].dtype
            for k, c in enumerate(ids):
                payloads[c][name] = combined[k].reshape(stacked.shape[1:]).astype(dtype)
        for c in ids:
            payloads[c].update(plan.clear.get(c, {}))
        return payloads

    def _rows(self, matrix: np.ndarray, columns: np.ndarray, values: np.ndarray, f: int
              ) -> np.ndarray:
        """Every row of ``matrix`` [K, K] applied robustly to ``values`` [K, P] (every
        client's flattened upload; ``columns``: those that passed screening) -> [K, P].

        Equal rows (one global model) are Flower's rules over the screened clients. A
        personalized plan's row i keeps its own weight on its own update, and only the
        others' share is made robust: w_ii·θ_i + (1 − w_ii)·R_i(θ_j, j ≠ i); a hostile
        client's own row gives only itself its own model back."""
        ranked = order = None
        if self.rule in ROBUST_ROW_RULES:
            order = np.argsort(values, axis=0, kind="stable")
            ranked = np.take_along_axis(values, order, axis=0)
        if (matrix == matrix[0]).all():
            return np.broadcast_to(self._row(_normalised(matrix[0] * columns, columns),
                                             values, ranked, order, f), values.shape).copy()
        out = np.empty_like(values)
        for i, row in enumerate(matrix):
            others = row * columns
            own, others[i] = row[i], 0.0
            if others.sum() <= 0 or own >= 1.0:
                out[i] = values[i]
                continue
            robust = self._row(others / others.sum(), values, ranked, order, f)
            out[i] = own * values[i] + (1.0 - own) * robust
        return out

    def _row(self, w: np.ndarray, values: np.ndarray, ranked: np.ndarray | None,
             order: np.ndarray | None, f: int) -> np.ndarray:
        """One row's robust combination of ``values`` [K, P] with weights ``w`` [K]
        (summing to 1; a client weighted 0 takes no part); ``ranked``: ``values`` sorted
        per column by ``order`` (the row rules)."""
        if ranked is None or order is None:  # norm-bound, krum, multi-krum: the weighted mean
            return w @ values
        ranked_w = w[order]
        n = int(np.count_nonzero(w))
        if self.rule == "median":
            return weighted_median(ranked, ranked_w)
        if self.rule == "trimmed-mean":
            # Flower cuts ⌊βn⌋ of n clients from each end; a row cuts that share of its weight.
            return weighted_trimmed_mean(ranked, ranked_w, int(self.trim_beta * n) / n)
        return bulyan_average(ranked, ranked_w, f, n)


def _normalised(weights: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """``weights`` summing to 1; none left (krum left out all a row mixes): the screened
    clients uniformly."""
    total = weights.sum()
    return weights / total if total > 0 else columns / max(int(columns.sum()), 1)


def bulyan_average(ranked: np.ndarray, ranked_w: np.ndarray, malicious: int, theta: int
                   ) -> np.ndarray:
    """Bulyan's second step per column of ``ranked`` [n, P] (sorted, weights summing to 1,
    ``theta`` of them non-zero): the weighted mean of the (θ − 2f)/θ of the weight closest
    to the weighted median (for equal weights: the θ − 2f values nearest the median, as
    Flower's ``Bulyan``)."""
    keep = max(theta - 2 * malicious, 1) / theta
    median = weighted_median(ranked, ranked_w)
    by_distance = np.argsort(np.abs(ranked - median), axis=0, kind="stable")
    near = np.take_along_axis(ranked, by_distance, axis=0)
    near_w = np.take_along_axis(ranked_w, by_distance, axis=0)
    upper = np.cumsum(near_w, axis=0)
    kept = np.clip(np.minimum(upper, keep) - (upper - near_w), 0.0, None)
    kept[kept < EPS] = 0.0
    return (kept * near).sum(axis=0) / kept.sum(axis=0)


def finite_rows(plan: MixingPlan) -> MixingPlan:
    """``plan`` with every weight that is not a finite non-negative number set to 0 and the
    rows renormalised (an all-zero row: uniform). A hostile model can overflow what the
    server computes from it (FED-PUB's functional embedding): its column then weighs 0
    instead of turning every row into NaN."""
    matrices = np.nan_to_num(np.asarray(plan.matrices, dtype=np.float64), nan=0.0, posinf=0.0,
                             neginf=0.0).clip(min=0.0)
    if np.array_equal(matrices, plan.matrices):
        return plan
    totals = matrices.sum(axis=-1, keepdims=True)
    matrices = np.where(totals > 0, matrices / np.where(totals > 0, totals, 1.0),
                        1.0 / matrices.shape[-1])
    return replace(plan, matrices=matrices)


def non_finite_payloads(payloads: dict[int, Arrays]) -> list[int]:
    """The clients whose payload holds a NaN or Inf in a float array (each distinct payload
    object checked once: FedAvg hands every client the same one)."""
    verdict: dict[int, bool] = {}
    out = []
    for cid, arrays in payloads.items():
        if id(arrays) not in verdict:
            verdict[id(arrays)] = any(a.dtype.kind in "fc" and not np.isfinite(a).all()
                                      for a in arrays.values() if isinstance(a, np.ndarray))
        if verdict[id(arrays)]:
            out.append(cid)
    return out


def weighted_median(ranked: np.ndarray, ranked_w: np.ndarray) -> np.ndarray:
    """Per column of ``ranked`` [n, P] (sorted ascending, weights ``ranked_w`` [n, P]
    summing to 1): the value where the cumulative weight reaches 1/2, the mean of the two
    middle values when it lands exactly on 1/2 (numpy's median for equal weights)."""
    upper = np.cumsum(ranked_w, axis=0)
    lo = np.argmax(upper >= 0.5 - EPS, axis=0)
    hi = np.argmax(upper > 0.5 + EPS, axis=0)
    take = lambda idx: np.take_along_axis(ranked, idx[None], axis=0)[0]  # noqa: E731
    return 0.5 * (take(lo) + take(hi))


def weighted_trimmed_mean(ranked: np.ndarray, ranked_w: np.ndarray, beta: float) -> np.ndarray:
    """Per column of ``ranked`` [n, P] (sorted ascending, weights summing to 1): the
    weighted mean of what lies between cumulative weights β and 1 − β (for n equal
    weights and integer βn: the mean with βn values cut from each end, as Flower's
    ``FedTrimmedAvg``)."""
    upper = np.cumsum(ranked_w, axis=0)
    kept = np.clip(np.minimum(upper, 1.0 - beta) - np.maximum(upper - ranked_w, beta), 0.0, None)
    kept[kept < EPS] = 0.0
    return (kept * ranked).sum(axis=0) / kept.sum(axis=0)


def krum_select(vectors: np.ndarray, malicious: int, keep: int) -> list[int]:
    """The ``keep`` rows of ``vectors`` [n, P] of lowest Krum score, the sum of squared
    distances to their n − f − 2 nearest other rows (Flower's ``select_multikrum``)."""
    n = vectors.shape[0]
    sq = np.square(vectors).sum(axis=1)
    distances = sq[:, None] + sq[None, :] - 2.0 * vectors @ vectors.T
    nearest = max(1, n - malicious - 2)
    scores = np.array([np.sort(np.delete(distances[i], i))[:nearest].sum() for i in range(n)])
    return [int(i) for i in np.argsort(scores, kind="stable")[:keep]]


def _float_names(arrays: Arrays) -> list[str]:
    """The arrays that are mixed: floating ones (integer buffers stay with each client)."""
    return sorted(n for n, a in arrays.items() if np.issubdtype(a.dtype, np.floating))


def _origin(name: str, upload: np.ndarray, sent: Arrays, initial: Arrays) -> np.ndarray:
    """Where a client's array started this round: what it was sent, else the initial model."""
    for source in (sent, initial):
        if name in source and np.shape(source[name]) == upload.shape \
                and np.issubdtype(np.asarray(source[name]).dtype, np.floating):
            return np.asarray(source[name])
    return np.zeros_like(upload)


def _flat(arrays: Arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays.values()])


def _join(first: str | None, second: str) -> str:
    return second if first is None else f"{first}; {second}"
