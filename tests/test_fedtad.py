"""FedTAD's class-wise knowledge reliability, its walks, its normalisations, the pseudo
graph and the diversity loss on hand-made inputs with known answers; the server's
distillation fixed point; a 3-round smoke of each switch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_baselines import (
    CPU,
    NUM_CLASSES,
    NUM_FEATURES,
    assert_smoke,
    make_config,
    run_rounds,
    tiny_graph,
)

from fedgraph_flwr.algorithms import fedtad
from fedgraph_flwr.core.options import ConfigError
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.nn.fedtad_generator import ConditionalGenerator, knn_pseudo_graph


def test_ckr_on_a_three_node_path():
    """e = [x, 0]: cos(0,1) = 1, cos(1,2) = 0. Node 0: (1 + 1)/2 = 1; node 1: (1 + 0 + 1)/3;
    node 2: (0 + 1)/2. Classes [0, 0, 1]: CKR = [1 + 2/3, 1/2]."""
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    y = torch.tensor([0, 0, 1])
    ckr = fedtad.class_knowledge_reliability(x, edge_index, y, torch.ones(3, dtype=torch.bool), 2,
                                             torch.zeros(3, 1))
    assert torch.allclose(ckr, torch.tensor([1 + 2 / 3, 0.5], dtype=torch.float64))
    only_node_2 = torch.tensor([False, False, True])
    ckr = fedtad.class_knowledge_reliability(x, edge_index, y, only_node_2, 2, torch.zeros(3, 1))
    assert torch.allclose(ckr, torch.tensor([0.0, 0.5], dtype=torch.float64))


def test_walks_start_at_the_node_and_follow_the_chosen_transition():
    g = torch.Generator().manual_seed(0)
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])  # a path 0-1-2-3
    walks = fedtad.random_walk_ids(edge_index, 4, 5, "transition", g)
    assert walks.shape == (4, 15)
    starts = [0, 1, 3, 6, 10]  # each length's block opens with the start node
    assert all(torch.equal(walks[:, s], torch.arange(4)) for s in starts)
    allowed = {(u, v) for u, v in edge_index.t().tolist()} | {(u, u) for u in range(4)}
    for s, length in zip(starts, range(1, 6)):
        for a in range(s, s + length - 1):
            assert all((int(u), int(v)) in allowed for u, v in zip(walks[:, a], walks[:, a + 1]))


def test_the_codes_walk_stays_with_probability_e_to_one_over_d():
    """A ∘ D⁺ keeps only 1/d_i on the diagonal: with four isolated nodes (d = 1, the
    self-loop), a step stays with probability e/(e + 3) and otherwise jumps."""
    g = torch.Generator().manual_seed(1)
    walks = fedtad.random_walk_ids(torch.empty(2, 0, dtype=torch.long), 4, 40, "code", g)
    stays = steps = 0
    start = 0
    for length in range(1, 41):
        block = walks[:, start:start + length]
        stays += int((block[:, 1:] == block[:, :-1]).sum())
        steps += block[:, 1:].numel()
        start += length
    assert abs(stays / steps - math.e / (math.e + 3)) < 0.03  # 3120 steps: σ ≈ 0.009


def test_normalisations_share_each_class_over_clients_or_each_client_over_classes():
    ckr = np.array([[1.0, 3.0], [3.0, 1.0], [0.0, -0.5]])  # the last entry: dp noise
    by_clients = fedtad.normalised_reliability(ckr, "clients")
    assert np.allclose(by_clients, [[0.25, 0.75], [0.75, 0.25], [0.0, 0.0]])
    by_classes = fedtad.normalised_reliability(ckr, "classes")
    assert np.allclose(by_classes, [[0.25, 0.75], [0.75, 0.25], [0.0, 0.0]])
    ckr = np.array([[1.0, 1.0], [3.0, 1.0]])
    assert np.allclose(fedtad.normalised_reliability(ckr, "clients"), [[0.25, 0.5], [0.75, 0.5]])
    assert np.allclose(fedtad.normalised_reliability(ckr, "classes"), [[0.5, 0.5], [0.75, 0.25]])


def test_pseudo_graph_links_each_node_to_its_nearest_and_back():
    features = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    edges = {tuple(e) for e in knn_pseudo_graph(features, 2).t().tolist()}
    assert edges == {(0, 0), (1, 1), (2, 2), (3, 3), (0, 1), (1, 0), (2, 3), (3, 2)}
    with pytest.raises(ValueError, match="k must be"):
        knn_pseudo_graph(features, 5)


def test_pseudo_labels_and_diversity_loss():
    assert fedtad.pseudo_labels(10, 3).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    z = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    f = torch.tensor([[0.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    # pairs (0,1) and (1,0): noise mean sq diff 4/2 = 2, feature mean abs diff 3/3 = 1
    assert torch.isclose(fedtad.diversity_loss(z, f), torch.tensor(math.exp(-(2 * 2 * 1) / 4)))
    gen = ConditionalGenerator(4, 3, 6)
    assert gen(torch.zeros(5, 4), torch.tensor([0, 1, 2, 0, 1])).shape == (5, 6)


def _updates(config, arrays_per_client, ckr_per_client):
    return {c: ClientUpdate(a, {fedtad.CKR_KEY: np.asarray(k, np.float32)}, 10)
            for c, (a, k) in enumerate(zip(arrays_per_client, ckr_per_client))}


def test_distillation_keeps_the_model_when_every_client_sends_it():
    """Teachers equal to the FedAvg model (no dropout, no weight decay): every class-wise
    L1 gap is 0, its gradient is 0, so the server's model is the FedAvg model exactly."""
    config = make_config(fedtad.FedTADOptions, dropout=0.0, weight_decay=0.0, fedtad_num_gen=12,
                         fedtad_glb_epochs=2)
    initial = fedtad.FedTADTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    agg = fedtad.FedTADAggregator(config, [0, 1], initial)
    result = agg.aggregate(1, _updates(config, [initial, initial], [[1, 2, 3], [3, 2, 1]]))
    assert result.metrics["distill-loss"] == 0.0
    for name, value in initial.items():
        assert np.array_equal(result.payloads[0][name], value), name


