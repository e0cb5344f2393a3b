"""Baselines (FedProx, FedPer, FED-PUB, GCFL, APFL): aggregation rules on hand-made inputs,
trainer invariants, and a 3-round in-process smoke per algorithm (no Flower, no engine)."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import stochastic_blockmodel_graph

from fedgraph_flwr.algorithms import apfl, fedper, fedprox, fedpub, gcfl
from fedgraph_flwr.algorithms.fedavg import FedAvgAggregator, GCNTrainer
from fedgraph_flwr.config import RunConfig
from fedgraph_flwr.core.options import Options
from fedgraph_flwr.core.phases import ClientUpdate

CPU = torch.device("cpu")
NUM_FEATURES, NUM_CLASSES = 8, 3


def make_config(options: type[Options], **overrides) -> RunConfig:
    """The algorithm of ``options`` (their defaults) with ``overrides``, in round 1."""
    cfg = {"algorithm": options.prefix, "hidden": 16, "seed": 0, "server-round": 1}
    cfg.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return RunConfig.from_config(cfg)


def tiny_graph(seed: int, n: int = 40) -> Data:
    """Two-block SBM with block-dependent features and labels: learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        edge_index = stochastic_blockmodel_graph([n // 2, n // 2], torch.tensor([[0.3, 0.02], [0.02, 0.3]]))
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    x = torch.randn(n, NUM_FEATURES, generator=g)
    x[torch.arange(n), y] += 2.0
    perm = torch.randperm(n, generator=g)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    masks[0][perm[: n // 2]] = True
    masks[1][perm[n // 2: 3 * n // 4]] = True
    masks[2][perm[3 * n // 4:]] = True
    return Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1],
                test_mask=masks[2])


def state_dicts_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def run_rounds(trainer_cls, aggregator_cls, config: dict, rounds: int = 3, num_clients: int = 3,
               payload_keys=None):
    """Drive trainers and an aggregator by hand, as the engine does; return per-round logs.
    ``payload_keys``: what every payload carries where that is not the upload's schema."""
    datas = [tiny_graph(100 + c, n=30 + 10 * c) for c in range(num_clients)]
    initial = trainer_cls.initial_arrays(NUM_FEATURES, NUM_CLASSES, config)
    agg = aggregator_cls(config, list(range(num_clients)), initial)
    payloads = {c: initial for c in range(num_clients)}
    states: dict[int, bytes] = {}
    log = []
    for rnd in range(1, rounds + 1):
        cfg = config.with_keys({"server-round": rnd})
        updates, metrics = {}, {}
        for c, data in enumerate(datas):
            trainer = trainer_cls(data, cfg, NUM_CLASSES, CPU)
            if c in states:  # through bytes, as the engine persists it
                trainer.load_local_state(torch.load(io.BytesIO(states[c]), weights_only=False))
            trainer.load_payload(payloads[c])
            torch.manual_seed(cfg.seed * 1_000_003 + c * 10_007 + rnd)
            m = trainer.train(cfg.local_epochs)
            m.update(trainer.evaluate())
            up = trainer.upload()
            assert set(up) == set(initial)  # the engine's schema check
            assert all(up[k].shape == initial[k].shape for k in up)
            buf = io.BytesIO()
            torch.save(trainer.local_state(), buf)
            states[c] = buf.getvalue()
            updates[c] = ClientUpdate(up, trainer.signature(), int(data.train_mask.sum()), m)
            metrics[c] = m
        result = agg.aggregate(rnd, updates)
        for p in result.payloads.values():
            assert set(p) == (set(initial) if payload_keys is None else set(payload_keys))
            assert all(p[k].shape == initial[k].shape and p[k].dtype == initial[k].dtype
                       for k in p if k in initial)
            assert all(np.isfinite(v).all() for v in p.values())
        payloads.update(result.payloads)
        log.append({"metrics": metrics, "result": result})
    return log, agg


def assert_smoke(log) -> None:
    for entry in log:
        for m in entry["metrics"].values():
            assert np.isfinite(m["train_loss"]) and 0.0 <= m["val_metric"] <= 1.0
    first = np.mean([m["train_loss"] for m in log[0]["metrics"].values()])
    last = np.mean([m["train_loss"] for m in log[-1]["metrics"].values()])
    assert last < first  # three rounds of lr 0.01 on a learnable toy task


def payloads_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        all(np.array_equal(a[c][k], b[c][k]) for k in a[c]) for c in a)


# --- FedProx ----------------------------------------------------------------------------


def _train_once(trainer_cls, config, payload, epochs=5):
    trainer = trainer_cls(tiny_graph(1), config, NUM_CLASSES, CPU)
    trainer.load_payload(payload)
    torch.manual_seed(7)
    trainer.train(epochs)
    return trainer


def test_fedprox_mu_zero_is_fedavg_exactly():
    cfg = make_config(fedprox.FedProxOptions, fedprox_mu=0.0)
    torch.manual_seed(3)
    payload = {k: v + np.random.default_rng(0).normal(0, 0.1, v.shape).astype(v.dtype)
               for k, v in GCNTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, cfg).items()}
    prox = _train_once(fedprox.FedProxTrainer, cfg, payload)
    avg = _train_once(GCNTrainer, cfg.with_keys({"algorithm": "fedavg"}), payload)
    assert state_dicts_equal(prox.model.state_dict(), avg.model.state_dict())
    # and with μ > 0 it differs
    prox_mu = _train_once(fedprox.FedProxTrainer, cfg.with_keys({"fedprox-mu": 1.0}), payload)
    assert not state_dicts_equal(prox_mu.model.state_dict(), avg.model.state_dict())


@pytest.mark.slow
def test_fedprox_term_value_and_pull_toward_anchor():
    cfg = make_config(fedprox.FedProxOptions, fedprox_mu=0.5)
    anchor = fedprox.FedProxTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, cfg)
    trainer = fedprox.FedProxTrainer(tiny_graph(1), cfg, NUM_CLASSES, CPU)
    trainer.load_payload(anchor)
    assert float(trainer.extra_loss().detach()) == 0.0  # at the anchor
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.1)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    assert float(trainer.extra_loss()) == pytest.approx(0.5 * 0.5 * 0.01 * n_params, rel=1e-5)

    def distance(mu: float) -> float:
        t = _train_once(fedprox.FedProxTrainer, cfg.with_keys({"fedprox-mu": mu}), anchor, epochs=30)
        return float(sum(((p.detach() - torch.as_tensor(anchor[n])) ** 2).sum()
                         for n, p in t.model.named_parameters()))

    d0, d_small, d_big = distance(0.0), distance(0.1), distance(10.0)
    assert d_big < d_small < d0


# --- FedPer -----------------------------------------------------------------------------


def test_fedper_head_never_uploaded_nor_overwritten():
    cfg = make_config(fedper.FedPerOptions)
    initial = fedper.FedPerTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, cfg)
    assert initial and not any(k.startswith("convs.1.") for k in initial)
    trainer = fedper.FedPerTrainer(tiny_graph(1), cfg, NUM_CLASSES, CPU)
    assert set(trainer.upload()) == set(initial)
    head_before = {k: v.clone() for k, v in trainer.model.state_dict().items() if k.startswith("convs.1.")}
    # A payload that (wrongly) carries a head: the body is applied, the head is not.
    full = {k: np.full(v.shape, 3.0, np.float32) for k, v in trainer.model.state_dict().items()}
    trainer.load_payload(full)
    state = trainer.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in head_before.items())
    assert all(torch.all(state[k] == 3.0) for k in initial)
    # 3-layer GCN: the head is convs.2, convs.1 is shared
    cfg3 = cfg.with_keys({"num-layers": 3})
    keys3 = fedper.FedPerTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, cfg3)
    assert any(k.startswith("convs.1.") for k in keys3) and not any(k.startswith("convs.2.") for k in keys3)


