"""Time and peak memory of FedIIH's reconstruction term, dense vs blockwise vs sampled.

The term is mean_{i,j∈[n]} BCEWithLogits(r_iᵀ r_j, A_ij) over all n² pairs (docs/reading/fediih.md §3.7).
Each (method, n) runs in its own subprocess so that peak memory is clean: on CPU the
peak is the rise of the process's max RSS during forward+backward, on CUDA
``torch.cuda.max_memory_allocated`` above the inputs. Random graph with mean degree
~10, embeddings r [n, D] ~ N(0, 1/D) (the same seed for every method, so the losses
are comparable).

    python benchmarks/fediih_recon.py                      # 1k..50k nodes, D=256, CPU
    python benchmarks/fediih_recon.py --nodes 1000 5000 --dim 64 --dense-max 5000

Prints a table and one JSON line (``{"benchmark": "fediih_recon", ...}``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def run_one(method: str, n: int, dim: int, columns: int, repeats: int, device: str) -> dict:
    """One measurement in this process: forward + backward of the reconstruction term."""
    import torch
    from torch_geometric.utils import to_undirected

    from fedgraph_flwr.nn.hvgae import reconstruction_loss

    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    edge_index = to_undirected(torch.randint(0, n, (2, 5 * n), generator=g)).to(dev)
    h = (torch.randn(n, dim, generator=g) / dim ** 0.5).to(dev).requires_grad_(True)
    # Warm-up on a tiny graph: lazy imports and kernel set-up stay out of the numbers.
    small = torch.randn(64, dim, device=dev, requires_grad=True)
    torch.autograd.grad(reconstruction_loss(small, edge_index[:, :0], method, num_columns=8), small)
    torch.manual_seed(0)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    rss0 = _maxrss_mb()
    times, loss_value = [], float("nan")
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = reconstruction_loss(h, edge_index, method, num_columns=columns)
        (grad,) = torch.autograd.grad(loss, h)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        loss_value = float(loss)
        del loss, grad
    peak = ((torch.cuda.max_memory_allocated() - base) / 2 ** 20 if dev.type == "cuda"
            else max(0.0, _maxrss_mb() - rss0))
    return {"method": method, "nodes": n, "edges": int(edge_index.size(1)), "dim": dim,
            "time_s": min(times), "peak_mb": peak, "loss": loss_value, "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 2000, 5000, 10000, 20000, 50000])
    parser.add_argument("--dim", type=int, default=256, help="K·d_k (Cora NO: 2×128)")
    parser.add_argument("--columns", type=int, default=256, help="sampled: columns per step")
    parser.add_argument("--dense-max", type=int, default=10000, help="skip dense above this n")
    parser.add_argument("--blockwise-max", type=int, default=50000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:
        method, n = args.one[0], int(args.one[1])
        repeats = 3 if n <= 5000 else 1
        print(json.dumps(run_one(method, n, args.dim, args.columns, repeats, args.device)))
        return

    rows = []
    for n in args.nodes:
        exact = None
        for method in ("dense", "blockwise", "sampled"):
            if ((method == "dense" and n > args.dense_max)
                    or (method == "blockwise" and n > args.blockwise_max)):
                rows.append({"method": method, "nodes": n, "skipped": True})
                continue
            cmd = [sys.executable, __file__, "--one", method, str(n), "--dim", str(args.dim),
                   "--columns", str(args.columns), "--device", args.device]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                rows.append({"method": method, "nodes": n, "error": out.stderr.strip().splitlines()[-1:]})
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            if method in ("dense", "blockwise") and exact is None:
                exact = row["loss"]
            row["rel_err_vs_exact"] = (abs(row["loss"] - exact) / abs(exact)) if exact else None
            rows.append(row)
            print(f"  done {method:9s} n={n}", file=sys.stderr, flush=True)

    header = f"{'nodes':>7} {'method':>10} {'time_s':>9} {'peak_MB':>9} {'loss':>10} {'rel_err':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.get("skipped") or "error" in r:
            note = "skipped" if r.get("skipped") else f"error: {r['error']}"
            print(f"{r['nodes']:>7} {r['method']:>10} {note}")
            continue
        err = "" if r["rel_err_vs_exact"] is None else f"{r['rel_err_vs_exact']:.2e}"
        print(f"{r['nodes']:>7} {r['method']:>10} {r['time_s']:>9.3f} {r['peak_mb']:>9.1f} "
              f"{r['loss']:>10.6f} {err:>9}")
    print(json.dumps({"benchmark": "fediih_recon", "device": args.device, "dim": args.dim,
                      "columns": args.columns, "rows": rows}))


if __name__ == "__main__":
    main()
