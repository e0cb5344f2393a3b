"""FedIIH: routing, HVGAE reconstruction, server math, trainer/aggregator behaviour."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.utils import erdos_renyi_graph, subgraph, to_undirected

from fedgraph_flwr.algorithms.fediih import (
    PRIOR_KEY,
    FedIIHAggregator,
    FedIIHOptions,
    FedIIHTrainer,
    factor_block,
    factor_similarity,
    gaussian_js,
    global_factor_means,
)
from fedgraph_flwr.config import RunConfig
from fedgraph_flwr.core.mixing import mix, row_softmax
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.nn.disengcn import NeighbourhoodRouting, routing_layer_split
from fedgraph_flwr.nn.factor_graph import EdgeAggregate, EdgeDots, build_factor_graph
from fedgraph_flwr.nn.hvgae import (
    hvgae_loss,
    reconstruction_loss,
    resolve_recon_method,
    standard_prior_loss,
)

CPU = torch.device("cpu")
SMALL = RunConfig.from_config({
    "algorithm": "fediih", "seed": 0, "lr": 0.02, "weight-decay": 5e-4, "hidden": 8,
    "dropout": 0.3, "fediih-factors": 2, "fediih-routing-layers": 3, "fediih-routing-iters": 3})


def random_graph(n: int, num_features: int = 12, num_classes: int = 3, p: float = 0.05,
                 seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    edge_index = to_undirected(erdos_renyi_graph(n, p))
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = torch.randn(n, num_features, generator=g) + F.one_hot(y, num_features).float()
    split = torch.rand(n, generator=g)
    return Data(x=x, edge_index=edge_index, y=y, train_mask=split < 0.4,
                val_mask=(split >= 0.4) & (split < 0.7), test_mask=split >= 0.7)


# --- DisenGCN routing ---------------------------------------------------------------------
def naive_routing(x: torch.Tensor, edge_index: torch.Tensor, k: int, iters: int, tau: float) -> torch.Tensor:
    """Loop-per-node reference of the released DisenConv."""
    n = x.size(0)
    z = F.normalize(x.view(n, k, -1), dim=-1)
    c = z.clone()
    for _ in range(iters):
        new = z.clone()
        for e in range(edge_index.size(1)):
            v, u = int(edge_index[0, e]), int(edge_index[1, e])
            p = torch.softmax((z[v] * c[u]).sum(-1) / tau, dim=0)
            new[u] = new[u] + p[:, None] * z[v]
        c = F.normalize(new, dim=-1)
    return c.reshape(n, -1)


def test_routing_matches_loop_reference_and_rows_are_unit_norm_per_factor():
    torch.manual_seed(0)
    n, k, d = 15, 3, 4
    edge_index = to_undirected(erdos_renyi_graph(n, 0.3))
    x = torch.randn(n, k * d)
    layer = NeighbourhoodRouting(k, iterations=3, tau=1.0)
    out = layer(x, edge_index)
    assert out.shape == (n, k * d)
    assert torch.allclose(out.view(n, k, d).norm(dim=-1), torch.ones(n, k), atol=1e-6)
    assert torch.allclose(out, naive_routing(x, edge_index, k, 3, 1.0), atol=1e-5)
    # An isolated node keeps its own normalised factor embedding.
    lone = NeighbourhoodRouting(k, 2)(x[:1], torch.empty(2, 0, dtype=torch.long))
    assert torch.allclose(lone, F.normalize(x[:1].view(1, k, d), dim=-1).view(1, -1), atol=1e-6)


def gather_routing(x: torch.Tensor, edge_index: torch.Tensor, k: int, iters: int, tau: float) -> torch.Tensor:
    """Differentiable gather/scatter form of the same routing (the pre-CSR implementation)."""
    n = x.size(0)
    z = F.normalize(x.view(n, k, -1), dim=-1)
    src, trg = edge_index
    c = z
    for _ in range(iters):
        p = torch.softmax((z[src] * c[trg]).sum(-1) / tau, dim=1)
        c = F.normalize(torch.zeros_like(z).index_add(0, trg, p.unsqueeze(-1) * z[src]) + z, dim=-1)
    return c.reshape(n, -1)


def test_factor_graph_kernels_pass_gradcheck():
    torch.manual_seed(1)
    n, k, d = 7, 2, 3
    # Directed, with a duplicate edge and a self-loop: nothing assumes symmetry.
    edge_index = torch.tensor([[0, 1, 2, 2, 3, 5, 6, 6, 4], [1, 2, 0, 0, 3, 4, 0, 2, 6]])
    graph = build_factor_graph(edge_index, n, k)
    assert graph.num_edges == 8 and graph.count.tolist().count(2.0) == 1
    c = torch.randn(n * k, d, dtype=torch.float64, requires_grad=True)
    z = torch.randn(n * k, d, dtype=torch.float64, requires_grad=True)
    w = torch.rand(graph.num_edges, k, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: EdgeDots.apply(a, b, graph), (c, z))
    assert torch.autograd.gradcheck(lambda a, b: EdgeAggregate.apply(a, b, graph), (w, z))


def test_factor_graph_cache_follows_the_edge_index_lifetime():
    import gc

    from fedgraph_flwr.nn import factor_graph as fg

    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    first = fg.factor_graph(edge_index, 3, 2)
    assert fg.factor_graph(edge_index, 3, 2) is first  # reused by every layer
    before = fg.factor_graph(edge_index, 3, 4)
    assert before is not first  # another K: rebuilt
    edge_index[0, 0] = 2  # edited in place (edge 0→1 becomes 2→1): the version changes
    rebuilt = fg.factor_graph(edge_index, 3, 4)
    assert rebuilt is not before and not torch.equal(rebuilt.col, before.col)
    key = id(edge_index)
    del edge_index
    gc.collect()
    assert key not in fg._CACHE


def test_routing_forward_and_gradient_match_gather_form_with_duplicate_edges():
    torch.manual_seed(2)
    n, k, d = 30, 3, 5
    edge_index = torch.cat([erdos_renyi_graph(n, 0.15, directed=True),
                            torch.tensor([[0, 0], [1, 1]])], dim=1)  # 0 → 1 twice (at least)
    x = torch.randn(n, k * d, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(n, k * d, dtype=torch.float64)
    out = NeighbourhoodRouting(k, iterations=4, tau=0.7)(x, edge_index)
    (grad,) = torch.autograd.grad((out * weight).sum(), x)
    ref = gather_routing(x, edge_index, k, 4, 0.7)
    (ref_grad,) = torch.autograd.grad((ref * weight).sum(), x)
    assert torch.allclose(out, ref, atol=1e-10)
    assert torch.allclose(grad, ref_grad, atol=1e-10)


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_fused_routing_equals_the_sparse_kernels_forward_and_gradient(tau):
    torch.manual_seed(3)
    n, k, d = 40, 3, 5
    # Directed, duplicate edges (0 → 1 twice), a self-loop and isolated nodes (38, 39).
    edge_index = torch.cat([erdos_renyi_graph(38, 0.12, directed=True),
                            torch.tensor([[0, 0, 4], [1, 1, 4]])], dim=1)
    x = torch.randn(n, k * d, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(n, k * d, dtype=torch.float64)
    outs, grads = [], []
    for kernel in ("sparse", "fused"):
        out = NeighbourhoodRouting(k, iterations=4, tau=tau, kernel=kernel)(x, edge_index)
        outs.append(out)
        grads.append(torch.autograd.grad((out * weight).sum(), x)[0])
    assert torch.allclose(outs[0], outs[1], atol=1e-12)
    assert torch.allclose(grads[0], grads[1], atol=1e-12)
    with torch.no_grad():  # the forward-only path (two reused buffers) gives the same
        again = NeighbourhoodRouting(k, iterations=4, tau=tau, kernel="fused")(x, edge_index)
    assert torch.equal(again, outs[1].detach())
    from fedgraph_flwr.nn.fused_routing import fused_routing

    small = torch.randn(9, 2 * 3, dtype=torch.float64, requires_grad=True)
    ring = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 0], [1, 2, 3, 4, 5, 6, 7, 8, 0, 0]])
    assert torch.autograd.gradcheck(lambda t: fused_routing(t, ring, 2, 3, 0.8), (small,))


def test_auto_kernel_routes_large_cpu_graphs_fused_and_small_ones_sparse():
    from fedgraph_flwr.nn.disengcn import FUSED_ROUTING_MIN_NODES, uses_fused_routing

    small, large = torch.zeros(FUSED_ROUTING_MIN_NODES - 1, 4), torch.zeros(FUSED_ROUTING_MIN_NODES, 4)
    assert not uses_fused_routing("auto", small) and uses_fused_routing("auto", large)
    assert uses_fused_routing("fused", small) and not uses_fused_routing("sparse", large)
    with pytest.raises(ValueError, match="unknown routing kernel"):
        NeighbourhoodRouting(2, 2, kernel="dense")
    with pytest.raises(ValueError, match="routing-kernel"):
        FedIIHOptions.from_config({"fediih-routing-kernel": "dense"})


@pytest.mark.slow
def test_trainer_on_a_large_client_trains_the_same_with_either_kernel():
    """Above the threshold ``auto`` takes the fused kernel; without dropout (the fused
    path draws other masks) a round's losses and upload equal the sparse kernels' to
    rounding."""
    from fedgraph_flwr.nn.disengcn import FUSED_ROUTING_MIN_NODES

    data = random_graph(FUSED_ROUTING_MIN_NODES, p=0.0008)
    config = SMALL.with_keys({"dropout": 0.0, "local-epochs": 1})
    results = []
    for kernel in ("auto", "sparse"):
        trainer = FedIIHTrainer(data, config.with_keys({"fediih-routing-kernel": kernel}), 3, CPU)
        metrics = trainer.train(2)
        results.append((metrics, trainer.upload(), trainer.signature()))
    (fused_metrics, fused_up, fused_sig), (sparse_metrics, sparse_up, sparse_sig) = results
    assert fused_metrics["train_loss"] == pytest.approx(sparse_metrics["train_loss"], rel=1e-5)
    for key in fused_up:
        np.testing.assert_allclose(fused_up[key], sparse_up[key], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(fused_sig["mu"], sparse_sig["mu"], rtol=1e-4, atol=1e-6)


def test_routing_layer_mapping():
    assert [routing_layer_split(L) for L in (1, 2, 3, 4, 6)] == [(1, 1), (1, 1), (1, 2), (2, 2), (4, 2)]


# --- HVGAE --------------------------------------------------------------------------------
def test_dense_blockwise_and_full_sampled_reconstruction_agree():
    torch.manual_seed(1)
    n = 120
    edge_index = to_undirected(erdos_renyi_graph(n, 0.05))
    edge_index = torch.cat([edge_index, edge_index[:, :5]], 1)  # duplicates: A stays binary
    h = torch.randn(n, 10, dtype=torch.float64, requires_grad=True)
    values, grads = [], []
    for method, kw in (("dense", {}), ("blockwise", {"block_rows": 17}),
                       ("blockwise", {}), ("sampled", {"num_columns": n})):
        loss = reconstruction_loss(h, edge_index, method, **kw)
        values.append(loss.detach())
        grads.append(torch.autograd.grad(loss, h)[0])
    for v, g in zip(values[1:], grads[1:]):
        assert abs(float(v - values[0])) < 1e-12
        assert torch.allclose(g, grads[0], atol=1e-14, rtol=1e-10)
    h32 = h.detach().float()
    assert torch.allclose(reconstruction_loss(h32, edge_index, "blockwise", block_rows=7),
                          reconstruction_loss(h32, edge_index, "dense"), rtol=1e-5)


@pytest.mark.slow
def test_sampled_reconstruction_is_unbiased_estimate():
    torch.manual_seed(2)
    n = 200
    edge_index = to_undirected(erdos_renyi_graph(n, 0.04))
    h = torch.randn(n, 6, dtype=torch.float64)
    exact = float(reconstruction_loss(h, edge_index, "blockwise"))
    draws = torch.stack([reconstruction_loss(h, edge_index, "sampled", num_columns=10)
                         for _ in range(200)])
    assert float(draws.std()) > 1e-3  # really a random estimate
    stderr = float(draws.std()) / math.sqrt(len(draws))
    assert abs(float(draws.mean()) - exact) < 4 * stderr + 1e-3
    # The gradient estimate is unbiased too (loosely).
    hg = h.clone().requires_grad_(True)
    g_exact = torch.autograd.grad(reconstruction_loss(hg, edge_index, "dense"), hg)[0]
    g_mean = sum(torch.autograd.grad(reconstruction_loss(hg, edge_index, "sampled", num_columns=20), hg)[0]
                 for _ in range(100)) / 100
    g_one = torch.autograd.grad(reconstruction_loss(hg, edge_index, "sampled", num_columns=20), hg)[0]
    err_mean = float((g_mean - g_exact).norm() / g_exact.norm())
    err_one = float((g_one - g_exact).norm() / g_exact.norm())
    assert err_mean < 0.2 and err_mean < err_one / 4, (err_mean, err_one)


def test_recon_auto_switch():
    assert resolve_recon_method("auto", 100, 4096) == "dense"
    assert resolve_recon_method("auto", 5000, 4096) == "blockwise"
    assert resolve_recon_method("auto", 5000, 4096, needs_gradient=False) == "sampled"
    assert resolve_recon_method("auto", 100, 4096, needs_gradient=False) == "dense"
    assert resolve_recon_method("sampled", 100, 4096) == "sampled"
    with pytest.raises(ValueError):
        resolve_recon_method("nope", 10, 10)


def test_hvgae_loss_terms_closed_form():
    torch.manual_seed(3)
    n, k, d = 9, 2, 3
    mu, logvar = torch.randn(n, k, d), 0.3 * torch.randn(n, k, d)
    a_loc, a_glob = torch.randn(k, d), torch.randn(k, d)
    terms = hvgae_loss(mu, logvar, a_loc, a_glob, to_undirected(erdos_renyi_graph(n, 0.4)))
    assert torch.allclose(terms["kl_alpha"], (2 * (a_loc - a_glob) ** 2).mean(-1).sum())
    assert torch.allclose(terms["log_prior"],
                          (-0.5 * math.log(2 * math.pi) - 0.5 * a_loc ** 2).mean(-1).sum())
    kl = 0.5 * (math.log(0.25) - logvar + (logvar.exp() + (mu - a_loc) ** 2) / 0.25 - 1)
    assert torch.allclose(terms["kl_data"], kl.mean(dim=(0, 2)).sum(), atol=1e-6)
    assert torch.allclose(terms["loss"], terms["log_prior"] + terms["kl_alpha"]
                          + terms["kl_data"] + terms["recon"])


# --- server math --------------------------------------------------------------------------
def test_gaussian_js_zero_for_identical_and_symmetric():
    rng = np.random.default_rng(0)
    mu_a, mu_b = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    lv_a, lv_b = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    assert np.allclose(gaussian_js(mu_a, lv_a, mu_a, lv_a), 0.0)
    js = gaussian_js(mu_a, lv_a, mu_b, lv_b)
    # The closed form equals the definition: the two KLs to the moment-matched midpoint.
    var_a, var_b = np.exp(lv_a), np.exp(lv_b)
    mu_m, var_m = (mu_a + mu_b) / 2, (var_a + var_b) / 2

    def kl(mu, var):
        return 0.5 * (np.log(var_m / var) + (var + (mu - mu_m) ** 2) / var_m - 1).sum(-1)

    assert np.allclose(js, 0.5 * (kl(mu_a, var_a) + kl(mu_b, var_b)), rtol=1e-12, atol=1e-12)
    assert js.shape == (4,) and (js > 0).all()
    assert np.allclose(js, gaussian_js(mu_b, lv_b, mu_a, lv_a))
    # Only the variance differs: still > 0 (the variances matter, not only the means).
    assert (gaussian_js(mu_a, lv_a, mu_a, lv_a + 1.0) > 0).all()


def test_factor_similarity_and_weights():
    rng = np.random.default_rng(1)
    mu, lv = rng.normal(size=(5, 3, 4)), 0.2 * rng.normal(size=(5, 3, 4))
    s = factor_similarity(mu, lv)
    assert s.shape == (3, 5, 5)
    assert np.allclose(np.diagonal(s, axis1=1, axis2=2), 1.0)
    assert np.allclose(s, s.transpose(0, 2, 1))
    assert np.isclose(s[1, 0, 2], 1 - gaussian_js(mu[0, 1], lv[0, 1], mu[2, 1], lv[2, 1]) / math.log(2))
    beta = row_softmax(s, 10.0)
    assert np.allclose(beta.sum(-1), 1.0) and (beta > 0).all()
    # The self-weight is each row's largest (S(m,m) = 1 is the row maximum here).
    assert (np.diagonal(beta, axis1=1, axis2=2) >= beta.max(-1) - 1e-12).all()
    assert np.allclose(beta[0, 0], np.exp(10 * s[0, 0]) / np.exp(10 * s[0, 0]).sum())


def test_global_factor_means_closed_form():
    mu = np.arange(24, dtype=np.float64).reshape(4, 2, 3)
    assert np.allclose(global_factor_means(mu), mu.sum(0) / 4.25)


def _update(arrays, mu, logvar) -> ClientUpdate:
    return ClientUpdate({k: v.copy() for k, v in arrays.items()},
                        {"mu": mu.astype(np.float32), "logvar": logvar.astype(np.float32)}, 10)


def test_blockwise_mixing_identical_clients_returns_same_model_and_alpha():
    init = FedIIHTrainer.initial_arrays(12, 3, SMALL)
    rng = np.random.default_rng(2)
    mus = rng.normal(size=(3, 2, 8))
    updates = {c: _update(init, mus[c], rng.normal(size=(2, 8))) for c in range(3)}
    res = FedIIHAggregator(SMALL, [0, 1, 2], init).aggregate(1, updates)
    for c in range(3):
        for name, value in init.items():
            assert res.payloads[c][name].dtype == value.dtype
            assert np.allclose(res.payloads[c][name], value, atol=1e-6)
        assert np.allclose(res.payloads[c][PRIOR_KEY], mus.sum(0) / 3.25, atol=1e-6)
    assert set(res.diagnostics) == {"similarity.0", "similarity.1"}
    assert all(m.shape == (3, 3) for m in res.diagnostics.values())


def test_blockwise_mixing_uses_each_factors_own_weights():
    """Client 0's factor-k blocks are Σ_j β^k_0j × client j's factor-k blocks."""
    rng = np.random.default_rng(3)
    m, k, d, feats, classes = 3, 2, 4, 5, 3
    arrays = [{"pca.weight": rng.normal(size=(k * d, feats)).astype(np.float32),
               "pca.bias": rng.normal(size=k * d).astype(np.float32),
               "clf.weight": rng.normal(size=(classes, k * d)).astype(np.float32),
               "clf.bias": rng.normal(size=classes).astype(np.float32)} for _ in range(m)]
    mu, lv = rng.normal(size=(m, k, d)), 0.3 * rng.normal(size=(m, k, d))
    updates = {c: _update(arrays[c], mu[c], lv[c]) for c in range(m)}
    res = FedIIHAggregator(SMALL.with_keys({"fediih-tau": 2.0}), list(range(m)),
                           arrays[0]).aggregate(1, updates)
    beta = row_softmax(factor_similarity(mu, lv), 2.0)
    assert not np.allclose(beta[0], beta[1])  # the factors really get different weights
    for c, out in res.payloads.items():
        for f in range(k):
            rows = slice(f * d, (f + 1) * d)
            exp_w = sum(beta[f, c, j] * arrays[j]["pca.weight"][rows] for j in range(m))
            exp_b = sum(beta[f, c, j] * arrays[j]["pca.bias"][rows] for j in range(m))
            exp_c = sum(beta[f, c, j] * arrays[j]["clf.weight"][:, rows] for j in range(m))
            assert np.allclose(out["pca.weight"][rows], exp_w, atol=1e-6)
            assert np.allclose(out["pca.bias"][rows], exp_b, atol=1e-6)
            assert np.allclose(out["clf.weight"][:, rows], exp_c, atol=1e-6)
        assert np.allclose(out["clf.bias"], np.mean([a["clf.bias"] for a in arrays], 0), atol=1e-6)
    # server-mix-dtype=float32: the same payloads to float32 precision.
    fast = FedIIHAggregator(SMALL.with_keys({"fediih-tau": 2.0, "server-mix-dtype": "float32"}),
                            list(range(m)),
                            arrays[0]).aggregate(1, updates)
    for c in range(m):
        for name, value in res.payloads[c].items():
            assert fast.payloads[c][name].dtype == value.dtype
            assert np.allclose(fast.payloads[c][name], value, rtol=1e-5, atol=1e-6)


# --- trainer --------------------------------------------------------------------------------
def test_upload_and_signature_do_not_scale_with_nodes():
    shapes = []
    for n in (40, 90):
        tr = FedIIHTrainer(random_graph(n), SMALL, 3, CPU)
        tr.train(1)
        up, sig = tr.upload(), tr.signature()
        assert set(up) == {"pca.weight", "pca.bias", "clf.weight", "clf.bias"}
        assert sig["mu"].shape == sig["logvar"].shape == (2, 8) and sig["mu"].dtype == np.float32
        shapes.append(({k: v.shape for k, v in up.items()}, {k: v.shape for k, v in sig.items()}))
    assert shapes[0] == shapes[1]
    assert {k: v.shape for k, v in FedIIHTrainer.initial_arrays(12, 3, SMALL).items()} == shapes[0][0]


def _run(config, data, epochs=2, seed=5):
    tr = FedIIHTrainer(data, config, 3, CPU)
    torch.manual_seed(seed)
    metrics = tr.train(epochs)
    return tr, metrics


def test_training_is_deterministic():
    data = random_graph(60)
    (a, ma), (b, mb) = _run(SMALL, data), _run(SMALL, data)
    assert ma == mb
    for k, v in a.upload().items():
        assert np.array_equal(v, b.upload()[k])
    assert all(np.array_equal(a.signature()[k], b.signature()[k]) for k in ("mu", "logvar"))


def test_code_mode_elbo_moves_only_alpha_hat_paper_mode_trains_encoder():
    data = random_graph(60)
    fresh = FedIIHTrainer(data, SMALL, 3, CPU)
    code, _ = _run(SMALL, data)
    paper, _ = _run(SMALL.with_keys({"fediih-mode": "paper"}), data)
    # Step A is identical in both modes; Step B only differs in what it updates.
    assert np.array_equal(code.upload()["clf.weight"], paper.upload()["clf.weight"])
    assert not np.allclose(code.upload()["pca.weight"], paper.upload()["pca.weight"])
    assert not torch.allclose(code.alpha_local, fresh.alpha_local)
    # In code mode the model after train() equals a classification-only run.
    cls_only = FedIIHTrainer(data, SMALL, 3, CPU)
    torch.manual_seed(5)
    cls_only.model.train()
    for _ in range(2):
        cls_only.optimizer.zero_grad()
        cls_only.classification_loss(cls_only.model(data.x, data.edge_index), data.train_mask).backward()
        cls_only.optimizer.step()
    for k, v in cls_only.upload().items():
        assert np.array_equal(v, code.upload()[k])


# --- ablations (docs/reading/fediih.md §9.18) ------------------------------------------------------------
NO_HM = {"fediih-prior": "standard"}
NO_VI = {"fediih-inference": "deterministic"}


def test_standard_prior_is_bit_identical_in_code_mode_and_differs_in_paper_mode():
    """Code mode: Step B trains nothing the model uses, and the standard prior draws the
    same random numbers, so "w/o HM" is FedIIH to the bit; paper mode tells them apart."""
    data = random_graph(60)
    full, m_full = _run(SMALL, data)
    no_hm, m_no_hm = _run(SMALL.with_keys(NO_HM), data)
    assert m_no_hm["train_loss"] == m_full["train_loss"]
    assert set(m_no_hm) == {"train_loss", "hvgae_loss", "hvgae_kl_data", "hvgae_recon"}
    assert m_no_hm["hvgae_recon"] == m_full["hvgae_recon"]
    for k, v in full.upload().items():
        assert np.array_equal(v, no_hm.upload()[k])
    for k in ("mu", "logvar"):
        assert np.array_equal(full.signature()[k], no_hm.signature()[k])
    paper = SMALL.with_keys({"fediih-mode": "paper"})
    a, _ = _run(paper, data)
    b, _ = _run(paper.with_keys(NO_HM), data)
    assert not np.allclose(a.upload()["pca.weight"], b.upload()["pca.weight"])


def test_standard_prior_kl_is_the_closed_form_against_n01():
    mu, logvar = torch.tensor([[[0.5, -1.0]]]), torch.tensor([[[0.2, -0.3]]])
    ei = torch.tensor([[0], [0]])
    terms = standard_prior_loss(mu, logvar, ei)
    expected = 0.5 * (mu ** 2 + logvar.exp() - 1.0 - logvar).mean()
    assert torch.isclose(terms["kl_data"], expected)


def test_deterministic_encoder_sends_mu_alone_and_trains_the_encoder_as_an_autoencoder():
    data = random_graph(60)
    tr, metrics = _run(SMALL.with_keys(NO_VI), data)
    sig = tr.signature()
    assert set(sig) == {"mu"} and sig["mu"].shape == (2, 8)
    assert set(metrics) == {"train_loss", "hvgae_loss", "hvgae_recon"}
    # Code mode: the model is the classification-only model of the full method's run.
    full, _ = _run(SMALL, data)
    assert np.array_equal(full.upload()["clf.weight"], tr.upload()["clf.weight"])
    paper, _ = _run(SMALL.with_keys({**NO_VI, "fediih-mode": "paper"}), data)
    assert not np.allclose(paper.upload()["pca.weight"], tr.upload()["pca.weight"])


def test_deterministic_similarity_is_the_cosine_of_node_mean_mu_and_sends_no_prior():
    """Two factors; clients 0 and 1 parallel in factor 0, orthogonal in factor 1."""
    init = FedIIHTrainer.initial_arrays(12, 3, SMALL)
    mu = np.zeros((3, 2, 8))
    mu[0, 0, 0] = 1.0
    mu[1, 0, 0] = 3.0
    mu[2, 0, 1] = 1.0
    mu[0, 1, 2], mu[1, 1, 3], mu[2, 1, 2] = 1.0, 1.0, 1.0
    updates = {c: ClientUpdate({k: v.copy() for k, v in init.items()},
                               {"mu": mu[c].astype(np.float32)}, 10) for c in range(3)}
    config = SMALL.with_keys({**NO_VI, "fediih-tau": 2.0})
    res = FedIIHAggregator(config, [0, 1, 2], init).aggregate(1, updates)
    s0 = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=float)
    s1 = np.array([[1, 0, 1], [0, 1, 0], [1, 0, 1]], dtype=float)
    assert np.allclose(res.diagnostics["similarity.0"], s0)
    assert np.allclose(res.diagnostics["similarity.1"], s1)
    assert np.isclose(res.metrics["beta-self-mean.0"],
                      np.mean([np.e ** 2 / (2 * np.e ** 2 + 1)] * 2 + [np.e ** 2 / (np.e ** 2 + 2)]))
    assert "alpha-norm" not in res.metrics
    for c in range(3):
        assert PRIOR_KEY not in res.payloads[c]
    plan = FedIIHAggregator(config, [0, 1, 2], init).mixing_plan(1, updates)
    assert plan.clear == {}
    no_hm = FedIIHAggregator(SMALL.with_keys(NO_HM), [0, 1, 2], init).aggregate(
        1, {c: _update(init, mu[c], np.zeros((2, 8))) for c in range(3)})
    assert all(PRIOR_KEY not in p for p in no_hm.payloads.values())


def test_binary_task_uses_one_logit_and_roc_auc():
    data = random_graph(80, num_classes=2)
    tr = FedIIHTrainer(data, SMALL, 2, CPU)
    assert tr.upload()["clf.weight"].shape == (1, 16)
    metrics = tr.train(1) | tr.evaluate()
    assert 0.0 <= metrics["val_metric"] <= 1.0 and math.isfinite(metrics["val_loss"])


@pytest.mark.parametrize("num_classes", [3, 2])
def test_evaluate_reports_the_pooled_counts(num_classes):
    """The counts of FedSpray's pooled protocol agree with FedIIH's own metrics, also for
    binary tasks (one logit, BCE validation loss)."""
    data = random_graph(80, num_classes=num_classes)
    tr = FedIIHTrainer(data, SMALL.with_keys({"metric": "accuracy"}), num_classes, CPU)
    tr.train(1)
    m = tr.evaluate()
    assert m["test_count"] == int(data.test_mask.sum()) and m["val_count"] == int(data.val_mask.sum())
    assert m["test_correct"] / m["test_count"] == pytest.approx(m["test_metric"])
    assert m["val_loss_sum"] == pytest.approx(m["val_loss"] * m["val_count"])
    assert 0 <= m["minority_correct"] <= m["minority_count"] <= m["test_count"]


@pytest.mark.slow
def test_federation_has_the_pooled_figures_at_best_val_loss(tmp_path, synthetic_root):
    from fedgraph_flwr.engine.loop import run_federation

    cfg = {"algorithm": "fediih", "dataset": "SBM", "num-clients": 3, "rounds": 2, "hidden": 8,
           "data-root": str(synthetic_root), "output-dir": str(tmp_path), "run-name": "fediih"}
    final = run_federation(cfg, write=False)["final"]
    assert final["pooled_best_round"] in (1, 2)
    for key in ("pooled_test_at_best_val_loss", "pooled_minority_at_best_val_loss",
                "pooled_majority_at_best_val_loss", "macro_test_at_best_val_loss",
                "macro_minority_at_best_val_loss"):
        assert 0.0 <= final[key] <= 100.0, key
    assert math.isfinite(final["pooled_val_loss"])


def test_config_defaults_are_plain_scalars():
    defaults = FedIIHOptions.defaults()
    assert all(k.startswith("fediih-") for k in defaults)
    assert all(isinstance(v, (str, int, float, bool)) for v in defaults.values())


# --- a small federation by hand -----------------------------------------------------------
@pytest.fixture(scope="module")
def cora(data_root):
    import torch_geometric.transforms as T
    from torch_geometric.datasets import Planetoid

    ds = Planetoid(str(data_root), "Cora",
                   transform=T.Compose([T.LargestConnectedComponents(), T.NormalizeFeatures()]))
    return ds[0]


def split_clients(graph: Data, num_clients: int, seed: int = 0) -> list[Data]:
    """Random 20/40/40 split, then contiguous chunks of a random node order per client."""
    n = graph.num_nodes
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    n_train, n_test = int(0.2 * n), round(0.4 * n)
    train = torch.zeros(n, dtype=torch.bool)
    train[perm[:n_train]] = True
    test = torch.zeros(n, dtype=torch.bool)
    test[perm[n_train:n_train + n_test]] = True
    val = ~(train | test)
    clients = []
    for chunk in torch.randperm(n, generator=g).chunk(num_clients):
        nodes = chunk.sort().values
        edge_index, _ = subgraph(nodes, graph.edge_index, relabel_nodes=True, num_nodes=n)
        clients.append(Data(x=graph.x[nodes], edge_index=edge_index, y=graph.y[nodes],
                            train_mask=train[nodes], val_mask=val[nodes], test_mask=test[nodes]))
    return clients


@pytest.mark.slow
def test_small_federation_improves_validation_accuracy(cora):
    clients = split_clients(cora, 3)
    config = SMALL.with_keys({"hidden": 16, "lr": 0.05})
    init = FedIIHTrainer.initial_arrays(cora.num_features, 7, config)
    aggregator = FedIIHAggregator(config, [0, 1, 2], init)
    payloads, states, mean_val = {c: init for c in range(3)}, {}, []
    for rnd in range(1, 5):
        updates, vals = {}, []
        for c, data in enumerate(clients):  # as the engine: rebuild, restore, load, seed, train
            tr = FedIIHTrainer(data, config, 7, CPU)
            if c in states:
                tr.load_local_state(states[c])
            tr.load_payload(payloads[c])
            if rnd > 1:
                assert np.allclose(tr.alpha_global.numpy(), payloads[c][PRIOR_KEY])
            torch.manual_seed(1000 * rnd + c)
            metrics = tr.train(2) | tr.evaluate()
            vals.append(metrics["val_metric"])
            updates[c] = ClientUpdate(tr.upload(), tr.signature(), int(data.train_mask.sum()), metrics)
            states[c] = tr.local_state()
        result = aggregator.aggregate(rnd, updates)
        payloads = result.payloads
        mean_val.append(float(np.mean(vals)))
    assert mean_val[-1] > mean_val[0] + 0.2, mean_val


def test_server_maths_in_blocks_equals_the_broadcast_formulas(monkeypatch):
    """Row-blocked JS (memory linear in M·d_k) and per-factor BLAS mixing give exactly
    the one-shot broadcast/einsum results."""
    from fedgraph_flwr.algorithms import fediih

    rng = np.random.default_rng(0)
    mu, logvar = rng.normal(size=(7, 3, 5)), 0.3 * rng.normal(size=(7, 3, 5))
    m, lv = mu.transpose(1, 0, 2), logvar.transpose(1, 0, 2)
    full = 1.0 - fediih.gaussian_js(m[:, :, None], lv[:, :, None], m[:, None], lv[:, None]) / np.log(2)
    monkeypatch.setattr(fediih, "JS_BLOCK_ELEMENTS", 2 * 7 * 5)  # 2 rows per block
    np.testing.assert_array_equal(fediih.factor_similarity(mu, logvar), full)
    beta = row_softmax(full, 10.0)
    blocks = rng.normal(size=(7, 3, 4, 6))  # client, factor, d_k, features
    uploads = [{"pca.weight": b.reshape(12, 6), "pca.bias": np.zeros(12),
                "clf.weight": np.zeros((1, 12))} for b in blocks]
    per_factor = [mix(beta[k], [factor_block(a, k, 4) for a in uploads]) for k in range(3)]
    mixed = np.stack([[per_factor[k][c]["pca.weight"] for k in range(3)] for c in range(7)])
    np.testing.assert_allclose(mixed, np.einsum("kmj,jk...->mk...", beta, blocks),
                               rtol=1e-12, atol=1e-14)


def test_float32_similarity_in_blocks_matches_float64(monkeypatch):
    """server-mix-dtype=float32's JS (torch, float32, upper triangle mirrored, row
    blocks) equals the float64 form to float32 precision, for blocks that split the
    triangle unevenly too; symmetric with S(m, m) = 1 exactly."""
    from fedgraph_flwr.algorithms import fediih

    rng = np.random.default_rng(4)
    mu, logvar = rng.normal(size=(11, 3, 6)), rng.normal(scale=0.5, size=(11, 3, 6)) - 1.0
    exact = fediih.factor_similarity(mu, logvar)
    for rows in (1, 3, 11):
        monkeypatch.setattr(fediih, "JS_BLOCK_ELEMENTS_FLOAT32", rows * 11 * 6)
        fast = fediih.factor_similarity_float32(mu, logvar)
        assert fast.dtype == np.float64 and fast.shape == exact.shape
        np.testing.assert_allclose(fast, exact, rtol=0, atol=2e-5)
        np.testing.assert_array_equal(fast, fast.transpose(0, 2, 1))
        np.testing.assert_array_equal(np.diagonal(fast, axis1=1, axis2=2), 1.0)
    # The weights the server mixes with agree too.
    np.testing.assert_allclose(row_softmax(fast, 10.0),
                               row_softmax(exact, 10.0), rtol=5e-4, atol=1e-9)