def test_fedper_smoke_heads_stay_personal():
    cfg = make_config(fedper.FedPerOptions)
    log, _ = run_rounds(fedper.FedPerTrainer, fedper.FedPerAggregator, cfg)
    assert_smoke(log)
    payloads = log[-1]["result"].payloads
    assert payloads_equal({0: payloads[0]}, {0: payloads[1]})  # one shared body


# --- FED-PUB ----------------------------------------------------------------------------


def _fedpub_arrays(seed: int, cfg: dict, noise: float = 0.0, noise_seed: int = 0) -> dict:
    arrays = fedpub.FedPubTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, cfg.with_keys({"seed": seed}))
    rng = np.random.default_rng(noise_seed)
    return {k: (v + noise * rng.normal(size=v.shape)).astype(v.dtype) if "mask" not in k else v
            for k, v in arrays.items()}


def test_fedpub_identical_clients_and_tau_zero_mix_uniformly():
    cfg = make_config(fedpub.FedPubOptions)
    initial = fedpub.FedPubTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, cfg)
    agg = fedpub.FedPubAggregator(cfg, [0, 1, 2], initial)
    same = _fedpub_arrays(5, cfg)
    res = agg.aggregate(1, {c: ClientUpdate(same, {}, 10 + c) for c in range(3)})
    np.testing.assert_allclose(res.diagnostics["mixing"], np.full((3, 3), 1 / 3), rtol=1e-12)
    assert payloads_equal({0: res.payloads[0]}, {0: res.payloads[2]})
    for k, v in res.payloads[1].items():
        np.testing.assert_allclose(v, same[k], rtol=1e-6, atol=1e-7)
        assert v.shape == initial[k].shape and v.dtype == initial[k].dtype
    # τ = 0: uniform mixing whatever the clients
    agg0 = fedpub.FedPubAggregator(cfg.with_keys({"fedpub-tau": 0.0}), [0, 1, 2], initial)
    diverse = {c: ClientUpdate(_fedpub_arrays(c, cfg), {}, 10) for c in range(3)}
    res0 = agg0.aggregate(1, diverse)
    np.testing.assert_allclose(res0.diagnostics["mixing"], np.full((3, 3), 1 / 3), rtol=1e-12)
    expected = {k: np.mean([diverse[c].arrays[k] for c in range(3)], axis=0) for k in initial}
    for k in initial:
        np.testing.assert_allclose(res0.payloads[0][k], expected[k], rtol=1e-5, atol=1e-6)


