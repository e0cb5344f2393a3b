"""Algorithms: each a client trainer plus a server aggregator, registered by name."""

from . import apfl, fedaux, fedavg, fediih, fedper, fedprox, fedpub, fedspray, gcfl, local, phase_demo
from .registry import ALGORITHMS, Algorithm, get_algorithm, register

register("fedavg", fedavg.GCNTrainer, fedavg.FedAvgAggregator, fedavg.CONFIG_DEFAULTS)
register("local", local.LocalTrainer, local.LocalAggregator)
register("fedaux", fedaux.FedAuxTrainer, fedaux.FedAuxAggregator, fedaux.CONFIG_DEFAULTS,
         fedaux.LEGACY_VALUES)
register("fedprox", fedprox.FedProxTrainer, fedprox.FedProxAggregator, fedprox.CONFIG_DEFAULTS)
register("fedper", fedper.FedPerTrainer, fedper.FedPerAggregator, fedper.CONFIG_DEFAULTS)
register("fedpub", fedpub.FedPubTrainer, fedpub.FedPubAggregator, fedpub.CONFIG_DEFAULTS)
register("gcfl", gcfl.GCFLTrainer, gcfl.GCFLAggregator, gcfl.CONFIG_DEFAULTS)
register("apfl", apfl.APFLTrainer, apfl.APFLAggregator, apfl.CONFIG_DEFAULTS)
register("fediih", fediih.FedIIHTrainer, fediih.FedIIHAggregator, fediih.CONFIG_DEFAULTS)
register("fedspray", fedspray.FedSprayTrainer, fedspray.FedSprayAggregator, fedspray.CONFIG_DEFAULTS)
register("phase-demo", phase_demo.PhaseDemoTrainer, phase_demo.PhaseDemoAggregator)

__all__ = ["ALGORITHMS", "Algorithm", "get_algorithm", "register"]
