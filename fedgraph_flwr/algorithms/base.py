"""The bases a method subclasses: core's trainer and aggregator (the contract,
:mod:`fedgraph_flwr.core.bases`), their config the typed run configuration.

``self.config`` of a :class:`ClientTrainer` is a :class:`~fedgraph_flwr.config.ClientConfig`,
of an :class:`Aggregator` a :class:`~fedgraph_flwr.config.RunConfig`. The phases and what
crosses in them are in :mod:`fedgraph_flwr.core.phases`, mixing plans and the mixing maths
in :mod:`fedgraph_flwr.core.mixing`.
"""

from ..config import ClientConfig, RunConfig
from ..core import bases

ClientTrainer = bases.ClientTrainer[ClientConfig]
Aggregator = bases.Aggregator[RunConfig]

__all__ = ["Aggregator", "ClientTrainer"]
