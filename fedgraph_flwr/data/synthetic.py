"""Seeded synthetic graphs, generated without downloads and without dense N×N arrays.

- :func:`sbm_edge_index`: exact stochastic-block-model sampling (every node pair is an
  independent Bernoulli), done per block pair with a binomial count plus sampling
  without replacement, so the cost is O(#blocks² + #edges), not O(N²).
- :func:`fedaux_sbm`: FedAux paper App. D.4 (docs/reading/fedaux.md §7.7), 20 blocks of 150.
- :func:`csbm`: a contextual SBM in the spirit of FedSpray's Proposition 3.1
  (docs/reading/fedspray.md §10): per client a majority class, minority nodes whose neighbours are
  mostly majority-class, Gaussian features around class means.

Both graph builders store ``block`` (int64 [N], the intended client of each node), which
the ``"blocks"`` partition mode uses.
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import coalesce


def _decode_upper_triangle(k: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row/col (i < j) of the k-th strictly-upper-triangular entry of an n×n matrix (row-major)."""
    k = k.astype(np.float64)
    i = n - 2 - np.floor(np.sqrt(-8.0 * k + 4.0 * n * (n - 1) - 7.0) / 2.0 - 0.5)
    j = k + i + 1 - n * (n - 1) / 2.0 + (n - i) * ((n - i) - 1) / 2.0
    return i.astype(np.int64), j.astype(np.int64)


