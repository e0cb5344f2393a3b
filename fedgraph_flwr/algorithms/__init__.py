"""Algorithms: each a client trainer plus a server aggregator, registered by name."""

from .. import pyg_warnings  # noqa: F401  (before any PyG import)
from . import (
    adafgl,
    apfl,
    fedaux,
    fedavg,
    feddc,
    feddep,
    fedgcn,
    fedgl,
    fedgnn,
    fedgta,
    fediih,
    fedlit,
    fedper,
    fedproto,
    fedprox,
    fedpub,
    fedsage,
    fedspray,
    fedstar,
    fedtad,
    fedtgp,
    fggp,
    fgssl,
    gcfl,
    local,
    moon,
    scaffold,
)
from .options import ConfigError, Options, option
from .registry import ALGORITHMS, Algorithm, get_algorithm, register

# Registration order is the order of the algorithms' keys in pyproject.toml.
register("fedavg", fedavg.GCNTrainer, fedavg.FedAvgAggregator, fedavg.FedAvgOptions)
register("local", local.LocalTrainer, local.LocalAggregator, local.LocalOptions)
register("fedaux", fedaux.FedAuxTrainer, fedaux.FedAuxAggregator, fedaux.FedAuxOptions,
         legacy_values=fedaux.LEGACY_VALUES)
register("fedprox", fedprox.FedProxTrainer, fedprox.FedProxAggregator, fedprox.FedProxOptions)
register("fedper", fedper.FedPerTrainer, fedper.FedPerAggregator, fedper.FedPerOptions)
register("fedpub", fedpub.FedPubTrainer, fedpub.FedPubAggregator, fedpub.FedPubOptions)
register("gcfl", gcfl.GCFLTrainer, gcfl.GCFLAggregator, gcfl.GCFLOptions)
register("apfl", apfl.APFLTrainer, apfl.APFLAggregator, apfl.APFLOptions)
register("fediih", fediih.FedIIHTrainer, fediih.FedIIHAggregator, fediih.FedIIHOptions)
register("fedspray", fedspray.FedSprayTrainer, fedspray.FedSprayAggregator, fedspray.FedSprayOptions)
register("fedgta", fedgta.FedGTATrainer, fedgta.FedGTAAggregator, fedgta.FedGTAOptions)
register("fedstar", fedstar.FedStarTrainer, fedstar.FedStarAggregator, fedstar.FedStarOptions)
register("fedlit", fedlit.FedLitTrainer, fedlit.FedLitAggregator, fedlit.FedLitOptions)
register("fedgnn", fedgnn.FedGNNTrainer, fedgnn.FedGNNAggregator, fedgnn.FedGNNOptions)
register("fedsage", fedsage.FedSageTrainer, fedsage.FedSageAggregator, fedsage.FedSageOptions)
register("adafgl", adafgl.AdaFGLTrainer, adafgl.AdaFGLAggregator, adafgl.AdaFGLOptions)
register("scaffold", scaffold.ScaffoldTrainer, scaffold.ScaffoldAggregator, scaffold.ScaffoldOptions)
register("moon", moon.MOONTrainer, moon.MOONAggregator, moon.MOONOptions)
register("fedproto", fedproto.FedProtoTrainer, fedproto.FedProtoAggregator, fedproto.FedProtoOptions)
register("fedtgp", fedtgp.FedTGPTrainer, fedtgp.FedTGPAggregator, fedtgp.FedTGPOptions)
register("feddc", feddc.FedDCTrainer, feddc.FedDCAggregator, feddc.FedDCOptions)
register("fedtad", fedtad.FedTADTrainer, fedtad.FedTADAggregator, fedtad.FedTADOptions)
register("fgssl", fgssl.FGSSLTrainer, fgssl.FGSSLAggregator, fgssl.FGSSLOptions)
register("fedgl", fedgl.FedGLTrainer, fedgl.FedGLAggregator, fedgl.FedGLOptions)
register("fedgcn", fedgcn.FedGCNTrainer, fedgcn.FedGCNAggregator, fedgcn.FedGCNOptions)
register("feddep", feddep.FedDEPTrainer, feddep.FedDEPAggregator, feddep.FedDEPOptions)
register("fggp", fggp.FGGPTrainer, fggp.FGGPAggregator, fggp.FGGPOptions)

__all__ = ["ALGORITHMS", "Algorithm", "ConfigError", "Options", "get_algorithm", "option", "register"]
