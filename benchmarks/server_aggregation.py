"""Server-side aggregation time for many clients (no Flower, no training).

For each algorithm, one real client trainer is built on a small random graph to get
the exact shapes of what a client uploads (parameters) and reports (signature); K
clients' updates are that upload plus Gaussian noise (so similarities are not all
equal), and the algorithm's registered aggregator combines them. ``--features`` and
``--hidden`` set the model size; the table shows the resulting parameter count.

    python benchmarks/server_aggregation.py --clients 1000 --algorithms fedavg fedaux fediih
    python benchmarks/server_aggregation.py --clients 1000 --algorithms fedaux fediih --mix-dtype float32

Prints a table and one JSON line per algorithm (``{"benchmark": "server_aggregation", ...}``).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def client_shapes(algorithm: str, features: int, classes: int, hidden: int, mix_dtype: str):
    """(config, upload, signature) of one real client of ``algorithm``."""
    import torch
    from torch_geometric.data import Data

    from fedgraph_flwr.algorithms import get_algorithm
    from fedgraph_flwr.config import resolve_config

    config = resolve_config(None, {"algorithm": algorithm, "hidden": hidden,
                                   "dataset": "SBM", "server-mix-dtype": mix_dtype})
    n = 64
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, n, (2, 4 * n), generator=gen)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[: n // 2] = True
    data = Data(x=torch.rand(n, features, generator=gen), edge_index=edge_index,
                y=torch.arange(n) % classes, train_mask=mask, val_mask=~mask, test_mask=~mask)
    trainer = get_algorithm(algorithm).trainer(data, config, classes, torch.device("cpu"))
    trainer.train(1)
    return config, trainer.upload(), trainer.signature()


def bench(algorithm: str, clients: int, features: int, classes: int, hidden: int,
          repeats: int, mix_dtype: str = "float64") -> dict:
    import numpy as np

    from fedgraph_flwr.algorithms import get_algorithm
    from fedgraph_flwr.core.phases import ClientUpdate

    config, upload, signature = client_shapes(algorithm, features, classes, hidden, mix_dtype)
    rng = np.random.default_rng(0)

    def noisy(arrays):
        return {k: (v + 0.1 * rng.standard_normal(v.shape).astype(v.dtype)
                    if np.issubdtype(v.dtype, np.floating) else v) for k, v in arrays.items()}

    updates = {c: ClientUpdate(noisy(upload), noisy(signature), int(rng.integers(10, 500)))
               for c in range(clients)}
    params = int(sum(v.size for v in upload.values()))
    aggregator = get_algorithm(algorithm).aggregator(config, list(range(clients)), upload)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    times = []
    for r in range(1, repeats + 1):
        t0 = time.perf_counter()
        aggregator.aggregate(r, updates)
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {"benchmark": "server_aggregation", "algorithm": algorithm, "clients": clients,
            "params_per_client": params, "mix_dtype": mix_dtype,
            "seconds_median": float(np.median(times)),
            "seconds_min": float(min(times)), "repeats": repeats,
            "peak_rss_rise_mb": peak - rss0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "fedaux", "fediih"])
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mix-dtype", default="float64", choices=["float64", "float32"],
                        help="server-mix-dtype of the personalized mixing")
    args = parser.parse_args()
    rows = [bench(a, args.clients, args.features, args.classes, args.hidden, args.repeats,
                  args.mix_dtype) for a in args.algorithms]
    print(f"{'algorithm':<10} {'clients':>7} {'params':>9} {'s (median)':>10} {'peak MB':>8}")
    for r in rows:
        print(f"{r['algorithm']:<10} {r['clients']:>7} {r['params_per_client']:>9} "
              f"{r['seconds_median']:>10.3f} {r['peak_rss_rise_mb']:>8.0f}")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
