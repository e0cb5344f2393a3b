"""AdaFGL: the HCS, the rewiring and the signed propagation on graphs small enough to work by
hand, ChebNet's Chebyshev terms, the server's node-weighted average, checkpoint and one-time
delivery, and short runs (in process on a synthetic graph; a Flower simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.utils import to_undirected

from fedgraph_flwr.algorithms.adafgl import (
    EXTRACT,
    GLOBAL_VAL,
    NODES_KEY,
    AdaFGLAggregator,
    AdaFGLOptions,
    hcs_split,
    homophily_confidence,
    rewired_adjacency,
    similarity_support,
    smoothed_features,
)
from fedgraph_flwr.config import ConfigError, resolve_config
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.nn.chebnet import ChebNet, chebyshev_terms
from fedgraph_flwr.nn.gamlp import normalized_adjacency
from fedgraph_flwr.nn.signed_propagation import signed_propagate, signed_relation

from helpers import round_metrics, simulation_equals_in_process

CPU = torch.device("cpu")
PATH = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # 0 - 1 - 2
# Two triangles {0, 1, 2} and {3, 4, 5}, not connected.
TWO_TRIANGLES = to_undirected(torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3]]))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _mask(n: int, idx: list[int]) -> torch.Tensor:
    mask = torch.zeros(n, dtype=torch.bool)
    mask[idx] = True
    return mask


# --- HCS ------------------------------------------------------------------------------------
def test_hcs_is_the_lp_accuracy_on_the_held_out_half_by_hand():
    adjacency = normalized_adjacency(TWO_TRIANGLES, 6)
    seeds, held = _mask(6, [0, 3]), _mask(6, [1, 4])
    # Homophilous labels: each held-out node gets its triangle's seed label.
    homophilous = torch.tensor([0, 0, 0, 1, 1, 1])
    assert homophily_confidence(homophilous, seeds, held, adjacency, 2, 10, 0.5) == 1.0
    # The held-out nodes disagree with their triangle's seed: LP gets both wrong.
    heterophilous = torch.tensor([0, 1, 0, 1, 0, 1])
    assert homophily_confidence(heterophilous, seeds, held, adjacency, 2, 10, 0.5) == 0.0
    # Half right: only node 4 disagrees.
    mixed = torch.tensor([0, 0, 0, 1, 0, 1])
    for boost in (True, False):
        assert homophily_confidence(mixed, seeds, held, adjacency, 2, 10, 0.5, boost) == 0.5
    # Nothing held out: 0 (no evidence of homophily).
    assert homophily_confidence(mixed, seeds, _mask(6, []), adjacency, 2, 10, 0.5) == 0.0


def test_hcs_one_step_on_a_path_and_ties_go_to_the_lowest_class():
    """Path 0 - 1 - 2, node 0 a seed of class 1, F⁰ = [0, 1] there and [½, ½] elsewhere;
    one step F = ½ÂF⁰ + ½F⁰ (+ F⁰ on the seed). Node 1 hears node 0, so it leans to
    class 1; node 2 does not (one hop away from uniform rows only): a tie, class 0."""
    adjacency = normalized_adjacency(PATH, 3)
    seeds = _mask(3, [0])
    labels = torch.tensor([1, 1, 1])
    assert homophily_confidence(labels, seeds, _mask(3, [1]), adjacency, 2, 1, 0.5) == 1.0
    assert homophily_confidence(labels, seeds, _mask(3, [2]), adjacency, 2, 1, 0.5) == 0.0
    # Two steps: the seed's label reaches node 2.
    assert homophily_confidence(labels, seeds, _mask(3, [2]), adjacency, 2, 2, 0.5) == 1.0


def test_hcs_split_halves_the_training_nodes():
    train = _mask(9, [0, 2, 3, 5, 7])
    torch.manual_seed(0)
    seeds, held = hcs_split(train)
    assert int(seeds.sum()) == 2 and int(held.sum()) == 3
    assert not (seeds & held).any() and torch.equal(seeds | held, train)


# --- rewiring -------------------------------------------------------------------------------
def _predictions() -> torch.Tensor:
    # Nodes 0, 1: the same confident class-0 prediction; 2, 3: the same class-1 one.
    return torch.tensor([[0.98, 0.01, 0.01], [0.98, 0.01, 0.01],
                         [0.02, 0.96, 0.02], [0.02, 0.96, 0.02]])


def test_similarity_links_equal_predictions_dense_and_topk():
    probs = _predictions()
    row, col, prior = similarity_support(probs, 0.999, "dense")
    assert row.numel() == 12 and not (row == col).any()  # every ordered pair i != j
    linked = {(int(i), int(j)) for i, j, s in zip(row, col, prior) if s > 0}
    assert linked == {(0, 1), (1, 0), (2, 3), (3, 2)}
    # The cosine of softmax(P) between the two groups, by hand, is far below 0.999.
    q = F.softmax(probs, dim=1)
    assert float(F.cosine_similarity(q[0], q[2], dim=0)) < 0.9
    # topk = 1, no random pairs: each node's nearest is its twin; the same S.
    row, col, prior = similarity_support(probs, 0.999, "topk", topk=1, random_pairs=0)
    assert list(zip(row.tolist(), col.tolist())) == [(0, 1), (1, 0), (2, 3), (3, 2)]
    assert prior.tolist() == [1.0, 1.0, 1.0, 1.0]
    # Random pairs join the support (symmetrically), not S.
    torch.manual_seed(0)
    row, col, prior = similarity_support(probs, 0.999, "topk", topk=1, random_pairs=2)
    pairs = set(zip(row.tolist(), col.tolist()))
    assert {(0, 1), (2, 3)} <= pairs and all((j, i) in pairs for i, j in pairs)
    assert len(pairs) == row.numel() and int(prior.sum()) == 4
    with pytest.raises(ValueError, match="dense-max-nodes"):
        similarity_support(probs, 0.999, "dense", dense_max_nodes=3)


def test_rewired_adjacency_and_smoothed_features_by_hand():
    """Edge 0 - 2 in A, S = {0 - 1, 2 - 3}: Ã + I = I + 0.05·A + 0.95·S."""
    a_edges = to_undirected(torch.tensor([[0], [2]]))
    s_row, s_col = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2])
    adjacency = rewired_adjacency(a_edges, 4, s_row, s_col, alpha=0.05, r=0.5).to_dense()
    m = torch.eye(4)
    m[0, 2] = m[2, 0] = 0.05
    m[0, 1] = m[1, 0] = m[2, 3] = m[3, 2] = 0.95
    d = m.sum(dim=1)  # 2.0, 1.95, 2.0, 1.95
    expected = m / torch.sqrt(d[:, None] * d[None, :])
    torch.testing.assert_close(adjacency, expected)
    x = torch.arange(8.0).view(4, 2)
    smooth = smoothed_features(x, adjacency.to_sparse_csr(), 2)
    torch.testing.assert_close(smooth, torch.cat([x, expected @ x, expected @ expected @ x], 1))


# --- the signed propagation -----------------------------------------------------------------
def _dense_reference(e: torch.Tensor, s: torch.Tensor, beta: float, prelu: nn.PReLU) -> torch.Tensor:
    """The official code's dense HetePropagateLayer after its MLP, written out over n × n."""
    q = F.softmax(e, dim=1)
    re = q @ q.t()
    diag = torch.diag(re).unsqueeze(1)
    re = re / torch.sqrt(diag @ diag.t())
    re = re - torch.diag(torch.diag(re))
    r = beta * s + (1 - beta) * re
    mean, peak = r.mean(), r.max()
    x = r - mean
    r = torch.where(x > 0, x / (peak - mean), -((x + mean) / mean))
    r = r + torch.eye(r.size(0))
    pos, neg = prelu(r), prelu(-r)
    return (F.softmax(pos @ e, dim=1) - F.softmax(neg @ e, dim=1) + e) / 2


