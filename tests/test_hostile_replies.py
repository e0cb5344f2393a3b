"""Issue #76's findings 1-5, one regression test each: a hostile client's reply costs it the
round, never the run; no schema or bound is taken from a reply. Each failed on b19d891."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.engine.federation import Federation
from fedgraph_flwr.engine.records import INLINE, pack_arrays, reply_content
from fedgraph_flwr.engine.transport import ClientReply

from helpers import contract_metrics

pytestmark = pytest.mark.smoke  # the fast tier: README's Test, .ci/run's first step

NUM_FEATURES, NUM_CLASSES = 6, 3
TRAIN = 10  # every client's num-train at the handshake


def _federation(tmp_path, algorithm="fedavg", num_clients=3, **extra) -> Federation:
    cfg = resolve_config(None, {"algorithm": algorithm, "num-clients": num_clients, "hidden": 8,
                                "dataset": "SBM", "output-dir": str(tmp_path), **extra})
    roster = {c: {"partition-id": c, "num-features": NUM_FEATURES, "num-classes": NUM_CLASSES,
                  "num-train": TRAIN, "num-val": 10, "num-test": 10, "num-nodes": 30}
              for c in range(num_clients)}
    return Federation(cfg, roster, log=lambda msg: None)


def _upload(fed: Federation, value: float) -> dict:
    return {k: np.full_like(v, value) for k, v in fed.initial.items()}


def _reply(upload, signature=None, **metrics) -> ClientReply:
    return ClientReply(upload, signature or {},
                       contract_metrics(**{"num-train": float(TRAIN), **metrics}))


@pytest.mark.parametrize("count", [float("nan"), float("inf"), -float("inf")])
def test_finding_1_a_non_finite_num_train_costs_its_sender_the_round_not_the_run(tmp_path, count):
    fed = _federation(tmp_path)
    replies = {0: _reply(_upload(fed, 1.0), **{"num-train": count}),
               1: _reply(_upload(fed, 2.0)), 2: _reply(_upload(fed, 2.0))}
    record = fed.complete_round(1, [0, 1, 2], replies, {}, {})  # raised ValueError on b19d891
    assert "num-train" in record.failures[0] and set(record.clients) == {1, 2}
    assert all(np.all(v == 2.0) for v in fed.payloads[1].values())


def test_finding_2_a_wrong_signature_sent_first_does_not_lock_the_others_out(tmp_path):
    fed = _federation(tmp_path, algorithm="fedaux")
    apv = fed.initial["apv"]
    honest = {c: _reply(_upload(fed, 0.1 * (c + 1)), {"apv": apv + c}) for c in (1, 2)}
    wrong = _reply(_upload(fed, 0.1), {"apv": np.zeros(3, np.float32)})
    for server_round in (1, 2):
        record = fed.complete_round(server_round, [0, 1, 2], {0: wrong, **honest}, {}, {})
        assert set(record.clients) == {1, 2} and not record.void
        assert record.failures[0] == "rejected: signature 'apv' has shape (3,), expected (8,)"


@pytest.mark.parametrize(("count", "reason"), [
    (1e9, "num-train is 1e+09, above num-train=10 of the handshake"),
    (11.0, "num-train is 11, above num-train=10 of the handshake"),
    (-5.0, "num-train is -5.0, not a count"),
    (2.5, "num-train is 2.5, not a count"),
    (0.0, "num-train is 0: a client without training nodes cannot train"),
])
def test_finding_3_num_train_is_bounded_by_the_handshake(tmp_path, count, reason):
    fed = _federation(tmp_path)
    replies = {0: _reply(_upload(fed, 100.0), **{"num-train": count}),
               1: _reply(_upload(fed, 1.0)), 2: _reply(_upload(fed, 1.0))}
    record = fed.complete_round(1, [0, 1, 2], replies, {}, {})
    assert record.failures[0] == f"rejected: {reason}"
    assert all(np.all(v == 1.0) for v in fed.payloads[1].values())  # not the attacker's model


def test_finding_4_a_scaled_update_is_outvoted_under_robust_aggregation(tmp_path):
    """One of ten clients scaling its update ×100: FedAvg's aggregate is the attacker's
    model without ``robust`` (as on b19d891) and the honest clients' under robust=median."""
    def run(**extra):
        fed = _federation(tmp_path / str(extra), num_clients=10, **extra)
        replies = {c: _reply(_upload(fed, 100.0 if c == 3 else 1.0 + 0.01 * c))
                   for c in range(10)}
        fed.complete_round(1, list(range(10)), replies, {}, {})
        return fed.payloads[0]

    assert all(np.all(np.abs(v - 1.045) < 0.01) for v in run(robust="median").values())
    assert all(np.all(v > 10.0) for v in run().values())


def test_finding_5_signatures_and_uploads_are_held_to_the_servers_schema(tmp_path):
    fed = _federation(tmp_path, algorithm="fedaux", **{"max-array-bytes": 1000})
    good = _upload(fed, 0.5)
    apv = fed.initial["apv"]
    cases = {
        0: _reply(good, {"apv": apv, "extra": np.zeros(4 * 2**20, np.float32)}),  # 16 MB
        1: _reply(good, {"other": apv}),
        2: _reply({**good, "apv": good["apv"].astype(np.float64)}, {"apv": apv}),
    }
    record = fed.complete_round(1, [0, 1, 2], cases, {}, {})
    assert record.failures == {
        0: "rejected: wrong signature names (missing [], unexpected ['extra'])",
        1: "rejected: wrong signature names (missing ['apv'], unexpected ['other'])",
        2: "rejected: array 'apv' has dtype float64, expected float32",
    }
    assert record.void


def test_finding_5_malformed_wire_data_is_one_clients_failure():
    """Bytes that the decoders cannot read are the sender's failure (decode_reply), not an
    exception in the server's exchange."""
    from fedgraph_flwr.engine.flower_transport import decode_reply

    good = reply_content({"w": np.ones(3, np.float32)}, {"partition-id": 1.0}, {})
    packed = bytes(good["metrics"][INLINE])
    truncated = packed[:len(packed) - 60]  # into the array's bytes (the rest is padding)
    cases = [
        RecordDict({"metrics": ConfigRecord({"partition-id": 1.0, INLINE: truncated})}),
        RecordDict({"metrics": ConfigRecord({"partition-id": 1.0, INLINE: b"junk"})}),
        RecordDict({"metrics": ConfigRecord({"partition-id": 1.0, "sig.apv": [1.0, 2.0],
                                             "sigshape.apv": [5], INLINE: pack_arrays({})})}),
        RecordDict({"metrics": ConfigRecord({"partition-id": 1.0, "x": [1.0, 2.0],
                                             INLINE: pack_arrays({})})}),
        RecordDict({"other": ConfigRecord({"partition-id": 1.0})}),
    ]
    for content in cases:
        reason = decode_reply(content, 1)
        assert isinstance(reason, str) and reason.startswith("malformed reply: ")
        assert "\n" not in reason
    assert decode_reply(good, 2) == "reply claims client 1, sent to client 2"
    decoded = decode_reply(good, 1)
    assert isinstance(decoded, ClientReply) and decoded.upload["w"].tolist() == [1.0, 1.0, 1.0]