def test_fedpub_similar_clients_weigh_each_other_more():
    cfg = make_config(fedpub.FedPubOptions)
    initial = fedpub.FedPubTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, cfg)
    agg = fedpub.FedPubAggregator(cfg, list(range(4)), initial)
    # two groups: {0, 1} around model A, {2, 3} around model B
    ups = {c: ClientUpdate(_fedpub_arrays(11 if c < 2 else 22, cfg, noise=0.01, noise_seed=c), {}, 10)
           for c in range(4)}
    res = agg.aggregate(1, ups)
    w, sim = res.diagnostics["mixing"], res.diagnostics["similarity"]
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    for a, b, other in [(0, 1, 2), (1, 0, 3), (2, 3, 0), (3, 2, 1)]:
        assert sim[a, b] > sim[a, other]
        assert w[a, b] > w[a, other]
    # higher τ sharpens the mixing toward the own group
    agg_hot = fedpub.FedPubAggregator(cfg.with_keys({"fedpub-tau": 50.0}), list(range(4)), initial)
    w_hot = agg_hot.aggregate(1, ups).diagnostics["mixing"]
    assert w_hot[0, 1] + w_hot[0, 0] > w[0, 1] + w[0, 0]


def test_fedpub_server_embedding_is_client_model_on_proxy():
    cfg = make_config(fedpub.FedPubOptions, fedpub_proxy_graphs=2, fedpub_proxy_nodes=30)
    trainer = fedpub.FedPubTrainer(tiny_graph(2), cfg, NUM_CLASSES, CPU)
    with torch.no_grad():  # give it non-trivial masks, one pruned entry
        trainer.model.convs[1].lin.mask.uniform_(0.5, 1.5)
        trainer.model.convs[1].lin.mask[0, 0] = 1e-4
    up = trainer.upload()
    initial = fedpub.FedPubTrainer.initial_arrays(NUM_FEATURES, NUM_CLASSES, cfg)
    agg = fedpub.FedPubAggregator(cfg, [0], initial)
    proxy = fedpub.proxy_graph(NUM_FEATURES, agg.options, cfg.seed)
    assert proxy.num_nodes == 60 and proxy.x.shape == (60, NUM_FEATURES)
    again = fedpub.proxy_graph(NUM_FEATURES, agg.options, cfg.seed)
    assert torch.equal(proxy.edge_index, again.edge_index)  # seeded
    block = proxy.edge_index // 30
    assert torch.equal(block[0], block[1])  # no edges across proxy graphs
    trainer.model.eval()
    with torch.no_grad():
        ref = trainer.model(proxy.x, proxy.edge_index, embed=True).mean(0).double().numpy()
    np.testing.assert_allclose(agg.functional_embedding(up), ref, rtol=1e-5, atol=1e-6)