def _all_pairs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.arange(n)
    row, col = idx.repeat_interleave(n), idx.repeat(n)
    keep = row != col
    return row[keep], col[keep]


def test_signed_relation_by_hand():
    """e: nodes 0, 1 uniform, node 2 all on class 0, so cos(0, 1) = 1, cos(·, 2) = 1/√2."""
    e = torch.tensor([[0.0, 0.0], [0.0, 0.0], [60.0, 0.0]])
    row, col = _all_pairs(3)
    key = {(int(i), int(j)): k for k, (i, j) in enumerate(zip(row, col))}
    s = torch.zeros(6)
    rel = signed_relation(e, row, col, s, beta=0.0)
    mean = (2 + 4 / math.sqrt(2)) / 9  # over all 9 entries, the diagonal's 0 included
    assert float(rel[key[0, 1]]) == pytest.approx(1.0)  # the maximum
    assert float(rel[key[0, 2]]) == pytest.approx((1 / math.sqrt(2) - mean) / (1 - mean), rel=1e-5)
    # β = ½ with S = {0 - 1}: R_02 = ½·cos = √2/4 falls below the mean: the code's −R/μ.
    s[[key[0, 1], key[1, 0]]] = 1.0
    rel = signed_relation(e, row, col, s, beta=0.5)
    mean = (2 * 1.0 + 4 * math.sqrt(2) / 4) / 9
    assert float(rel[key[0, 1]]) == pytest.approx(1.0)
    assert float(rel[key[2, 0]]) == pytest.approx(-(math.sqrt(2) / 4) / mean, rel=1e-5)


