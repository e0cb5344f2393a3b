"""What leaves a client never scales with its node count; bad replies never reach an aggregate."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from fedgraph_flwr.algorithms import ALGORITHMS
from fedgraph_flwr.config import RunConfig, resolve_config
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine import client_runtime as rt
from fedgraph_flwr.engine.federation import Federation
from fedgraph_flwr.engine.replies import ReplyValidator
from fedgraph_flwr.engine.transport import ClientReply

from helpers import contract_metrics, labelled_graph

NUM_FEATURES, NUM_CLASSES = 12, 3

README = Path(__file__).resolve().parents[1] / "README.md"

#: Baselines whose published protocol itself sends per-node values: those whose trainer
#: names arrays in ``ClientTrainer.per_node_arrays`` (with the paper's reason in its
#: docstring). Read from the registry, not kept here; what keeps the exemption deliberate
#: is that README's algorithm table must disclose it (test below).
PUBLISHED_PER_NODE_UPLOADS: frozenset[str] = frozenset(
    name for name, algo in ALGORITHMS.items() if algo.trainer.per_node_arrays)


def test_every_per_node_exemption_is_disclosed_in_the_readme():
    """A method that sends per-node values says so to the user in README's method table
    (its "per-node values that leave the client" column names the arrays), and no other
    row claims it."""
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `([a-z0-9-]+)` \|(.*)$", README.read_text(),
                                            flags=re.MULTILINE)}
    per_node = {name: row.split("|")[2].strip() for name, row in rows.items()
                if name != "algorithm"}  # the header row
    disclosed = {name for name, arrays in per_node.items() if arrays != "none"}
    assert disclosed == PUBLISHED_PER_NODE_UPLOADS
    for name in disclosed:
        listed = {a.strip(" `") for a in per_node[name].split(",")}
        assert listed == set(ALGORITHMS[name].trainer.per_node_arrays)


def _graph(n: int, seed: int, halo: bool = False) -> Data:
    graph = labelled_graph(n, NUM_CLASSES, NUM_FEATURES, seed, degree=4)
    graph.global_id = torch.arange(n)  # what the partition cache gives every client (FedGNN hashes it)
    if halo:  # and its halo, to the trainer that reads it (FedGCN): 5 outside nodes
        graph.halo_global_id = torch.arange(n, n + 5)
        graph.halo_edge_index = torch.tensor([[0, n, 1, n + 4], [n, 0, n + 4, 1]])
    return graph


def _config(algorithm: str) -> RunConfig:
    cfg = resolve_config(None, {"algorithm": algorithm, "hidden": 8, "num-clients": 2,
                                "dataset": "SBM"})
    return cfg.with_keys({"server-round": 1, "num-classes-global": NUM_CLASSES,
                          "num-features-global": NUM_FEATURES, "run-name": "privacy"})


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_nothing_a_client_sends_scales_with_its_node_count(algorithm):
    """Two clients, 40 and 400 nodes: in every phase of the algorithm's round, every
    uploaded array, signature and metric has the same shape (the papers' privacy claim:
    no embeddings, scores or per-node values)."""
    cfg = _config(algorithm)
    algo = ALGORITHMS[algorithm]
    exempt = algo.trainer.per_node_arrays  # the published exemption, if any (above)
    halo = algo.trainer.reads_halo
    initial = algo.trainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, cfg)
    for phase in algo.trainer.phases:
        sent = {}
        for n in (40, 400):
            aggregator = algo.aggregator(cfg, [0], initial)
            state = None
            for earlier in algo.trainer.phases[:algo.trainer.phases.index(phase)]:
                # the client as it is when this phase comes: after the earlier phases and
                # the server's steps on them
                req = aggregator.configure(earlier, 1, [0])[0]
                reply = rt.phase_round(_graph(n, n, halo), NUM_CLASSES, cfg, earlier, req,
                                       state, 1, 0, torch.device("cpu"))
                aggregator.step(earlier, 1, {0: ClientUpdate(reply.upload, reply.signature, 1,
                                                             reply.metrics)})
                state = reply.state
            request = initial if phase.name == "train" else aggregator.configure(phase, 1, [0])[0]
            sent[n] = rt.phase_round(_graph(n, n, halo), NUM_CLASSES, cfg, phase, request,
                                     state, 1, 0, torch.device("cpu"))
        small, large = sent[40], sent[400]
        if phase.name != "train":  # each reply is what the trainer declares for it
            spec = algo.trainer.phase_reply_spec(phase, request, NUM_FEATURES, NUM_CLASSES, cfg)
            validator = ReplyValidator({}, {}, {0: {"num-nodes": 400}}, 1 << 30)
            for reply in (small, large):
                assert validator.check(0, ClientReply(reply.upload, reply.signature,
                                                      reply.metrics), phase.name, spec) is None
        for part in ("upload", "signature"):
            a, b = getattr(small, part), getattr(large, part)
            assert set(a) == set(b), (phase, part)
            assert {k: v.shape for k, v in a.items() if k not in exempt} == {
                k: v.shape for k, v in b.items() if k not in exempt}, (phase, part)
            assert all(400 not in v.shape for k, v in b.items() if k not in exempt), (phase, part)
        assert set(small.metrics) == set(large.metrics)
    # The upload is exactly what the server expects (same names and shapes as round 1's model).
    assert {k: v.shape for k, v in large.upload.items()} == {k: v.shape for k, v in initial.items()}


def _federation(tmp_path, **extra) -> Federation:
    cfg = resolve_config(None, {"algorithm": "fedavg", "num-clients": 3, "hidden": 8,
                                "dataset": "SBM", "output-dir": str(tmp_path), **extra})
    roster = {c: {"num-features": NUM_FEATURES, "num-classes": NUM_CLASSES, "num-train": 10,
                  "num-nodes": 30} for c in range(3)}
    return Federation(cfg, roster, log=lambda msg: None)


def test_poisoned_replies_are_rejected_and_never_aggregated(tmp_path):
    fed = _federation(tmp_path)
    good = {k: np.full_like(v, 1.0) for k, v in fed.initial.items()}
    name = next(iter(good))
    nan = dict(good, **{name: np.full_like(good[name], np.nan)})
    wrong_shape = dict(good, **{name: np.zeros((3, 3), dtype=np.float32)})
    wrong_names = {("x." + k): v for k, v in good.items()}
    metrics = contract_metrics(**{"num-train": 10.0, "train_loss": 0.5, "val_metric": 0.5,
                                  "test_metric": 0.5})
    replies = {
        0: ClientReply(good, {}, metrics),
        1: ClientReply(nan, {}, metrics),
        2: ClientReply(wrong_shape, {}, metrics),
    }
    record = fed.complete_round(1, [0, 1, 2], replies, {}, {})
    assert set(record.clients) == {0}
    assert "NaN or Inf" in record.failures[1]
    assert "shape" in record.failures[2]
    for arrays in fed.payloads.values():  # the aggregate is the one good reply, unpoisoned
        for k, v in arrays.items():
            np.testing.assert_array_equal(v, good[k])
    record = fed.complete_round(2, [0, 1, 2], {1: ClientReply(wrong_names, {}, metrics)}, {}, {})
    assert record.void and "wrong array names" in record.failures[1]


def test_min_clients_makes_a_short_round_void(tmp_path):
    fed = _federation(tmp_path, **{"min-clients": 2})
    good = {k: np.full_like(v, 1.0) for k, v in fed.initial.items()}
    reply = ClientReply(good, {}, contract_metrics(**{"num-train": 10.0}))
    record = fed.complete_round(1, [0, 1, 2], {0: reply}, {1: "missing", 2: "missing"}, {})
    assert record.void and fed.payloads == {}


def test_partial_participation_samples_by_seed_and_round(tmp_path):
    assert _federation(tmp_path).sample(1) == [0, 1, 2]
    fed = _federation(tmp_path, fraction=0.34)
    picks = [fed.sample(r) for r in range(1, 6)]
    assert all(len(p) == 1 for p in picks)
    assert picks == [fed.sample(r) for r in range(1, 6)]  # deterministic
    assert len({tuple(p) for p in picks}) > 1  # varies with the round
