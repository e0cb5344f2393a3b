"""Partition diagnostics: label histograms, edge cut and FedAux's non-IIDness ξ.

FedAux (docs/reading/fedaux.md §3, Eqs. 62–63; Table 4, §7.3) measures how non-IID
a partition is by ξ = JSD + MMD:

- **JSD** (Eq. 62) = (1/K) Σ_k ½[KL(P_k‖R_k) + KL(P‖R_k)], R_k = ½(P_k + P): the mean
  over clients of the Jensen–Shannon divergence between client k's label distribution
  P_k and the global one P. The paper does not say what P is nor the log base.
  Chosen reading: P is the pooled label distribution of all clients' nodes (a node in
  two clients counts twice), which for a disjoint covering partition (METIS) is exactly
  the global graph's label distribution; natural log (nats, so 0 ≤ JSD ≤ ln 2).
- **MMD** (Eq. 63) = (2/(K(K−1))) Σ_{k<l} ‖μ_k − μ_l‖², with μ_k = (1/|V_k|) Σ_i φ(z_{k,i})
  the kernel mean embedding of client k's propagated features Z_k = A_k X_k (A_k the
  client's raw, unnormalised adjacency without self loops, X_k its features as
  loaded, i.e. row-normalised for Planetoid/Amazon). The kernel is unstated; chosen
  (docs/reading/fedaux.md §10.16): the Gaussian RBF k(x, y) = exp(−‖x−y‖² / (2h²)) with bandwidth
  h = the median pairwise Euclidean distance over the pooled Z of all clients (the
  "median heuristic"; on a seeded subsample of at most ``bandwidth_sample`` rows when
  the pool is larger; if that median is 0, the median of the non-zero distances).
  ‖μ_k − μ_l‖² = mean k(Z_k, Z_k) + mean k(Z_l, Z_l) − 2 mean k(Z_k, Z_l) (the biased
  V-statistic, which is what Eq. 63 writes). Clients with more than
  ``max_nodes_per_client`` nodes are represented by a seeded uniform subsample of that
  many rows (exact otherwise: every Cora client is below the default cap). Kernel sums
  are accumulated in row blocks, so no more than ~2^24 kernel entries exist at once.

The edge cut counts undirected edges of the global graph (self loops ignored) that no
client keeps: ``cut`` = both endpoints lie in some client but never together (for a
disjoint covering partition: endpoints in different clients), ``uncovered`` = an
endpoint lies in no client (Louvain drops small communities). Fractions are of all
undirected edges.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from scipy.special import rel_entr
from torch_geometric.data import Data

DIAGNOSTICS_VERSION = 1
MAX_NODES_PER_CLIENT = 2000
BANDWIDTH_SAMPLE = 3000
_BLOCK_ENTRIES = 1 << 24  # kernel entries held at once


# --------------------------------------------------------------------------------------
# labels
# --------------------------------------------------------------------------------------
def label_histograms(clients: Sequence[Data], num_classes: int) -> np.ndarray:
    """Nodes per class of every client, int64 [K, C]."""
    return np.stack([torch.bincount(c.y.view(-1).long(), minlength=num_classes)[:num_classes].numpy()
                     for c in clients]).astype(np.int64)


def _distributions(hists: np.ndarray) -> np.ndarray:
    hists = np.asarray(hists, dtype=np.float64)
    totals = hists.sum(-1, keepdims=True)
    if np.any(totals <= 0):
        raise ValueError("a label histogram is empty")
    return hists / totals


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """½[KL(p‖m) + KL(q‖m)], m = (p+q)/2, in nats, over the last axis (broadcasts)."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    m = 0.5 * (p + q)
    return 0.5 * (rel_entr(p, m).sum(-1) + rel_entr(q, m).sum(-1))


def label_jsd(hists: np.ndarray) -> float:
    """Eq. 62: mean over clients of JS(P_k, P), P = the pooled label distribution."""
    hists = np.asarray(hists, dtype=np.float64)
    pooled = _distributions(hists.sum(0))
    return float(js_divergence(_distributions(hists), pooled[None]).mean())


