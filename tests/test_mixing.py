"""core/mixing.py on hand-made inputs with known answers, and the aggregators
that mix through it keeping non-float arrays per client."""

from __future__ import annotations

import numpy as np
import pytest

from fedgraph_flwr.algorithms.fedaux import FedAuxAggregator
from fedgraph_flwr.algorithms.fedavg import FedAvgAggregator
from fedgraph_flwr.algorithms.fediih import FedIIHAggregator
from fedgraph_flwr.config import RunConfig
from fedgraph_flwr.core.mixing import average, cosine_similarity, mix, row_softmax
from fedgraph_flwr.core.phases import ClientUpdate

ORDERS = [{"normalise_first": True}, {"normalise_first": False}]


# --- cosine similarity ----------------------------------------------------------------------
@pytest.mark.parametrize("order", ORDERS)
def test_cosine_of_parallel_antiparallel_and_orthogonal_vectors(order):
    v = np.array([[1.0, 0.0, 0.0], [3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [-0.5, 0.0, 0.0]])
    expected = np.array([[1, 1, 0, -1], [1, 1, 0, -1], [0, 0, 1, 0], [-1, -1, 0, 1]], float)
    sim = cosine_similarity(v, **order)
    assert sim.dtype == np.float64
    np.testing.assert_allclose(sim, expected, atol=1e-15)


@pytest.mark.parametrize("order", ORDERS)
def test_cosine_known_angle_symmetry_and_zero_vector(order):
    v = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]], dtype=np.float32)  # 45°, and a zero row
    sim = cosine_similarity(v, **order)
    assert sim[0, 1] == pytest.approx(np.sqrt(0.5))
    np.testing.assert_array_equal(sim, sim.T)
    assert np.isfinite(sim).all() and (sim[2] == 0).all()  # no NaN: the norm floor


def _config(keys: dict) -> RunConfig:
    return RunConfig.from_config(keys)


def test_cosine_clip_keeps_rounding_inside_minus_one_one():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(50, 7)) * rng.uniform(1e-3, 1e3, size=(50, 1))
    clipped = cosine_similarity(v)
    assert clipped.max() <= 1.0 and clipped.min() >= -1.0
    np.testing.assert_allclose(cosine_similarity(v, clip=False), clipped, atol=1e-15)


# --- row softmax ----------------------------------------------------------------------------
def test_row_softmax_rows_sum_to_one_on_any_leading_axes():
    rng = np.random.default_rng(1)
    for shape in [(4, 4), (3, 5, 5)]:
        w = row_softmax(rng.normal(size=shape), 7.0)
        assert w.shape == shape and (w > 0).all()
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-15)


def test_row_softmax_known_value_and_temperature_limits():
    s = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert row_softmax(s, 2.0)[0, 1] == pytest.approx(1 / (np.exp(2.0) + 1))
    np.testing.assert_array_equal(row_softmax(s, 0.0), 0.5)  # scale 0: uniform
    scores = np.array([[0.1, 0.9, 0.3], [0.5, -0.2, 0.4]])
    np.testing.assert_allclose(row_softmax(scores, 1e4), [[0, 1, 0], [1, 0, 0]], atol=1e-12)
    assert np.isfinite(row_softmax(np.array([[1e4, -1e4]]), 1e4)).all()  # no overflow


# --- mixing -------------------------------------------------------------------------------
def clients(k: int = 3, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"w": rng.normal(size=(2, 3)).astype(np.float32),
             "b": rng.normal(size=4).astype(np.float64),
             "counter": np.array([10 * c + 1, 2], dtype=np.int64),
             "mask": np.array([c % 2 == 0, True])} for c in range(k)]


@pytest.mark.parametrize("rowwise", [False, True])
def test_mix_with_identity_weights_returns_each_clients_own_arrays(rowwise):
    per_client = clients()
    out = mix(np.eye(3), per_client, rowwise=rowwise)
    for own, got in zip(per_client, out):
        assert list(got) == list(own)  # every name, in upload order
        for name in own:
            assert got[name].dtype == own[name].dtype
            np.testing.assert_array_equal(got[name], own[name])