@pytest.mark.parametrize("beta", [0.0, 0.2, 1.0])
def test_signed_propagation_on_every_pair_is_the_codes_dense_computation(beta):
    torch.manual_seed(0)
    n = 7
    e = torch.randn(n, 3, requires_grad=True)
    s = (torch.rand(n, n) > 0.6).float()
    s = torch.triu(s, 1) + torch.triu(s, 1).t()
    prelu = nn.PReLU()
    expected = _dense_reference(e, s, beta, prelu)
    row, col = _all_pairs(n)
    got = signed_propagate(e, row, col, signed_relation(e, row, col, s[row, col], beta), prelu)
    torch.testing.assert_close(got, expected)
    # Gradients flow to e and to the shared PReLU the same way.
    g_expected = torch.autograd.grad(expected.square().sum(), (e, prelu.weight))
    got = signed_propagate(e, row, col, signed_relation(e, row, col, s[row, col], beta), prelu)
    g_got = torch.autograd.grad(got.square().sum(), (e, prelu.weight))
    for a, b in zip(g_got, g_expected):
        torch.testing.assert_close(a, b)


def test_sparse_support_drops_the_pairs_outside_it():
    """A sparse Ω: the same R' on its pairs (the mean stays the all-pairs mean), no messages
    along the pairs outside it."""
    e = torch.tensor([[3.0, 0.0], [2.0, 0.0], [0.0, 3.0], [0.0, 1.0], [3.0, 0.5]])
    row, col = _all_pairs(5)
    full = signed_relation(e, row, col, torch.zeros(row.numel()), 0.0)
    keep = (row - col).abs() == 1  # a path's pairs
    part = signed_relation(e, row[keep], col[keep], torch.zeros(int(keep.sum())), 0.0)
    negative = full[keep] <= 0  # the rescale's negative branch needs the mean only
    assert 0 < int(negative.sum()) < int(keep.sum())
    torch.testing.assert_close(part[negative], full[keep][negative])
    prelu = nn.PReLU()
    dropped = torch.zeros(5, 5)
    dropped[row[keep], col[keep]] = part
    dropped = dropped + torch.eye(5)
    expected = (F.softmax(prelu(dropped) @ e, 1) - F.softmax(prelu(-dropped) @ e, 1) + e) / 2
    torch.testing.assert_close(signed_propagate(e, row[keep], col[keep], part, prelu), expected)