def test_fedpub_masks_local_and_regularisers():
    cfg = make_config(fedpub.FedPubOptions, fedpub_l1=0.1, fedpub_loc_l2=0.2)
    trainer = fedpub.FedPubTrainer(tiny_graph(3), cfg, NUM_CLASSES, CPU)
    with torch.no_grad():
        trainer.model.classifier.mask.fill_(0.5)
    payload = {k: np.full(v.shape, 2.0, np.float32) for k, v in trainer.upload().items()}
    trainer.load_payload(payload)
    state = trainer.model.state_dict()
    assert torch.all(state["classifier.mask"] == 0.5)  # masks never overwritten
    assert torch.all(state["classifier.weight"] == 2.0)
    # Round 1: L1 only; its gradient on a mask is l1 · sign(M)
    n_mask = sum(p.numel() for n, p in trainer.model.named_parameters() if "mask" in n)
    reg = trainer.extra_loss()
    expected_l1 = 0.1 * (n_mask - trainer.model.classifier.mask.numel() * 0.5)
    assert float(reg) == pytest.approx(expected_l1, rel=1e-5)
    reg.backward()
    assert torch.allclose(trainer.model.classifier.mask.grad, torch.full((NUM_CLASSES, 16), 0.1))
    # Later rounds add loc_l2 · ||θ - θ_received||_2 per non-mask tensor
    trainer.config = cfg.with_keys({"server-round": 2})
    trainer.model.zero_grad()
    with torch.no_grad():
        trainer.model.classifier.weight.add_(torch.full_like(trainer.model.classifier.weight, 0.1))
    extra = float(trainer.extra_loss()) - expected_l1
    assert extra == pytest.approx(0.2 * 0.1 * (NUM_CLASSES * 16) ** 0.5, rel=1e-4)
    # fedpub-reg-grad=false: the FED-PUB code's detached terms -> no gradient at all
    trainer.options = dataclasses.replace(trainer.options, reg_grad=False)
    assert not trainer.extra_loss().requires_grad


@pytest.mark.slow
def test_fedpub_smoke():
    cfg = make_config(fedpub.FedPubOptions)
    log, _ = run_rounds(fedpub.FedPubTrainer, fedpub.FedPubAggregator, cfg)
    assert_smoke(log)
    w = log[-1]["result"].diagnostics["mixing"]
    assert w.shape == (3, 3) and np.allclose(w.sum(1), 1.0)
    again, _ = run_rounds(fedpub.FedPubTrainer, fedpub.FedPubAggregator, cfg)
    assert payloads_equal(log[-1]["result"].payloads, again[-1]["result"].payloads)  # deterministic


# --- GCFL -------------------------------------------------------------------------------


def _gcfl_setup(mode: str, k: int = 6, **over):
    cfg = make_config(gcfl.GCFLOptions, gcfl_mode=mode, **over)
    initial = {"w": np.zeros(4, np.float32), "b": np.zeros(2, np.float32)}
    return cfg, initial, gcfl.GCFLAggregator(cfg, list(range(k)), initial)


def _updates(sent: dict, directions: dict, grad_norms: dict | None = None, sizes=None):
    ups = {}
    for c, d in directions.items():
        arrays = {"w": (sent[c]["w"] + d[:4]).astype(np.float32),
                  "b": (sent[c]["b"] + d[4:]).astype(np.float32)}
        sig = {gcfl.GRAD_NORM: np.array([grad_norms[c]], np.float32)} if grad_norms else {}
        ups[c] = ClientUpdate(arrays, sig, sizes[c] if sizes else 10)
    return ups


U = np.array([1.0, 0.5, 0.0, 0.0, 0.2, 0.0])  # ||U|| ≈ 1.14 > ε2


