"""FedAux: kernel maths, the chunked autograd function, the server rule, masks, SBM groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

from fedgraph_flwr.algorithms.fedaux import (
    FedAuxAggregator,
    FedAuxTrainer,
    spectral_gap,
)
from fedgraph_flwr.config import RunConfig
from fedgraph_flwr.core.mixing import cosine_similarity, row_softmax
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.nn.apv_kernel import (
    HardSortConv1d,
    apv_scores,
    chebyshev_degree,
    kernel_smooth,
    kernel_smooth_chebyshev,
    kernel_smooth_chunked,
    kernel_smooth_dense,
    kernel_smooth_fast,
    kernel_weights_dense,
)
from fedgraph_flwr.nn.fedaux_net import FedAuxNet
from fedgraph_flwr.nn.masked import MaskedGCNConv, MaskedLinear

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_config(**overrides) -> RunConfig:
    base = {"algorithm": "fedaux", "seed": 0, "lr": 0.01, "weight-decay": 1e-6, "hidden": 16,
            "dropout": 0.5, "metric": "accuracy"}
    base.update(overrides)
    return RunConfig.from_config(base)


def random_graph(n: int = 40, f: int = 8, c: int = 3, seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (4 * n,), generator=g)
    dst = torch.randint(0, n, (4 * n,), generator=g)
    ei = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    y = torch.randint(0, c, (n,), generator=g)
    perm = torch.randperm(n, generator=g)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    masks[0][perm[: n // 4]] = True
    masks[1][perm[n // 4: n // 2]] = True
    masks[2][perm[n // 2:]] = True
    return Data(x=torch.randn(n, f, generator=g), edge_index=ei, y=y,
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])


def embeddings(n: int, d: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=dtype).relu()


# --- the kernel ---------------------------------------------------------------------------
def test_kernel_rows_sum_to_one_and_self_weight_is_largest():
    s = torch.linspace(-1, 1, 50, dtype=torch.float64) ** 3
    beta = kernel_weights_dense(s, sigma=0.5)
    assert torch.allclose(beta.sum(1), torch.ones(50, dtype=torch.float64))
    assert torch.equal(beta.argmax(1), torch.arange(50))


@pytest.mark.parametrize("smooth", [kernel_smooth_dense, kernel_smooth_chunked])
def test_sigma_limits(smooth):
    h = embeddings(30, 5)
    s = torch.linspace(-1, 1, 30, dtype=torch.float64)  # distinct, spaced 0.069
    assert torch.allclose(smooth(s, h, 1e-3), h, atol=1e-12)  # σ→0: z = h (Thm 3.2)
    mean = h.mean(0, keepdim=True).expand_as(h)
    assert torch.allclose(smooth(s, h, 1e4), mean, atol=1e-6)  # σ→∞: z = mean(h)
    assert not torch.allclose(smooth(s, h, 1.0), h, atol=1e-3)


@pytest.mark.parametrize("mode", ["cosine", "maxnorm"])
def test_apv_sign_invariance(mode):
    h = embeddings(25, 6)
    a = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    z_pos = kernel_smooth_dense(apv_scores(h, a, mode), h, 1.0)
    z_neg = kernel_smooth_dense(apv_scores(h, -a, mode), h, 1.0)
    assert torch.allclose(z_pos, z_neg, atol=1e-12)
    # ...while the server's signed cosine calls them opposite
    assert cosine_similarity(np.stack([a.numpy(), -a.numpy()]))[0, 1] == pytest.approx(-1.0)


def test_scores():
    h = torch.tensor([[3.0, 4.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    a = torch.tensor([2.0, 0.0], dtype=torch.float64)
    assert torch.allclose(apv_scores(h, a, "cosine"), torch.tensor([0.6, 0.0, 0.0], dtype=torch.float64))
    # max-norm: one scalar per client (max row norm 5), APV not normalised
    assert torch.allclose(apv_scores(h, a, "maxnorm"), torch.tensor([1.2, 0.0, 0.0], dtype=torch.float64))


def test_kernel_is_permutation_equivariant():
    h = embeddings(40, 4)
    s = torch.rand(40, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    z = kernel_smooth_chunked(s, h, 0.7, block_elems=200)
    assert torch.allclose(kernel_smooth_chunked(s[perm], h[perm], 0.7, block_elems=200), z[perm])


def test_gradcheck_chunked_through_the_apv():
    """float64 gradcheck of the custom backward, through scores -> APV and into h."""
    # no ReLU here: an all-zero row makes the cosine score non-differentiable in h
    h = torch.randn(13, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(8)).requires_grad_()
    a = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()

    def fn(a_, h_):  # block of 3 rows -> 5 blocks, last one ragged
        return kernel_smooth_chunked(apv_scores(h_, a_, "cosine"), h_, 0.5, block_elems=3 * 13)

    assert torch.autograd.gradcheck(fn, (a, h), eps=1e-6, atol=1e-7)
    grad_a, = torch.autograd.grad(fn(a, h).square().sum(), a)
    assert grad_a.abs().max() > 1e-4  # the APV really learns through the kernel


@pytest.mark.parametrize("mode,sigma", [("cosine", 1.0), ("cosine", 0.2), ("maxnorm", 1.0)])
def test_chunked_equals_dense_float32(mode, sigma):
    g = torch.Generator().manual_seed(5)
    h = torch.randn(300, 32, generator=g).relu()
    a = torch.randn(32, generator=g)
    upstream = torch.randn(300, 32, generator=g)
    results = {}
    for impl in ("dense", "chunked", "chebyshev"):
        h_ = h.clone().requires_grad_()
        a_ = a.clone().requires_grad_()
        s = apv_scores(h_, a_, mode)
        z = kernel_smooth(s, h_, sigma, impl, block_elems=300 * 7)  # 43 blocks
        (z * upstream).sum().backward()
        results[impl] = (z.detach(), a_.grad, h_.grad)
    for impl in ("chunked", "chebyshev"):
        for got, ref in zip(results[impl], results["dense"]):
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4), impl


def test_chebyshev_degree_is_adaptive_and_accurate():
    assert chebyshev_degree(2.0, 1.0) < chebyshev_degree(2.0, 0.2) < chebyshev_degree(20.0, 0.2)
    h = embeddings(200, 8)
    s = torch.rand(200, dtype=torch.float64, generator=torch.Generator().manual_seed(6)) * 6 - 3
    ref = kernel_smooth_dense(s, h, 0.5)
    assert torch.allclose(kernel_smooth_chebyshev(s, h, 0.5), ref, atol=1e-8)
    # too few terms really is worse: the automatic degree is doing the work
    assert not torch.allclose(kernel_smooth_chebyshev(s, h, 0.5, degree=6), ref, atol=1e-3)


def test_auto_switches_to_fast_above_threshold():
    """auto: the exact dense kernel at or below dense_max_nodes (published numbers), fast above."""
    h = embeddings(50, 3)
    s = torch.rand(50, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    dense = kernel_smooth_dense(s, h, 1.0)
    z = kernel_smooth(s, h.requires_grad_(), 1.0, "auto", dense_max_nodes=50)
    assert torch.equal(z, dense)  # bit-identical to the dense formula at the threshold
    z = kernel_smooth(s, h, 1.0, "auto", dense_max_nodes=49)
    assert torch.equal(z, kernel_smooth_fast(s, h, 1.0)) and not torch.equal(z, dense)
    assert torch.allclose(z, dense, atol=1e-12)
    assert "Chunked" in type(kernel_smooth(s, h, 1.0, "chunked").grad_fn).__name__


# --- Theorem 3.1: Oja's rule ----------------------------------------------------------------
def test_projected_iteration_finds_top_eigenvector():
    """Π((I + ηC) a) -> ±u_max; the paper's Eq. 10/25 form Π((I − ηC) a) finds
    u_min instead (docs/reading/fedaux.md §3)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6)) * np.array([3.0, 2.0, 1.5, 1.0, 0.5, 0.2])
    cov = np.cov(x.T)
    evals, evecs = np.linalg.eigh(cov)
    eta = 1.0 / evals[-1]
    a_plus = a_minus = rng.normal(size=6)
    for _ in range(500):
        a_plus = (a_plus + eta * cov @ a_plus) / np.linalg.norm(a_plus + eta * cov @ a_plus)
        a_minus = (a_minus - eta * cov @ a_minus) / np.linalg.norm(a_minus - eta * cov @ a_minus)
    assert abs(a_plus @ evecs[:, -1]) > 1 - 1e-6
    assert abs(a_minus @ evecs[:, 0]) > 1 - 1e-6