# --- ChebNet --------------------------------------------------------------------------------
def test_chebyshev_terms_on_a_path():
    adjacency = normalized_adjacency(PATH, 3)
    a = adjacency.to_dense()
    x = torch.tensor([[1.0], [0.0], [2.0]])
    terms = chebyshev_terms(x, adjacency, 3)
    torch.testing.assert_close(terms, torch.cat([x, a @ x, 2 * a @ (a @ x) - x], dim=1))
    torch.testing.assert_close(chebyshev_terms(x, adjacency, 1), x)
    model = ChebNet(4, 8, 3, k=2)
    assert model.layers[0].weight.shape == (8, 8) and model.layers[1].weight.shape == (3, 16)
    assert model(torch.randn(3, 4), adjacency).shape == (3, 3)
    with pytest.raises(ValueError, match="k must be"):
        ChebNet(4, 8, 3, k=0)


# --- the server -----------------------------------------------------------------------------
def _update(value: float, nodes: int, val: float | None) -> ClientUpdate:
    metrics = {NODES_KEY: float(nodes), GLOBAL_VAL: math.nan if val is None else val}
    arrays = {} if value is None else {"w": np.full(2, value, np.float32)}
    return ClientUpdate(arrays, {}, 0, metrics)


@pytest.mark.parametrize("checkpoint", ["best", "final"])
def test_aggregator_averages_by_nodes_keeps_the_best_and_delivers_once(checkpoint):
    cfg = resolve_config(None, {"algorithm": "adafgl", "dataset": "SBM", "rounds": 6,
                                "adafgl-rounds-step1": 2, "adafgl-checkpoint": checkpoint})
    agg = AdaFGLAggregator(cfg, [0, 1], {})
    assert agg.configure(EXTRACT, 1, [0, 1]) == {0: {}, 1: {}}  # θ_0: the clients' own
    agg.step(EXTRACT, 1, {0: _update(0.0, 10, 0.9), 1: _update(1.0, 30, 0.9)})
    theta1 = agg.configure(EXTRACT, 2, [0, 1])[0]
    np.testing.assert_allclose(theta1["w"], [0.75, 0.75])  # (10·0 + 30·1) / 40
    # Round 2 scores θ_1 (10·0.5 + 30·0.9)/40 = 0.8 and averages θ_2 = 3.5.
    result = agg.step(EXTRACT, 2, {0: _update(2.0, 10, 0.5), 1: _update(4.0, 30, 0.9)})
    assert result.metrics["global_val"] == pytest.approx(0.8)
    assert agg.best_round == 1
    if checkpoint == "best":
        # Round 3 only scores θ_2 (worse: 0.55), so round 4 delivers θ_1.
        theta2 = agg.configure(EXTRACT, 3, [0, 1])
        np.testing.assert_allclose(theta2[1]["w"], [3.5, 3.5])
        agg.step(EXTRACT, 3, {0: _update(None, 10, 0.4), 1: _update(None, 30, 0.6)})
        assert agg.best_round == 1
        delivery, expected = 4, 0.75
    else:
        delivery, expected = 3, 3.5
    sent = agg.configure(EXTRACT, delivery, [0])  # client 1 not sampled this round
    np.testing.assert_allclose(sent[0]["w"], [expected] * 2)
    agg.step(EXTRACT, delivery, {0: _update(None, 10, None)})
    later = agg.configure(EXTRACT, delivery + 1, [0, 1])
    assert later[0] == {}  # sent once
    np.testing.assert_allclose(later[1]["w"], [expected] * 2)  # its first chance
    state = agg.state_dict()
    other = AdaFGLAggregator(cfg, [0, 1], {})
    other.load_state_dict(state)
    assert other.best_round == agg.best_round and other.delivered == {0}
    assert agg.aggregate(delivery, {0: _update(None, 10, None)}).payloads == {0: {}}


