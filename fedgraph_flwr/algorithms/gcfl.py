"""GCFL / GCFL+ (Xie et al., NeurIPS 2021): clustered FL by bi-partitioning clients.

All clients start in one cluster; FedAvg runs inside each cluster. The server
computes each client's update ``dW_k = θ_k(uploaded) - θ_k(sent)`` (it keeps
what it sent). A cluster ``c`` is split in two when, after the warm-up::

    ||mean_{k∈c} dW_k|| < ε1   and   max_{k∈c} ||dW_k|| > ε2   and   |c| > 2

i.e. the cluster's training has stalled on average while some members still
move: they pull in opposite directions. The split is a Stoer-Wagner minimum
cut of the complete graph over the cluster weighted by client similarity:

* ``gcfl-mode=gcfl+`` (default; GCFL+ with "gradient sequences"): each client
  reports the norm of its last local gradient (a 1-float signature); the split
  uses DTW distances between the last ``gcfl-seq-length`` norms, similarity =
  max(DTW) - DTW, and needs every client to have a full sequence (sequences are
  reset after a split), as in ``run_gcflplus`` of the GCFL code.
* ``gcfl+dws``: the same with the server-side sequence ``||dW_k||`` (``run_gcflplus_dWs``).
* ``gcfl``: cosine similarity + 1 of the flattened updates (``run_gcfl``).

Cluster aggregation (``aggregate_clusterwise``): every member gets
``θ_sent,k + Σ_{l∈c} (n_l / Σ n) dW_l`` (train-node weights). GCFL is for
graph classification; on node classification the client model is the same
GCN as FedAvg. The split test needs every member of the cluster to have
replied this round (GCFL runs with full participation).

Defaults are the GCFL code's: ε1 = 0.05, ε2 = 0.1, sequence length 5, no DTW
standardisation, splits only after round 20 (hard-coded there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np
import torch

from ..core.mixing import cosine_similarity
from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from .base import Aggregator
from .fedavg import GCNTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

MODES = ("gcfl", "gcfl+", "gcfl+dws")
GRAD_NORM = "grad-norm"


@dataclass(frozen=True)
class GCFLOptions(Options, prefix="gcfl"):
    """GCFL's knobs (``gcfl-*``); defaults = the GCFL code's."""

    mode: str = option("gcfl+", "gcfl (cosine of updates) | gcfl+ (DTW of gradient-norm "
                       "sequences) | gcfl+dws (DTW of update-norm sequences)", choices=MODES)
    eps1: float = option(0.05, "split a cluster when its mean update's norm is < ε1 (and its "
                         "largest > ε2)", low=0.0)
    eps2: float = option(0.1, "split a cluster when its largest update norm is > ε2 (and its "
                         "mean's < ε1)", low=0.0)
    seq_length: int = option(5, "GCFL+: length of the norm sequences compared by DTW", low=1)
    warmup_rounds: int = option(20, "no split up to this round", low=0)
    standardize: bool = option(False, "GCFL+: divide each sequence by its std before DTW")


class GCFLTrainer(GCNTrainer):
    """Plain GCN; also reports the norm of its last local gradient (GCFL+'s sequence element)."""

    options_class = GCFLOptions

    last_grad_norm: float = 0.0

    def train(self, epochs: int) -> dict[str, float]:
        """Local training; records the gradient norms GCFL+ compares."""
        out = super().train(epochs)
        # After the last step .grad still holds that step's gradient (zeroed only at the next step).
        grads = [p.grad.flatten() for p in self.model.parameters() if p.grad is not None]
        self.last_grad_norm = float(torch.linalg.vector_norm(torch.cat(grads))) if grads else 0.0
        out["grad_norm"] = self.last_grad_norm
        return out

    @classmethod
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfig
                         ) -> dict[str, tuple[int, ...]]:
        """The last local step's gradient norm [1]."""
        return {GRAD_NORM: (1,)}

    def signature(self) -> Arrays:
        """The last local step's gradient norm."""
        return {GRAD_NORM: np.array([self.last_grad_norm], dtype=np.float32)}


def dtw_distance(a: np.ndarray, b: np.ndarray) -> float:
    """DTW between 1-D sequences: sqrt of the least cumulative squared difference (as dtaidistance)."""
    n, m = len(a), len(b)
    cost = np.full((n + 1, m + 1), np.inf)
    cost[0, 0] = 0.0
    for i in range(1, n + 1):  # sequences are seq-length (5) long: a tiny loop
        for j in range(1, m + 1):
            d = (a[i - 1] - b[j - 1]) ** 2
            cost[i, j] = d + min(cost[i - 1, j], cost[i, j - 1], cost[i - 1, j - 1])
    return float(np.sqrt(cost[n, m]))


def dtw_matrix(seqs: np.ndarray, standardize: bool = False) -> np.ndarray:
    """Pairwise DTW distances [k, k] of sequences [k, L]; optionally divided by each row's std."""
    seqs = np.asarray(seqs, dtype=np.float64)
    if standardize:
        seqs = seqs / np.maximum(seqs.std(axis=1, keepdims=True), 1e-12)
    k = len(seqs)
    out = np.zeros((k, k))
    for i in range(k):
        for j in range(i + 1, k):
            out[i, j] = out[j, i] = dtw_distance(seqs[i], seqs[j])
    return out


def cosine_plus_one(vectors: np.ndarray) -> np.ndarray:
    """GCFL's ``pairwise_angles``: cos(dW_i, dW_j) + 1 ∈ [0, 2], [k, k] (its rounding:
    dot products over products of norms, unclipped)."""
    return cosine_similarity(vectors, clip=False, normalise_first=False) + 1.0


