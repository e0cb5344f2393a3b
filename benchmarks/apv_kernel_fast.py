"""FedAux's fast kernel (``fedaux-kernel=fast``, ``auto`` above 4,096 nodes) against the exact kernel.

    OMP_NUM_THREADS=1 python benchmarks/apv_kernel_fast.py [--sizes 1000,5000,20000,50000,169343]
        [--dim 256] [--exact-max 20000] [--sample-rows 512] [--threads 1] [--skip-errors] [--skip-timing]

Error table: for each N, float32 and float64, and two score distributions —
``apv`` (cosine APV scores of ReLU embeddings against a random APV, σ = 1, the
config default) and ``clustered`` (four tight clusters in [−1, 1], σ = 0.1) —
the max abs error of z, ∂L/∂s and ∂L/∂h of the fast kernel divided by the
maximum of the exact kernel in float64 (column "exact32": the largest of the
same three errors for the exact kernel run in float32), with
L = Σ_i ⟨G_i, z_i⟩ for a random upstream G. Up to ``--exact-max`` nodes the
exact reference is the chunked kernel over all rows. Above it the reference is
still exact but restricted: G is zero outside ``--sample-rows`` random rows, so
L, z on those rows and the full gradients ∂L/∂s, ∂L/∂h need only those rows of
the kernel (computed exactly in float64 blocks); the fast kernel runs on all
N rows with the same G.
Time/memory table: one forward + backward, h [N, dim] float32, each case in a
fresh process ("extra MiB" = rise of peak RSS over the RSS before the call).
The exact kernel is timed up to ``--exact-max`` nodes; above, its time is
extrapolated from the largest timed size by (N/N₀)² (its memory is linear).
Prints tables and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

# benchmarks/ is the script's folder, so its sibling imports by name.
import apv_kernel
import torch
from apv_kernel import peak_rss_mib, rss_mib


def make_case(dist: str, n: int, dim: int, dtype, seed: int = 0):
    """(s, h, σ, upstream) for one score distribution."""
    from fedgraph_flwr.nn.apv_kernel import apv_scores

    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, dim, generator=g, dtype=dtype).relu_()
    upstream = torch.randn(n, dim, generator=g, dtype=dtype)
    if dist == "apv":
        a = torch.randn(dim, generator=g, dtype=dtype)
        return apv_scores(h, a, "cosine"), h, 1.0, upstream
    centres = torch.tensor([-0.9, -0.2, 0.35, 0.8], dtype=dtype)
    s = centres[torch.randint(0, 4, (n,), generator=g)] + 0.01 * torch.randn(n, generator=g, dtype=dtype)
    return s.clamp_(-1, 1), h, 0.1, upstream


def exact_rows(s, h, sigma, upstream, rows, block=64, dtype=torch.float64):
    """Exact z[rows], ∂L/∂s, ∂L/∂h for L = Σ_{i∈rows} ⟨G_i, z_i⟩, in row blocks (float64 by default)."""
    s64 = s.detach().to(dtype).clone().requires_grad_()
    h64 = h.detach().to(dtype).clone().requires_grad_()
    g64 = upstream.to(dtype)
    zs = []
    for start in range(0, rows.numel(), block):
        idx = rows[start:start + block]
        k = torch.exp(-((s64[idx, None] - s64[None, :]) ** 2) / sigma**2)
        z = (k @ h64) / k.sum(dim=1, keepdim=True)
        (z * g64[idx]).sum().backward()
        zs.append(z.detach())
    return torch.cat(zs), s64.grad, h64.grad


def rel(x, ref) -> float:
    return float((x.double() - ref.double()).abs().max() / ref.double().abs().max())


def error_row(dist: str, n: int, dim: int, dtype, exact_max: int, sample_rows: int) -> dict:
    from fedgraph_flwr.nn.apv_kernel import fast_kernel_parameters, kernel_smooth_chunked, kernel_smooth_fast

    s0, h0, sigma, upstream = make_case(dist, n, dim, dtype)
    s0, h0 = s0.detach(), h0.detach()
    if n > exact_max:
        rows = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:sample_rows]
        mask = torch.zeros(n, 1, dtype=dtype)
        mask[rows] = 1
        upstream = upstream * mask
    s, h = s0.clone().requires_grad_(), h0.clone().requires_grad_()
    z = kernel_smooth_fast(s, h, sigma)
    (z * upstream).sum().backward()
    fast = (z.detach(), s.grad, h.grad)
    # reference: the exact kernel in float64; for float32 rows also the exact kernel's own float32 error
    exact32 = None
    if n > exact_max:
        ref = exact_rows(s0, h0, sigma, upstream, rows)
        fast = (fast[0][rows],) + fast[1:]
        if dtype == torch.float32:
            exact32 = exact_rows(s0, h0, sigma, upstream, rows, dtype=torch.float32)
        reference = f"exact float64, {sample_rows} sampled rows"
    else:
        def chunked(dt):
            s, h = s0.to(dt).clone().requires_grad_(), h0.to(dt).clone().requires_grad_()
            zc = kernel_smooth_chunked(s, h, sigma)
            (zc * upstream.to(dt)).sum().backward()
            return zc.detach(), s.grad, h.grad
        ref = chunked(torch.float64)
        if dtype == torch.float32:
            exact32 = chunked(torch.float32)
        reference = "exact float64, all rows"
    exact32_err = max(rel(x, r) for x, r in zip(exact32, ref)) if exact32 is not None else None
    p, m, eps = fast_kernel_parameters(n)
    return {"dist": dist, "sigma": sigma, "nodes": n, "dtype": str(dtype).split(".")[-1],
            "rel_err_z": rel(fast[0], ref[0]), "rel_err_grad_s": rel(fast[1], ref[1]),
            "rel_err_grad_h": rel(fast[2], ref[2]), "terms": p, "offsets": m,
            "bound_vs_max_h": 2 * n * eps / (1 - n * eps), "reference": reference,
            "exact_float32_max_err": exact32_err}


def time_case(impl: str, n: int, dim: int) -> dict:
    from fedgraph_flwr.nn.apv_kernel import kernel_smooth

    s, h, sigma, upstream = make_case("apv", n, dim, torch.float32)
    s, h = s.detach().requires_grad_(), h.detach().requires_grad_()
    before = rss_mib()
    t0 = time.perf_counter()
    z = kernel_smooth(s, h, sigma, impl)
    t1 = time.perf_counter()
    (z * upstream).sum().backward()
    t2 = time.perf_counter()
    return {"impl": impl, "nodes": n, "forward_s": t1 - t0, "backward_s": t2 - t1, "total_s": t2 - t0,
            "extra_mib": peak_rss_mib() - before}


def run_worker(args: list[str], threads: int) -> dict:
    return apv_kernel.run_worker(args, threads, script=__file__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,20000,50000,169343")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--exact-max", type=int, default=20000)
    parser.add_argument("--sample-rows", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-errors", action="store_true")
    parser.add_argument("--worker", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker is not None:
        kind, n = args.worker[0], int(args.worker[1])
        if kind.startswith("err-"):
            _, dist, dt = kind.split("-")
            row = error_row(dist, n, args.dim, getattr(torch, dt), args.exact_max, args.sample_rows)
        else:
            row = time_case(kind, n, args.dim)
        print(json.dumps(row))
        return

    sizes = [int(x) for x in args.sizes.split(",")]
    errors = []
    print(f"{'dist':>9} {'σ':>4} {'N':>7} {'dtype':>8} {'z':>8} {'∂s':>8} {'∂h':>8} {'p':>3} {'m':>3} "
          f"{'exact32':>8} reference")
    for n in ([] if args.skip_errors else sizes):
        for dtype in ("float32", "float64"):
            for dist in ("apv", "clustered"):
                row = run_worker([f"err-{dist}-{dtype}", str(n), "--dim", str(args.dim),
                                  "--exact-max", str(args.exact_max), "--sample-rows", str(args.sample_rows)],
                                 args.threads)
                errors.append(row)
                if "error" in row:
                    print(f"{dist:>9} {n:>7} {dtype:>8} failed: {row['error']}")
                    continue
                exact32 = row["exact_float32_max_err"]
                exact32_text = format(exact32, "8.1e") if exact32 else "       –"
                print(f"{dist:>9} {row['sigma']:>4} {n:>7} {dtype:>8} {row['rel_err_z']:8.1e} "
                      f"{row['rel_err_grad_s']:8.1e} {row['rel_err_grad_h']:8.1e} {row['terms']:>3} "
                      f"{row['offsets']:>3} {exact32_text} {row['reference']}", flush=True)
    timings = []
    if not args.skip_timing:
        print(f"\n{'impl':>8} {'N':>7} {'fwd s':>8} {'bwd s':>8} {'total s':>8} {'extra MiB':>10}")
        last_exact = None
        for n in sizes:
            for impl in ("chunked", "fast"):
                if impl == "chunked" and n > args.exact_max:
                    if last_exact:
                        est = last_exact["total_s"] * (n / last_exact["nodes"]) ** 2
                        timings.append({"impl": impl, "nodes": n, "total_s_estimated": est})
                        shown = "~" + format(est, ".0f")
                        print(f"{impl:>8} {n:>7} {'':>8} {'':>8} {shown:>8} {'(est.)':>10}")
                    continue
                row = run_worker([impl, str(n), "--dim", str(args.dim)], args.threads)
                row.setdefault("impl", impl)
                row.setdefault("nodes", n)
                timings.append(row)
                if "error" in row:
                    print(f"{impl:>8} {n:>7} failed: {row['error']}")
                    continue
                if impl == "chunked":
                    last_exact = row
                print(f"{impl:>8} {n:>7} {row['forward_s']:8.2f} {row['backward_s']:8.2f} "
                      f"{row['total_s']:8.2f} {row['extra_mib']:10.0f}", flush=True)
    print(json.dumps({"benchmark": "apv_kernel_fast", "threads": args.threads, "dim": args.dim,
                      "machine": platform.processor() or platform.machine(),
                      "errors": errors, "timings": timings}))


if __name__ == "__main__":
    main()
