"""Record the engine's golden figures: Cora-10, 5 rounds, seed 0, CPU, in process.

    python tests/golden/record.py --data-root <root holding Cora/raw> [--out cora10.host-c.json]

writes ``tests/golden/cora10.json`` (or ``--out``: the same code's figures on another kind
of CPU, whose kernels round differently; ``tests/test_golden.py`` accepts any file here).
One torch thread, as a simulated ClientApp has: the in-process and the simulated figures
are then the same bits. Run it only to *change* the golden figures on purpose (an
algorithm's numbers moved for a reason stated in the commit), or to add a host kind's
file from unchanged code; a refactor must leave them bit for bit (``tests/test_golden.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: A deliberate subset, not the registry: the recorded figures are of these five (the
#: papers' methods and the mixing baselines); a new algorithm needs no golden figures.
ALGORITHMS = ("fedaux", "fediih", "fedpub", "fedspray", "gcfl")
KEYS = ("train_loss", "val_loss", "val_metric", "test_metric")
FINAL = ("test_at_best_val", "val_at_best_val", "best_round", "per_client_best_val_test")


def config(algorithm: str, data_root: str, out: str) -> dict:
    return {"algorithm": algorithm, "dataset": "Cora", "num-clients": 10, "rounds": 5,
            "seed": 0, "data-root": data_root, "output-dir": out, "run-name": algorithm}


def figures(results: dict) -> dict:
    """The figures a refactor must keep: per-round, per-client losses and metrics, and
    the headline result. NaN as the string "nan" (JSON has none)."""
    def clean(v):
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    return {
        "rounds": [{c: {k: clean(m[k]) for k in KEYS} for c, m in r["clients"].items()}
                   for r in results["rounds"]],
        "final": {k: clean(results["final"][k]) for k in FINAL},
    }


def main() -> None:
    import torch

    from fedgraph_flwr.engine.loop import run_federation

    torch.set_num_threads(1)  # as in a simulated ClientApp (one CPU each): same sums, same bits

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--out", default="cora10.json", help="file name under tests/golden/")
    args = parser.parse_args()
    golden = {}
    with tempfile.TemporaryDirectory() as out:
        for algorithm in ALGORITHMS:
            golden[algorithm] = figures(run_federation(config(algorithm, args.data_root, out),
                                                       write=False))
            print(algorithm, golden[algorithm]["final"])
    (HERE / args.out).write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main()
