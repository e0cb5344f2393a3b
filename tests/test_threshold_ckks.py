"""secure-aggregation=ckks-threshold: OpenFHE's threshold CKKS, each client one key share.

- the shared-key weakness of ``ckks`` is gone: under ``ckks`` one client's key decrypts
  another client's upload; under ``ckks-threshold`` one client's share does not (OpenFHE
  refuses to decode), while every share together does;
- a short in-process federation (fedavg, fedaux) ends on plaintext's figures, and the
  server only ever calls OpenFHE's public operations (no secret share reaches it);
- a bad partial decryption from one client costs that client the round, not the run;
- the server cannot decrypt a mixture that several clients receive (FedAvg's) from the
  partial decryptions it relays: they are sealed for their receivers (unsealed, every
  party's main partial of one ciphertext would give the server its plaintext).

Needs an interpreter with OpenFHE (scripts/install-openfhe-worker.sh); skips, saying
why, where there is none.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedgraph_flwr import secure_aggregation as secure
from fedgraph_flwr.config import ConfigError, resolve_config
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.threshold_ckks import (
    CHANNEL,
    DECRYPT,
    KEYGEN_JOIN,
    KEYGEN_LEAD,
    KEYGEN_SHARE,
    LEAD,
    PUBLIC,
    SHARE,
    backend,
)
from fedgraph_flwr.threshold_ckks import client as threshold_client
from fedgraph_flwr.threshold_ckks import server as threshold_server

WHY_NOT = backend.available()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no OpenFHE: {WHY_NOT}")
K = 3


def keyed_clients(tmp_path, monkeypatch, k=K):
    """K clients' key setup through the protocol's own client code (as the server drives
    it): their configs, and each one's key store."""
    monkeypatch.setenv(threshold_client.STORE_ENV, str(tmp_path / "keys"))
    config = resolve_config(None, {"secure-aggregation": "ckks-threshold"}).client_config(
        client_state_token="test")
    stores = {c: threshold_client.KeyStore(config, c) for c in range(k)}
    replies = {}
    for c in range(k):
        reply = threshold_client.run_phase(config, KEYGEN_LEAD, {LEAD: np.array([int(c == 0)])}, c, {})
        replies.update({c: reply} if reply else {})
    for c in range(1, k):
        replies[c] = threshold_client.run_phase(config, KEYGEN_SHARE, {PUBLIC: replies[0][PUBLIC]},
                                                c, {})
    join = {f"{SHARE}{p}": r[PUBLIC] for p, r in replies.items()}
    join.update({f"{CHANNEL}{p}": r[CHANNEL] for p, r in replies.items()})
    for c in range(k):
        threshold_client.run_phase(config, KEYGEN_JOIN, join, c, {})
    return config, stores