@pytest.mark.parametrize("rowwise", [False, True])
def test_mix_known_weights_and_uniform_mean(rowwise):
    per_client = clients()
    w = np.array([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    out = mix(w, per_client, rowwise=rowwise)
    x = [c["b"] for c in per_client]
    np.testing.assert_allclose(out[0]["b"], (x[0] + x[1]) / 2, rtol=1e-15)
    np.testing.assert_allclose(out[2]["b"], 0.2 * x[0] + 0.3 * x[1] + 0.5 * x[2], rtol=1e-15)
    uniform = mix(np.full((3, 3), 1 / 3), per_client, rowwise=rowwise)
    for got in uniform:
        np.testing.assert_allclose(got["b"], np.mean(x, axis=0), rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(got["w"], np.mean([c["w"] for c in per_client], axis=0), rtol=1e-6)


def test_rowwise_and_matrix_products_agree_to_rounding():
    per_client = clients(5)
    w = row_softmax(np.random.default_rng(2).normal(size=(5, 5)), 3.0)
    for a, b in zip(mix(w, per_client), mix(w, per_client, rowwise=True)):
        np.testing.assert_allclose(a["b"], b["b"], rtol=1e-14)


def test_average_is_mix_with_equal_rows_and_none_is_the_plain_mean():
    per_client = clients()
    w = np.array([0.2, 0.3, 0.5])
    avg = average(w, per_client)
    np.testing.assert_allclose(avg["b"], mix(np.tile(w, (3, 1)), per_client)[1]["b"], rtol=1e-15)
    mean = average(None, per_client)
    np.testing.assert_array_equal(mean["b"], np.mean([c["b"] for c in per_client], axis=0))
    assert mean["w"].dtype == np.float32


@pytest.mark.parametrize("combine", ["mix", "mix-rowwise", "average", "average-mean"])
def test_float32_mixing(combine):
    """dtype=float32: float32 arithmetic, results in the uploads' dtype (float32 stays
    float32), within float32 rounding of float64 mixing."""
    per_client = clients()
    w = row_softmax(np.arange(9.0).reshape(3, 3) / 9, 2.0)

    def run(dtype):
        if combine == "mix":
            return mix(w, per_client, dtype)[1]
        if combine == "mix-rowwise":
            return mix(w, per_client, dtype, rowwise=True)[1]
        return average(w[1] if combine == "average" else None, per_client, dtype)

    fast, exact = run(np.float32), run(np.float64)
    assert fast["w"].dtype == np.float32 and fast["b"].dtype == np.float64
    # A float64 upload mixed in float32 holds float32 values (and is not the float64 mix).
    np.testing.assert_array_equal(fast["b"].astype(np.float32), fast["b"])
    assert not np.array_equal(fast["b"], exact["b"])
    for name in ("w", "b"):
        np.testing.assert_allclose(fast[name], exact[name], rtol=1e-5, atol=1e-6)


# --- non-float arrays stay with each client, on every path ---------------------------------
@pytest.mark.parametrize("rowwise", [False, True])
def test_mix_hands_each_client_its_own_non_float_arrays(rowwise):
    per_client = clients()
    for own, got in zip(per_client, mix(row_softmax(np.ones((3, 3)), 1.0), per_client,
                                        rowwise=rowwise)):
        assert got["counter"] is own["counter"] and got["mask"] is own["mask"]


@pytest.mark.parametrize("weights", [np.array([0.2, 0.3, 0.5]), None])
def test_average_leaves_non_float_arrays_out(weights):
    """Not sent, so each client keeps its own (load_payload only writes what it gets)."""
    assert set(average(weights, clients())) == {"w", "b"}


def updates_with_a_counter(arrays: list[dict[str, np.ndarray]], **signature) -> dict[int, ClientUpdate]:
    return {c: ClientUpdate({**a, "counter": np.array([c, 7], dtype=np.int64)},
                            {k: v[c] for k, v in signature.items()}, num_train=5 + c)
            for c, a in enumerate(arrays)}


@pytest.mark.parametrize("server", ["personalized", "average"])
def test_fedaux_keeps_non_float_arrays_per_client(server):
    rng = np.random.default_rng(3)
    ups = updates_with_a_counter([{"apv": rng.normal(size=4).astype(np.float32),
                                   "conv.weight": rng.normal(size=(2, 2)).astype(np.float32)}
                                  for _ in range(3)])
    config = _config({"algorithm": "fedaux", "fedaux-server": server})
    res = FedAuxAggregator(config, sorted(ups), {}).aggregate(1, ups)
    for c, up in ups.items():
        np.testing.assert_array_equal(res.payloads[c]["counter"], up.arrays["counter"])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fedavg_keeps_non_float_arrays_per_client(dtype):
    rng = np.random.default_rng(4)
    ups = updates_with_a_counter([{"lin.weight": rng.normal(size=(2, 3)).astype(np.float32)}
                                  for _ in range(3)])
    config = _config({"algorithm": "fedavg", "server-mix-dtype": dtype})
    res = FedAvgAggregator(config, sorted(ups), {}).aggregate(1, ups)
    weights = np.array([5, 6, 7]) / 18
    expected = np.tensordot(weights, np.stack([u.arrays["lin.weight"] for u in ups.values()]), 1)
    for payload in res.payloads.values():
        assert "counter" not in payload
        assert payload["lin.weight"].dtype == np.float32
        np.testing.assert_allclose(payload["lin.weight"], expected, rtol=1e-6)


@pytest.mark.parametrize("num_factors", [1, 2])
def test_fediih_keeps_non_float_arrays_per_client(num_factors):
    rng = np.random.default_rng(5)
    d, m = 3, 3
    arrays = [{"pca.weight": rng.normal(size=(num_factors * d, 4)).astype(np.float32),
               "pca.bias": rng.normal(size=num_factors * d).astype(np.float32),
               "clf.weight": rng.normal(size=(2, num_factors * d)).astype(np.float32),
               "clf.bias": rng.normal(size=2).astype(np.float32)} for _ in range(m)]
    ups = updates_with_a_counter(
        arrays, mu=rng.normal(size=(m, num_factors, d)).astype(np.float32),
        logvar=(0.3 * rng.normal(size=(m, num_factors, d))).astype(np.float32))
    res = FedIIHAggregator(_config({"algorithm": "fediih", "fediih-factors": num_factors}), sorted(ups),
                           {}).aggregate(1, ups)
    for payload in res.payloads.values():
        assert "counter" not in payload
        assert {n: a.dtype for n, a in payload.items() if n in arrays[0]} == {
            n: np.dtype(np.float32) for n in arrays[0]}
