"""Helpers shared by the tests (imported by name: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

# Per-client metric keys that differ run to run (wall times, serialised state size, memory).
TIMING = ("time-", "state-bytes", "mem-")


def round_metrics(results: dict) -> list:
    """Per-round, per-client metrics of a results dict without timings; NaN as the
    string "nan" so that == compares two runs."""
    return [{c: {k: "nan" if isinstance(v, float) and math.isnan(v) else v
                 for k, v in m.items() if not k.startswith(TIMING)}
             for c, m in r["clients"].items()} for r in results["rounds"]]


def simulate(server_app, client_app, num_supernodes: int) -> None:
    """A real Flower simulation (Ray backend): one CPU per simulated client, two in all
    (fedgraph_flwr.engine.simulation: ``run_simulation`` without its deprecation line)."""
    from fedgraph_flwr.engine.simulation import simulate as run

    run(server_app, client_app, num_supernodes=num_supernodes,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                        "init_args": {"num_cpus": 2, "include_dashboard": False}})


def contract_metrics(**values: float) -> dict:
    """A train reply's metrics holding every key of the engine's metric contract
    (fedgraph_flwr/engine/protocols.py), with ``values`` on top."""
    from fedgraph_flwr.engine.protocols import REQUIRED_METRICS

    metrics = {k: 1.0 for keys in REQUIRED_METRICS.values() for k in keys}
    metrics.update(values)
    return metrics


def simulation_equals_in_process(config: dict, out, num_supernodes: int) -> dict:
    """Run ``config`` as a real Flower simulation (run-name "flower") and in process;
    assert every round completed with every client and both gave the same per-client
    metrics; return the simulation's results."""
    import json

    from fedgraph_flwr.engine.client_app import make_client_app
    from fedgraph_flwr.engine.loop import run_federation
    from fedgraph_flwr.engine.server_app import make_server_app

    # A generous round-timeout: on a loaded machine a slow phase (FedDEP's pre-training took
    # over 120 s beside two other jobs) would time a client out and the figures would differ.
    config = {"round-timeout": 900, **config, "output-dir": str(out), "run-name": "flower"}
    simulate(make_server_app(config), make_client_app(), num_supernodes)
    flower = json.loads((out / "flower" / "results.json").read_text())
    assert [r["round"] for r in flower["rounds"]] == list(range(1, int(config["rounds"]) + 1))
    assert all(len(r["clients"]) == num_supernodes and not r["failures"] for r in flower["rounds"])
    inproc = run_federation(dict(config, **{"run-name": "inproc"}), write=False)
    assert round_metrics(flower) == round_metrics(inproc)
    assert 0 < flower["final"]["test_at_best_val"] <= 100
    return flower


def benchmark_module(name: str):
    """``benchmarks/<name>.py`` imported as module ``name`` (benchmarks/ is no package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def labelled_graph(n: int = 60, num_classes: int = 3, num_features: int = 8, seed: int = 0,
                   degree: int = 3) -> Data:
    """A seeded random graph for algorithm tests: labels, features shifted by the label,
    ``degree·n`` random edges (made undirected), train/val/test a third each."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = torch.randn(n, num_features, generator=g) + y[:, None].float()
    edge_index = to_undirected(torch.randint(0, n, (2, degree * n), generator=g))
    perm = torch.randperm(n, generator=g)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for mask, part in zip(masks, (perm[: n // 3], perm[n // 3: 2 * n // 3], perm[2 * n // 3:])):
        mask[part] = True
    return Data(x=x, y=y, edge_index=edge_index, train_mask=masks[0], val_mask=masks[1],
                test_mask=masks[2])


def _flower_is_tested() -> bool:
    """Whether the fedgraph-* commands run their speed-ups and fixes on the installed Flower."""
    from fedgraph_flwr.engine import accelerate

    return ".".join(accelerate.flower_version().split(".")[:2]) in accelerate.TESTED_FLOWER


#: For the tests that go through the fedgraph-* commands' guard: on a Flower outside
#: TESTED_FLOWER the commands run stock Flower instead (tests/test_flower_surface.py checks
#: that), without the fixes these tests check (scripts/test-flwr-nightly.sh, docs/architecture.md).
through_the_guard = pytest.mark.skipif(
    not _flower_is_tested(), reason="the installed Flower is not in TESTED_FLOWER: the "
                                    "fedgraph-* commands run stock Flower there")
