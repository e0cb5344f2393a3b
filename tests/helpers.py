"""Helpers shared by the tests (imported by name: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import math

# Per-client metric keys that differ run to run (wall times, serialised state size).
TIMING = ("time-", "state-bytes")


def round_metrics(results: dict) -> list:
    """Per-round, per-client metrics of a results dict without timings; NaN as the
    string "nan" so that == compares two runs."""
    return [{c: {k: "nan" if isinstance(v, float) and math.isnan(v) else v
                 for k, v in m.items() if not k.startswith(TIMING)}
             for c, m in r["clients"].items()} for r in results["rounds"]]


def simulate(server_app, client_app, num_supernodes: int) -> None:
    """A real Flower simulation (Ray backend): one CPU per simulated client, two in all."""
    from flwr.simulation import run_simulation

    run_simulation(
        server_app, client_app, num_supernodes=num_supernodes,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                        "init_args": {"num_cpus": 2, "include_dashboard": False}},
    )


def contract_metrics(**values: float) -> dict:
    """A train reply's metrics holding every key of the engine's metric contract
    (fedgraph_flwr/engine/protocols.py), with ``values`` on top."""
    from fedgraph_flwr.engine.protocols import REQUIRED_METRICS

    metrics = {k: 1.0 for keys in REQUIRED_METRICS.values() for k in keys}
    metrics.update(values)
    return metrics