def test_gcfl_splits_opposed_groups_not_agreeing_ones():
    cfg, initial, agg = _gcfl_setup("gcfl")
    opposed = {c: (U if c < 3 else -U) for c in range(6)}
    # warm-up: no split up to round 20 even though the criterion holds
    res = agg.aggregate(20, _updates(agg.sent, opposed))
    assert agg.clusters == [list(range(6))] and res.metrics["splits"] == 0
    assert res.metrics["mean-update-norm"] < 0.05 < 0.1 < res.metrics["max-update-norm"]
    res = agg.aggregate(21, _updates(agg.sent, opposed))
    assert agg.clusters == [[0, 1, 2], [3, 4, 5]] and res.metrics["num-clusters"] == 2
    np.testing.assert_array_equal(res.diagnostics["clusters"], np.kron(np.eye(2), np.ones((3, 3))))
    # after the split each cluster averages its own updates: group A moves by +U, B by -U
    np.testing.assert_allclose(res.payloads[0]["w"], U[:4], rtol=1e-6)
    np.testing.assert_allclose(res.payloads[4]["w"], -U[:4], rtol=1e-6)
    # clusters of 3 whose updates agree never split further
    res = agg.aggregate(22, _updates(agg.sent, {c: U for c in range(6)}))
    assert len(agg.clusters) == 2 and res.metrics["splits"] == 0
    # agreeing updates: the mean norm is large -> no split
    _, _, agg2 = _gcfl_setup("gcfl")
    agg2.aggregate(21, _updates(agg2.sent, {c: U * (1 + 0.1 * c) for c in range(6)}))
    assert agg2.clusters == [list(range(6))]


def test_gcfl_weighted_cluster_average():
    cfg, initial, agg = _gcfl_setup("gcfl", k=3)
    dirs = {0: U, 1: 2 * U, 2: 4 * U}
    res = agg.aggregate(1, _updates(agg.sent, dirs, sizes={0: 1, 1: 1, 2: 2}))
    np.testing.assert_allclose(res.payloads[2]["w"], (0.25 + 0.5 + 2.0) * U[:4], rtol=1e-6)
    assert res.payloads[0] is res.payloads[1]  # one model per cluster


def test_gcfl_plus_splits_by_gradient_sequences_and_resumes():
    cfg, initial, agg = _gcfl_setup("gcfl+")
    opposed = {c: (U if c < 3 else -U) for c in range(6)}
    rising, falling = [1, 2, 3, 4, 5], [5, 4, 3, 2, 1]
    # groups differ in the trend of their gradient norms, cut across the direction groups
    group = {0: rising, 1: rising, 3: rising, 2: falling, 4: falling, 5: falling}
    for i, rnd in enumerate(range(17, 21)):
        agg.aggregate(rnd, _updates(agg.sent, opposed, {c: group[c][i] + 0.01 * c for c in range(6)}))
    assert agg.clusters == [list(range(6))]
    # resume mid-run through the engine's checkpoint path (numpy -> torch -> numpy)
    from fedgraph_flwr.engine import state_codec
    from fedgraph_flwr.engine.checkpoint import to_numpy as _to_numpy

    blob = state_codec.encode(agg.state_dict())
    _, _, resumed = _gcfl_setup("gcfl+")
    resumed.load_state_dict(_to_numpy(state_codec.decode(blob)))
    norms = {c: group[c][4] + 0.01 * c for c in range(6)}
    res = agg.aggregate(21, _updates(agg.sent, opposed, norms))
    res_b = resumed.aggregate(21, _updates(resumed.sent, opposed, norms))
    assert agg.clusters == [[0, 1, 3], [2, 4, 5]] == resumed.clusters
    assert payloads_equal(res.payloads, res_b.payloads)
    assert all(len(s) == 0 for s in agg.seqs.values())  # sequences restart after a split


def test_gcfl_dtw():
    assert gcfl.dtw_distance(np.array([0.0, 0, 1]), np.array([0.0, 1, 1])) == 0.0  # warping
    assert gcfl.dtw_distance(np.array([1.0, 2]), np.array([1.0, 2])) == 0.0
    assert gcfl.dtw_distance(np.array([0.0, 0]), np.array([3.0, 4])) == pytest.approx(5.0)
    d = gcfl.dtw_matrix(np.array([[1.0, 2, 3], [1, 2, 3], [3, 2, 1]]))
    assert d[0, 1] == 0 and d[0, 2] > 0 and np.allclose(d, d.T)


def test_gcfl_smoke_and_grad_norm_signature():
    cfg = make_config(gcfl.GCFLOptions, gcfl_warmup_rounds=0, gcfl_seq_length=2)
    log, agg = run_rounds(gcfl.GCFLTrainer, gcfl.GCFLAggregator, cfg)
    assert_smoke(log)
    for m in log[-1]["metrics"].values():
        assert m["grad_norm"] > 0
    assert all(len(s) in (0, 1, 2, 3) for s in agg.seqs.values())


# --- APFL -------------------------------------------------------------------------------