# --- server maths ---------------------------------------------------------------------------
def test_mixing_weights():
    rng = np.random.default_rng(1)
    sim = cosine_similarity(rng.normal(size=(6, 10)))
    assert np.allclose(np.diag(sim), 1.0) and np.allclose(sim, sim.T)
    w = row_softmax(sim, 10.0)
    assert np.allclose(w.sum(1), 1.0) and (w > 0).all()
    assert np.array_equal(w.argmax(1), np.arange(6))  # self-similarity is the largest
    assert np.allclose(row_softmax(sim, 0.0), 1 / 6)  # α=0: FedAvg
    assert spectral_gap(row_softmax(sim, 0.0)) == pytest.approx(0.0, abs=1e-12)
    assert 0 < spectral_gap(w) < spectral_gap(row_softmax(sim, 1e4)) <= 1 + 1e-9
    # hand-checked 2-client case: w_12 = e^{0} / (e^{α} + e^{0}) for orthogonal APVs
    w2 = row_softmax(cosine_similarity(np.eye(2)), 2.0)
    assert w2[0, 1] == pytest.approx(1 / (np.exp(2.0) + 1))


def _updates(num_clients: int = 4, d: int = 5, seed: int = 0) -> dict[int, ClientUpdate]:
    rng = np.random.default_rng(seed)
    ups = {}
    for c in [7, 2, 9, 4][:num_clients]:  # unsorted, non-contiguous ids
        apv = rng.normal(size=d).astype(np.float32)
        arrays = {"apv": apv, "conv1.lin.weight": rng.normal(size=(3, 2)).astype(np.float32)}
        ups[c] = ClientUpdate(arrays, {"apv": apv}, num_train=10 + c)
    return ups


