"""CUFL: the server's proxy-similarity weights against a hand computation, the client's
self-paced curriculum, pd schedule, edge confidences and λ scheduler, the trainer's state
and signature, and a short federation that learns."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from test_baselines import CPU, NUM_CLASSES, make_config, tiny_graph
from torch_geometric.data import Data

from fedgraph_flwr.algorithms import cufl
from fedgraph_flwr.algorithms.cufl import CuflAggregator, CuflOptions, CuflTrainer
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.loop import run_federation

OPTIONS = CuflOptions()


def _row(values: list[float]) -> list[float]:
    total = sum(values)
    return [v / total for v in values]


def test_weights_are_exp_of_scaled_cosines_row_normalised():
    """v0 = (1, 0), v1 = (1, 1), v2 = (0, 1): cos = [[1, c, 0], [c, 1, c], [0, c, 1]], c = 1/√2."""
    vectors = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    scales = np.array([2.0, 3.0, 5.0])
    c = 1 / math.sqrt(2)
    expected = [
        _row([math.exp(2 * 1), math.exp(2 * c), math.exp(0)]),
        _row([math.exp(3 * c), math.exp(3 * 1), math.exp(3 * c)]),
        _row([math.exp(0), math.exp(5 * c), math.exp(5 * 1)]),
    ]
    np.testing.assert_allclose(cufl.cufl_weights(vectors, scales, OPTIONS), expected, rtol=1e-12)
    linear = CuflOptions(agg_metric="linear")
    np.testing.assert_allclose(cufl.cufl_weights(vectors, scales, linear)[1],
                               _row([c, 1.0, c]), rtol=1e-12)
    # filter: row 1's exp weights [e^{3c}, e^3, e^{3c}] have mean above e^{3c}: only itself stays
    filtered = cufl.cufl_weights(vectors, scales, CuflOptions(filter=True))
    np.testing.assert_allclose(filtered[1], [0.0, 1.0, 0.0])


def test_aggregator_mixes_each_row_and_clips_a_hostile_scale():
    """Client 1 claims λ = 1e6: the server holds it to cufl-max-scale (10)."""
    config = make_config(CuflOptions)
    initial = {"w": np.zeros(2, dtype=np.float32)}
    agg = CuflAggregator(config, [0, 1], initial)
    vectors = [np.array([1.0, 0.0], np.float32), np.array([1.0, 1.0], np.float32)]
    updates = {
        c: ClientUpdate({"w": np.array([float(c), 2.0 * c], np.float32)},
                        {cufl.PROXY_KEY: vectors[c], cufl.SCALE_KEY: np.array([s], np.float32)}, 5)
        for c, s in ((0, 4.0), (1, 1e6))
    }
    result = agg.aggregate(1, updates)
    c = 1 / math.sqrt(2)
    w0 = _row([math.exp(4 * 1), math.exp(4 * c)])
    w1 = _row([math.exp(10 * c), math.exp(10 * 1)])
    np.testing.assert_allclose(result.payloads[0]["w"], [w0[1], 2 * w0[1]], rtol=1e-6)
    np.testing.assert_allclose(result.payloads[1]["w"], [w1[1], 2 * w1[1]], rtol=1e-6)
    assert result.metrics["mean-scale"] == pytest.approx(7.0)
    assert CuflAggregator.has_mixing_plan()  # so robust aggregation and ckks apply


def test_pd_schedule_follows_the_codes_rules():
    # rule 1, R = 100: knee ⌊200/3⌋ = 66; pd = 1/(67 - r) before it, 1 after
    assert cufl.personalization_degree("1", 1.0, 1e-3, 100, 0) == pytest.approx(1 / 67)
    assert cufl.personalization_degree("1", 1.0, 1e-3, 100, 65) == pytest.approx(1 / 2)
    assert cufl.personalization_degree("1", 1.0, 1e-3, 100, 66) == 1.0
    assert cufl.personalization_degree("2", 1.0, 1e-3, 10, 4) == pytest.approx(1 / 7)
    assert cufl.personalization_degree("3", 2.0, 1e-3, 10, 5) == pytest.approx(1.001)


def test_curriculum_selects_the_edges_reconstructed_within_pd():
    """scores [1, 0.5, 0.95]: squared errors [0, 0.25, 0.0025]; pd = 0.1 makes the gradient
    of s negative on edges 0 and 2 only, so one Adam step moves them up by lr, edge 1 stays 0."""
    curriculum = cufl.Curriculum(3, lr=0.05, weight_decay=0.0, device=CPU)
    loss = curriculum.fit(torch.tensor([1.0, 0.5, 0.95]), pd=0.1, steps=1)
    assert loss == 0.0  # computed at s = 0, before the step
    np.testing.assert_allclose(curriculum.s.detach().numpy(), [0.05, 0.0, 0.05], atol=1e-7)
    chosen, weight = curriculum.selection(0.03)
    assert chosen.tolist() == [True, False, True]
    assert weight.tolist() == [0.0, 0.0]  # not recorded yet: the code's first round
    curriculum.record(0.03)
    _, weight = curriculum.selection(0.03)
    np.testing.assert_allclose(weight.numpy(), [1.0, 1.0], rtol=1e-7)
    # s is clamped to [0, 1]
    curriculum.fit(torch.ones(3), pd=10.0, steps=40)
    assert float(curriculum.s.detach().max()) == 1.0


def test_edge_confidence_is_the_product_of_min_normalised_difficulties():
    logits = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]))
    data = Data(y=torch.tensor([0, 0, 0]), edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]),
                train_mask=torch.tensor([True, True, False]))
    ce = [-math.log(0.5), -math.log(0.9)]  # node 2 is not a training node: difficulty 1
    d = [math.exp(2 * ce[0]), math.exp(2 * ce[1])]
    d = [d[0] / d[1], 1.0, 1.0]  # the min over all nodes is node 1's
    expected = [d[0] * d[1], d[1] * d[2], d[2] * d[0]]
    np.testing.assert_allclose(cufl.edge_confidence(logits, data, OPTIONS).numpy(), expected,
                               rtol=1e-6)


def test_transfer_zeroes_the_bottom_quantile():
    vector = np.array([0.1, 0.2, 0.3, 0.4])  # the 0.3-quantile is 0.19
    np.testing.assert_allclose(cufl.transfer_vector(vector, OPTIONS), [0.0, 0.2, 0.3, 0.4])
    threshold = CuflOptions(transfer_method="threshold", transfer_threshold=0.25)
    np.testing.assert_allclose(cufl.transfer_vector(vector, threshold), [0.0, 0.0, 0.3, 0.4])


def test_scale_scheduler_moves_on_patience_and_turns_round():
    scheduler = cufl.ScaleScheduler(CuflOptions(scale_window=1, scale_patience=2))
    for loss in (3.0, 2.0):  # two new bests: λ · 1.25
        scheduler.observe(loss)
    assert scheduler.scale == pytest.approx(6.25)
    for loss in (5.0, 5.0):  # two without: turn round, λ / 1.25
        scheduler.observe(loss)
    assert scheduler.scale == pytest.approx(5.0) and not scheduler.increase
    for _ in range(20):  # keeps turning round: clipped to [3, 10] throughout
        scheduler.observe(9.0)
        assert 3.0 <= scheduler.scale <= 10.0


def _trainer(**overrides) -> CuflTrainer:
    config = make_config(CuflOptions, pretrain_epochs=10, **overrides).client_config()
    return CuflTrainer(tiny_graph(0), config, NUM_CLASSES, CPU)


def test_signature_has_its_declared_shapes_and_a_restored_trainer_continues_identically():
    trainer = _trainer()
    shapes = CuflTrainer.signature_shapes(trainer.data.num_features, NUM_CLASSES, trainer.config)
    trainer.train(3)
    signature = trainer.signature()
    assert {k: v.shape for k, v in signature.items()} == shapes
    assert (signature[cufl.PROXY_KEY] == 0).mean() >= OPTIONS.transfer_ratio - 1e-9
    assert "mask" not in "".join(k for k in trainer.upload() if "classifier" in k)

    restored = _trainer()
    restored.load_local_state(copy.deepcopy(trainer.local_state()))  # as saved
    torch.manual_seed(5)
    a = trainer.train(2)
    torch.manual_seed(5)
    b = restored.train(2)
    assert a == b
    for key, value in trainer.signature().items():
        np.testing.assert_array_equal(value, restored.signature()[key])


@pytest.mark.slow
def test_federation_on_sbm_learns(tmp_path, synthetic_root):
    """4 METIS clients of the synthetic SBM (5 classes, chance 20%), 5 rounds."""
    results = run_federation({
        "algorithm": "cufl", "dataset": "SBM", "num-clients": 4, "rounds": 5, "hidden": 16,
        "partition": "metis", "local-epochs": 5, "data-root": str(synthetic_root),
        "output-dir": str(tmp_path), "verbose": False, "cufl-pretrain-epochs": 20,
        "cufl-pd-rounds": 5}, write=False)
    rounds = results["rounds"]
    assert results["final"]["test_at_best_val"] > 45
    first = np.mean([m["test_metric"] for m in rounds[0]["clients"].values()])
    last = np.mean([m["test_metric"] for m in rounds[-1]["clients"].values()])
    assert last > first + 0.15
    assert all(0 < r["aggregate"]["mean-self-weight"] < 1 for r in rounds)