def test_distillation_narrows_the_gap_to_the_clients_and_resumes():
    config = make_config(fedtad.FedTADOptions, dropout=0.0, fedtad_num_gen=12, fedtad_it_d=20,
                         fedtad_glb_epochs=1)  # one pseudo graph: first and last step comparable
    initial = fedtad.FedTADTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    rng = np.random.default_rng(0)
    clients = [{k: (v + rng.normal(scale=0.3, size=v.shape)).astype(np.float32) for k, v in initial.items()}
               for _ in range(2)]
    agg = fedtad.FedTADAggregator(config, [0, 1], initial)
    torch.manual_seed(0)
    first = agg.aggregate(1, _updates(config, clients, [[1, 1, 1], [1, 1, 1]]))
    assert 0 < first.metrics["distill-loss"] < first.metrics["distill-loss-first"]
    again = fedtad.FedTADAggregator(config, [0, 1], initial)
    again.load_state_dict(agg.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(again.generator.parameters(), agg.generator.parameters()))


def test_refuses_what_it_cannot_distil():
    config = make_config(fedtad.FedTADOptions, fedtad_num_gen=2)
    initial = fedtad.FedTADTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    with pytest.raises(ConfigError, match="num-gen"):
        fedtad.FedTADAggregator(config, [0], initial)


def test_client_signs_its_ckr_and_keeps_it():
    config = make_config(fedtad.FedTADOptions)
    trainer = fedtad.FedTADTrainer(tiny_graph(2), config, NUM_CLASSES, CPU)
    sig = trainer.signature()
    assert sig[fedtad.CKR_KEY].shape == (NUM_CLASSES,) and (sig[fedtad.CKR_KEY] > 0).all()
    again = fedtad.FedTADTrainer(tiny_graph(2), config, NUM_CLASSES, CPU)
    assert np.array_equal(again.signature()[fedtad.CKR_KEY], sig[fedtad.CKR_KEY])  # seeded walks


@pytest.mark.parametrize("switches", [
    {}, {"fedtad_ckr_norm": "classes", "fedtad_evaluate": "after-train", "fedtad_walk": "transition"},
    {"fedtad_distill": "rep"}])
def test_fedtad_smoke(switches):
    config = make_config(fedtad.FedTADOptions, fedtad_num_gen=12, **switches)
    initial = fedtad.FedTADTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    log, _ = run_rounds(fedtad.FedTADTrainer, fedtad.FedTADAggregator, config, rounds=3)
    assert_smoke(log)
    assert set(log[-1]["result"].payloads[0]) == set(initial)
