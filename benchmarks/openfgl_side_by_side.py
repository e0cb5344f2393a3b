"""OpenFGL and fedgraph-flwr on identical client files: run OpenFGL, then tabulate both.

``run`` drives an unmodified ``openfgl-lib`` (1.1.0) through its public trainer on CPU, one
thread, and records each round's per-client validation and test accuracy (ROC-AUC with
``--metric auc``) and wall time. Run it in a virtual environment of its own (OpenFGL pins
nothing and imports much), from the checkout with ``PYTHONPATH=.`` (it scores with this
project's best-round rule); see docs/results/baselines.md, "Side by side with OpenFGL", for
the set-up:

    PYTHONPATH=. python benchmarks/openfgl_side_by_side.py run fedgta 0 runs/fedgta-0.json \\
        --root <openfgl-root> --dataset Cora --simulation subgraph_fl_metis --clients 10

``--config KEY=VALUE ...`` sets entries of the method's own config dict first (an ablation
of OpenFGL's switches, e.g. FedGL's ``ssl_loss_weight=0``); its row is named by them.

``compare`` reads those JSON files and this project's ``results.json`` of the same methods
(``fedgraph-experiments run configs/paper/openfgl-side-by-side-cora.yaml``) and scores both
by the same three rules, from the per-client curves:

- ``openfgl``: OpenFGL's own rule: per round, the clients' accuracies averaged with weights
  = their node counts; the test figure at the first round whose weighted validation mean is
  highest;
- ``mean_val``: the same with unweighted means (this project's ``test_at_best_val``);
- ``per_client``: each client's test at its own best-validation round, averaged (FedIIH's).

    python benchmarks/openfgl_side_by_side.py compare --openfgl runs \\
        --ours outputs/experiments/openfgl-side-by-side-cora-10

Seconds per round: OpenFGL's is the wall time from the server's broadcast to the end of the
round's evaluation; ours is ``rounds[*].times.round`` (in-process engine): the median over
rounds. And the whole run's wall time over its rounds, which counts the costly stages
(FedSage+'s pre-training and generator rounds, AdaFGL's step 2): OpenFGL's ``train()``
alone; ours ``wall_time_s``, set-up included.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from fedgraph_flwr.algorithms import get_algorithm
from fedgraph_flwr.engine.protocols import best_val_index

#: OpenFGL 1.1.0's AdaFGL config ``num_rounds_vanilla``: its step 1 (FedAvg of the extractor)
#: is rounds 0..49, step 2 from 50. Its trainer scores every round, step 1 included; ours
#: scores step 2 only, so ``compare`` also scores OpenFGL's step-2 rounds alone.
OPENFGL_ADAFGL_STEP1 = 50

#: Common keys a row of ours is named by where they differ from OpenFGL's default (dropout:
#: FedDEP's row without it, as OpenFGL's classifier trains in eval mode).
NAMED_COMMON = {"dropout": 0.5}

#: ``run --fix``: OpenFGL defects the harness can mend, one at a time, to measure what each
#: costs (the fixed run's row names it).
FIXES = {
    "feddep-train-mode": "FedDEP's classifier rounds never call model.train(), so after each "
                         "round's evaluation the classifier trains in eval mode (no dropout); "
                         "call it before each client's round",
}

#: OpenFGL's algorithm names that differ from this project's; the others are the same.
RENAMED = {"fedsage_plus": "fedsage"}


def ours(openfgl_name: str) -> str:
    """This project's name of OpenFGL's algorithm ``openfgl_name`` (one line if it has none)."""
    name = RENAMED.get(openfgl_name, openfgl_name)
    get_algorithm(name)  # ValueError naming the valid ones
    return name


def run_openfgl(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="openfgl_side_by_side.py run")
    parser.add_argument("algorithm", help="OpenFGL's name (fedsage_plus for FedSage+)")
    parser.add_argument("seed", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--root", required=True, help="OpenFGL's data root (global/ and distrib/)")
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--simulation", default="subgraph_fl_metis")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--model", default="gcn", help="OpenFGL's backbone for algorithms that use one")
    parser.add_argument("--metric", choices=("accuracy", "auc"), default="accuracy",
                        help="what each client's val/test figure is (auc: binary tasks)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                        help="set entries of the method's own config dict "
                             "(openfgl.flcore.<algorithm>.<algorithm>_config.config): OpenFGL's "
                             "switches, for an ablation; the row names them")
    parser.add_argument("--fix", nargs="*", default=[], choices=sorted(FIXES),
                        help="harness-side fixes of OpenFGL defects, to trace a gap (the row "
                             "names them): " + "; ".join(f"{k}: {v}" for k, v in FIXES.items()))
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--config {item!r}: expected KEY=VALUE")
        overrides[key] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") \
            else value
    try:
        ours(args.algorithm)
    except ValueError as err:
        parser.error(str(err))
    sys.argv = sys.argv[:1]  # openfgl.config parses the command line when imported

    import torch
    from openfgl.config import args as fgl
    from openfgl.flcore.trainer import FGLTrainer
    from openfgl.utils.basic_utils import seed_everything

    if args.algorithm == "feddep":
        # PyG 2.8's BaseTransform.forward is abstract; OpenFGL 1.1.0's HideGraph predates it
        # and defines only __call__: forward = its __call__, behaviour unchanged.
        from openfgl.flcore.feddep._utils import HideGraph
        HideGraph.forward, HideGraph.__abstractmethods__ = HideGraph.__call__, frozenset()
    if "feddep-train-mode" in args.fix:
        from openfgl.flcore.feddep.client import FedDEPClient
        execute = FedDEPClient.execute

        def execute_in_train_mode(self):
            self.task.model.train()
            return execute(self)

        FedDEPClient.execute = execute_in_train_mode
    torch.set_num_threads(1)
    fgl.root, fgl.dataset, fgl.scenario = args.root, [args.dataset], "subgraph_fl"
    fgl.simulation_mode, fgl.num_clients, fgl.num_rounds = args.simulation, args.clients, args.rounds
    fgl.fl_algorithm, fgl.model, fgl.metrics = args.algorithm, [args.model], [args.metric]
    fgl.use_cuda, fgl.seed = False, args.seed
    if args.metric == "auc":
        score_positive_class()
    if overrides:
        import importlib
        method_config = importlib.import_module(
            f"openfgl.flcore.{args.algorithm}.{args.algorithm}_config").config
        unknown = sorted(set(overrides) - set(method_config))
        if unknown:
            parser.error(f"--config: {args.algorithm} has no {unknown}; it has {sorted(method_config)}")
        method_config.update(overrides)
    seed_everything(args.seed)
    trainer = FGLTrainer(fgl)

    # Observe, never change: wrap the broadcast (round start), each client's evaluation and
    # the trainer's evaluation (round end).
    per_round: list[list[tuple[float, float, int]]] = []
    round_s: list[float] = []
    started = [0.0]
    broadcast, evaluate = trainer.server.send_message, trainer.evaluate

    def timed_broadcast():
        started[0] = time.perf_counter()
        return broadcast()

    def recorded_evaluate():
        per_round.append([])
        evaluate()
        round_s.append(time.perf_counter() - started[0])

    def recording(task, client_evaluate):
        def wrapped(*a, **k):
            result = client_evaluate(*a, **k)
            if not a and not k:  # the trainer's "local model on local data" call
                val, test = result[f"{args.metric}_val"], result[f"{args.metric}_test"]
                per_round[-1].append((float(val), float(test),
                                      int(task.num_samples)))
            return result
        return wrapped

    trainer.server.send_message, trainer.evaluate = timed_broadcast, recorded_evaluate
    for client in trainer.clients:
        client.task.evaluate = recording(client.task, client.task.evaluate)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "library": "openfgl", "algorithm": args.algorithm, "seed": args.seed, "rounds": args.rounds,
        "dataset": args.dataset, "simulation": args.simulation, "clients": args.clients,
        "wall_s": wall, "round_s": round_s, "per_round": per_round,
        "config": {**overrides, **({"fix": ",".join(args.fix)} if args.fix else {})},
        "openfgl_best": {k: float(v) for k, v in trainer.evaluation_result.items()}}))
    print(f"{args.algorithm} seed {args.seed}: OpenFGL's best test {trainer.evaluation_result}, "
          f"{wall:.1f} s")
    return 0


def score_positive_class() -> None:
    """OpenFGL 1.1.0 scores ROC-AUC on ``softmax(logits)``, an [n, 2] matrix for a binary task
    with two logits, which scikit-learn refuses ("y should be a 1d array"). Its node
    classification task then scores the positive class's probability instead, as this project
    does; nothing else in OpenFGL changes."""
    from openfgl.task import node_cls
    from openfgl.utils import metrics as metrics_module

    score = metrics_module.compute_supervised_metrics

    def positive_class(metrics, logits, labels, suffix):  # OpenFGL passes them by keyword
        if logits.dim() == 2 and logits.size(1) == 2:
            # its sigmoid is softmax(logits)[:, 1]; where a method passes probabilities it is
            # 2 p_1 - 1, the same ranking (AUC) and the same sign (accuracy)
            logits = logits[:, 1] - logits[:, 0]
        return score(metrics, logits, labels, suffix)

    # node_cls imported the function at load; AdaFGL's and FedSage+'s clients import it
    # from the module at each call
    node_cls.compute_supervised_metrics = metrics_module.compute_supervised_metrics = positive_class


def scores(per_round: list[list[tuple[float, float, int]]]) -> dict[str, float]:
    """The three rules on per-round lists of (val, test, nodes) per client, in percent:
    OpenFGL's (node-weighted mean val picks the round), ours (unweighted mean val) and
    each client's own best-val round; rounds are picked by ``protocols.best_val_index``
    (the earliest best, as OpenFGL's trainer, whose comparison is strict)."""
    def at_best_round(weighted: bool) -> float:
        def mean(clients: list[tuple[float, float, int]], which: int) -> float:
            w = [n if weighted else 1 for _, _, n in clients]
            return sum(c[which] * wi for c, wi in zip(clients, w)) / sum(w)

        best = per_round[best_val_index([mean(clients, 0) for clients in per_round])]
        return 100 * mean(best, 1)

    per_client = []
    for c in range(len(per_round[0])):
        curve = [r[c] for r in per_round]
        per_client.append(curve[best_val_index([v for v, _, _ in curve])][1])
    return {"openfgl": at_best_round(True), "mean_val": at_best_round(False),
            "per_client": 100 * sum(per_client) / len(per_client)}


def ours_per_round(results: dict) -> list[list[tuple[float, float, int]]]:
    nodes = {cid: int(info["num-nodes"]) for cid, info in results["clients"].items()}
    order = sorted(nodes, key=int)
    out = []
    for rnd in results["rounds"]:
        clients = rnd.get("clients") or {}
        if any(cid not in clients or not math.isfinite(clients[cid].get("val_metric", math.nan))
               for cid in order):
            continue  # a round without every client's evaluation (AdaFGL's step-2 set-up)
        out.append([(clients[cid]["val_metric"], clients[cid]["test_metric"], nodes[cid])
                    for cid in order])
    return out


def compare(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="openfgl_side_by_side.py compare")
    parser.add_argument("--openfgl", type=Path, required=True, help="folder of `run` JSON files")
    parser.add_argument("--ours", type=Path, required=True, nargs="+", help="the grids' output folders")
    args = parser.parse_args(argv)
    rows: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for path in sorted(args.openfgl.glob("*.json")):
        run = json.loads(path.read_text())
        row = scores(run["per_round"])
        row["s_per_round"] = statistics.median(run["round_s"])
        row["s_mean"] = run["wall_s"] / len(run["round_s"])
        clients = int(run.get("clients", 10))
        library = "OpenFGL" + "".join(f", {k}={v}" for k, v in sorted(run.get("config", {}).items()))
        rows.setdefault((ours(run["algorithm"]), clients, library), []).append(row)
        if run["algorithm"] == "adafgl":
            step2 = scores(run["per_round"][OPENFGL_ADAFGL_STEP1:])
            step2.update(s_per_round=row["s_per_round"], s_mean=row["s_mean"])
            rows.setdefault(("adafgl", clients, "OpenFGL, step-2 rounds"), []).append(step2)
    for path in sorted(p for folder in args.ours for p in folder.glob("*/results.json")):
        results = json.loads(path.read_text())
        row = scores(ours_per_round(results))
        times = [r["times"]["round"] for r in results["rounds"]]
        row["s_per_round"] = statistics.median(times)
        row["s_mean"] = results["wall_time_s"] / len(times)
        config = results["config"]
        library = "fedgraph-flwr"
        if config["algorithm"] == "adafgl" and config.get("adafgl-schedule") == "epoch-per-round":
            library += ", OpenFGL's switches"  # the grid's second AdaFGL configuration
        elif config["algorithm"] != "adafgl":  # a switch off its default names the row
            defaults = get_algorithm(config["algorithm"]).config_defaults
            library += "".join(f", {k}={config[k]}" for k in sorted(defaults)
                               if k in config and config[k] != defaults[k])
        library += "".join(f", {k}={config[k]}" for k, v in NAMED_COMMON.items()
                           if k in config and config[k] != v)
        rows.setdefault((config["algorithm"], int(config["num-clients"]), library), []).append(row)

    def cell(values: list[float]) -> str:
        values = [float(v) for v in values]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.2f} ± {sd:.2f}"

    print("| method | clients | library | seeds | OpenFGL's rule (%) | test @ best mean val (%) "
          "| per-client best-val test (%) | s/round (median) | run wall s / rounds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (method, clients, library), runs in sorted(rows.items()):
        print(f"| {method} | {clients} | {library} | {len(runs)} | {cell([r['openfgl'] for r in runs])} "
              f"| {cell([r['mean_val'] for r in runs])} | {cell([r['per_client'] for r in runs])} "
              f"| {statistics.median(r['s_per_round'] for r in runs):.3f} "
              f"| {statistics.mean(r['s_mean'] for r in runs):.3f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "compare"):
        print(__doc__.splitlines()[0] + "\nusage: openfgl_side_by_side.py {run,compare} ...")
        return 2
    return run_openfgl(argv[1:]) if argv[0] == "run" else compare(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
