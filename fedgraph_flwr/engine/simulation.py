"""An in-process Flower simulation of a ServerApp and a ClientApp object.

``flwr run .`` runs this project's apps as a user does (a local SuperLink, the FAB, a
``flwr-simulation`` process). The experiment runner, the tests and the benchmarks run app
*objects* built in this process (``make_server_app(overrides)``, a ClientApp with test
mods) instead, which only ``flwr.simulation.run_simulation`` does. Flower 1.42 logs it as a
deprecated feature ("Please use `flwr run` in the CLI instead"), and so does 1.43
(flwr-nightly 1.43.0.dev20261026): neither has another public in-process API
(``flwr.simulation.__all__``: ``run_simulation``, ``run_simulation_process`` (the
``flwr-simulation`` process's entry point, which needs a SuperLink),
``start_simulation`` (the legacy, deprecated strategy API), ``SimulationIoConnection``).
``flwr run`` cannot take app objects, so it replaces none of these callers.

So :func:`simulate` calls ``run_simulation`` and drops exactly that one warning record,
for the duration of the call: Flower logs it on every call although the call is the only
way to do what the callers do. Every other record of Flower's logger passes.
"""

from __future__ import annotations

import logging
from typing import Any

#: The text of the warning :func:`simulate` drops (Flower 1.42, 1.43).
RUN_SIMULATION_DEPRECATED = "The `run_simulation` function is deprecated"


class _DropRunSimulationDeprecation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return RUN_SIMULATION_DEPRECATED not in record.getMessage()


def simulate(server_app, client_app, num_supernodes: int,
             backend_config: dict[str, Any] | None = None) -> None:
    """Run ``server_app`` with ``num_supernodes`` simulated SuperNodes running
    ``client_app`` (Ray backend, ``backend_config`` as ``run_simulation`` takes it);
    re-raises the ServerApp's error."""
    from flwr.simulation import run_simulation

    logger = logging.getLogger("flwr")  # Flower's logger (stdlib logging, by its name)
    drop = _DropRunSimulationDeprecation()
    logger.addFilter(drop)
    try:
        run_simulation(server_app, client_app, num_supernodes=num_supernodes,
                       backend_config=backend_config)
    finally:
        logger.removeFilter(drop)
