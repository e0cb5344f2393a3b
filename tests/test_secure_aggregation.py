"""secure-aggregation=ckks: the server mixes CKKS ciphertexts it cannot decrypt.

- each supported method's :class:`MixingPlan` gives, in the clear, what its ``aggregate``
  gives, and the ciphertext mixture decrypts to that within CKKS precision;
- in a real in-process federation the server side only ever holds ciphertext uploads
  and a public context, and never calls the plaintext ``aggregate``;
- a method whose server needs the weights, and a missing or wrong key, are refused in
  one line before any client trains;
- three rounds under ckks give plaintext's accuracy (within 0.1 points).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedgraph_flwr import secure_aggregation as secure
from fedgraph_flwr.algorithms import get_algorithm
from fedgraph_flwr.config import ConfigError, resolve_config
from fedgraph_flwr.core.mixing import apply_plan
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine import federation as federation_module
from fedgraph_flwr.engine.ckks_mixing import CiphertextMixer
from fedgraph_flwr.engine.loop import run_federation

SUPPORTED = ("fedavg", "fedprox", "fedper", "fedaux", "fediih", "fedpub", "cufl")
NUM_FEATURES, NUM_CLASSES, K = 12, 3, 3


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """(secret context, public context) of one fresh key pair, as loaded from files."""
    secret_path, public_path = secure.generate_keys(tmp_path_factory.mktemp("keys"))
    config = resolve_config(None, {"ckks-secret-context": str(secret_path)})
    return secure.load_secret_context(config), secure.load_public_context(public_path)


def updates_for(algorithm: str, seed: int = 0):
    """The aggregator of ``algorithm`` on a small model and K clients' random updates
    (signatures as the trainers send them)."""
    config = resolve_config(None, {"algorithm": algorithm, "hidden": 8,
                                   **({"fediih-factors": 2} if algorithm == "fediih" else {})})
    algo = get_algorithm(algorithm)
    initial = algo.trainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config.client_config())
    rng = np.random.default_rng(seed)
    updates = {}
    for c in range(K):
        arrays = {n: (a + rng.normal(0, 0.5, a.shape)).astype(a.dtype) for n, a in initial.items()}
        signature = {}
        if algorithm == "fedaux":
            signature["apv"] = arrays["apv"].copy()
        if algorithm == "fediih":
            factors = config.options.factors
            signature = {"mu": rng.normal(0, 1, (factors, 8)).astype(np.float32),
                         "logvar": rng.normal(0, 0.3, (factors, 8)).astype(np.float32)}
        if algorithm == "cufl":  # its declared signature: proxy vector and λ
            shapes = algo.trainer.signature_shapes(NUM_FEATURES, NUM_CLASSES,
                                                   config.client_config())
            signature = {"proxy-recon": rng.uniform(0, 1, shapes["proxy-recon"]).astype(np.float32),
                         "scale": np.array([rng.uniform(3, 10)], np.float32)}
        updates[c] = ClientUpdate(arrays, signature, num_train=int(rng.integers(5, 50)))
    aggregator = algo.aggregator(config, list(range(K)), initial)
    if algorithm == "fedpub":  # what the client sends under ckks: the same computation
        for update in updates.values():
            update.signature["functional-embedding"] = aggregator.functional_embedding(
                update.arrays).astype(np.float32)
    return aggregator, initial, updates


@pytest.mark.parametrize("algorithm", SUPPORTED)
def test_plan_in_the_clear_is_the_aggregate(algorithm):
    aggregator, _, updates = updates_for(algorithm)
    result = aggregator.aggregate(1, updates)
    plan = aggregator.mixing_plan(1, updates)
    assert plan.client_ids == sorted(updates)
    np.testing.assert_allclose(plan.matrices.sum(axis=-1), 1.0, atol=1e-12)
    planned = apply_plan(plan, [updates[c].arrays for c in plan.client_ids])
    # float64 sums in another order, cast to float32: within a float32 ulp. FED-PUB's
    # plan reads the client's float32 embedding, its aggregate the server's float64 one.
    atol = 1e-5 if algorithm == "fedpub" else 1e-7
    for k, c in enumerate(plan.client_ids):
        assert set(planned[k]) == set(result.payloads[c])
        for name, value in result.payloads[c].items():
            np.testing.assert_allclose(planned[k][name], value, rtol=2e-6, atol=atol,
                                       err_msg=f"{algorithm} client {c} {name}")
    assert plan.metrics.keys() == result.metrics.keys()
    np.testing.assert_allclose(list(plan.metrics.values()), list(result.metrics.values()),
                               rtol=1e-6)


@pytest.mark.parametrize("algorithm", SUPPORTED)
def test_ciphertext_mixture_decrypts_to_the_plaintext_mixture(algorithm, keys):
    secret, public = keys
    aggregator, initial, updates = updates_for(algorithm, seed=1)
    plan = aggregator.mixing_plan(1, updates)
    expected = apply_plan(plan, [updates[c].arrays for c in plan.client_ids])
    mixer = CiphertextMixer(public, initial)
    sealed = {c: ClientUpdate(secure.encrypt_arrays(u.arrays, secret), u.signature, u.num_train)
              for c, u in updates.items()}
    assert all(mixer.check(u.arrays) is None for u in sealed.values())
    payloads = mixer.mix(plan, sealed)
    for k, c in enumerate(plan.client_ids):
        assert all(v.dtype == np.uint8 for n, v in payloads[c].items()
                   if secure.parse_cipher_key(n))
        opened = secure.decrypt_arrays(payloads[c], secret, initial)
        assert set(opened) == set(expected[k])
        for name, value in expected[k].items():
            np.testing.assert_allclose(opened[name], value, rtol=0, atol=1e-5,
                                       err_msg=f"{algorithm} client {c} {name}")


def test_the_validator_refuses_tampered_ciphertexts(keys):
    secret, public = keys
    _, initial, updates = updates_for("fedavg")
    mixer = CiphertextMixer(public, initial)
    sealed = secure.encrypt_arrays(updates[0].arrays, secret)
    name = sorted(sealed)[0]
    assert "does not load" in mixer.check({**sealed, name: sealed[name][:100]})
    assert "wrong ciphertext names" in mixer.check({k: v for k, v in sealed.items() if k != name})
    assert "wrong ciphertext names" in mixer.check(updates[0].arrays)  # plaintext refused


def sbm(tmp_path, data_root, **keys):
    return {"dataset": "SBM", "num-clients": K, "rounds": 3, "hidden": 16,
            "data-root": str(data_root), "output-dir": str(tmp_path), **keys}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedavg", "fedaux"])
def test_ckks_federation_matches_plaintext_and_the_server_sees_only_ciphertexts(
        tmp_path, synthetic_root, monkeypatch, algorithm):
    plain = run_federation(sbm(tmp_path, synthetic_root, algorithm=algorithm, **{"run-name": "plain"}),
                           write=False)

    # Spies on the server's side (the real functions still run): what it loads, what it
    # is given to aggregate, and that the plaintext aggregate never runs.
    loaded, seen = [], []
    real_load = federation_module.load_public_context

    def load_public(path):
        context = real_load(path)
        loaded.append(context)
        return context

    real_aggregate = federation_module.Federation._aggregate

    def aggregate(self, record, server_round, updates):
        for update in updates.values():
            seen.append(update)
            assert update.arrays and all(
                v.dtype == np.uint8 and secure.parse_cipher_key(n) for n, v in update.arrays.items())
        type(self.aggregator).aggregate = refuse
        real_aggregate(self, record, server_round, updates)
        for payload in self.payloads.values():
            assert all(v.dtype == np.uint8 for n, v in payload.items()
                       if secure.parse_cipher_key(n))

    def refuse(*args, **kwargs):
        raise AssertionError("the plaintext aggregate ran under ckks")

    aggregator_class = get_algorithm(algorithm).aggregator
    monkeypatch.setattr(aggregator_class, "aggregate", aggregator_class.aggregate)
    monkeypatch.setattr(federation_module, "load_public_context", load_public)
    monkeypatch.setattr(federation_module.Federation, "_aggregate", aggregate)
    ckks = run_federation(sbm(tmp_path, synthetic_root, algorithm=algorithm,
                              **{"run-name": "ckks", "secure-aggregation": "ckks"}), write=False)

    assert loaded and all(not c.is_private() and c.is_public() for c in loaded)
    assert len(seen) == K * 3
    assert abs(ckks["final"]["test_at_best_val"] - plain["final"]["test_at_best_val"]) <= 0.1
    assert abs(ckks["final"]["per_client_best_val_test"]
               - plain["final"]["per_client_best_val_test"]) <= 0.1
    assert (tmp_path / "ckks" / "ckks" / "public.ckks").is_file()


@pytest.mark.slow
def test_ckks_run_resumes_with_its_own_keys(tmp_path, synthetic_root):
    """A ckks run stopped after round 2 resumes to round 3 with the key pair it made (the
    checkpoint's payloads are ciphertexts under it) and ends where an uninterrupted run
    does: within 0.1 points, since CKKS noise is drawn afresh by each encryption."""
    cfg = sbm(tmp_path, synthetic_root, algorithm="fedaux",
              **{"secure-aggregation": "ckks", "client-state": "file"})
    full = run_federation(dict(cfg, **{"run-name": "full",
                                       "client-state-dir": str(tmp_path / "full-state")}))
    stopped = dict(cfg, **{"run-name": "stopped", "client-state-dir": str(tmp_path / "state")})
    run_federation(dict(stopped, rounds=2))
    public = tmp_path / "stopped" / "ckks" / "public.ckks"
    made = public.read_bytes()
    logged: list[str] = []
    resumed = run_federation(dict(stopped, resume=True), log=logged.append)
    assert any("after round 2" in line for line in logged)
    assert public.read_bytes() == made  # the same keys, not a new pair
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3]
    for key in ("test_at_best_val", "per_client_best_val_test"):
        assert abs(resumed["final"][key] - full["final"][key]) <= 0.1


def test_methods_that_need_clear_weights_are_refused():
    with pytest.raises(ConfigError) as err:
        resolve_config(None, {"algorithm": "gcfl", "secure-aggregation": "ckks"})
    assert "\n" not in str(err.value) and "needs the clients' weights in the clear" in str(err.value)


def test_missing_or_wrong_keys_are_refused_before_training(tmp_path, synthetic_root, monkeypatch):
    monkeypatch.delenv(secure.SECRET_ENV, raising=False)
    secret, public = secure.generate_keys(tmp_path / "keys")
    base = sbm(tmp_path, synthetic_root, algorithm="fedavg", **{"secure-aggregation": "ckks"})
    trained = []
    monkeypatch.setattr("fedgraph_flwr.engine.client_runtime.run_round",
                        lambda *a, **k: trained.append(1))
    cases = {  # (public, secret) -> what the one line says
        (str(public), ""): "has no secret CKKS context",
        (str(public), str(tmp_path / "nowhere")): "is not a file",
        (str(tmp_path / "nowhere"), str(secret)): "no public CKKS context",
        (str(secret), str(secret)): "holds a secret key",  # the server given the secret
        (str(public), str(public)): "holds no secret key",
    }
    for (pub, sec), says in cases.items():
        with pytest.raises(ConfigError) as err:
            run_federation({**base, "ckks-public-context": pub, "ckks-secret-context": sec},
                           write=False)
        assert "\n" not in str(err.value) and says in str(err.value), str(err.value)
    assert trained == []


def test_fedpub_client_embedding_is_the_servers():
    """Under ckks a FED-PUB client sends the functional embedding the server would have
    computed from its (now encrypted) weights: the same proxy graph, the same model."""
    import torch

    from helpers import labelled_graph

    config = resolve_config(None, {"algorithm": "fedpub", "hidden": 8,
                                   "secure-aggregation": "ckks"})
    data = labelled_graph(num_classes=NUM_CLASSES, num_features=NUM_FEATURES)
    algo = get_algorithm("fedpub")
    trainer = algo.trainer(data, config.client_config(server_round=1), NUM_CLASSES,
                           torch.device("cpu"))
    trainer.train(2)
    sent = trainer.signature()["functional-embedding"]
    initial = algo.trainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config.client_config())
    server = algo.aggregator(config, [0], initial)
    np.testing.assert_allclose(sent, server.functional_embedding(trainer.upload()), rtol=1e-6)
    plain = resolve_config(None, {"algorithm": "fedpub", "hidden": 8})
    trainer.config = plain.client_config(server_round=1)
    assert trainer.signature() == {}  # off: nothing extra leaves the client


@pytest.mark.simulation
def test_ckks_with_dp_runs_in_a_flower_simulation(tmp_path, synthetic_root):
    """A real Flower simulation (Ray) under ckks and dp=client: the owners' key pair given
    as files (the server's config names only the public half), every round complete with
    every client, ε reported, and the accuracy of the same run in process within 0.1
    points (CKKS encryption is randomised, so not bit-equal)."""
    import json

    from fedgraph_flwr.engine.client_app import make_client_app
    from fedgraph_flwr.engine.server_app import make_server_app

    from helpers import simulate

    secret, public = secure.generate_keys(tmp_path / "keys")
    cfg = dict(sbm(tmp_path, synthetic_root, algorithm="fedaux"), rounds=2, **{
        "secure-aggregation": "ckks", "ckks-secret-context": str(secret),
        "ckks-public-context": str(public), "dp": "client", "dp-epsilon": 4.0})
    simulate(make_server_app(dict(cfg, **{"run-name": "flower"})), make_client_app(), K)
    flower = json.loads((tmp_path / "flower" / "results.json").read_text())
    assert [len(r["clients"]) for r in flower["rounds"]] == [K, K]
    assert not any(r["failures"] for r in flower["rounds"])
    assert 0 < flower["dp"]["epsilon"] <= 4.0
    inproc = run_federation(dict(cfg, **{"run-name": "inproc"}), write=False)
    assert abs(flower["final"]["test_at_best_val"] - inproc["final"]["test_at_best_val"]) <= 0.1
