"""FedDEP: the reconstruction losses, slot rules, hidden-neighbour tables, cross-client
targets, prototypes, the mend and the classifier's embedding branch on inputs small enough
to check by hand; neighbour sampling; DEC; the relayed generator step against the same step
computed with the other client's prototypes in hand; state; short runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_fedsage import _graph  # FedSage+'s test graph: the relay's tests share it
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from fedgraph_flwr.algorithms.feddep import (
    FedDEPAggregator,
    FedDEPTrainer,
    Preparation,
    cluster_means,
    cross_slots,
    hidden_neighbours,
    local_slots,
    reconstruction_loss,
)
from fedgraph_flwr.algorithms.fedsage import (
    CONTRIBUTORS,
    GEN_GRAD,
    GEN_SEND,
    GEN_STEP,
    PRETRAIN,
    SLOTS,
    VECTORS,
)
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.client_runtime import state_from_bytes, state_to_bytes
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.nn.dec_clustering import dec_clusters
from fedgraph_flwr.nn.feddep_classifier import DepClassifier
from fedgraph_flwr.nn.feddep_encoder import sample_in_edges
from fedgraph_flwr.nn.feddep_generator import mended_mean

from helpers import simulation_equals_in_process

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(**extra):
    return resolve_config(None, {"algorithm": "feddep", "dataset": "SBM", "hidden": 8,
                                 "feddep-emb-dim": 8, "feddep-latent-dim": 8,
                                 "feddep-encoder-epochs": 5, "feddep-dec-epochs": 2,
                                 "feddep-gen-optimizer": "adam", "feddep-gen-lr": 0.01,
                                 "feddep-pretrain-steps": 40, **extra})


# --- the characteristic steps, by hand -------------------------------------------------------
def test_cross_reconstruction_loss_and_gradient_by_hand():
    """P = 2, e = 2. Row 0 counts both slots: ĝ = [[0,0],[2,2]], targets [[1,1],[2,0]]:
    MSEs min(1, 2) = 1 and min(5, 1) = 1; row 1 counts none. Loss = (1 + 1) / (2·2) = 0.5;
    d/dĝ₀₀ = 2·(ĝ₀₀ − [1,1]) / (2 · 4) = [−0.25, −0.25]."""
    generated = torch.tensor([[[0.0, 0.0], [2.0, 2.0]], [[3.0, 3.0], [3.0, 3.0]]],
                             requires_grad=True)
    targets = torch.tensor([[[1.0, 1.0], [2.0, 0.0]]] * 2)
    loss = reconstruction_loss(generated, targets, torch.tensor([2, 0]), torch.tensor([2, 2]))
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(generated.grad[0, 0], torch.tensor([-0.25, -0.25]))
    torch.testing.assert_close(generated.grad[1], torch.zeros(2, 2))


def test_local_loss_looks_only_at_the_true_hidden_neighbours():
    """With one true neighbour, the far second target does not count: (0 − 1)² per dim."""
    generated = torch.zeros(1, 2, 1)
    targets = torch.tensor([[[1.0], [0.0]]])
    loss = reconstruction_loss(generated, targets, torch.tensor([1]), torch.tensor([1]))
    assert loss.item() == pytest.approx(1.0 / 2)


def test_slot_rules_round_locally_and_truncate_across_clients():
    degree = torch.tensor([0.4, 1.6, 7.0])
    assert local_slots(degree, 3).tolist() == [0, 2, 3]
    assert cross_slots(degree, 3).tolist() == [0, 1, 3]


def test_hidden_neighbours_and_the_impaired_graph_of_a_path():
    """Path 0–1–2–3, node 1 hidden, clusters [0, 1, 0, 1], P = 3: ñ = [1, 0, 1, 0] over all
    nodes; G' keeps [0, 2, 3] with the edge 2–3 only; node 0's first slot is cluster 1."""
    edge_index = to_undirected(torch.tensor([[0, 1, 2], [1, 2, 3]]))
    data = Data(x=torch.zeros(4, 1), edge_index=edge_index, num_nodes=4)
    clusters = torch.tensor([0, 1, 0, 1])
    prototypes = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    prep = Preparation.build(data, clusters, prototypes, torch.tensor([1]), 3)
    assert prep.missing.tolist() == [1, 0, 1, 0]
    assert prep.keep.tolist() == [0, 2, 3]
    assert sorted(map(tuple, prep.edge_index.t().tolist())) == [(1, 2), (2, 1)]
    assert prep.slot_clusters[0].tolist() == [1, -1, -1]
    torch.testing.assert_close(prep.targets[0], torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))


def test_hidden_neighbours_follow_the_order_they_were_drawn():
    """Star 0–{1, 2, 3, 4}, hidden in the order 3, 1, 4, P = 2: node 0 misses 3 and keeps
    the first two drawn, [3, 1]; each leaf misses nothing but the centre is not hidden."""
    edge_index = to_undirected(torch.tensor([[0, 0, 0, 0], [1, 2, 3, 4]]))
    missing, first = hidden_neighbours(edge_index, 5, torch.tensor([3, 1, 4]), 2)
    assert missing.tolist() == [3, 0, 0, 0, 0]
    assert first[0].tolist() == [3, 1]
    assert (first[1:] == -1).all()


def _two_cluster_client(rule: str) -> FedDEPTrainer:
    """Path 0–1–2 with node 1 hidden; clusters [0, 1, 0]; prototype 1 sums to −1."""
    data = _graph(n=30)
    trainer = FedDEPTrainer(data, _config(**{"feddep-empty-slot": rule, "feddep-num-pred": 2}).with_keys(
        {"server-round": 1}), 3, CPU)
    edge_index = to_undirected(torch.tensor([[0, 1], [1, 2]]))
    tiny = Data(x=torch.zeros(3, 1), edge_index=edge_index, num_nodes=3)
    prototypes = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    trainer.prep = Preparation.build(tiny, torch.tensor([0, 1, 0]), prototypes,
                                     torch.tensor([1]), 2)
    return trainer


@pytest.mark.parametrize("rule", ["count", "sum"])
def test_cross_targets_draw_hidden_neighbours_or_fall_back_to_the_own_prototype(rule):
    """Nodes 0 and 2 each miss node 1 (cluster 1) in slot 0; every other slot is empty and
    gives the drawn node's own prototype (its cluster). Under ``sum`` the codes' test also
    drops slot 0, whose prototype sums to −1 < 1e-15."""
    trainer = _two_cluster_client(rule)
    torch.manual_seed(3)
    targets = trainer.cross_targets(200)
    torch.manual_seed(3)
    centre = torch.randint(3, (200,))
    slot = torch.randint(2, (200, 2))
    expected = torch.tensor([0, 1, 0])[centre].unsqueeze(1).repeat(1, 2)  # own clusters
    filled = (centre.unsqueeze(1) != 1) & (slot == 0)
    if rule == "count":
        expected[filled] = 1
    torch.testing.assert_close(targets, trainer.prep.prototypes[expected])
    assert filled.any()


def test_prototypes_are_cluster_means():
    emb = torch.tensor([[0.0], [2.0], [10.0], [12.0]])
    protos = cluster_means(emb, torch.tensor([0, 0, 1, 1]), 3)
    assert protos.view(-1).tolist() == [1.0, 11.0, 0.0]  # an empty cluster: 0


def test_mended_mean_divides_the_first_round_nhat_slots_by_p():
    generated = torch.arange(12, dtype=torch.float).view(2, 3, 2)
    z = mended_mean(generated, torch.tensor([1.6, 0.2]))
    torch.testing.assert_close(z[0], (generated[0, 0] + generated[0, 1]) / 3)
    torch.testing.assert_close(z[1], torch.zeros(2))


@pytest.mark.parametrize("branch", ["chained", "direct"])
def test_classifier_adds_a_chained_or_direct_linear_map_of_the_embedding(branch):
    """With the SAGE layers zeroed, logits = the embedding branch alone: W₂(W₁z̄ + b₁) + b₂
    (chained; relu is the identity on these positive values) or W₂z̄ + b₂ (direct)."""
    model = DepClassifier(3, 2, 2, 2, num_layers=2, dropout=0.0, branch=branch).eval()
    with torch.no_grad():
        for conv in model.convs:
            for p in conv.parameters():
                p.zero_()
        model.lins[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        model.lins[0].bias.copy_(torch.tensor([1.0, 1.0]))
        model.lins[1].weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
        model.lins[1].bias.copy_(torch.tensor([0.0, 3.0]))
    z = torch.tensor([[1.0, 2.0]])
    out = model(torch.ones(1, 3), z, torch.zeros(2, 0, dtype=torch.long))
    hidden = torch.tensor([[2.0, 5.0]]) if branch == "chained" else z
    torch.testing.assert_close(out, hidden @ model.lins[1].weight.t() + model.lins[1].bias)


def test_sampled_in_edges_keep_min_degree_k_distinct_edges_per_target():
    edge_index = to_undirected(torch.randint(0, 40, (2, 400), generator=torch.Generator().manual_seed(0)))
    torch.manual_seed(0)
    sampled = sample_in_edges(edge_index, 40, 3)
    degree = torch.bincount(edge_index[1], minlength=40)
    assert torch.bincount(sampled[1], minlength=40).tolist() == degree.clamp(max=3).tolist()
    original = set(map(tuple, edge_index.t().tolist()))
    kept = list(map(tuple, sampled.t().tolist()))
    assert len(set(kept)) == len(kept) and set(kept) <= original
    assert sample_in_edges(edge_index, 40, 0) is edge_index


def test_dec_separates_two_far_blobs():
    torch.manual_seed(0)
    emb = torch.cat([torch.randn(40, 8) + 4, torch.randn(40, 8) - 4]).tanh()
    clusters = dec_clusters(emb, 2, pretrain_epochs=1, finetune_epochs=1, dec_epochs=2)
    assert clusters[:40].unique().numel() == 1 and clusters[40:].unique().numel() == 1
    assert clusters[0] != clusters[40]


# --- the relay -------------------------------------------------------------------------------
@pytest.mark.parametrize("fed_step", ["twice", "once"])
def test_relayed_step_equals_the_step_with_the_other_clients_prototypes(fed_step):
    """Client i's generator step through the server equals one computed with j's targets in
    hand: g = ∇[(1/2)·L_i] and c = ∇[(1/2)·β_n·Σ min-MSE / (n'·P)]; ``twice`` steps on g
    then on g + c (the official client), ``once`` on g + c; only ``gen`` moves."""
    cfg = _config(**{"feddep-gen-rounds": 2, "feddep-fed-step": fed_step,
                     "feddep-gen-optimizer": "sgd", "feddep-gen-lr": 0.05}
                  ).with_keys({"server-round": 1})
    i = FedDEPTrainer(_graph(seed=1), cfg, 3, CPU)
    j = FedDEPTrainer(_graph(seed=2), cfg, 3, CPU)
    for c, trainer in enumerate((i, j)):
        torch.manual_seed(c)
        trainer.run_phase(PRETRAIN, {})
    server = FedDEPAggregator(cfg, [0, 1], {})
    reference = {k: v.clone() for k, v in i.generator.state_dict().items()}
    sent = {c: t.run_phase(GEN_SEND, {}) for c, t in enumerate((i, j))}
    assert sent[0].arrays[VECTORS].shape[0] > 0 and sent[0].arrays[SLOTS].min() >= 1
    server.step(GEN_SEND, 1, {c: ClientUpdate(r.arrays, {}, 0, r.metrics) for c, r in sent.items()})
    requests = server.configure(GEN_GRAD, 1, [0, 1])
    torch.manual_seed(5)
    replies = {c: t.run_phase(GEN_GRAD, requests[c]) for c, t in enumerate((i, j))}
    server.step(GEN_GRAD, 1, {c: ClientUpdate(r.arrays, {}, 0, r.metrics) for c, r in replies.items()})
    back = server.configure(GEN_STEP, 1, [0, 1])
    assert back[0][CONTRIBUTORS].tolist() == [1]
    seed = i.gen_seed
    i.run_phase(GEN_STEP, back[0])

    # The same step, computed centrally: j's targets drawn as j drew them.
    torch.manual_seed(5)
    i.cross_targets(len(requests[0].get(VECTORS, [])))  # i's own answer came first
    targets = j.cross_targets(len(sent[0].arrays[VECTORS]))
    twin = FedDEPTrainer(_graph(seed=1), cfg, 3, CPU)
    twin.load_local_state({**i.local_state(), "gen_seed": None})
    twin.generator.load_state_dict(reference)
    params = twin._fed_mode()
    out = twin._seeded_pass(seed)
    rows = twin._sent_rows(out)
    slots = cross_slots(out.degree[rows], 5)
    used = (torch.arange(5).view(1, -1) < slots.view(-1, 1)).unsqueeze(-1)
    cross = reconstruction_loss(out.generated[rows] * used, targets, slots, torch.full_like(slots, 5))
    n_rows = rows.numel()
    own = torch.autograd.grad(0.5 * twin._local_loss(out), params, retain_graph=True)
    rel = torch.autograd.grad(0.5 * cross * n_rows / twin.prep.keep.numel(), params)
    with torch.no_grad():
        steps = [own, [a + b for a, b in zip(own, rel)]] if fed_step == "twice" else \
            [[a + b for a, b in zip(own, rel)]]
        for grads in steps:
            for p, g in zip(params, grads):
                p -= 0.05 * g
    for name, value in twin.generator.gen.state_dict().items():
        torch.testing.assert_close(i.generator.gen.state_dict()[name], value, rtol=1e-4, atol=1e-6)
    for name, value in i.generator.state_dict().items():
        if not name.startswith("gen."):
            torch.testing.assert_close(value, reference[name])


def test_restored_client_carries_on_identically():
    """A client restored from its state bytes (as a ClientApp does) takes the same generator
    step, and after mending holds only z̄."""
    cfg = _config(**{"feddep-gen-rounds": 2}).with_keys({"server-round": 1})
    trainer = FedDEPTrainer(_graph(seed=1), cfg, 3, CPU)
    torch.manual_seed(0)
    trainer.run_phase(PRETRAIN, {})
    twin = FedDEPTrainer(_graph(seed=1), cfg, 3, CPU)
    twin.load_local_state(state_from_bytes(state_to_bytes(trainer.local_state()), CPU))
    for t in (trainer, twin):
        torch.manual_seed(1)
        t.run_phase(GEN_SEND, {})
        t.run_phase(GEN_STEP, {CONTRIBUTORS: np.array([0])})
    for name, value in trainer.generator.state_dict().items():
        torch.testing.assert_close(twin.generator.state_dict()[name], value, rtol=0, atol=0)
    later = FedDEPTrainer(_graph(seed=1), cfg.with_keys({"server-round": 3}), 3, CPU)
    later.load_local_state(trainer.local_state())
    later.train(1)
    state = later.local_state()
    assert state["generator"] is None and state["prep"] is None
    assert state["mend"].shape == (60, 8) and state["mend"].abs().sum() > 0


# --- runs ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_short_federation_relays_mends_and_learns(tmp_path, synthetic_root):
    """SBM, 3 clients: two generator rounds relay vectors and gradients, the classifier
    rounds learn, and the best round is a classifier round."""
    results = run_federation({
        "algorithm": "feddep", "dataset": "SBM", "num-clients": 3, "rounds": 6, "hidden": 16,
        "feddep-gen-rounds": 2, "feddep-pretrain-steps": 40, "feddep-gen-optimizer": "adam",
        "feddep-gen-lr": 0.01, "feddep-emb-dim": 16, "feddep-encoder-epochs": 10,
        "feddep-optimizer": "adam", "feddep-eval-emb": "mended", "lr": 0.01,
        "data-root": str(synthetic_root), "output-dir": str(tmp_path), "verbose": False},
        write=False)
    rounds = results["rounds"]
    for r in rounds[:2]:
        assert r["aggregate"]["gen_send.sent_slots_mean"] > 0
        assert r["aggregate"]["gen_step.contributors_mean"] == 2
        assert all(math.isnan(c["val_metric"]) for c in r["clients"].values())
    first = np.mean([c["val_metric"] for c in rounds[2]["clients"].values()])
    last = np.mean([c["val_metric"] for c in rounds[-1]["clients"].values()])
    assert last > first
    assert results["final"]["best_round"] > 2


@pytest.mark.simulation
def test_flower_simulation_smoke_matches_inprocess(tmp_path, synthetic_root):
    simulation_equals_in_process({
        "algorithm": "feddep", "dataset": "SBM", "num-clients": 3, "rounds": 3, "hidden": 16,
        "feddep-gen-rounds": 1, "feddep-emb-dim": 16, "feddep-encoder-epochs": 5,
        "feddep-pretrain-steps": 20, "feddep-gen-optimizer": "adam", "feddep-gen-lr": 0.01,
        "data-root": str(synthetic_root)}, tmp_path, num_supernodes=3)


@pytest.mark.slow
def test_finished_generator_stage_sends_no_messages_and_changes_no_number(tmp_path, synthetic_root,
                                                                          monkeypatch):
    """After the generator rounds the aggregator skips gen_send/gen_grad/gen_step
    (``runs_phase``): each classifier round is one exchange, not four, and every figure
    equals the run that still sends them (their handlers are no-ops then)."""
    config = {"algorithm": "feddep", "dataset": "SBM", "num-clients": 3, "rounds": 3,
              "hidden": 16, "feddep-gen-rounds": 1, "feddep-emb-dim": 16,
              "feddep-encoder-epochs": 3, "feddep-pretrain-steps": 5,
              "data-root": str(synthetic_root), "output-dir": str(tmp_path), "verbose": False}
    skipped = run_federation(config, write=False)
    monkeypatch.setattr(FedDEPAggregator, "runs_phase", lambda self, phase, server_round: True)
    sent = run_federation(config, write=False)
    for a, b in zip(skipped["rounds"], sent["rounds"]):
        for c in a["clients"]:  # NaN in the generator round: assert_equal treats them equal
            np.testing.assert_equal(
                [a["clients"][c][k] for k in ("val_metric", "test_metric", "train_loss")],
                [b["clients"][c][k] for k in ("val_metric", "test_metric", "train_loss")])
    assert skipped["final"]["test_at_best_val"] == sent["final"]["test_at_best_val"]
    def total(r):
        return sum(r["bytes_sent"].values())

    assert total(skipped["rounds"][0]) == total(sent["rounds"][0])
    for a, b in zip(skipped["rounds"][1:], sent["rounds"][1:]):
        assert total(a) < total(b)