# --------------------------------------------------------------------------------------
# propagated features
# --------------------------------------------------------------------------------------
def adjacency(edge_index: torch.Tensor, num_nodes: int, *, self_loops: bool = False,
              normalize: bool = False) -> sp.csr_matrix:
    """Binary adjacency (duplicate edges merged) as scipy CSR, optionally with self loops
    and GCN's symmetric normalisation D^{-1/2}(A+I)D^{-1/2}."""
    ei = edge_index.numpy() if isinstance(edge_index, torch.Tensor) else np.asarray(edge_index)
    adj = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(num_nodes, num_nodes))
    adj.sum_duplicates()
    adj.data[:] = 1.0
    if self_loops:
        adj = adj.tolil()
        adj.setdiag(1.0)
        adj = adj.tocsr()
    if normalize:
        deg = np.asarray(adj.sum(1)).ravel()
        inv = np.zeros_like(deg)
        inv[deg > 0] = deg[deg > 0] ** -0.5
        adj = sp.diags(inv) @ adj @ sp.diags(inv)
    return adj.tocsr()


def propagated_features(client: Data, mode: str = "raw") -> np.ndarray:
    """Z = A X (``raw``: the client's adjacency, no self loops; FedAux Eq. 63) or
    Â X (``gcn``: self loops + symmetric normalisation), float64 [n, d]."""
    if mode not in ("raw", "gcn"):
        raise ValueError(f"unknown propagation {mode!r}; expected raw or gcn")
    n = int(client.num_nodes)
    adj = adjacency(client.edge_index, n, self_loops=mode == "gcn", normalize=mode == "gcn")
    return np.asarray(adj @ client.x.double().numpy())


# --------------------------------------------------------------------------------------
# MMD
# --------------------------------------------------------------------------------------
def _subsample(n: int, cap: int, rng: np.random.Generator) -> np.ndarray:
    return np.arange(n) if n <= cap else np.sort(rng.choice(n, size=cap, replace=False))


def median_bandwidth(pooled: np.ndarray, sample: int = BANDWIDTH_SAMPLE, seed: int = 0) -> float:
    """Median pairwise Euclidean distance over (a seeded subsample of) the rows."""
    rows = torch.from_numpy(np.asarray(pooled, np.float64))
    idx = _subsample(rows.shape[0], sample, np.random.default_rng(seed))
    if idx.size < 2:
        return 1.0
    sub = rows[torch.from_numpy(idx)]
    iu = torch.triu_indices(len(idx), len(idx), 1)
    dist = torch.cdist(sub, sub, compute_mode="use_mm_for_euclid_dist")[iu[0], iu[1]].numpy()
    h = float(np.median(dist))
    if h <= 0.0:  # more than half the pairs coincide: use the distinct pairs
        positive = dist[dist > 0]
        h = float(np.median(positive)) if positive.size else 1.0
    return h


