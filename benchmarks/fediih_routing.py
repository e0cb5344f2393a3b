"""FedIIH's neighbourhood routing: the fused and sparse CSR kernels vs the gather form.

One routing layer (T iterations) on a random graph of ``n`` nodes and average degree
``deg``, with K factors of width d_k: forward without autograd (Step B and
evaluation) and forward + backward (Step A). ``csr`` is the layer's sparse kernels
(``kernel="sparse"``, :mod:`fedgraph_flwr.nn.factor_graph`); ``fused`` its fused CPU
kernel (``kernel="fused"``, :mod:`fedgraph_flwr.nn.fused_routing`, what ``auto`` takes
from 4,097 nodes); ``gather`` is the same routing written with ``z[src]`` gathers and a
scatter-add over [m, K, d_k] tensors, the form the sparse kernels replaced.

    python benchmarks/fediih_routing.py                 # the default cases below
    python benchmarks/fediih_routing.py --cases 1000:8:6:256 --iters 6

Prints a table and one JSON line per case (``{"benchmark": "fediih_routing", ...}``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# n:deg:K:d_k. Minesweeper-10 and Cora-10 client sizes with their docs/reading/fediih.md §6 widths, a
# larger client, and an arxiv-size client at 10 clients (configs/scale: K = 2, d_k = 128).
DEFAULT_CASES = ["1000:8:6:256", "250:4:2:128", "20000:10:4:64", "16441:13:2:128"]


def gather_routing(x, edge_index, k: int, iters: int, tau: float = 1.0):
    import torch
    import torch.nn.functional as F

    n = x.size(0)
    z = F.normalize(x.view(n, k, -1), dim=-1)
    src, trg = edge_index
    z_src = z[src]
    c = z
    for _ in range(iters):
        p = torch.softmax((z_src * c[trg]).sum(-1) / tau, dim=1)
        c = F.normalize(torch.zeros_like(z).index_add(0, trg, p.unsqueeze(-1) * z_src) + z, dim=-1)
    return c.reshape(n, -1)


def bench_case(n: int, deg: int, k: int, d: int, iters: int, repeats: int) -> list[dict]:
    import torch
    from torch_geometric.utils import to_undirected

    from fedgraph_flwr.nn.disengcn import NeighbourhoodRouting

    gen = torch.Generator().manual_seed(0)
    edge_index = to_undirected(torch.randint(0, n, (2, n * deg // 2), generator=gen), num_nodes=n)
    x = torch.randn(n, k * d, generator=gen, requires_grad=True)
    sparse = NeighbourhoodRouting(k, iters, kernel="sparse")
    fused = NeighbourhoodRouting(k, iters, kernel="fused")
    forms = {"csr": lambda: sparse(x, edge_index), "fused": lambda: fused(x, edge_index),
             "gather": lambda: gather_routing(x, edge_index, k, iters)}

    def timed(fn) -> float:
        fn()  # warm-up (the graphs' one-off construction; numba's compile or cache load)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    rows = []
    for form, run in forms.items():
        with torch.no_grad():
            forward = timed(run)
        backward = timed(lambda run=run: run().sum().backward())
        rows.append({"benchmark": "fediih_routing", "form": form, "nodes": n,
                     "edges": int(edge_index.size(1)), "factors": k, "factor_dim": d,
                     "iterations": iters, "forward_s": forward, "forward_backward_s": backward,
                     "threads": torch.get_num_threads()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="n:deg:K:d_k")
    parser.add_argument("--iters", type=int, default=6, help="routing iterations T")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for case in args.cases:
        n, deg, k, d = (int(v) for v in case.split(":"))
        rows += bench_case(n, deg, k, d, args.iters, args.repeats)
    print(f"{'form':8} {'nodes':>7} {'edges':>8} {'K x d_k':>9} {'fwd s':>8} {'fwd+bwd s':>10}")
    for r in rows:
        print(f"{r['form']:8} {r['nodes']:7d} {r['edges']:8d} {r['factors']:>4}x{r['factor_dim']:<4d}"
              f" {r['forward_s']:8.3f} {r['forward_backward_s']:10.3f}")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