def sbm_edge_index(block_sizes: list[int] | np.ndarray, probs: np.ndarray, seed: int) -> torch.Tensor:
    """Sample an undirected SBM; returns edge_index int64 [2, 2·E] (both directions, coalesced).

    ``block_sizes``: [B] node counts (nodes are numbered block by block).
    ``probs``: [B, B] symmetric edge probabilities. No self loops.
    """
    sizes = np.asarray(block_sizes, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    num_blocks = len(sizes)
    if probs.shape != (num_blocks, num_blocks) or not np.allclose(probs, probs.T):
        raise ValueError(f"probs must be a symmetric {num_blocks}x{num_blocks} matrix")
    if (probs < 0).any() or (probs > 1).any():
        raise ValueError("edge probabilities must lie in [0, 1]")
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rows, cols = [], []
    # One iteration per block pair (B²/2), never per node or per edge.
    for a in range(num_blocks):
        for b in range(a, num_blocks):
            p = probs[a, b]
            na, nb = int(sizes[a]), int(sizes[b])
            num_pairs = na * (na - 1) // 2 if a == b else na * nb
            if p <= 0 or num_pairs == 0:
                continue
            count = int(rng.binomial(num_pairs, p))
            if count == 0:
                continue
            picked = rng.choice(num_pairs, size=count, replace=False)
            if a == b:
                u, v = _decode_upper_triangle(picked, na)
            else:
                u, v = picked // nb, picked % nb
            rows.append(u + offsets[a])
            cols.append(v + offsets[b])
    if not rows:
        return torch.empty(2, 0, dtype=torch.long)
    row = torch.from_numpy(np.concatenate(rows))
    col = torch.from_numpy(np.concatenate(cols))
    edge_index = torch.stack([torch.cat([row, col]), torch.cat([col, row])])
    return coalesce(edge_index, num_nodes=int(offsets[-1]))


def fedaux_sbm(
    seed: int = 0,
    num_groups: int = 5,
    clients_per_group: int = 4,
    block_size: int = 150,
    p_intra_step: float = 0.15,
    p_inter: float = 0.02,
    p_group_label: float = 0.8,
) -> Data:
    """FedAux App. D.4: 20 blocks of 150 nodes, one block per client.

    Group i (1-based) has intra-block edge probability ``p_intra_step·i``; every pair of
    nodes in different blocks links with ``p_inter``. A node of group i has label i−1
    with probability 0.8 and each of the other labels with 0.2/(num_groups−1) = 0.05.
    Features are the one-hot labels (5-dim), as in the paper.

    Returns Data(x [3000, 5] float32, edge_index [2, E], y [3000] int64,
    block [3000] int64 (client id), group [3000] int64).
    """
    num_blocks = num_groups * clients_per_group
    num_nodes = num_blocks * block_size
    group_of_block = np.arange(num_blocks) // clients_per_group
    probs = np.full((num_blocks, num_blocks), p_inter)
    np.fill_diagonal(probs, p_intra_step * (group_of_block + 1))
    edge_index = sbm_edge_index([block_size] * num_blocks, probs, seed)

    rng = np.random.default_rng(seed + 1)  # separate stream: labels do not depend on edges
    block = np.repeat(np.arange(num_blocks), block_size)
    group = group_of_block[block]
    # Other labels: shift by 1..G-1, uniform, so each non-group label has (1-p)/(G-1).
    other = (group + rng.integers(1, num_groups, size=num_nodes)) % num_groups
    y = np.where(rng.random(num_nodes) < p_group_label, group, other)
    y_t = torch.from_numpy(y).long()
    x = torch.nn.functional.one_hot(y_t, num_groups).float()
    return Data(x=x, edge_index=edge_index, y=y_t,
                block=torch.from_numpy(block).long(), group=torch.from_numpy(group).long())


def csbm(
    seed: int = 0,
    num_clients: int = 10,
    nodes_per_client: int = 300,
    num_classes: int = 2,
    num_features: int = 16,
    mean_sep: float = 2.0,
    avg_degree: float = 10.0,
    p_majority: tuple[float, float] = (0.7, 0.9),
    minority_ratio: tuple[float, float] = (0.1, 0.5),
    p_inter: float = 0.0005,
) -> Data:
    """Contextual SBM with per-client label skew (FedSpray Prop. 3.1 generator).

    Client k has majority class ``k mod C`` (so classes are globally balanced when
    ``num_clients`` is a multiple of C) and minority:majority node ratio ``q_k``; the
    minority nodes take the other classes uniformly. Within a client, edge
    probabilities for (maj,maj), (maj,min), (min,min) pairs are chosen so that the
    expected share of majority-class neighbours is ``p_k`` for *both* classes, and a
    majority node has expected degree ``avg_degree``. ``p_k`` and ``q_k`` are spread
    linearly over the given ranges across clients. Features: x ~ N(μ_y, I) with class
    means at pairwise distance ``mean_sep``.

    Returns Data(x [N, F] float32, edge_index, y [N] int64, block [N] int64 (client id),
    p_majority [K] float32, minority_ratio [K] float32).
    """
    if num_features < num_classes:
        raise ValueError("csbm needs num_features >= num_classes (orthogonal class means)")
    rng = np.random.default_rng(seed)
    p_k = np.linspace(*p_majority, num_clients)
    q_k = np.linspace(*minority_ratio, num_clients)
    n_min = np.maximum(1, np.round(nodes_per_client * q_k / (1 + q_k)).astype(np.int64))
    n_maj = nodes_per_client - n_min

    # Blocks: [client0 majority, client0 minority, client1 majority, ...].
    sizes = np.stack([n_maj, n_min], 1).reshape(-1)
    probs = np.full((2 * num_clients, 2 * num_clients), p_inter)
    for k in range(num_clients):  # per client, not per node
        p, d = p_k[k], avg_degree
        a = p * d / max(n_maj[k] - 1, 1)  # maj-maj
        b = (1 - p) * d / n_min[k]  # maj-min: a majority node's minority share
        d_min = n_maj[k] * b / p  # a minority node's degree that makes its majority share p
        c = (1 - p) * d_min / max(n_min[k] - 1, 1)  # min-min
        block_probs = np.array([[a, b], [b, c]])
        if (block_probs > 1).any():
            raise ValueError(f"csbm client {k}: edge probability > 1; lower avg_degree")
        probs[2 * k:2 * k + 2, 2 * k:2 * k + 2] = block_probs
    edge_index = sbm_edge_index(sizes, probs, seed)

    majority = np.arange(num_clients) % num_classes
    block = np.repeat(np.arange(num_clients), nodes_per_client)
    is_min = np.concatenate([np.r_[np.zeros(n_maj[k], bool), np.ones(n_min[k], bool)]
                             for k in range(num_clients)])
    shift = rng.integers(1, num_classes, size=block.size) if num_classes > 1 else 0
    y = np.where(is_min, (majority[block] + shift) % num_classes, majority[block])

    # Orthonormal class directions scaled so that ||μ_a − μ_b|| = mean_sep.
    q, _ = np.linalg.qr(rng.standard_normal((num_features, num_classes)))
    means = q.T * (mean_sep / np.sqrt(2.0))
    x = means[y] + rng.standard_normal((block.size, num_features))
    return Data(
        x=torch.from_numpy(x).float(), edge_index=edge_index, y=torch.from_numpy(y).long(),
        block=torch.from_numpy(block).long(),
        p_majority=torch.from_numpy(p_k).float(), minority_ratio=torch.from_numpy(q_k).float(),
    )


#: ogbn-arxiv's shape: nodes, undirected edges (after ToUndirected), features, classes.
ARXIV_SHAPE = {"num_nodes": 169_343, "num_edges": 1_166_243, "num_features": 128,
               "num_classes": 40}


def _ring_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance on the unit circle of positions in [0, 1)."""
    d = np.abs(a - b) % 1.0
    return np.minimum(d, 1.0 - d)


def arxiv_like(
    seed: int = 0,
    num_nodes: int = ARXIV_SHAPE["num_nodes"],
    num_edges: int = ARXIV_SHAPE["num_edges"],
    num_features: int = ARXIV_SHAPE["num_features"],
    num_classes: int = ARXIV_SHAPE["num_classes"],
    num_communities: int = 200,
    intra_share: float = 0.8,
    ring_decay: float = 0.05,
    label_width: float = 0.5,
    label_noise: float = 0.1,
    feature_signal: float = 0.12,
) -> Data:
    """A seeded graph with ogbn-arxiv's shape and community structure (issue #29's workload).

    Communities (log-normal sizes) sit on a ring, like research areas: a share
    ``intra_share`` of the expected ``num_edges`` undirected edges falls inside
    communities, the rest between communities with a probability that decays as
    ``exp(-ring distance / ring_decay)``. So METIS cuts the ring into arcs, and clients
    differ. Classes sit on the same ring; a community's labels follow a Gaussian of
    width ``label_width`` class spacings around its position, mixed with ``label_noise``
    uniform labels, so each community holds a few neighbouring classes and neighbouring
    clients share some. Features: ``feature_signal``·μ_y + N(0, I), μ_c ~ N(0, I), so
    features alone are weak and the graph helps: on a global 5/47.5/47.5 split a two-layer
    MLP reaches 17 % test accuracy and a two-layer GCN 62 % (100 full-batch Adam epochs).

    Degrees are Poisson within blocks, not arxiv's heavy tail. Cost: one iteration per
    community pair (``num_communities``²/2) plus O(num_edges) sampling; no N×N array.

    Returns Data(x [N, F] float32, edge_index [2, 2·E] int64, y [N] int64,
    community [N] int64).
    """
    if not 0.0 < intra_share <= 1.0:
        raise ValueError("intra_share must lie in (0, 1]")
    if num_communities < 2 or num_nodes < 2 * num_communities:
        raise ValueError("need at least 2 communities and 2 nodes per community")
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, 0.5, num_communities)
    sizes = np.floor(weights / weights.sum() * num_nodes).astype(np.int64)
    sizes[: num_nodes - int(sizes.sum())] += 1  # exact total
    sizes = np.maximum(sizes, 2)
    sizes[np.argmax(sizes)] -= int(sizes.sum()) - num_nodes

    position = (np.arange(num_communities) + 0.5) / num_communities
    intra_pairs = sizes * (sizes - 1) / 2.0
    pair_weight = np.exp(-_ring_distance(position[:, None], position[None, :]) / ring_decay)
    np.fill_diagonal(pair_weight, 0.0)
    inter_mass = float((np.outer(sizes, sizes) * pair_weight).sum() / 2.0)
    probs = pair_weight * ((1.0 - intra_share) * num_edges / inter_mass)
    np.fill_diagonal(probs, intra_share * num_edges / intra_pairs.sum())
    if (probs > 1).any():
        raise ValueError("edge probability > 1: use fewer edges or more communities")
    edge_index = sbm_edge_index(sizes, probs, seed)

    label_rng = np.random.default_rng(seed + 1)  # labels and features do not depend on edges
    community = np.repeat(np.arange(num_communities), sizes)
    class_position = (np.arange(num_classes) + 0.5) / num_classes
    spacing = _ring_distance(position[:, None], class_position[None, :]) * num_classes
    label_probs = np.exp(-0.5 * (spacing / label_width) ** 2)
    label_probs = ((1.0 - label_noise) * label_probs / label_probs.sum(1, keepdims=True)
                   + label_noise / num_classes)
    cdf = np.cumsum(label_probs, 1)
    u = label_rng.random(num_nodes)
    y = np.minimum((u[:, None] > cdf[community]).sum(1), num_classes - 1)

    means = label_rng.standard_normal((num_classes, num_features)).astype(np.float32)
    x = feature_signal * means[y] + label_rng.standard_normal((num_nodes, num_features),
                                                               dtype=np.float32)
    return Data(x=torch.from_numpy(x), edge_index=edge_index, y=torch.from_numpy(y).long(),
                community=torch.from_numpy(community).long())