def test_one_clients_key_decrypts_anothers_upload_under_ckks_but_not_under_threshold(
        tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    model = {"w": rng.normal(0, 1, (40, 300)).astype(np.float32)}  # 2 ciphertexts' worth

    # ckks: every client is given the same secret.ckks, so client 0 opens client 1's upload
    secret_path, _ = secure.generate_keys(tmp_path / "ckks")
    client_settings = resolve_config(None, {"ckks-secret-context": str(secret_path)})
    upload_of_1 = secure.encrypt_arrays(model, secure.load_secret_context(client_settings))
    read_by_0 = secure.decrypt_arrays(upload_of_1, secure.load_secret_context(client_settings), model)
    assert np.abs(read_by_0["w"] - model["w"]).max() < 1e-5

    # ckks-threshold: client 1's upload under the joint key (as a mixture of weight 1, what
    # the protocol decrypts); client 0's share alone fails
    config, stores = keyed_clients(tmp_path, monkeypatch)
    upload = threshold_client.seal_upload(config, model, 1)
    blobs = [upload[k].tobytes() for k in sorted(upload, key=lambda k: int(k.rsplit("@ckks", 1)[1]))]
    (blobs,) = backend.call("mix", [blobs], [[1.0]])
    count = model["w"].size
    for c in range(K):
        alone = backend.call("decrypt_with_one_share", blobs, stores[c].read("secret-share"), count)
        assert alone is None or np.abs(np.frombuffer(alone) - model["w"].reshape(-1)).max() > 1.0
    # ... while every share together opens it (the same ciphertexts, the protocol's fusion)
    parts = [backend.call("partial_decrypt", blobs, stores[0].read("secret-share"), True)]
    parts += [backend.call("partial_decrypt", blobs, stores[c].read("secret-share"), False)
              for c in range(1, K)]
    opened = np.frombuffer(backend.call("fuse", parts, count))
    assert np.abs(opened - model["w"].reshape(-1)).max() < 1e-5
    # and two of three shares do not
    with pytest.raises(backend.OpenFHEError):
        backend.call("fuse", parts[:2], count)


def test_a_client_refuses_a_decrypt_request_without_its_own_upload(tmp_path, monkeypatch):
    config, _ = keyed_clients(tmp_path, monkeypatch)
    schema = {"w": np.zeros(10, dtype=np.float32)}
    own = threshold_client.seal_upload(config, {"w": np.ones(10, dtype=np.float32)}, 1)
    forged = threshold_client.seal_upload(config, {"w": np.full(10, 2.0, dtype=np.float32)}, 1)
    # two rows of weights: the clients get the uploads and recompute the mixtures
    request = {"ckksthr:senders": np.array([0, 1]),
               "ckksthr:weights": np.array([[0.5, 0.5], [0.25, 0.75]]),
               "ckksthr:row-of": np.array([0, 1]),
               "w@ckks0@from0": own["w@ckks0"], "w@ckks0@from1": own["w@ckks0"]}
    # client 1's last upload is `forged`: the request's is not it
    with pytest.raises(threshold_client.ThresholdProtocolError, match="own upload"):
        threshold_client.run_phase(config, DECRYPT, request, 1, schema)
    # weights that are no distribution are refused too
    threshold_client.seal_upload(config, {"w": np.ones(10, dtype=np.float32)}, 1)
    del forged
    bad = {**request, "ckksthr:weights": np.array([[0.0, 2.0], [0.5, 0.5]])}
    with pytest.raises(threshold_client.ThresholdProtocolError, match="distribution"):
        threshold_client.run_phase(config, DECRYPT, bad, 1, schema)


def test_the_server_cannot_decrypt_a_mixture_every_client_receives(tmp_path, monkeypatch):
    config, _ = keyed_clients(tmp_path, monkeypatch)
    rng = np.random.default_rng(1)
    models = [{"w": rng.normal(0, 1, 9000).astype(np.float32)} for _ in range(K)]  # 2 chunks
    schema = {"w": np.zeros(9000, dtype=np.float32)}
    uploads = [threshold_client.seal_upload(config, models[c], c) for c in range(K)]
    chunks = sorted(uploads[0], key=lambda k: int(k.rsplit("@ckks", 1)[1]))
    weights = np.array([[0.2, 0.3, 0.5]])  # FedAvg: one row, every client receives it
    expected = sum(w * m["w"].astype(np.float64) for w, m in zip(weights[0], models))
    (mixture,) = backend.call("mix", [[u[k].tobytes() for k in chunks] for u in uploads],
                              weights.tolist())
    request = {"ckksthr:senders": np.arange(K), "ckksthr:weights": weights,
               "ckksthr:row-of": np.zeros(K, dtype=np.int64),
               **{f"{k}@mixture": np.frombuffer(b, dtype=np.uint8) for k, b in zip(chunks, mixture)}}
    replies = {c: threshold_client.run_phase(config, DECRYPT, request, c, schema) for c in range(K)}

    # the attack is real: every party's main partial of the one mixture decrypts it ...
    secrets = [threshold_client.KeyStore(config, c).read("secret-share") for c in range(K)]
    mains = [backend.call("partial_decrypt", mixture, s, False) for s in secrets]
    opened = backend.call("decrypt_with_every_main_partial", mixture, mains, 9000)
    assert np.abs(np.frombuffer(opened) - expected).max() < 1e-5
    # ... but what the clients send the server is sealed: no array of it loads in OpenFHE
    sent = [a.tobytes() for reply in replies.values() for a in reply.values()]
    assert len(sent) == K * (len(chunks) + K - 1)  # a row's chunks + its key for each receiver
    assert all(backend.call("check_ciphertexts", [blob], 2) for blob in sent)
    # while each receiver opens its own train request: the others' sealed partials, relayed
    for c in range(K):
        train = {f"{k}@part{p}": replies[p][f"{k}@row0"] for p in range(K) if p != c for k in chunks}
        train.update({f"ckksthr:key{p}": replies[p][f"ckksthr:key{c}"] for p in range(K) if p != c})
        got = threshold_client.open_payload(config, train, c, schema)["w"]
        assert np.abs(got - expected).max() < 1e-5
        # a partial relayed to the wrong receiver does not open
        if c == 1:
            wrong = {**train, "ckksthr:key0": replies[0]["ckksthr:key2"]}
            with pytest.raises(threshold_client.ThresholdProtocolError, match="does not open"):
                threshold_client.open_payload(config, wrong, c, schema)


def sbm(tmp_path, data_root, **keys):
    return {"dataset": "SBM", "num-clients": K, "rounds": 3, "hidden": 16,
            "data-root": str(data_root), "output-dir": str(tmp_path), **keys}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedavg", "fedaux"])
def test_threshold_federation_matches_plaintext_and_the_server_holds_public_material_only(
        tmp_path, synthetic_root, monkeypatch, algorithm):
    monkeypatch.setenv(threshold_client.STORE_ENV, str(tmp_path / "keys"))
    plain = run_federation(sbm(tmp_path, synthetic_root, algorithm=algorithm, **{"run-name": "plain"}),
                           write=False)
    server_ops = []
    real_call = threshold_server.call

    def spy(name, *args):
        server_ops.append(name)
        return real_call(name, *args)

    monkeypatch.setattr(threshold_server, "call", spy)
    res = run_federation(sbm(tmp_path, synthetic_root, algorithm=algorithm,
                             **{"run-name": "threshold", "secure-aggregation": "ckks-threshold"}),
                         write=False)
    # never a party's secret: public checks, mixing, and partial_size (a throwaway key)
    assert set(server_ops) <= {"check_public", "check_ciphertexts", "mix", "partial_size"}
    assert all(not r["failures"] for r in res["rounds"]) and len(res["rounds"]) == 3
    assert abs(res["final"]["test_at_best_val"] - plain["final"]["test_at_best_val"]) <= 0.1
    assert abs(res["final"]["per_client_best_val_test"]
               - plain["final"]["per_client_best_val_test"]) <= 0.1
    for a, b in zip(plain["rounds"], res["rounds"]):
        for c in a["clients"]:
            assert abs(a["clients"][c]["train_loss"] - b["clients"][c]["train_loss"]) < 1e-4


@pytest.mark.slow
def test_a_bad_partial_decryption_costs_its_sender_the_round_only(tmp_path, synthetic_root,
                                                                  monkeypatch):
    monkeypatch.setenv(threshold_client.STORE_ENV, str(tmp_path / "keys"))
    real = threshold_client._partial_decryptions
    calls = {"n": 0}

    def partial(store, arrays, me, schema):
        reply = real(store, arrays, me, schema)
        if me == 1:
            calls["n"] += 1
            if calls["n"] == 1:  # round 2: client 1 sends bytes that are no partial decryption
                return {k: np.frombuffer(b"not a ciphertext", dtype=np.uint8) for k in reply}
        return reply

    monkeypatch.setattr(threshold_client, "_partial_decryptions", partial)
    res = run_federation(sbm(tmp_path, synthetic_root, algorithm="fedavg",
                             **{"run-name": "bad", "secure-aggregation": "ckks-threshold"}),
                         write=False)
    rounds = res["rounds"]
    assert len(rounds) == 3
    assert list(rounds[1]["failures"]) == ["1"] or list(rounds[1]["failures"]) == [1]
    reason = next(iter(rounds[1]["failures"].values()))
    assert "ckks_decrypt" in reason and "bytes of a sealed partial decryption" in reason
    assert sorted(map(int, rounds[1]["clients"])) == [0, 2]  # the others trained that round
    assert rounds[1]["aggregate"]["ckks_decrypt.ckks-threshold-closed"] == 2.0
    assert sorted(map(int, rounds[2]["clients"])) == [0, 1, 2] and not rounds[2]["failures"]


@pytest.mark.slow
def test_a_threshold_run_resumes_with_the_key_shares_it_made(tmp_path, synthetic_root,
                                                             monkeypatch):
    """Stopped after round 2, a fedaux run resumes: no new key setup (the checkpoint holds
    the public shares and round 2's uploads and plan, the clients' key stores their
    shares), and round 3 opens every mixture of round 2."""
    monkeypatch.setenv(threshold_client.STORE_ENV, str(tmp_path / "keys"))
    cfg = sbm(tmp_path, synthetic_root, algorithm="fedaux",
              **{"run-name": "stopped", "secure-aggregation": "ckks-threshold"})
    run_federation(dict(cfg, rounds=2))
    phases = []
    real = threshold_client.run_phase

    def run_phase(config, phase, *args):
        phases.append(phase.name)
        return real(config, phase, *args)

    monkeypatch.setattr(threshold_client, "run_phase", run_phase)
    logged: list[str] = []
    resumed = run_federation(dict(cfg, resume=True), log=logged.append)
    assert any("after round 2" in line for line in logged)
    assert set(phases) == {"ckks_decrypt"}  # no key setup again
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3]
    last = resumed["rounds"][2]
    assert not last["failures"] and sorted(map(int, last["clients"])) == [0, 1, 2]
    assert last["aggregate"]["ckks_decrypt.ckks-threshold-closed"] == 0.0


def test_settings_the_protocol_does_not_cover_are_refused():
    for extra in ({"dp": "client", "dp-noise-multiplier": 1.0}, {"client-state": "file"},
                  {"fraction": 0.5}):
        with pytest.raises(ConfigError, match="ckks-threshold does not support"):
            resolve_config(None, {"algorithm": "fedavg", "secure-aggregation": "ckks-threshold",
                                  **extra})
