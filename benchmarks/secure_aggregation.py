"""secure-aggregation=ckks and ckks-threshold vs off: bytes and seconds per round, in-process.

Runs each algorithm once per mode on the same config (``secure-aggregation=off``, ``ckks``,
and with ``--modes`` ``ckks-threshold``)
through the in-process transport and reports per round (mean over the rounds run):
bytes sent to and received from all clients, the round's wall time, the server's
aggregation time (ciphertext mixing under ckks), the clients' summed encrypt and decrypt
time, and the final accuracy of both.

    FEDGRAPH_DATA_ROOT=/path/to/data python benchmarks/secure_aggregation.py \\
        --algorithms fedavg fedaux --rounds 5
    python benchmarks/secure_aggregation.py --algorithms fedavg --rounds 100 \
        --modes off ckks ckks-threshold --mode-rounds ckks-threshold=3
    python benchmarks/secure_aggregation.py --runs <out>/ckks-cora-10   # a grid's runs

Prints a markdown table and one JSON line per run (``{"benchmark": "secure_aggregation", ...}``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(algorithm: str, mode: str, rounds: int, dataset: str, clients: int, out: Path,
            extra: dict) -> dict:
    """One run; its per-round means and final figures."""
    from fedgraph_flwr.engine.loop import run_federation

    res = run_federation({"algorithm": algorithm, "dataset": dataset, "num-clients": clients,
                          "rounds": rounds, "secure-aggregation": mode, "output-dir": str(out),
                          "run-name": f"{algorithm}-{mode}", "verbose": False, **extra},
                         write=True)
    return summarize(res)


def profile_openfhe() -> dict[str, list]:
    """Count and time every OpenFHE operation (``{name: [calls, seconds]}``, all parties of
    an in-process run together: they share one worker)."""
    from fedgraph_flwr.threshold_ckks import backend

    seconds: dict[str, list] = {}
    real = backend.call

    def timed(name: str, *args):
        t0 = time.perf_counter()
        try:
            return real(name, *args)
        finally:
            entry = seconds.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - t0

    backend.call = timed
    for module in ("client", "server"):  # they imported `call` by name
        importlib.import_module(f"fedgraph_flwr.threshold_ckks.{module}").call = timed
    return seconds


def summarize(res: dict) -> dict:
    """A run's results.json as one row: per-round means and the final figures."""
    per_round = res["rounds"]
    config = res["config"]

    def client_sum(key: str) -> float:
        return mean(sum(m.get(key, 0.0) for m in r["clients"].values()) for r in per_round)

    return {
        "benchmark": "secure_aggregation", "algorithm": config["algorithm"],
        "mode": config.get("secure-aggregation", "off"), "dataset": config["dataset"],
        "clients": config["num-clients"], "rounds": len(per_round),
        "bytes_sent_per_round": mean(sum(r["bytes_sent"].values()) for r in per_round),
        "bytes_received_per_round": mean(sum(r["bytes_received"].values()) for r in per_round),
        "round_s": mean(r["times"]["round"] for r in per_round),
        # ckks-threshold: the key setup before round 1 (bytes both ways, seconds)
        "setup_bytes": sum(p.get("bytes_sent", 0) + p.get("bytes_received", 0)
                           for p in res.get("precompute", {}).values()),
        "setup_s": sum(p.get("seconds", 0.0) for p in res.get("precompute", {}).values()),
        # the run's wall time per round: rounds plus what happens between them (the
        # checkpoint, which under ckks holds every client's ciphertext payload)
        "wall_s_per_round": res["wall_time_s"] / len(per_round),
        "aggregate_s": mean(r["times"]["aggregate"] for r in per_round),
        "client_train_s": client_sum("time-train"),
        "client_encrypt_s": client_sum("time-encrypt"),
        "client_decrypt_s": client_sum("time-decrypt"),
        "test_at_best_val": res["final"]["test_at_best_val"],
        "per_client_best_val_test": res["final"]["per_client_best_val_test"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "fedaux"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--modes", nargs="+", default=["off", "ckks"],
                        choices=["off", "ckks", "ckks-threshold"])
    parser.add_argument("--mode-rounds", nargs="*", default=[], metavar="MODE=ROUNDS",
                        help="fewer rounds for a costly mode (e.g. ckks-threshold=3)")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench-secure-aggregation"))
    parser.add_argument("--data-root", default="", help="else FEDGRAPH_DATA_ROOT")
    parser.add_argument("--profile", action="store_true",
                        help="ckks-threshold: also print the OpenFHE seconds per operation "
                             "(calls to fedgraph_flwr.threshold_ckks.backend, all parties)")
    parser.add_argument("--runs", type=Path,
                        help="summarize the results.json files under this folder (e.g. "
                             "configs/paper/ckks-cora-10.yaml's grid run in a Flower "
                             "simulation) instead of running")
    args = parser.parse_args(argv)
    rows = []
    if args.runs is not None:
        found = sorted(args.runs.glob("*/results.json"))
        if not found:
            parser.error(f"no */results.json under {args.runs}")
        for path in found:
            row = summarize(json.loads(path.read_text()))
            print(json.dumps({**row, "run": path.parent.name}), flush=True)
            rows.append(row)
        rows.sort(key=lambda r: (r["algorithm"], r["mode"] != "off"))
    extra = {"data-root": args.data_root} if args.data_root else {}
    openfhe_seconds = profile_openfhe() if args.profile else None
    mode_rounds = {m: int(r) for m, r in (item.split("=", 1) for item in args.mode_rounds)}
    for algorithm in args.algorithms if args.runs is None else []:
        for mode in args.modes:
            row = measure(algorithm, mode, mode_rounds.get(mode, args.rounds), args.dataset,
                          args.clients, args.out, extra)
            if openfhe_seconds is not None and mode == "ckks-threshold":
                row["openfhe_s"] = {k: [n, round(t, 2)] for k, (n, t) in
                                    sorted(openfhe_seconds.items(), key=lambda kv: -kv[1][1])}
                openfhe_seconds.clear()
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| algorithm | mode | rounds | MB sent/round | MB received/round | s/round "
          "| wall s/round | aggregate s | encrypt s (all clients) | decrypt s (all clients) "
          "| test@best-val | per-client best-val test |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['algorithm']} | {r['mode']} | {r['rounds']} | "
              f"{r['bytes_sent_per_round'] / 1e6:.2f} | "
              f"{r['bytes_received_per_round'] / 1e6:.2f} | {r['round_s']:.2f} | "
              f"{r['wall_s_per_round']:.2f} | "
              f"{r['aggregate_s']:.2f} | {r['client_encrypt_s']:.2f} | "
              f"{r['client_decrypt_s']:.2f} | {r['test_at_best_val']:.2f} | "
              f"{r['per_client_best_val_test']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