# --- runs -----------------------------------------------------------------------------------
def _run(tmp_path, root, **extra) -> dict:
    cfg = {"algorithm": "adafgl", "dataset": "SBM", "num-clients": 3, "rounds": 6,
           "hidden": 16, "local-epochs": 2, "data-root": str(root),
           "output-dir": str(tmp_path), "adafgl-rounds-step1": 3, "adafgl-epochs": 20,
           "adafgl-topk": 8, "adafgl-random-pairs": 8, "verbose": False, **extra}
    return run_federation(cfg, write=False)


@pytest.mark.slow
def test_short_federation_learns_and_scores_step_2_only(tmp_path, synthetic_root):
    results = _run(tmp_path, synthetic_root)
    rounds = results["rounds"]
    assert not any(r["void"] or r["failures"] for r in rounds)
    # Step 1 learns: the global extractor scores better at the end than at the start.
    val = [r["aggregate"]["extract.global_val"] for r in rounds[:4]]
    assert val[3] > val[0] + 0.1
    best = int(rounds[4]["aggregate"]["extract.best_round"])
    assert best == 1 + int(np.argmax(val[1:4]))  # round r scores θ_(r-1)
    # Rounds 1-4 (step 1 and the scoring round) report no val/test: only step 2 is scored.
    for r in rounds[:4]:
        assert all(math.isnan(m["val_metric"]) for m in r["clients"].values())
    step2 = rounds[4]["clients"]
    assert all(m["step2_epochs"] == 20 and 0 <= m["hcs"] <= 1 for m in step2.values())
    assert results["final"]["best_round"] in (5, 6)
    # Step 2 beats the delivered extractor on these clients' test nodes.
    mean = np.mean([m["test_metric"] for m in step2.values()])
    assert mean > np.mean([m["extractor_test_metric"] for m in step2.values()])
    assert results["final"]["test_at_best_val"] > 60
    # Uploads: the extractor in rounds 1-3, nothing after.
    sizes = [sum(r["bytes_received"].values()) for r in rounds]
    assert all(s > 0 for s in sizes[:3]) and sizes[3:] == [0, 0, 0]


def test_switches_keep_live_and_restored_trainers_equal(tmp_path, synthetic_root):
    extra = {"rounds": 6, "adafgl-rounds-step1": 2, "adafgl-checkpoint": "final",
             "adafgl-schedule": "epoch-per-round", "adafgl-epochs": 3,
             "adafgl-combine": "soft", "adafgl-fresh-optimizer": False}
    live = _run(tmp_path, synthetic_root, **extra, **{"run-name": "live"})
    restored = _run(tmp_path, synthetic_root, **extra, **{
        "run-name": "restored", "client-state": "file",
        "client-state-dir": str(tmp_path / "state")})
    assert round_metrics(live) == round_metrics(restored)
    epochs = [r["clients"]["0"]["step2_epochs"] for r in live["rounds"]]
    assert epochs == [0, 0, 1, 2, 3, 3]  # one epoch a round from D = 3, up to 3


@pytest.mark.simulation
def test_flower_simulation_smoke_matches_inprocess(tmp_path, data_root):
    simulation_equals_in_process({"algorithm": "adafgl", "dataset": "Cora", "num-clients": 3,
                                  "rounds": 3, "hidden": 16, "data-root": str(data_root),
                                  "adafgl-rounds-step1": 1, "adafgl-epochs": 5},
                                 tmp_path, num_supernodes=3)


def test_a_run_too_short_for_step_2_is_refused_before_any_client():
    with pytest.raises(ConfigError, match=r"rounds=100 leaves no room for AdaFGL's step 2: it "
                       r"needs rounds >= 102 .*set rounds=102 or adafgl-rounds-step1=98"):
        resolve_config(None, {"algorithm": "adafgl", "adafgl-rounds-step1": 100})
    assert resolve_config(None, {"algorithm": "adafgl"}).options_of(AdaFGLOptions).rounds_step1 == 98
