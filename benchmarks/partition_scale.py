"""Partitioning at ogbn-arxiv scale: time and peak memory of METIS + subgraph building.

    python benchmarks/partition_scale.py [--nodes 170000 --edges 1200000 --clients 10]

Builds a seeded SBM-like graph (equal blocks, most edges inside blocks) with the
vectorised sampler of ``fedgraph_flwr.data.synthetic``, random float32 features
(128-dim, as arxiv) and 40 labels, a global 5/47.5/47.5 split, then
``partition_graph(..., "metis")``. Prints a table of phases and one JSON line.
Peak memory: ``ru_maxrss`` of this process (whole-process high-water mark, KiB on Linux).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time

import numpy as np
import torch
from torch_geometric.data import Data

from fedgraph_flwr.data.partition import csr_adjacency, metis_membership, partition_graph
from fedgraph_flwr.data.splits import random_split, split_ratios
from fedgraph_flwr.data.synthetic import sbm_edge_index


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build_graph(num_nodes: int, num_edges: int, num_blocks: int, intra_share: float,
                num_features: int, num_classes: int, seed: int) -> Data:
    """An SBM whose expected undirected edge count is ``num_edges``."""
    sizes = np.full(num_blocks, num_nodes // num_blocks)
    sizes[: num_nodes % num_blocks] += 1
    intra_pairs = float((sizes * (sizes - 1) // 2).sum())
    inter_pairs = num_nodes * (num_nodes - 1) / 2.0 - intra_pairs
    probs = np.full((num_blocks, num_blocks), (1 - intra_share) * num_edges / inter_pairs)
    np.fill_diagonal(probs, intra_share * num_edges / intra_pairs)
    edge_index = sbm_edge_index(sizes, probs, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(num_nodes, num_features, generator=gen)
    y = torch.randint(0, num_classes, (num_nodes,), generator=gen)
    return Data(x=x, edge_index=edge_index, y=y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=170_000)
    ap.add_argument("--edges", type=int, default=1_200_000, help="undirected edges (expected)")
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--intra-share", type=float, default=0.85)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rows: list[tuple[str, float, float]] = []
    t0 = time.perf_counter()
    graph = build_graph(args.nodes, args.edges, args.blocks, args.intra_share, args.features,
                        args.classes, args.seed)
    rows.append(("generate graph", time.perf_counter() - t0, peak_rss_mib()))

    t = time.perf_counter()
    graph.train_mask, graph.val_mask, graph.test_mask = random_split(
        graph.num_nodes, *split_ratios(0.05), seed=1234)
    rows.append(("global split", time.perf_counter() - t, peak_rss_mib()))

    t = time.perf_counter()
    xadj, adjncy = csr_adjacency(graph.edge_index, graph.num_nodes)
    rows.append(("CSR adjacency (alone)", time.perf_counter() - t, peak_rss_mib()))
    del xadj, adjncy

    t = time.perf_counter()
    parts = metis_membership(graph.edge_index, graph.num_nodes, args.clients)
    rows.append(("METIS k-way (alone, incl. CSR)", time.perf_counter() - t, peak_rss_mib()))

    t = time.perf_counter()
    clients = partition_graph(graph, args.clients, "metis", seed=1234)
    t_part = time.perf_counter() - t
    rows.append(("partition_graph (METIS + subgraphs)", t_part, peak_rss_mib()))
    total = time.perf_counter() - t0

    kept = sum(c.edge_index.size(1) for c in clients)
    sizes = [c.num_nodes for c in clients]
    assert sum(sizes) == graph.num_nodes and np.bincount(parts).size == args.clients

    print(f"graph: {graph.num_nodes} nodes, {graph.edge_index.size(1) // 2} undirected edges, "
          f"{args.features} features; METIS into {args.clients} clients "
          f"(torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads)")
    print(f"{'phase':<38} {'seconds':>9} {'peak RSS MiB':>13}")
    print("-" * 62)
    for name, sec, rss in rows:
        print(f"{name:<38} {sec:>9.2f} {rss:>13.0f}")
    print("-" * 62)
    print(f"{'total':<38} {total:>9.2f} {peak_rss_mib():>13.0f}")
    print(f"client nodes min/max {min(sizes)}/{max(sizes)}; edges kept inside clients "
          f"{kept / graph.edge_index.size(1):.1%}")
    print(json.dumps({
        "benchmark": "partition_scale", "nodes": graph.num_nodes,
        "undirected_edges": graph.edge_index.size(1) // 2, "clients": args.clients,
        "features": args.features, "seconds": {name: round(sec, 3) for name, sec, _ in rows},
        "total_seconds": round(total, 3), "peak_rss_mib": round(peak_rss_mib(), 1),
        "client_nodes_min": min(sizes), "client_nodes_max": max(sizes),
        "edge_share_kept": round(kept / graph.edge_index.size(1), 4),
    }))


if __name__ == "__main__":
    main()
