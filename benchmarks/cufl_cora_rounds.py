"""One in-process Cora run, METIS-10, round by round (issue #79: CUFL beside FED-PUB).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/cufl_cora_rounds.py ROUNDS \
        [JSON_KEYS] --data-root <root with Cora/raw>

Defaults: ``algorithm=cufl`` (its ``cufl-pd-rounds`` set to ROUNDS), the comparison's
common keys (hidden 128, lr 0.01, weight decay 1e-6, one local epoch, seed 0); JSON_KEYS
override them (``'{"algorithm": "fedpub", "fedpub-tau": 3, "fedpub-reg-grad": false}'``).
Prints each round's mean client test accuracy, the aggregate's metrics and (CUFL) the mean
share of edges the curriculum trains on, then one line
``FINAL`` with the run's test at best validation and its wall time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from fedgraph_flwr.engine.loop import run_federation


def main() -> None:
    """Run and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int)
    parser.add_argument("keys", nargs="?", default="{}", help="run-config keys, as JSON")
    parser.add_argument("--data-root", required=True)
    args = parser.parse_args()
    extra = json.loads(args.keys)
    keys = {"algorithm": "cufl", "dataset": "Cora", "partition": "metis", "num-clients": 10,
            "rounds": args.rounds, "local-epochs": 1, "hidden": 128, "lr": 0.01,
            "weight-decay": 1e-6, "seed": 0, "data-root": args.data_root,
            "output-dir": tempfile.mkdtemp(), "verbose": False}
    if extra.get("algorithm", "cufl") == "cufl":
        keys["cufl-pd-rounds"] = args.rounds
    start = time.time()
    results = run_federation({**keys, **extra}, write=False)
    for i, record in enumerate(results["rounds"], start=1):
        clients = record["clients"].values()
        mean = 100 * sum(m["test_metric"] for m in clients) / len(clients)
        # CUFL's clients also report the share of their edges the curriculum trains on
        shares = [m["curriculum_edges"] for m in clients if "curriculum_edges" in m]
        share = round(sum(shares) / len(shares), 3) if shares else None
        print(i, round(mean, 2), record["aggregate"], "curriculum_edges", share, flush=True)
    final = results["final"]
    print("FINAL", extra, {k: final[k] for k in ("test_at_best_val", "best_round",
                                                 "per_client_best_val_test")},
          "wall_s", round(time.time() - start))


if __name__ == "__main__":
    main()
