"""FedAux's Gaussian-kernel soft sorting: dense vs chunked (exact) vs Chebyshev (bounded error).

    python benchmarks/apv_kernel.py [--sizes 1000,4000,8000,16000,34000,50000] [--dim 256]
                                    [--dense-max 8000] [--threads 2] [--train-nodes 34000]

For each size N and implementation, one forward + backward of
``z = kernel_smooth(apv_scores(h, a), h, σ=1)`` with ``h`` [N, d'] and the APV
``a`` [d'] requiring grad, float32 on CPU. Each case runs in a fresh
subprocess; "extra MiB" is the rise of the process's peak RSS (``ru_maxrss``)
over its RSS just before the call, i.e. what the kernel itself needed.
Then: errors against the dense reference (float32 and float64), and the extra
peak memory of one full FedAux training step (``FedAuxTrainer.train(1)``) on
a synthetic client of ``--train-nodes`` nodes (arxiv-like: 128 features,
40 classes, ~14 directed edges per node, d'=256, ``fedaux-kernel=auto``).
Prints tables and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time

import torch


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def kernel_case(impl: str, n: int, dim: int, seed: int = 0) -> dict:
    """One forward+backward in this process: seconds and extra peak MiB."""
    from fedgraph_flwr.nn.apv_kernel import apv_scores, kernel_smooth

    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, dim, generator=g).relu_().requires_grad_()
    a = torch.randn(dim, generator=g).requires_grad_()
    upstream = torch.randn(n, dim, generator=g)
    before = rss_mib()
    t0 = time.perf_counter()
    z = kernel_smooth(apv_scores(h, a, "cosine"), h, 1.0, impl)
    t1 = time.perf_counter()
    (z * upstream).sum().backward()
    t2 = time.perf_counter()
    return {"impl": impl, "nodes": n, "dim": dim, "forward_s": t1 - t0, "backward_s": t2 - t1,
            "total_s": t2 - t0, "extra_mib": peak_rss_mib() - before}


def train_case(n: int, dim: int, seed: int = 0) -> dict:
    """One FedAuxTrainer step on an arxiv-sized client: seconds and extra peak MiB."""
    from torch_geometric.data import Data

    from fedgraph_flwr.algorithms.fedaux import FedAuxTrainer
    from fedgraph_flwr.config import RunConfig

    g = torch.Generator().manual_seed(seed)
    m = 7 * n
    src, dst = torch.randint(0, n, (m,), generator=g), torch.randint(0, n, (m,), generator=g)
    y = torch.randint(0, 40, (n,), generator=g)
    train = torch.rand(n, generator=g) < 0.05
    data = Data(x=torch.randn(n, 128, generator=g), y=y,
                edge_index=torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]),
                train_mask=train, val_mask=~train, test_mask=~train)
    config = RunConfig.from_config({"algorithm": "fedaux", "seed": 0, "lr": 0.01,
                                    "weight-decay": 1e-6, "hidden": dim, "dropout": 0.5,
                                    "metric": "accuracy"})
    trainer = FedAuxTrainer(data, config, 40, torch.device("cpu"))
    before = rss_mib()
    t0 = time.perf_counter()
    loss = trainer.train(1)["train_loss"]
    t1 = time.perf_counter()
    return {"impl": "train-step", "nodes": n, "dim": dim, "total_s": t1 - t0,
            "extra_mib": peak_rss_mib() - before, "train_loss": loss}


def error_rows(n: int, dim: int) -> list[dict]:
    """Max abs error of z, ∂/∂a, ∂/∂h relative to the dense path's max magnitude."""
    from fedgraph_flwr.nn.apv_kernel import apv_scores, kernel_smooth

    rows = []
    for dtype in (torch.float32, torch.float64):
        for mode, sigma in (("cosine", 1.0), ("maxnorm", 1.0), ("maxnorm", 0.3)):
            g = torch.Generator().manual_seed(1)
            h0 = torch.randn(n, dim, generator=g, dtype=dtype).relu_()
            a0 = torch.randn(dim, generator=g, dtype=dtype)
            upstream = torch.randn(n, dim, generator=g, dtype=dtype)
            out = {}
            for impl in ("dense", "chunked", "chebyshev"):
                h, a = h0.clone().requires_grad_(), a0.clone().requires_grad_()
                z = kernel_smooth(apv_scores(h, a, mode), h, sigma, impl, block_elems=1 << 20)
                (z * upstream).sum().backward()
                out[impl] = (z.detach(), a.grad, h.grad)
            for impl in ("chunked", "chebyshev"):
                errs = [float((x - r).abs().max() / r.abs().max()) for x, r in zip(out[impl], out["dense"])]
                rows.append({"impl": impl, "dtype": str(dtype).split(".")[-1], "score": mode,
                             "sigma": sigma, "rel_err_z": errs[0], "rel_err_grad_a": errs[1],
                             "rel_err_grad_h": errs[2]})
    return rows


