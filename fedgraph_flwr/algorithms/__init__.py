"""Algorithms: each a client trainer plus a server aggregator, registered by name."""

from . import fedavg, local
from .registry import ALGORITHMS, Algorithm, get_algorithm, register

register("fedavg", fedavg.GCNTrainer, fedavg.FedAvgAggregator, fedavg.CONFIG_DEFAULTS)
register("local", local.LocalTrainer, local.LocalAggregator)

__all__ = ["ALGORITHMS", "Algorithm", "get_algorithm", "register"]
