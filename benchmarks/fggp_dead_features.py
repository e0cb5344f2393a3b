"""FGGP's official flavour: how its queue evaluation follows the death of its hidden features.

    python benchmarks/fggp_dead_features.py --data-root DIR [--rounds 50] [--every 5]
        [--set fggp-optimizer=adam lr=0.01 ...]

Runs one in-process federation (Cora, 10 METIS clients, the comparison's settings with
``fggp-optimizer=adam`` unless ``--set`` says otherwise) and, every ``--every`` rounds, reads
the first client's received model before it trains: the fraction of nodes whose
``features()`` (the last hidden layer, no batch norm) are all zero, the hidden units active
on any node, the mean bias of that layer, the mean pre-activation without the bias, and the
queue's validation accuracy. Prints one line per checkpoint.
"""

from __future__ import annotations

import argparse

import torch

from fedgraph_flwr.algorithms import fggp
from fedgraph_flwr.engine.loop import run_federation


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    config = {"algorithm": "fggp", "dataset": "Cora", "num-clients": 10, "partition": "metis",
              "rounds": args.rounds, "local-epochs": 1, "hidden": 128, "lr": 0.01,
              "weight-decay": 1e-6, "dropout": 0.5, "fggp-optimizer": "adam",
              "data-root": args.data_root, "verbose": False}
    config.update(item.split("=", 1) for item in args.set)
    seen: set[int] = set()
    queue_metrics = fggp.FGGPTrainer.queue_metrics

    def observed(self: fggp.FGGPTrainer) -> dict[str, float]:
        metrics = queue_metrics(self)
        round_ = self.config.server_round
        if round_ % args.every == 0 and round_ not in seen:  # the round's first client
            seen.add(round_)
            with torch.no_grad():
                features = self.model.features(self.data.x, self.propagation)
                layer = self.model.fcs[-2]
                pre = self.propagation @ (self.data.x @ layer.weight.t())
            dead = float((features.abs().sum(1) == 0).float().mean())
            print(f"round {round_:3d}: zero-feature nodes {dead:.3f}"
                  f", active units {int((features.sum(0) > 0).sum())}/{features.size(1)}"
                  f", bias mean {float(layer.bias.mean()):+.4f}, pre-activation mean {float(pre.mean()):.4f}"
                  f", queue val {metrics['val_metric']:.3f}", flush=True)
        return metrics

    fggp.FGGPTrainer.queue_metrics = observed  # type: ignore[method-assign]
    run_federation(config, write=False)


if __name__ == "__main__":
    main()