def mmd_matrix(features: Sequence[np.ndarray], bandwidth: float | None = None, *,
               max_nodes_per_client: int = MAX_NODES_PER_CLIENT,
               bandwidth_sample: int = BANDWIDTH_SAMPLE, seed: int = 0) -> tuple[np.ndarray, float]:
    """Squared RBF-kernel MMD between every pair of clients' feature sets.

    ``features``: one [n_k, d] array per client. Returns (M [K, K] with
    M_kl = ‖μ_k − μ_l‖², zero diagonal; the bandwidth h used).
    """
    k = len(features)
    if bandwidth is None:
        bandwidth = median_bandwidth(np.concatenate(features), bandwidth_sample, seed)
    rng = np.random.default_rng(seed)
    parts = [np.asarray(f, np.float64)[_subsample(len(f), max_nodes_per_client, rng)] for f in features]
    if any(len(p) == 0 for p in parts):
        raise ValueError("a client has no nodes")
    sample = torch.from_numpy(np.concatenate(parts))
    owner = torch.from_numpy(np.repeat(np.arange(k), [len(p) for p in parts]))
    onehot = torch.nn.functional.one_hot(owner, k).double()  # [n_s, K]
    n_s = sample.shape[0]
    block = max(1, min(n_s, _BLOCK_ENTRIES // n_s))
    sums = torch.zeros(k, k, dtype=torch.float64)
    gamma = 1.0 / (2.0 * bandwidth ** 2)
    for start in range(0, n_s, block):
        rows = sample[start:start + block]
        sq = torch.cdist(rows, sample, compute_mode="use_mm_for_euclid_dist").pow_(2)
        kernel_by_client = torch.exp_(sq.mul_(-gamma)) @ onehot  # [b, K]
        sums.index_add_(0, owner[start:start + block], kernel_by_client)
    counts = onehot.sum(0)
    mean_kernel = (sums / torch.outer(counts, counts)).numpy()
    diag = np.diag(mean_kernel)
    mmd = diag[:, None] + diag[None, :] - mean_kernel - mean_kernel.T
    mmd = np.clip(mmd, 0.0, None)
    np.fill_diagonal(mmd, 0.0)
    return mmd, float(bandwidth)


def mean_offdiagonal(matrix: np.ndarray) -> float:
    """(2/(K(K−1))) Σ_{k<l} M_kl for symmetric M; 0 when K = 1."""
    k = matrix.shape[0]
    if k < 2:
        return 0.0
    return float(matrix[np.triu_indices(k, 1)].mean())


# --------------------------------------------------------------------------------------
# ξ and the edge cut
# --------------------------------------------------------------------------------------
def noniidness(clients: Sequence[Data], num_classes: int, *, seed: int = 0,
               max_nodes_per_client: int = MAX_NODES_PER_CLIENT,
               bandwidth_sample: int = BANDWIDTH_SAMPLE) -> dict[str, Any]:
    """FedAux's ξ = JSD + MMD of a partition (module docstring: every choice made)."""
    jsd = label_jsd(label_histograms(clients, num_classes))
    feats = [propagated_features(c, "raw") for c in clients]
    mmd, h = mmd_matrix(feats, max_nodes_per_client=max_nodes_per_client,
                        bandwidth_sample=bandwidth_sample, seed=seed)
    mmd_mean = mean_offdiagonal(mmd)
    return {
        "xi": jsd + mmd_mean, "jsd": jsd, "mmd": mmd_mean, "bandwidth": h,
        "subsampled": any(int(c.num_nodes) > max_nodes_per_client for c in clients),
        "definition": ("xi = JSD + MMD (FedAux Eqs. 62-63): JSD in nats vs the pooled label "
                       "distribution; MMD^2 (V-statistic) of Z_k = A_k X_k (raw adjacency), "
                       "RBF exp(-d^2/(2h^2)), h = median pairwise distance of pooled Z"),
        "max_nodes_per_client": max_nodes_per_client, "bandwidth_sample": bandwidth_sample,
        "seed": seed,
    }


def _undirected_keys(edge_index: np.ndarray, num_nodes: int) -> np.ndarray:
    lo = np.minimum(edge_index[0], edge_index[1]).astype(np.int64)
    hi = np.maximum(edge_index[0], edge_index[1]).astype(np.int64)
    keep = lo != hi
    return np.unique(lo[keep] * num_nodes + hi[keep])


def edge_cut(edge_index: torch.Tensor, num_nodes: int, clients: Sequence[Data]) -> dict[str, Any]:
    """Undirected global edges kept by no client (see module docstring); clients need
    ``global_id`` and their induced ``edge_index``."""
    ei = edge_index.numpy() if isinstance(edge_index, torch.Tensor) else np.asarray(edge_index)
    total = _undirected_keys(ei, num_nodes)
    kept_parts = [_undirected_keys(c.global_id.numpy()[c.edge_index.numpy()], num_nodes)
                  for c in clients]
    kept = np.unique(np.concatenate(kept_parts)) if kept_parts else np.empty(0, np.int64)
    covered = np.zeros(num_nodes, dtype=bool)
    for c in clients:
        covered[c.global_id.numpy()] = True
    lost = np.setdiff1d(total, kept, assume_unique=True)
    uncovered = int((~(covered[lost // num_nodes] & covered[lost % num_nodes])).sum())
    cut = int(lost.size) - uncovered
    n_total = int(total.size)
    return {
        "undirected_edges": n_total, "kept": int(np.intersect1d(kept, total).size),
        "cut": cut, "cut_fraction": cut / n_total if n_total else 0.0,
        "uncovered": uncovered, "uncovered_fraction": uncovered / n_total if n_total else 0.0,
    }


def partition_diagnostics(graph: Data, clients: Sequence[Data], num_classes: int,
                          seed: int = 0) -> dict[str, Any]:
    """Everything the manifest stores under ``diagnostics`` (label histograms live in
    each client's ``class_hist``)."""
    out = {"version": DIAGNOSTICS_VERSION,
           "edge_cut": edge_cut(graph.edge_index, int(graph.num_nodes), clients),
           "noniid": noniidness(clients, num_classes, seed=seed)}
    if not all(math.isfinite(out["noniid"][k]) for k in ("xi", "jsd", "mmd")):
        raise ValueError("non-finite non-IIDness")
    return out