@pytest.mark.slow
def test_apfl_mixture_endpoints_and_adaptive_alpha():
    data = tiny_graph(4)
    cfg = make_config(apfl.APFLOptions, apfl_adaptive=False)
    trainer = apfl.APFLTrainer(data, cfg, NUM_CLASSES, CPU)
    with torch.no_grad():
        for p in trainer.local_model.parameters():
            p.add_(0.3)
    trainer.model.eval()
    trainer.local_model.eval()
    for alpha, ref_model in [(1.0, trainer.local_model), (0.0, trainer.model)]:
        trainer.alpha = torch.tensor(alpha)
        with torch.no_grad():
            assert torch.allclose(trainer.forward(), ref_model(data.x, data.edge_index), atol=1e-5)
    # fixed α stays put; without dropout the shared model w trains exactly like FedAvg's
    cfg_nodrop = cfg.with_keys({"dropout": 0.0})
    trainer = apfl.APFLTrainer(data, cfg_nodrop, NUM_CLASSES, CPU)
    fedavg_t = GCNTrainer(data, cfg_nodrop.with_keys({"algorithm": "fedavg"}), NUM_CLASSES, CPU)
    trainer.train(3)
    fedavg_t.train(3)
    assert float(trainer.alpha) == 0.25
    assert state_dicts_equal(trainer.model.state_dict(), fedavg_t.model.state_dict())
    assert not state_dicts_equal(trainer.local_model.state_dict(), fedavg_t.model.state_dict())
    # adaptive α moves and stays in [0, 1]
    ada = apfl.APFLTrainer(data, make_config(apfl.APFLOptions, apfl_alpha_lr=0.5),
                           NUM_CLASSES, CPU)
    ada.train(10)
    assert float(ada.alpha) != 0.25 and 0.0 <= float(ada.alpha) <= 1.0


@pytest.mark.slow
def test_apfl_smoke_local_state_persists():
    cfg = make_config(apfl.APFLOptions, apfl_alpha_lr=0.5)
    log, _ = run_rounds(apfl.APFLTrainer, apfl.APFLAggregator, cfg)
    assert_smoke(log)
    alphas = [[m["apfl_alpha"] for m in e["metrics"].values()] for e in log]
    assert alphas[0] != alphas[-1]  # α carried across rounds in local state and still moving


# --- FedProx smoke ------------------------------------------------------------------------


@pytest.mark.slow
def test_fedprox_smoke_matches_fedavg_when_mu_zero():
    # With one local step the proximal gradient is 0 (θ starts at the anchor): FedProx
    # differs from FedAvg only with several local epochs.
    cfg = make_config(fedprox.FedProxOptions, local_epochs=3)
    log, _ = run_rounds(fedprox.FedProxTrainer, fedprox.FedProxAggregator, cfg)
    assert_smoke(log)
    cfg0 = make_config(fedprox.FedProxOptions, fedprox_mu=0.0, local_epochs=3)
    log0, _ = run_rounds(fedprox.FedProxTrainer, fedprox.FedProxAggregator, cfg0)
    logavg, _ = run_rounds(GCNTrainer, FedAvgAggregator, cfg0.with_keys({"algorithm": "fedavg"}))
    assert payloads_equal(log0[-1]["result"].payloads, logavg[-1]["result"].payloads)
    assert not payloads_equal(log[-1]["result"].payloads, logavg[-1]["result"].payloads)


def test_fedpub_classifier_init_switch():
    """glorot (default): zero bias, draws as before; xavier: FED-PUB's [1, C] Xavier bias."""
    torch.manual_seed(0)
    default = fedpub.MaskedGCN(8, 16, 7)
    state = torch.get_rng_state()
    assert torch.equal(default.classifier.bias, torch.zeros(7))
    torch.manual_seed(0)
    fedpub.MaskedGCN(8, 16, 7, classifier_init="glorot")
    assert torch.equal(torch.get_rng_state(), state)
    xavier = fedpub.MaskedGCN(8, 16, 7, classifier_init="xavier")
    bias = xavier.classifier.bias.detach().clone()
    assert bias.abs().max() > 0.1 and bias.abs().max() <= (6 / 8) ** 0.5
    assert xavier.classifier.weight.abs().max() <= (6 / (16 + 7)) ** 0.5
    xavier.reset_parameters()
    assert not torch.equal(xavier.classifier.bias, bias)
    assert xavier.classifier.bias.abs().max() > 0.1
    with pytest.raises(ValueError, match="fedpub-classifier-init"):
        fedpub.MaskedGCN(8, 16, 7, classifier_init="he")