def test_aggregator_mixes_apv_and_theta_with_the_same_weights():
    ups = _updates()
    res = FedAuxAggregator(make_config(), sorted(ups), {}).aggregate(1, ups)
    ids = sorted(ups)
    apvs = np.stack([ups[c].arrays["apv"] for c in ids])
    w = row_softmax(cosine_similarity(apvs), 10.0)
    assert np.allclose(res.diagnostics["weights"], w)
    assert np.allclose(res.diagnostics["similarity"], cosine_similarity(apvs))
    theta = np.stack([ups[c].arrays["conv1.lin.weight"] for c in ids])
    for row, c in enumerate(ids):
        assert np.allclose(res.payloads[c]["apv"], w[row] @ apvs, atol=1e-6)  # Eq. 8, not renormalised
        assert np.allclose(res.payloads[c]["conv1.lin.weight"], np.tensordot(w[row], theta, 1), atol=1e-6)
        assert res.payloads[c]["apv"].dtype == np.float32
    assert res.metrics["spectral_gap"] == pytest.approx(spectral_gap(w))
    assert not np.allclose(res.payloads[2]["apv"], res.payloads[9]["apv"])  # personalised


def test_float32_mixing_matches_float64():
    ups = _updates()
    exact = FedAuxAggregator(make_config(), sorted(ups), {}).aggregate(1, ups)
    fast = FedAuxAggregator(make_config(**{"server-mix-dtype": "float32"}), sorted(ups), {}).aggregate(1, ups)
    for c in ups:
        for name, value in exact.payloads[c].items():
            assert fast.payloads[c][name].dtype == value.dtype
            assert np.allclose(fast.payloads[c][name], value, rtol=1e-5, atol=1e-6)


