"""FedSage+: the greedy matching loss, the nearest-feature cross-client term, impairing and
mending on graphs small enough to check by hand, the per-vector gradient relay against the
same step computed with direct access to the other client's features, and short runs (in
process; a Flower simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from fedgraph_flwr.algorithms.fedsage import (
    CONTRIBUTORS,
    GEN_GRAD,
    GEN_SEND,
    GEN_STEP,
    GRADS,
    PRETRAIN,
    SLOTS,
    VECTORS,
    FedSageAggregator,
    FedSageTrainer,
    generated_leaves,
    greedy_feature_loss,
    impair,
    mended_data,
    nearest_feature_loss,
    random_neighbourhood_targets,
    slot_counts,
)
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.client_runtime import state_from_bytes, state_to_bytes
from fedgraph_flwr.engine.loop import run_federation

from helpers import simulation_equals_in_process

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _graph(n: int = 60, d: int = 6, seed: int = 0, degree: int = 6) -> Data:
    """Three classes, features shifted by class, a random graph of mean degree ~2·degree;
    train/val/test = 1/3 each."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.rand(n, d, generator=g) * 0.5 + F.one_hot(y, 3).repeat(1, d // 3 + 1)[:, :d] * 0.5
    edge_index = to_undirected(torch.randint(0, n, (2, degree * n), generator=g))
    perm = torch.randperm(n, generator=g)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for mask, part in zip(masks, (perm[: n // 3], perm[n // 3: 2 * n // 3], perm[2 * n // 3:])):
        mask[part] = True
    return Data(x=x, y=y, edge_index=edge_index, train_mask=masks[0], val_mask=masks[1],
                test_mask=masks[2])


def _config(**extra) -> dict:
    return resolve_config(None, {"algorithm": "fedsage", "dataset": "SBM",
                                 "fedsage-fgen-hidden": 16, "fedsage-fgen-width": 32,
                                 "fedsage-gen-lr": 0.01, "fedsage-pretrain-epochs": 30,
                                 **extra})


# --- the characteristic step: greedy matching, dGen's SmoothL1, mending ---------------------
def test_greedy_feature_loss_by_hand():
    # One node, P = 2 slots, d = 2. Slot 0 = (0, 0): MSE 1 to t0 = (1, 1), 1.5 to t1 = (√3, 0).
    # Slot 1 = (2, 2): MSE 1 to t0, (2−√3)²/2 + 2 to t1.
    generated = torch.tensor([[[0.0, 0.0], [2.0, 2.0]]])
    targets = torch.tensor([[[1.0, 1.0], [math.sqrt(3.0), 0.0]]])
    two, one = torch.tensor([2]), torch.tensor([1])
    loss = greedy_feature_loss(generated, targets, pred_counts=two, true_counts=two)
    torch.testing.assert_close(loss, torch.tensor([[1.0, 1.0]]))
    # Only ⌊n̂⌋ = 1 slot counts; ñ = 0 counts nothing; ñ = 1 sees t0 alone.
    torch.testing.assert_close(greedy_feature_loss(generated, targets, one, two),
                               torch.tensor([[1.0, 0.0]]))
    assert greedy_feature_loss(generated, targets, two, torch.tensor([0])).abs().sum() == 0
    torch.testing.assert_close(greedy_feature_loss(generated, targets, two, one),
                               torch.tensor([[1.0, 1.0]]))
    # The codes' loop as written: from the last target (1.5 for slot 0), take t_k whenever
    # MSE_k < d · current: t0 (1 < 3), then t1 again (1.5 < 2 · 1): 1.5, not the min 1.
    code = greedy_feature_loss(generated, targets, two, two, match="code")
    torch.testing.assert_close(code, torch.tensor([[1.5, 1.0]]))
    # The gradient reaches the matched target only: d/dg MSE(g, t0) = 2 (g − t0) / d.
    g = generated.clone().requires_grad_(True)
    greedy_feature_loss(g, targets, one, two).sum().backward()
    torch.testing.assert_close(g.grad, torch.tensor([[[-1.0, -1.0], [0.0, 0.0]]]))


def test_nearest_feature_loss_and_gradient_by_hand():
    features = torch.tensor([[0.0, 0.0], [1.0, 1.0], [4.0, 4.0]])
    vectors = torch.tensor([[[0.9, 0.9], [3.0, 3.0]], [[7.0, 7.0], [0.0, 0.0]]],
                           requires_grad=True)
    slots = torch.tensor([2, 0])  # the second node sends nothing that counts
    loss = nearest_feature_loss(vectors, slots, features, chunk=1)
    torch.testing.assert_close(loss, torch.tensor([[0.01, 1.0], [0.0, 0.0]]))
    (grad,) = torch.autograd.grad(loss.sum(), vectors)
    torch.testing.assert_close(grad, torch.tensor([[[-0.1, -0.1], [-1.0, -1.0]],
                                                   [[0.0, 0.0], [0.0, 0.0]]]))


def test_impair_counts_hidden_neighbours_and_pads_their_features():
    # A star: 0 joined to 1, 2, 3, 4, 5; plus 1 - 2. Nodes 2, 3, 4 hidden, P = 2.
    edge_index = to_undirected(torch.tensor([[0, 0, 0, 0, 0, 1], [1, 2, 3, 4, 5, 2]]))
    x = torch.arange(12.0).view(6, 2)
    data = Data(x=x, edge_index=edge_index, y=torch.zeros(6, dtype=torch.long),
                train_mask=torch.ones(6, dtype=torch.bool))
    hidden = torch.tensor([False, False, True, True, True, False])
    g = impair(data, hidden, num_pred=2)
    assert g.keep.tolist() == [0, 1, 5]
    assert g.missing.tolist() == [3, 1, 0]
    assert sorted(map(tuple, g.edge_index.t().tolist())) == [(0, 1), (0, 2), (1, 0), (2, 0)]
    torch.testing.assert_close(g.targets[0], x[[2, 3]])  # the first P of 2, 3, 4
    torch.testing.assert_close(g.targets[1], torch.stack([x[2], torch.zeros(2)]))
    assert g.targets[2].abs().sum() == 0


def test_degree_loss_is_smooth_l1_of_the_hidden_neighbour_counts():
    data = _graph()
    trainer = FedSageTrainer(data, _config(**{"fedsage-pretrain-epochs": 0}), 3, CPU)
    trainer.run_phase(PRETRAIN, {})
    g = trainer.impaired
    assert int(trainer.hidden.sum()) == int(0.5 * int(data.val_mask.sum()))
    assert not (trainer.hidden & ~data.val_mask).any()  # only validation nodes are hidden
    trainer.neighgen.eval()
    torch.manual_seed(1)
    out = trainer._generator_pass()
    degree = F.relu(trainer.neighgen.dgen(trainer.neighgen.encoder(g.x, g.edge_index))).view(-1)
    diff = (degree - g.missing.float())[g.train_mask].abs()
    expected = torch.where(diff < 1, 0.5 * diff**2, diff - 0.5).mean()  # SmoothL1, β = 1
    torch.testing.assert_close(out.degree_loss, expected)


def test_mending_adds_min_p_floor_nhat_unlabelled_leaves_per_node():
    degree = torch.tensor([0.3, 1.7, 7.2, 2.0])
    counts = slot_counts(degree, num_pred=5)
    assert counts.tolist() == [0, 1, 5, 2]
    generated = torch.arange(4 * 5 * 2, dtype=torch.float32).view(4, 5, 2)
    owner, leaves = generated_leaves(counts, generated)
    assert owner.tolist() == [1, 2, 2, 2, 2, 2, 3, 3]
    torch.testing.assert_close(leaves[0], generated[1, 0])
    torch.testing.assert_close(leaves[-1], generated[3, 1])
    path = to_undirected(torch.tensor([[0, 1, 2], [1, 2, 3]]))
    masks = torch.ones(4, dtype=torch.bool)
    data = Data(x=torch.zeros(4, 2), edge_index=path, y=torch.arange(4), train_mask=masks,
                val_mask=masks, test_mask=masks)
    mended = mended_data(data, owner, leaves)
    assert mended.num_nodes == 4 + 8
    assert mended.y[4:].eq(-1).all() and mended.generated[4:].all() and not mended.generated[:4].any()
    for mask in (mended.train_mask, mended.val_mask, mended.test_mask):
        assert mask[:4].all() and not mask[4:].any()
    leaf_degree = torch.bincount(mended.edge_index[0], minlength=12)
    assert leaf_degree[4:].eq(1).all()  # leaves: one edge each, to their anchor
    added = torch.bincount(mended.edge_index[0], minlength=12)[:4] - torch.bincount(path[0], minlength=4)
    assert added.tolist() == counts.tolist()
    assert mended.edge_index.size(1) == path.size(1) + 2 * 8


@pytest.mark.parametrize("mend_input", ["impaired", "full"])
def test_trainer_mends_with_its_own_neighgen(mend_input):
    data = _graph()
    trainer = FedSageTrainer(data, _config(**{"fedsage-mend-input": mend_input,
                                              "fedsage-gen-rounds": 0}), 3, CPU)
    trainer.run_phase(PRETRAIN, {})
    neighgen = trainer.neighgen
    graph = trainer.impaired if mend_input == "impaired" else data
    with torch.no_grad():
        neighgen.eval()
        degree = F.relu(neighgen.dgen(neighgen.encoder(graph.x, graph.edge_index))).view(-1)
    expected = torch.zeros(data.num_nodes, dtype=torch.long)
    ids = trainer.impaired.keep if mend_input == "impaired" else torch.arange(data.num_nodes)
    expected[ids] = slot_counts(degree, 5)
    trainer.train(1)
    mended = trainer.mended
    assert trainer.neighgen is None  # freed once mended
    n = data.num_nodes
    anchors = mended.edge_index[0, mended.edge_index[1] >= n]
    assert torch.bincount(anchors, minlength=n).tolist() == expected.tolist()
    assert int(expected.sum()) > 0  # the check is not vacuous
    if mend_input == "impaired":
        assert expected[trainer.hidden].eq(0).all()  # hidden nodes get no leaves
    assert not (mended.train_mask[n:] | mended.val_mask[n:] | mended.test_mask[n:]).any()
    # Evaluation reads the client's own nodes only, on the mended graph.
    metrics = trainer.evaluate()
    assert metrics["val_count"] == float(data.val_mask.sum())


def test_random_neighbourhood_targets_are_neighbours_of_one_node():
    data = _graph(n=30)
    torch.manual_seed(0)
    targets = random_neighbourhood_targets(8, 5, data.edge_index, data.x)  # [8, 5, d]
    dense = torch.zeros(30, 30, dtype=torch.bool)
    dense[data.edge_index[0], data.edge_index[1]] = True
    for row in targets:
        ids = [int((data.x == t).all(dim=1).nonzero()[0]) for t in row]
        assert dense[:, ids].all(dim=1).any()  # some node is adjacent to all five


# --- the relay -----------------------------------------------------------------------------------
def test_relayed_step_equals_the_step_with_the_other_clients_features():
    """Client m's generator step through the server (its vectors to j, j's gradients back)
    equals one computed with j's features in hand: (1/2)[local + λ_f · Σ nearest MSE /
    (n_train · P)]."""
    cfg = _config(**{"fedsage-gen-rounds": 2}).with_keys({"server-round": 1})
    m = FedSageTrainer(_graph(seed=1), cfg, 3, CPU)
    j = FedSageTrainer(_graph(seed=2), cfg, 3, CPU)
    for c, trainer in enumerate((m, j)):
        torch.manual_seed(c)
        trainer.run_phase(PRETRAIN, {})
    server = FedSageAggregator(cfg, [0, 1], {})
    reference = {k: v.clone() for k, v in m.neighgen.state_dict().items()}
    sent = {c: t.run_phase(GEN_SEND, {}) for c, t in enumerate((m, j))}
    assert sent[0].arrays[VECTORS].shape[0] > 0 and sent[0].arrays[SLOTS].min() >= 1
    server.step(GEN_SEND, 1, {c: ClientUpdate(r.arrays, {}, 0, r.metrics) for c, r in sent.items()})
    requests = server.configure(GEN_GRAD, 1, [0, 1])
    np.testing.assert_array_equal(requests[1][VECTORS], sent[0].arrays[VECTORS])
    replies = {c: t.run_phase(GEN_GRAD, requests[c]) for c, t in enumerate((m, j))}
    server.step(GEN_GRAD, 1, {c: ClientUpdate(r.arrays, {}, 0, r.metrics) for c, r in replies.items()})
    back = server.configure(GEN_STEP, 1, [0, 1])
    assert back[0][CONTRIBUTORS].tolist() == [1]
    np.testing.assert_array_equal(back[0][GRADS], replies[1].arrays[GRADS])
    seed = m.gen_seed
    m.run_phase(GEN_STEP, back[0])
    relayed = m.neighgen.fgen.state_dict()

    # The same step, computed centrally from the state before it.
    twin = FedSageTrainer(_graph(seed=1), cfg, 3, CPU)
    twin.load_local_state({**m.local_state(), "gen_seed": None})
    twin.neighgen.load_state_dict(reference)
    trained = twin._fed_mode()
    optimizer = torch.optim.Adam(trained, lr=0.01, weight_decay=1e-4)
    out = twin._seeded_pass(seed)
    rows = twin._sent_rows(out)
    cross = nearest_feature_loss(out.generated[rows], out.slots[rows], j.data.x).sum()
    n_train = int(twin.impaired.train_mask.sum())
    loss = 0.5 * (twin._local_loss(out) + cross / (n_train * 5))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for name, value in twin.neighgen.fgen.state_dict().items():
        torch.testing.assert_close(relayed[name], value, rtol=1e-4, atol=1e-6)
    # Only fGen moved (fed-train = fgen, the official code).
    for name, value in m.neighgen.state_dict().items():
        if not name.startswith("fgen."):
            torch.testing.assert_close(value, reference[name])


@pytest.mark.parametrize("fed_train", ["fgen", "all"])
def test_state_keeps_the_pretraining_adam_only_where_it_trains_again(fed_train):
    """Under fed-train=fgen the generator rounds train fGen with their own Adam, so the
    pre-training Adam (two more copies of NeighGen) is dropped from the state; under
    fed-train=all it trains on and stays. A restored client carries on identically."""
    cfg = _config(**{"fedsage-gen-rounds": 2, "fedsage-fed-train": fed_train}
                  ).with_keys({"server-round": 1})
    trainer = FedSageTrainer(_graph(seed=1), cfg, 3, CPU)
    torch.manual_seed(0)
    trainer.run_phase(PRETRAIN, {})
    state = trainer.local_state()
    assert (state["gen_optimizer"] is None) == (fed_train == "fgen")
    twin = FedSageTrainer(_graph(seed=1), cfg, 3, CPU)
    twin.load_local_state(state_from_bytes(state_to_bytes(state), CPU))  # as a ClientApp does
    assert (twin.gen_optimizer is None) == (fed_train == "fgen")
    for t in (trainer, twin):
        torch.manual_seed(1)  # gen_send draws its pass's seed from the global stream
        t.run_phase(GEN_SEND, {})
        t.run_phase(GEN_STEP, {CONTRIBUTORS: np.array([0])})
    for name, value in trainer.neighgen.state_dict().items():
        torch.testing.assert_close(twin.neighgen.state_dict()[name], value, rtol=0, atol=0)


# --- runs ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_short_federation_relays_mends_and_learns(tmp_path, synthetic_root):
    """SBM, 3 clients: two generator rounds relay vectors and gradients, every client's
    graph is then mended with generated leaves, the classifier learns, and the best
    round is a classifier round."""
    results = run_federation({
        "algorithm": "fedsage", "dataset": "SBM", "num-clients": 3, "rounds": 5,
        "fedsage-gen-rounds": 2, "fedsage-pretrain-epochs": 20, "fedsage-gen-lr": 0.02,
        "fedsage-fgen-hidden": 16, "fedsage-fgen-width": 32, "lr": 0.01,
        "data-root": str(synthetic_root), "output-dir": str(tmp_path), "verbose": False},
        write=False)
    rounds = results["rounds"]
    for r in rounds[:2]:
        assert r["aggregate"]["gen_send.sent_slots_mean"] > 0
        assert r["aggregate"]["gen_step.contributors_mean"] == 2
        assert all(math.isnan(c["val_metric"]) for c in r["clients"].values())
    assert all(c["generated_nodes"] > 0 for c in rounds[2]["clients"].values())
    first = np.mean([c["val_metric"] for c in rounds[2]["clients"].values()])
    last = np.mean([c["val_metric"] for c in rounds[-1]["clients"].values()])
    assert last > first and last > 0.6  # five classes: chance is 0.2
    assert results["final"]["best_round"] > 2


@pytest.mark.simulation
def test_flower_simulation_smoke_matches_inprocess(tmp_path, synthetic_root):
    simulation_equals_in_process({
        "algorithm": "fedsage", "dataset": "SBM", "num-clients": 3, "rounds": 3,
        "fedsage-gen-rounds": 1, "fedsage-pretrain-epochs": 10, "fedsage-gen-lr": 0.02,
        "fedsage-fgen-hidden": 16, "fedsage-fgen-width": 32, "lr": 0.01,
        "data-root": str(synthetic_root)}, tmp_path, num_supernodes=3)
