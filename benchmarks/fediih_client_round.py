"""One FedIIH client's round at ogbn-arxiv size, per routing kernel.

    OMP_NUM_THREADS=1 python benchmarks/fediih_client_round.py --data-root DIR \\
        [--clients 10] [--kernels sparse fused] [--rounds 3]

Client 0 of ``configs/scale/fediih-synthetic-arxiv.yaml`` split into ``--clients`` METIS
clients (the partition is cached under ``--data-root``), built as a ClientApp builds it
(``restore_trainer``), then ``--rounds`` times what a round asks of it: ``train``
(``local-epochs`` = 2: Step A and Step B each twice) and ``evaluate``, in one process on
one thread. The first round (numba's compile or cache load, the graphs' construction) is
not counted in the timings; every round's training loss and validation accuracy are
reported too (the client alone: no server between its rounds). Each kernel runs in a
fresh subprocess, so the two share no caches or allocator state. Prints a table and one
JSON line per kernel
(``{"benchmark": "fediih_client_round", ...}``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "configs" / "scale" / "fediih-synthetic-arxiv.yaml"


def one_kernel(kernel: str, clients: int, rounds: int, data_root: str) -> dict:
    import torch

    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.client_runtime import identify, load_client_data, restore_trainer

    torch.set_num_threads(1)
    config = resolve_config(None, {"config-file": str(CONFIG), "num-clients": clients,
                                   "data-root": data_root, "fediih-routing-kernel": kernel})
    data, num_classes = load_client_data(identify({"partition-id": 0, "num-partitions": clients},
                                                  config), config)
    trainer = restore_trainer(data, num_classes, config.with_round(server_round=1), None,
                              torch.device("cpu"), 0)
    torch.manual_seed(0)
    train_s, eval_s, losses, val = [], [], [], []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        metrics = trainer.train(config.local_epochs)
        t1 = time.perf_counter()
        evaluation = trainer.evaluate()
        train_s.append(t1 - t0)
        eval_s.append(time.perf_counter() - t1)
        losses.append(metrics["train_loss"])
        val.append(evaluation["val_metric"])
    return {"benchmark": "fediih_client_round", "kernel": kernel, "clients": clients,
            "nodes": int(data.num_nodes), "edges": int(data.edge_index.size(1)),
            "train_s": statistics.median(train_s[1:]), "evaluate_s": statistics.median(eval_s[1:]),
            "train_losses": losses, "val_accuracy": val}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", required=True, help="writable: the partition cache goes here")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--kernels", nargs="+", default=["sparse", "fused"],
                    choices=["sparse", "fused", "auto"])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after the first")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # internal: one kernel, JSON out
    args = ap.parse_args()
    if args.rounds < 1 or args.clients < 1:
        ap.error("--rounds and --clients must be at least 1")
    if args.one:
        print("ROW " + json.dumps(one_kernel(args.one, args.clients, args.rounds, args.data_root)))
        return
    rows = []
    for kernel in args.kernels:
        cmd = [sys.executable, __file__, "--one", kernel, "--clients", str(args.clients),
               "--rounds", str(args.rounds), "--data-root", args.data_root]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = [ln[4:] for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
        if proc.returncode != 0 or not found:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            sys.exit(f"{kernel}: failed (exit {proc.returncode}): " + " | ".join(tail))
        rows.append(json.loads(found[0]))
    print(f"{'kernel':8} {'nodes':>7} {'edges':>8} {'train s':>8} {'evaluate s':>10}")
    for r in rows:
        print(f"{r['kernel']:8} {r['nodes']:7d} {r['edges']:8d} {r['train_s']:8.2f} {r['evaluate_s']:10.2f}")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
