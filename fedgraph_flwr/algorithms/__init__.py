"""Algorithms: each a client trainer plus a server aggregator, registered by name."""

from . import fedaux, fedavg, fediih, fedspray, local
from .registry import ALGORITHMS, Algorithm, get_algorithm, register

register("fedavg", fedavg.GCNTrainer, fedavg.FedAvgAggregator, fedavg.CONFIG_DEFAULTS)
register("local", local.LocalTrainer, local.LocalAggregator)
register("fedaux", fedaux.FedAuxTrainer, fedaux.FedAuxAggregator, fedaux.CONFIG_DEFAULTS)
register("fediih", fediih.FedIIHTrainer, fediih.FedIIHAggregator, fediih.CONFIG_DEFAULTS)
register("fedspray", fedspray.FedSprayTrainer, fedspray.FedSprayAggregator, fedspray.CONFIG_DEFAULTS)

__all__ = ["ALGORITHMS", "Algorithm", "get_algorithm", "register"]
