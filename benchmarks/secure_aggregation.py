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
    python benchmarks/secure_aggregation.py --algorithms fedavg --rounds 100 --set hidden=64 \
        --modes off ckks-threshold ckks --resume --out <out>   # rerun to continue a cut run

Runs under ckks and ckks-threshold are compared round by round with the plaintext run of
the same --out (``against_off``: rounds with equal figures, the largest differences).

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
            extra: dict, resume: bool = False) -> dict:
    """One run; its per-round means and final figures. ``resume``: a finished run (its
    results.json) is read, not run again, and a stopped one continues from its checkpoint."""
    from fedgraph_flwr.engine.loop import run_federation

    folder = out / f"{algorithm}-{mode}"
    if resume and (folder / "results.json").is_file():
        res = json.loads((folder / "results.json").read_text())
        if len(res["rounds"]) == rounds:
            return summarize(res)
    res = run_federation({"algorithm": algorithm, "dataset": dataset, "num-clients": clients,
                          "rounds": rounds, "secure-aggregation": mode, "output-dir": str(out),
                          "run-name": folder.name, "verbose": False, **extra,
                          "resume": resume and (folder / "checkpoint.pt").is_file()},
                         write=True, log=lambda line: print(line, file=sys.stderr, flush=True))
    return summarize(res)


def agreement(res: dict, plain: dict) -> dict:
    """How a run's per-round figures compare with the plaintext run's: rounds whose mean
    validation and test accuracy are equal, and the largest differences."""
    pairs = list(zip(res["rounds"], plain["rounds"]))
    out: dict = {"rounds_compared": len(pairs)}
    for key in ("mean_val", "mean_test", "mean_train_loss"):
        diffs = [abs(a[key] - b[key]) for a, b in pairs]
        out[f"{key}_equal_rounds"] = sum(d == 0.0 for d in diffs)
        out[f"{key}_max_abs_diff"] = max(diffs)
    for key in ("test_at_best_val", "per_client_best_val_test", "best_round"):
        out[f"final_{key}"] = [res["final"][key], plain["final"][key]]
    return out


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


def write_rounds(path: Path, results: list[Path]) -> None:
    """Per round of each run: its mean validation and test accuracy, mean train loss,
    seconds, and bytes sent and received (all clients)."""
    lines = ["algorithm,mode,round,mean_val,mean_test,mean_train_loss,round_s,"
             "bytes_sent,bytes_received"]
    for file in results:
        if not file.is_file():
            continue
        res = json.loads(file.read_text())
        config = res["config"]
        for r in res["rounds"]:
            lines.append(",".join(str(v) for v in (
                config["algorithm"], config.get("secure-aggregation", "off"), r["round"],
                r["mean_val"], r["mean_test"], r["mean_train_loss"], round(r["times"]["round"], 3),
                sum(r["bytes_sent"].values()), sum(r["bytes_received"].values()))))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


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
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config keys for every run (e.g. hidden=64)")
    parser.add_argument("--rounds-csv", type=Path,
                        help="also write every run's per-round figures and costs here")
    parser.add_argument("--resume", action="store_true",
                        help="read finished runs under --out, continue stopped ones from "
                             "their checkpoint (each round is checkpointed)")
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
    extra: dict = {"data-root": args.data_root} if args.data_root else {}
    for item in args.set:
        key, _, value = item.partition("=")
        extra[key] = value
    openfhe_seconds = profile_openfhe() if args.profile else None
    mode_rounds = {m: int(r) for m, r in (item.split("=", 1) for item in args.mode_rounds)}
    for algorithm in args.algorithms if args.runs is None else []:
        for mode in args.modes:
            row = measure(algorithm, mode, mode_rounds.get(mode, args.rounds), args.dataset,
                          args.clients, args.out, extra, args.resume)
            plain = args.out / f"{algorithm}-off" / "results.json"
            if mode != "off" and plain.is_file():
                row["against_off"] = agreement(
                    json.loads((args.out / f"{algorithm}-{mode}" / "results.json").read_text()),
                    json.loads(plain.read_text()))
            if openfhe_seconds is not None and mode == "ckks-threshold":
                row["openfhe_s"] = {k: [n, round(t, 2)] for k, (n, t) in
                                    sorted(openfhe_seconds.items(), key=lambda kv: -kv[1][1])}
                openfhe_seconds.clear()
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.rounds_csv is not None and args.runs is None:
        write_rounds(args.rounds_csv, [args.out / f"{a}-{m}" / "results.json"
                                       for a in args.algorithms for m in args.modes])
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
