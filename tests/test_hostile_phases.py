"""Issue #76, the phases before train: a hostile client's reply to a non-train phase costs
it that phase, never the run. Before the trainers declared these replies
(``ClientTrainer.phase_reply_specs``), a row too few in FedGCN's neighbour sums, a column
too many in FedGL's logits or AdaFGL's extractor, or a renamed array ended the run in the
aggregator's step (IndexError, ValueError, KeyError)."""

from __future__ import annotations

import numpy as np
import pytest

from fedgraph_flwr.algorithms import ALGORITHMS
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.phases import Arrays, ArraySpec, Phase, ReplySpec
from fedgraph_flwr.engine.federation import Federation
from fedgraph_flwr.engine.transport import ClientReply

NUM_FEATURES, NUM_CLASSES, CLIENTS = 6, 3, 3
#: Every algorithm whose round has a phase before train.
PHASED = sorted(name for name, algo in ALGORITHMS.items() if len(algo.trainer.phases) > 1)


def _federation(tmp_path, algorithm: str) -> Federation:
    cfg = resolve_config(None, {"algorithm": algorithm, "num-clients": CLIENTS, "hidden": 8,
                                "dataset": "SBM", "output-dir": str(tmp_path),
                                **({"adafgl-rounds-step1": 1} if algorithm == "adafgl" else {})})
    roster = {c: {"partition-id": c, "num-features": NUM_FEATURES, "num-classes": NUM_CLASSES,
                  "num-train": 10, "num-val": 10, "num-test": 10, "num-nodes": 30}
              for c in range(CLIENTS)}
    return Federation(cfg, roster, log=lambda msg: None)


def _arrays(specs: dict[str, ArraySpec], rng: np.random.Generator, rows: int) -> Arrays:
    """Arrays that fit ``specs``: each named length ``rows``, integers in range."""
    out = {}
    for name, spec in specs.items():
        shape = tuple(rows if isinstance(d, str) else d for d in spec.shape)
        if np.dtype(spec.dtype).kind == "f":
            out[name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            low = 0 if spec.low is None else spec.low
            high = 1 << 40 if spec.high is None else spec.high
            out[name] = rng.integers(low, high + 1, shape).astype(spec.dtype)
    return out


def _mutations(arrays: Arrays, specs: dict[str, ArraySpec]) -> dict[str, Arrays]:
    """What a hostile client sends in place of ``arrays``: the ways a layout can be wrong."""
    first = sorted(arrays)[0]
    out = {
        "renamed": {(k + "_x" if k == first else k): v for k, v in arrays.items()},
        "extra array": {**arrays, "extra": np.zeros(3, np.float32)},
        "a column more": {k: np.concatenate([v, v[..., :1]], -1) if v.ndim >= 2 else v
                          for k, v in arrays.items()},
        "other dtype": {k: v.astype(np.float64 if v.dtype.kind == "f" else np.float32)
                        for k, v in arrays.items()},
        "0-d": {k: np.asarray(1.0, v.dtype) for k, v in arrays.items()},
    }
    floats = [k for k, v in arrays.items() if v.dtype.kind == "f"]
    if floats:
        out["Inf"] = {**arrays, floats[0]: np.full_like(arrays[floats[0]], np.inf)}
    counted = [k for k, s in specs.items() if any(isinstance(d, str) for d in s.shape)]
    if counted:  # one array a row short of the others sharing its node count
        name = counted[0]
        out["a row short"] = {**arrays, name: arrays[name][:-1]}
    ranged = [k for k, s in specs.items() if s.high is not None]
    if ranged:
        out["out of range"] = {**arrays, ranged[0]: np.full_like(arrays[ranged[0]], 1 << 30)}
    return out


def _phases(fed: Federation) -> list[tuple[int, Phase]]:
    """The non-train exchanges of rounds 0 (before the first), 1 and 2 (FedGL asks for
    predictions from round 2)."""
    return ([(0, p) for p in fed.phases_when("before-first-round")]
            + [(r, p) for r in (1, 2) for p in fed.round_phases(r) if p.name != "train"])


def _replies(fed: Federation, phase: Phase, server_round: int, rng: np.random.Generator
             ) -> tuple[dict[int, ClientReply], dict[int, ReplySpec]]:
    """Each client's reply as its trainer declares it: arrays and numbers in range."""
    requests = fed.requests(phase, server_round, list(range(CLIENTS)))
    specs = {c: fed.algo.trainer.phase_reply_spec(phase, r.arrays, NUM_FEATURES, NUM_CLASSES,
                                                  fed.client_config(server_round))
             for c, r in requests.items()}
    metrics = {c: {k: max(m.low, 0.5) if m.fact is None else 10.0
                   for k, m in specs[c].metrics.items()} for c in requests}
    return {c: ClientReply(_arrays(specs[c].arrays, rng, 12 + c), {}, metrics[c])
            for c in requests}, specs


@pytest.mark.parametrize("algorithm", PHASED)
def test_replies_that_fit_the_declaration_are_taken(tmp_path, algorithm):
    """The declared layout is one the aggregator's step takes: no client fails."""
    fed = _federation(tmp_path, algorithm)
    rng = np.random.default_rng(0)
    for server_round, phase in _phases(fed):
        replies, _ = _replies(fed, phase, server_round, rng)
        failures: dict[int, str] = {}
        fed.phase_step(phase, server_round, replies, failures)
        assert failures == {}, (phase.name, failures)


@pytest.mark.parametrize("algorithm", PHASED)
def test_a_malformed_phase_reply_costs_its_sender_the_phase_not_the_run(tmp_path, algorithm):
    rng = np.random.default_rng(1)
    probed = 0
    for server_round, phase in _phases(_federation(tmp_path / "layout", algorithm)):
        fed = _federation(tmp_path / f"{phase.name}", algorithm)
        for r, earlier in _phases(fed):  # the federation as it is when this phase comes
            if (r, earlier) == (server_round, phase):
                break
            fed.phase_step(earlier, r, _replies(fed, earlier, r, rng)[0], {})
        replies, specs = _replies(fed, phase, server_round, rng)
        if not specs[0].arrays:
            continue  # this phase's reply carries nothing here
        honest = replies[0]
        hostile = {what: ClientReply(arrays, {}, honest.metrics)
                   for what, arrays in _mutations(honest.upload, specs[0].arrays).items()}
        hostile["nothing"] = ClientReply({}, {}, honest.metrics)
        for key in specs[0].metrics:
            hostile[f"{key} above the handshake"] = ClientReply(
                honest.upload, {}, {**honest.metrics, key: 1e9})
            hostile[f"no {key}"] = ClientReply(
                honest.upload, {}, {k: v for k, v in honest.metrics.items() if k != key})
        for what, reply in hostile.items():
            failures: dict[int, str] = {}
            fed.phase_step(phase, server_round, {**replies, 0: reply}, failures)
            assert set(failures) == {0}, (phase.name, what, failures)
            assert failures[0].startswith("rejected: ") and phase.name in failures[0]
            probed += 1
    assert probed, "no phase of this algorithm carried arrays"