def test_aggregator_average_mode_is_fedavg_mask():
    ups = _updates()
    res = FedAuxAggregator(make_config(**{"fedaux-server": "average"}), sorted(ups), {}).aggregate(1, ups)
    mean = np.mean([ups[c].arrays["conv1.lin.weight"] for c in ups], axis=0)
    for c in ups:
        assert np.allclose(res.payloads[c]["conv1.lin.weight"], mean, atol=1e-6)
    assert res.metrics["spectral_gap"] == pytest.approx(0.0, abs=1e-12)


# --- masked layers ------------------------------------------------------------------------
def test_masked_gcn_conv_with_unit_mask_equals_gcnconv_and_prunes_at_eval():
    data = random_graph()
    torch.manual_seed(0)
    masked = MaskedGCNConv(8, 5)
    plain = GCNConv(8, 5)
    plain.lin.weight.data.copy_(masked.lin.weight.data)
    plain.bias.data.copy_(torch.randn(5))
    masked.bias.data.copy_(plain.bias.data)
    assert torch.allclose(masked(data.x, data.edge_index), plain(data.x, data.edge_index), atol=1e-6)
    with torch.no_grad():
        masked.lin.mask[0].fill_(5e-4)  # below the 1e-3 threshold: pruned at eval only
    train_out = masked(data.x, data.edge_index)
    masked.eval()
    eval_out = masked(data.x, data.edge_index)
    assert not torch.allclose(train_out[:, 0], masked.bias[0].expand(40))
    assert torch.allclose(eval_out[:, 0], masked.bias[0].expand(40))  # bias is not masked
    assert torch.allclose(eval_out[:, 1:], train_out[:, 1:])


def test_masked_linear_gradient_reaches_mask():
    layer = MaskedLinear(4, 3)
    assert torch.equal(layer.mask, torch.ones(3, 4))
    layer(torch.randn(5, 4)).sum().backward()
    assert layer.mask.grad is not None and layer.mask.grad.abs().sum() > 0


# --- trainer --------------------------------------------------------------------------------
def test_masks_stay_local():
    data = random_graph()
    cfg = make_config()
    init = FedAuxTrainer.initial_arrays(8, 3, cfg)
    trainer = FedAuxTrainer(data, cfg, 3, torch.device("cpu"))
    mask_names = [k for k in trainer.model.state_dict() if "mask" in k]
    assert len(mask_names) == 3  # conv1, conv2, classifier
    assert not any("mask" in k for k in init) and "apv" in init
    assert set(init) == set(trainer.upload())
    trainer.load_payload(init)
    trainer.train(3)
    masks = {k: trainer.model.state_dict()[k].clone() for k in mask_names}
    assert any(not torch.equal(m, torch.ones_like(m)) for m in masks.values())
    assert not any("mask" in k for k in trainer.upload())
    # a payload that (wrongly) carries masks must not overwrite the client's own
    hostile = {**init, **{k: np.zeros(tuple(m.shape), np.float32) for k, m in masks.items()}}
    trainer.load_payload(hostile)
    for k, m in masks.items():
        assert torch.equal(trainer.model.state_dict()[k], m)
    assert np.allclose(trainer.upload()["apv"], init["apv"])  # ...while the APV is overwritten
    # the masks survive the round trip through the persisted local state
    fresh = FedAuxTrainer(data, cfg, 3, torch.device("cpu"))
    fresh.load_local_state(trainer.local_state())
    fresh.load_payload(init)
    for k, m in masks.items():
        assert torch.equal(fresh.model.state_dict()[k], m)