def run_worker(args: list[str], threads: int, script: str = __file__) -> dict:
    """``script --worker ARGS --threads T`` in a fresh process: its last stdout line as JSON."""
    cmd = [sys.executable, script, "--worker", *args, "--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,4000,8000,16000,34000,50000")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--dense-max", type=int, default=8000)
    parser.add_argument("--cheb-max", type=int, default=10**9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-nodes", type=int, default=34000)
    parser.add_argument("--error-nodes", type=int, default=2000)
    parser.add_argument("--worker", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker is not None:
        kind, n = args.worker[0], int(args.worker[1])
        row = train_case(n, args.dim) if kind == "train" else kernel_case(kind, n, args.dim)
        print(json.dumps(row))
        return

    rows = []
    print(f"{'impl':>10} {'N':>7} {'fwd s':>8} {'bwd s':>8} {'total s':>8} {'extra MiB':>10}")
    for n in (int(x) for x in args.sizes.split(",")):
        for impl in ("dense", "chunked", "chebyshev"):
            if (impl == "dense" and n > args.dense_max) or (impl == "chebyshev" and n > args.cheb_max):
                continue
            row = run_worker([impl, str(n), "--dim", str(args.dim)], args.threads)
            row.setdefault("impl", impl)
            row.setdefault("nodes", n)
            rows.append(row)
            if "error" in row:
                print(f"{impl:>10} {n:>7}  failed: {row['error']}")
            else:
                print(f"{impl:>10} {n:>7} {row['forward_s']:8.2f} {row['backward_s']:8.2f} "
                      f"{row['total_s']:8.2f} {row['extra_mib']:10.0f}", flush=True)
    train = run_worker(["train", str(args.train_nodes), "--dim", str(args.dim)], args.threads)
    print(f"\nFedAux train step, N={args.train_nodes}, d'={args.dim}: "
          + (f"{train['total_s']:.2f} s, extra peak {train['extra_mib']:.0f} MiB"
             if "error" not in train else f"failed: {train['error']}"))
    errors = error_rows(args.error_nodes, args.dim)
    print(f"\nerrors vs dense (N={args.error_nodes}, max abs error / max |dense|):")
    print(f"{'impl':>10} {'dtype':>8} {'score':>8} {'sigma':>6} {'z':>9} {'grad a':>9} {'grad h':>9}")
    for e in errors:
        print(f"{e['impl']:>10} {e['dtype']:>8} {e['score']:>8} {e['sigma']:>6} "
              f"{e['rel_err_z']:9.1e} {e['rel_err_grad_a']:9.1e} {e['rel_err_grad_h']:9.1e}")
    print(json.dumps({"benchmark": "apv_kernel", "threads": args.threads, "dim": args.dim,
                      "machine": platform.processor() or platform.machine(),
                      "kernel": rows, "train_step": train, "errors": errors}))


if __name__ == "__main__":
    main()