def min_cut_bipartition(similarity: np.ndarray, members: list[int]) -> tuple[list[int], list[int]]:
    """Stoer-Wagner minimum cut of the complete graph weighted by ``similarity`` [k, k]."""
    g = nx.Graph()
    k = len(members)
    g.add_nodes_from(range(k))
    for i in range(k):
        for j in range(i + 1, k):  # self-loops never cross a cut
            g.add_edge(i, j, weight=float(max(similarity[i, j], 0.0)))
    _, (part_a, part_b) = nx.stoer_wagner(g)
    c1, c2 = sorted(members[i] for i in part_a), sorted(members[i] for i in part_b)
    return (c1, c2) if c1[0] < c2[0] else (c2, c1)


def flatten(arrays: Arrays, names: list[str]) -> np.ndarray:
    """The ``names`` arrays as one float64 vector."""
    return np.concatenate([np.asarray(arrays[n], dtype=np.float64).ravel() for n in names])


class GCFLAggregator(Aggregator):
    """Cluster-wise FedAvg with gradient-based bi-partitioning of stalled clusters."""

    options_class = GCFLOptions
    options: GCFLOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        self.mode = self.options.mode
        self.names = sorted(initial)
        self.clusters: list[list[int]] = [sorted(self.client_ids)]
        self.sent: dict[int, Arrays] = {c: initial for c in self.client_ids}
        self.seqs: dict[int, list[float]] = {c: [] for c in self.client_ids}

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """FedAvg within each cluster; a cluster splits when its updates diverge."""
        eps1, eps2 = self.options.eps1, self.options.eps2
        seq_len = self.options.seq_length
        warmup = self.options.warmup_rounds
        standardize = self.options.standardize
        ids = sorted(updates)
        dw = {c: flatten(updates[c].arrays, self.names) - flatten(self.sent[c], self.names)
              for c in ids}
        dw_norm = {c: float(np.linalg.norm(dw[c])) for c in ids}
        for c in ids:
            if self.mode == "gcfl+":
                self.seqs[c].append(float(updates[c].signature[GRAD_NORM].ravel()[0]))
            elif self.mode == "gcfl+dws":
                self.seqs[c].append(dw_norm[c])

        new_clusters: list[list[int]] = []
        splits = 0
        for members in self.clusters:
            if not all(c in updates for c in members):
                new_clusters.append(members)
                continue
            max_norm = max(dw_norm[c] for c in members)
            mean_norm = float(np.linalg.norm(np.mean([dw[c] for c in members], axis=0)))
            sequences_ready = self.mode == "gcfl" or all(
                len(s) >= seq_len for s in self.seqs.values())
            if (mean_norm < eps1 and max_norm > eps2 and len(members) > 2
                    and server_round > warmup and sequences_ready):
                if self.mode == "gcfl":
                    sim = cosine_plus_one(np.stack([dw[c] for c in members]))
                else:
                    dist = dtw_matrix(np.array([self.seqs[c][-seq_len:] for c in members]),
                                      standardize)
                    sim = dist.max() - dist
                c1, c2 = min_cut_bipartition(sim, members)
                new_clusters += [c1, c2]
                splits += 1
                if self.mode != "gcfl":
                    self.seqs = {c: [] for c in self.client_ids}
            else:
                new_clusters.append(members)
        self.clusters = new_clusters

        payloads: dict[int, Arrays] = {}
        for members in self.clusters:
            part = [c for c in members if c in updates]
            if not part:
                continue
            w = np.array([max(updates[c].num_train, 0) for c in part], dtype=np.float64)
            w = w / w.sum() if w.sum() > 0 else np.full(len(part), 1.0 / len(part))
            mean_dw = {n: sum(wi * (np.asarray(updates[c].arrays[n], np.float64)
                                    - np.asarray(self.sent[c][n], np.float64))
                              for wi, c in zip(w, part)) for n in self.names}
            cache: dict[int, Arrays] = {}  # members that were sent the same model share a payload
            for c in members:
                key = id(self.sent[c])
                if key not in cache:
                    cache[key] = {n: (np.asarray(self.sent[c][n], np.float64) + mean_dw[n]).astype(
                        self.initial[n].dtype) for n in self.names}
                payloads[c] = cache[key]
        self.sent.update(payloads)

        label = {c: i for i, members in enumerate(self.clusters) for c in members}
        same = np.array([[float(label[a] == label[b]) for b in ids] for a in ids])
        sim_all = cosine_plus_one(np.stack([dw[c] for c in ids])) - 1.0
        return AggregateResult(
            payloads=payloads,
            diagnostics={"similarity": sim_all, "clusters": same},
            metrics={"num-clusters": float(len(self.clusters)), "splits": float(splits),
                     "max-update-norm": max(dw_norm.values()),
                     "mean-update-norm": float(np.linalg.norm(np.mean([dw[c] for c in ids], axis=0)))},
        )

    # --- checkpoint / resume --------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the payloads, for checkpoint/resume."""
        return {
            "clusters": [np.asarray(m, dtype=np.int64) for m in self.clusters],
            "sent": {str(c): dict(a) for c, a in self.sent.items()},
            "seqs": {str(c): np.asarray(s, dtype=np.float64) for c, s in self.seqs.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.clusters = [[int(c) for c in np.asarray(m).ravel()] for m in state["clusters"]]
        self.sent = {int(c): {n: np.asarray(v) for n, v in a.items()} for c, a in state["sent"].items()}
        self.seqs = {int(c): [float(x) for x in np.asarray(s).ravel()] for c, s in state["seqs"].items()}


ALGORITHM = Algorithm("gcfl", GCFLTrainer, GCFLAggregator, GCFLOptions)