def test_signature_is_the_apv_and_does_not_scale_with_nodes():
    cfg = make_config()
    sizes = []
    for n in (30, 90):
        trainer = FedAuxTrainer(random_graph(n=n), cfg, 3, torch.device("cpu"))
        trainer.train(1)
        sig = trainer.signature()
        assert set(sig) == {"apv"} and sig["apv"].shape == (16,) and sig["apv"].dtype == np.float32
        assert np.array_equal(sig["apv"], trainer.upload()["apv"])
        sizes.append(sum(v.size for v in trainer.upload().values()))
    assert sizes[0] == sizes[1]



def test_large_clients_propagate_through_a_csr_adjacency_with_the_same_logits():
    from fedgraph_flwr.algorithms.supervised import SPARSE_ADJACENCY_MIN_NODES

    cfg = make_config(dropout=0.0)
    small = FedAuxTrainer(random_graph(n=200), cfg, 3, torch.device("cpu"))
    assert small.message_graph() is small.data.edge_index
    n = SPARSE_ADJACENCY_MIN_NODES
    trainer = FedAuxTrainer(random_graph(n=n), cfg, 3, torch.device("cpu"))
    adj = trainer.message_graph()
    assert adj.layout == torch.sparse_csr and adj.shape == (n, n)
    assert trainer.message_graph() is adj  # built once
    trainer.model.eval()
    with torch.no_grad():
        dense_path = trainer.model(trainer.data.x, trainer.data.edge_index)
        sparse_path = trainer.forward()
    torch.testing.assert_close(sparse_path, dense_path, rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize("symmetric", [True, False])
def test_csr_propagation_keeps_gcnconvs_results_bit_for_bit(symmetric):
    """CSRGCNConv's backward through a kept transpose (the adjacency itself when symmetric)
    gives GCNConv's output and gradients exactly, on an undirected and a directed graph."""
    from torch_geometric.nn import GCNConv
    from torch_geometric.utils import to_torch_csr_tensor, to_undirected

    from fedgraph_flwr.nn.csr_gcn_conv import CSRGCNConv, csr_transpose
    from fedgraph_flwr.nn.masked import MaskedGCNConv

    torch.manual_seed(0)
    n = 300
    edge_index = torch.randint(0, n, (2, 2000))
    if symmetric:
        edge_index = to_undirected(edge_index)
    adj_t = to_torch_csr_tensor(edge_index.flip(0), size=(n, n))
    x = torch.randn(n, 16)
    for ours_cls in (CSRGCNConv, MaskedGCNConv):
        torch.manual_seed(1)
        ours = ours_cls(16, 8, cached=True)
        theirs = GCNConv(16, 8, cached=True)
        theirs.lin.weight.data.copy_(ours.lin.weight.data)
        results = []
        for conv in (ours, theirs):
            xi = x.clone().requires_grad_()
            for _ in range(2):  # the second pass reuses the cached normalisation (and transpose)
                out = conv(xi, adj_t)
                (out * torch.arange(8.0)).sum().backward()
            results.append((out.detach(), xi.grad, conv.lin.weight.grad))
        for a, b in zip(*results):
            assert torch.equal(a, b)
        normalised, kept = ours._cached_transpose
        assert (kept is normalised) == symmetric
    if symmetric:
        assert csr_transpose(adj_t) is adj_t


def test_uniform_mask_dropout_is_dropout():
    """Keeps a 1 − p share of entries scaled by 1/(1 − p), passes gradients through the
    same mask, repeats under a seed, and is the identity in eval mode or at p = 0."""
    from fedgraph_flwr.nn.fast_dropout import uniform_mask_dropout

    h = torch.rand(400, 300) + 0.5
    for p in (0.2, 0.5):
        torch.manual_seed(3)
        x = h.clone().requires_grad_()
        out = uniform_mask_dropout(x, p, training=True)
        kept = out != 0
        assert abs(kept.float().mean().item() - (1 - p)) < 0.01  # 120k draws: ±0.004 = 3σ
        torch.testing.assert_close(out[kept], h[kept] / (1 - p))
        out.sum().backward()
        torch.testing.assert_close(x.grad, kept.float() / (1 - p))
        torch.manual_seed(3)
        assert torch.equal(uniform_mask_dropout(h, p, training=True), out.detach())
    assert uniform_mask_dropout(h, 0.5, training=False) is h
    assert uniform_mask_dropout(h, 0.0, training=True) is h
    with pytest.raises(ValueError, match="dropout probability"):
        uniform_mask_dropout(h, 1.0, training=True)


def test_training_is_deterministic_and_learns():
    data = random_graph(n=60)
    uploads = []
    for _ in range(2):
        trainer = FedAuxTrainer(data, make_config(), 3, torch.device("cpu"))
        torch.manual_seed(123)
        first = trainer.train(1)["train_loss"]
        last = trainer.train(20)["train_loss"]
        uploads.append(trainer.upload())
        metrics = trainer.evaluate()
    assert last < first
    assert 0.0 <= metrics["apv_pc_alignment"] <= 1.0
    for k in uploads[0]:
        assert np.array_equal(uploads[0][k], uploads[1][k]), k


@pytest.mark.parametrize("overrides", [
    {"fedaux-masked": False},
    {"fedaux-variant": "hard", "fedaux-hard-kernel": 5},
    {"fedaux-score": "maxnorm", "fedaux-apv-init": "uniform"},
    {"fedaux-kernel": "chunked"},
    {"fedaux-head": "mlp", "fedaux-classifier-init": "xavier"},
    {"fedaux-head": "mlp", "fedaux-masked": False},
])
def test_variants_train_and_update_the_apv(overrides):
    cfg = make_config(**overrides)
    trainer = FedAuxTrainer(random_graph(), cfg, 3, torch.device("cpu"))
    before = trainer.upload()["apv"].copy()
    trainer.train(2)
    assert not np.allclose(trainer.upload()["apv"], before)
    assert np.isfinite(trainer.evaluate()["val_loss"])
    if overrides.get("fedaux-apv-init") == "uniform":
        assert (before >= 0).all() and (before <= 1).all()


def test_hard_sort_conv_is_permutation_equivariant():
    torch.manual_seed(0)
    layer = HardSortConv1d(4, 3)
    h, s = torch.randn(20, 4), torch.randn(20)
    perm = torch.randperm(20)
    assert torch.allclose(layer(h[perm], s[perm]), layer(h, s)[perm], atol=1e-6)


def test_classifier_heads_and_inits():
    """linear head 2d'->C or the paper's MLP (2d'->d'->C); xavier inits the bias too."""
    torch.manual_seed(0)
    linear = FedAuxNet(8, 16, 3, classifier_init="torch")
    assert tuple(linear.classifier.weight.shape) == (3, 32)
    # nn.Linear's default bound for the bias is 1/sqrt(32) ~ 0.18
    assert linear.classifier.bias.abs().max() <= 32 ** -0.5
    mlp = FedAuxNet(8, 16, 3, head="mlp", masked=True)
    names = {n for n, _ in mlp.named_parameters() if n.startswith("classifier")}
    assert names == {"classifier.0.weight", "classifier.0.mask", "classifier.0.bias",
                     "classifier.3.weight", "classifier.3.mask", "classifier.3.bias"}
    torch.manual_seed(0)
    wide_c = FedAuxNet(8, 16, 40)  # default: xavier, as the reference code
    # FED-PUB: Xavier on a [1, C] bias, bound sqrt(6 / (1 + C)); on the weight sqrt(6 / (2d' + C))
    assert wide_c.classifier.bias.abs().max() > 32 ** -0.5
    assert wide_c.classifier.bias.abs().max() <= (6 / 41) ** 0.5
    assert wide_c.classifier.weight.abs().max() <= (6 / (32 + 40)) ** 0.5
    assert torch.equal(wide_c.classifier.mask, torch.ones(40, 32))
    data = random_graph()
    assert mlp(data.x, data.edge_index).shape == (data.num_nodes, 3)
    with pytest.raises(ValueError, match="fedaux-head"):
        FedAuxNet(8, 16, 3, head="deep")
    with pytest.raises(ValueError, match="fedaux-classifier-init"):
        FedAuxNet(8, 16, 3, classifier_init="he")


def test_torch_classifier_init_draws_as_before_the_switch():
    """classifier-init=torch draws exactly what the layers draw (no re-initialisation),
    so a seed gives the same model, and the same numbers, as before the switch existed."""
    torch.manual_seed(7)
    net = FedAuxNet(8, 16, 3, classifier_init="torch")
    after_net = torch.get_rng_state()
    torch.manual_seed(7)
    MaskedGCNConv(8, 16, cached=True)
    MaskedGCNConv(16, 16, cached=True)
    head = MaskedLinear(32, 3)
    apv = torch.empty(16).normal_()
    assert torch.equal(torch.get_rng_state(), after_net)
    assert torch.equal(net.classifier.weight, head.weight)
    assert torch.equal(net.apv, apv)


@pytest.mark.parametrize("layers", [1, 3])
def test_num_layers_sets_the_gcn_depth(layers):
    """num-layers = L gives conv1 (d -> d') then L - 1 convs d' -> d' (the paper's Fig. 6
    sweep); the trainer passes the run config's value through."""
    data = random_graph()
    torch.manual_seed(0)
    trainer = FedAuxTrainer(data, make_config(**{"num-layers": layers}), 3, torch.device("cpu"))
    convs = sorted({name.split(".")[0] for name, _ in trainer.model.named_parameters()
                    if name.startswith("conv")})
    assert convs == [f"conv{i}" for i in range(1, layers + 1)]
    assert trainer.model.conv1.lin.weight.shape[1] == 8
    torch.manual_seed(0)
    deep = FedAuxNet(8, 16, 3, dropout=0.0, num_layers=layers).eval()
    h = data.x
    for conv in deep.convs():  # the embedding is the L-layer stack, nothing else
        h = conv(h, data.edge_index).relu()
    assert torch.allclose(deep.embed(data.x, data.edge_index), h)
    with pytest.raises(ValueError, match="num-layers"):
        FedAuxNet(8, 16, 3, num_layers=0)


def test_net_uses_kernel_output():
    """The classifier sees [h ‖ z]: the APV changes the logits."""
    data = random_graph()
    torch.manual_seed(0)
    net = FedAuxNet(8, 16, 3, dropout=0.0).eval()
    out = net(data.x, data.edge_index)
    with torch.no_grad():
        net.apv.copy_(torch.randn(16))
    assert not torch.allclose(out, net(data.x, data.edge_index))


# --- synthetic SBM (docs/reading/fedaux.md §7.7) ------------------------------------------------------------
def sbm_clients(seed: int, n: int = 150, groups: int = 5, per_group: int = 4, classes: int = 5):
    """20 client subgraphs: group i has intra-client edge prob 0.15·(i+1) and dominant label i.

    Inter-client edges are dropped (subgraph FL); features are one-hot labels
    (docs/reading/fedaux.md §7.7).
    """
    g = torch.Generator().manual_seed(seed)
    clients, truth = [], []
    for grp in range(groups):
        for _ in range(per_group):
            adj = torch.triu(torch.rand(n, n, generator=g) < 0.15 * (grp + 1), diagonal=1)
            ei = adj.nonzero().t()
            other = torch.randint(0, classes - 1, (n,), generator=g)
            other = other + (other >= grp).long()  # uniform over the 4 other labels
            y = torch.where(torch.rand(n, generator=g) < 0.8, torch.full((n,), grp), other)
            perm = torch.randperm(n, generator=g)
            masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
            masks[0][perm[: n // 5]] = True
            masks[1][perm[n // 5: 3 * n // 5]] = True
            masks[2][perm[3 * n // 5:]] = True
            clients.append(Data(x=F.one_hot(y, classes).float(), edge_index=torch.cat([ei, ei.flip(0)], 1),
                                y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2]))
            truth.append(grp)
    return clients, np.array(truth)


@pytest.mark.slow
def test_sbm_apv_similarity_recovers_groups():
    from sklearn.cluster import AgglomerativeClustering
    from sklearn.metrics import adjusted_rand_score

    def ari(similarity: np.ndarray) -> float:
        labels = AgglomerativeClustering(n_clusters=5, metric="precomputed",
                                         linkage="average").fit_predict(1 - similarity)
        return adjusted_rand_score(truth, labels)

    clients, truth = sbm_clients(seed=0)
    cfg = make_config(hidden=64)
    init = FedAuxTrainer.initial_arrays(5, 5, cfg)
    aggregator = FedAuxAggregator(cfg, list(range(20)), init)
    payloads = {c: init for c in range(20)}
    states: dict = {}
    for rnd in range(1, 16):
        updates = {}
        for c, data in enumerate(clients):
            trainer = FedAuxTrainer(data, cfg, 5, torch.device("cpu"))
            if c in states:
                trainer.load_local_state(states[c])
            trainer.load_payload(payloads[c])
            torch.manual_seed(c * 10_007 + rnd)
            metrics = trainer.train(1)
            updates[c] = ClientUpdate(trainer.upload(), trainer.signature(), 30, metrics)
            states[c] = trainer.local_state()
        result = aggregator.aggregate(rnd, updates)
        payloads.update(result.payloads)
    ari_apv = ari(result.diagnostics["similarity"])
    # FedAux's mixing keeps every APV nearly identical (shared init, small Adam steps):
    # the group signal lives in cosine gaps of ~1e-5, and W stays close to uniform.
    assert result.metrics["apv_similarity_mean"] > 0.999
    assert result.metrics["spectral_gap"] < 1e-2
    assert ari_apv >= 0.9
    # For reference (not asserted as "worse": on this reading of docs/reading/fedaux.md §7.7 it is not):
    # clustering the flattened uploaded parameters also recovers the groups.
    flat = np.stack([np.concatenate([v.ravel() for k, v in sorted(updates[c].arrays.items())
                                     if k != "apv"]) for c in range(20)])
    assert ari(cosine_similarity(flat)) >= 0.9


def test_apv_alignment_is_cosine_with_the_top_principal_direction():
    from fedgraph_flwr.algorithms.fedaux import apv_alignment

    gen = torch.Generator().manual_seed(0)
    u = torch.nn.functional.normalize(torch.randn(16, generator=gen), dim=0)
    v = torch.nn.functional.normalize(torch.randn(16, generator=gen), dim=0)
    v = torch.nn.functional.normalize(v - (v @ u) * u, dim=0)  # v ⟂ u
    # Spread 3 along u, 1 along v, a little elsewhere: u is Cov(h)'s top eigenvector.
    h = (3 * torch.randn(200, 1, generator=gen) * u + torch.randn(200, 1, generator=gen) * v
         + 0.01 * torch.randn(200, 16, generator=gen) + 5.0)
    assert apv_alignment(h, -2.5 * u) == pytest.approx(1.0, abs=1e-3)  # sign and scale free
    assert apv_alignment(h, v) == pytest.approx(0.0, abs=1e-2)
    a = torch.randn(16, generator=gen)
    centred = (h - h.mean(0)).double()
    top = torch.linalg.eigh(centred.T @ centred)[1][:, -1]
    assert apv_alignment(h, a) == pytest.approx(float((a.double() @ top).abs() / a.norm()), abs=1e-6)
