"""CUFL (Kang and Park, CIKM 2025): curriculum subgraph FL with proxy-reconstruction similarity.

Reading: docs/reading/cufl.md (official code Kang-Min-Ku/CUFL, config/cufl_cora.yaml).

Client: FED-PUB's masked GCN (masks personal, never overwritten; L1 on the masks and a
proximal ``loc_l2 · ||θ - θ_received||_2`` term, as :mod:`.fedpub`), ReLU after every
convolution, a plain linear classifier, no dropout (the code's ``use_dropout: false``).
Each client keeps a *curriculum*: a learnable edge mask ``s ∈ [0, 1]^E`` over its own
edges, trained every ``cufl-train-cycle`` rounds by ``cufl-spcl-epochs`` Adam steps on
the self-paced loss::

    L(s) = Σ_e s_e (dec(z)_e - 1)² - pd · Σ_e s_e,   s clamped to [0, 1] after each step

(``dec``: the cosine decoder ``(cos(z_u, z_v) + 1) / 2`` of the model's last-layer
embeddings ``z``; ``pd`` the personalization degree, growing over the rounds). After each
curriculum update the selected edges ``s_e > cufl-select-threshold`` are counted; the
training graph is the selected edges weighted by ``(times selected / updates) / c_e``,
where ``c_e`` is an edge confidence from node difficulties (cross-entropy of a pretrained
model, ``exp(2·CE)`` over its minimum, 1 off the training nodes, ``c_uv = d_u d_v``).
Evaluation uses the full graph.

What leaves the client: the model (masks included, as FED-PUB's code uploads them), and as
its signature the average curriculum mask of a second curriculum run on the server's
random *proxy* graph (one value per proxy edge: a size fixed by the server, not by the
client's nodes; the bottom ``cufl-transfer-ratio`` quantile zeroed) and the client's
similarity scale λ (one number, from a greedy scheduler over its validation loss).

Server: ``S = cos(proxy vectors)``, client ``i``'s row ``W_i ∝ exp(λ_i S_i)`` (or
``S_i`` with ``cufl-agg-metric=linear``), ``θ_i ← Σ_j W_ij θ_j``: a mixing plan from
signatures only, so robust aggregation and CKKS apply to it.

Where CPU-cheap replaces the published pipeline: the official node difficulties come from
a separate 200-round FedProx run's per-client best model; here each client pretrains its
own copy locally for ``cufl-pretrain-epochs`` epochs before round 1 (docs/reading/cufl.md §5).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.utils import stochastic_blockmodel_graph

from ..core.mixing import MixingPlan, cosine_similarity, mix
from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.masked import MaskedGCNConv
from .base import Aggregator
from .fedpub import FedPubTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig

PROXY_KEY = "proxy-recon"
SCALE_KEY = "scale"
AGG_METRICS = ("exp", "linear")
PD_RULES = ("1", "2", "3")
TRANSFER_METHODS = ("ratio", "threshold")


@dataclass(frozen=True)
class CuflOptions(Options, prefix="cufl"):
    """CUFL's knobs (``cufl-*``); defaults = the official config/cufl_cora.yaml."""

    l1: float = option(1e-3, "L1 weight on the masks", low=0.0)
    loc_l2: float = option(1e-3, "weight of the proximal ||θ - θ_received||_2 term", low=0.0)
    reg_grad: bool = option(False, "false: the code's L1 and proximal terms, over detached tensors "
                            "(no gradient); true: with gradient, as FED-PUB's paper writes them")
    proxy_nodes: int = option(100, "nodes per random proxy graph", low=1)
    proxy_graphs: int = option(5, "number of random proxy graphs", low=1)
    proxy_p: float = option(0.1, "edge probability within a proxy graph", low=0.0, high=1.0)
    agg_metric: str = option("exp", "row weights exp(λ S) | linear: S, row-normalised",
                             choices=AGG_METRICS)
    filter: bool = option(False, "zero a row's weights below the row mean before normalising")
    init_scale: float = option(5.0, "initial similarity scale λ", low=0.0)
    min_scale: float = option(3.0, "smallest λ", low=0.0)
    max_scale: float = option(10.0, "largest λ", low=0.0)
    scale_factor: float = option(1.25, "λ is multiplied or divided by this on a change", low=1.0)
    scale_window: int = option(5, "rounds averaged by the λ scheduler", low=1)
    scale_patience: int = option(5, "improving (or not) rounds before λ changes", low=1)
    decoder: str = option("cosine", "edge decoder: cosine (cos+1)/2 | inner: sigmoid(z_u·z_v)",
                          choices=("cosine", "inner"))
    spcl_lr: float = option(0.05, "Adam lr of the client's curriculum mask", low=0.0)
    proxy_lr: float = option(5e-4, "Adam lr of the proxy curriculum mask", low=0.0)
    spcl_epochs: int = option(5, "curriculum Adam steps per update", low=1)
    warmup_epochs: int = option(5, "curriculum steps before round 1 (on the pretrained model)",
                                low=0)
    warmup_pd: float = option(1e-3, "personalization degree of the warm-up", low=0.0)
    base_pd: float = option(1.0, "final personalization degree", low=0.0)
    pd_rule: str = option("1", "pd schedule: 1 = base/(⌊2R/3⌋+1-r) up to ⌊2R/3⌋; 2 = base/(R+1-r); "
                          "3 = base·r/R + warmup", choices=PD_RULES)
    pd_rounds: int = option(100, "R of the pd schedule (the code uses the run's rounds: set it "
                            "to rounds)", low=1)
    train_cycle: int = option(5, "the client curriculum is updated every this many rounds", low=1)
    proxy_cycle: int = option(5, "the proxy curriculum is updated every this many rounds", low=1)
    select_threshold: float = option(0.3, "an edge is trained on while s_e > this", low=0.0,
                                     high=1.0)
    transfer_method: str = option("ratio", "ratio: zero the bottom quantile of the proxy vector; "
                                  "threshold: zero entries below cufl-transfer-threshold",
                                  choices=TRANSFER_METHODS)
    transfer_ratio: float = option(0.3, "quantile zeroed before sending", low=0.0, high=1.0)
    transfer_threshold: float = option(0.4, "value below which entries are zeroed", low=0.0)
    confidence_scale: float = option(2.0, "node difficulty = exp(scale · CE)", low=0.0)
    confidence_norm: str = option("min", "difficulties divided by their min | sum",
                                  choices=("min", "sum"))
    use_confidence: bool = option(True, "divide edge weights by the edge confidence")
    pretrain_epochs: int = option(100, "local pretraining epochs of the difficulty model "
                                  "(replaces the code's separate FedProx run)", low=0)


class CuflGCN(nn.Module):
    """The code's MaskedGCN: masked GCN convolutions, each followed by ReLU, then a plain
    ``nn.Linear`` classifier (``use_classifier_mask: false``), no dropout.

    x [n, d], edge_index [2, m], edge_weight [m] or None -> logits [n, C], or with
    ``embed`` the last convolution's ReLU output [n, hidden] (the code's ``get_feature``).
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2) -> None:
        super().__init__()
        dims = [in_channels] + [hidden_channels] * num_layers
        # Not cached: the curriculum changes the training graph from round to round.
        self.convs = nn.ModuleList(MaskedGCNConv(a, b, cached=False)
                                   for a, b in zip(dims[:-1], dims[1:]))
        self.classifier = nn.Linear(hidden_channels, out_channels)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for conv in cast(Iterable[MaskedGCNConv], self.convs):
            conv.reset_parameters()
        self.classifier.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                edge_weight: torch.Tensor | None = None, embed: bool = False) -> torch.Tensor:
        """Logits [n, C], or with ``embed`` the last layer's features [n, hidden]."""
        for conv in self.convs:
            x = F.relu(conv(x, edge_index, edge_weight))
        return x if embed else self.classifier(x)


def decode(z: torch.Tensor, edge_index: torch.Tensor, decoder: str) -> torch.Tensor:
    """Edge scores in [0, 1] [m] from node features z [n, h]: cosine ``(cos + 1) / 2`` or
    inner product ``sigmoid(z_u · z_v)``."""
    if decoder == "cosine":
        z = z / z.norm(dim=-1, keepdim=True)  # a zero row gives NaN in the code too; guarded below
        value = (z[edge_index[0]] * z[edge_index[1]]).sum(dim=-1)
        return torch.nan_to_num((value + 1) / 2, nan=0.5)
    return torch.sigmoid((z[edge_index[0]] * z[edge_index[1]]).sum(dim=-1))


def spcl_loss(s: torch.Tensor, scores: torch.Tensor, pd: float) -> torch.Tensor:
    """The self-paced loss ``Σ s_e (score_e - 1)² - pd Σ s_e`` (the code's "increase")."""
    return torch.sum(s * (scores - 1.0) ** 2) - pd * torch.sum(s)


def personalization_degree(rule: str, base: float, warmup: float, rounds: int, r: int) -> float:
    """pd at 0-based round ``r`` of ``rounds`` (the code's ``update_pd``)."""
    if rule == "1":
        knee = rounds * 2 // 3
        return base / (knee + 1 - r) if r < knee else base
    if rule == "2":
        return base / (rounds + 1 - r) if r < rounds else base
    return base * r / rounds + warmup


class Curriculum:
    """A learnable edge mask over one graph's edges and its running counts (the code's SPCL).

    ``s`` [m] starts at zero; ``selected_count`` [m] counts, per edge, the updates after
    which it was selected, ``s_sum`` [m] sums ``s`` over them, ``updates`` counts them
    (from 1e-8, so before the first update every weight is 0, as in the code)."""

    EPS = 1e-8

    def __init__(self, num_edges: int, lr: float, weight_decay: float, device: torch.device) -> None:
        self.s = torch.zeros(num_edges, device=device, requires_grad=True)
        self.optimizer = torch.optim.Adam([self.s], lr=lr, weight_decay=weight_decay)
        self.selected_count = torch.zeros(num_edges, device=device)
        self.s_sum = torch.zeros(num_edges, device=device)
        self.updates = self.EPS

    def fit(self, scores: torch.Tensor, pd: float, steps: int) -> float:
        """``steps`` Adam steps on :func:`spcl_loss`, clamping ``s`` to [0, 1] after each."""
        loss = torch.zeros(())
        for _ in range(steps):
            self.optimizer.zero_grad()
            loss = spcl_loss(self.s, scores, pd)
            loss.backward()
            self.optimizer.step()
            with torch.no_grad():
                self.s.clamp_(0.0, 1.0)
        return float(loss.detach())

    @torch.no_grad()
    def record(self, threshold: float) -> None:
        """Count this update's selection (the code's ``predict(update_accumul=True)``)."""
        self.s_sum += self.s.detach()
        self.selected_count += (self.s > threshold).float()
        self.updates += 1

    @torch.no_grad()
    def selection(self, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(bool mask of the selected edges [m], their weights count/updates [m_sel])."""
        chosen = self.s.detach() > threshold
        return chosen, self.selected_count[chosen] / self.updates

    def state(self) -> dict[str, Any]:
        """Everything to resume it."""
        return {"s": self.s.detach().clone(), "optimizer": self.optimizer.state_dict(),
                "selected_count": self.selected_count, "s_sum": self.s_sum,
                "updates": self.updates}

    def load(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`."""
        with torch.no_grad():
            self.s.copy_(state["s"])
        self.optimizer.load_state_dict(state["optimizer"])
        # copies: the counts grow in place, and the saved state may be a live trainer's
        self.selected_count = state["selected_count"].to(self.s.device, copy=True)
        self.s_sum = state["s_sum"].to(self.s.device, copy=True)
        self.updates = float(state["updates"])


class ScaleScheduler:
    """The code's ``VectorGSS``: λ moves by ``factor`` in its current direction after
    ``patience`` rounds whose windowed mean validation loss set a new best, and turns
    round (then moves) after ``patience`` rounds that did not; clipped to [min, max]."""

    def __init__(self, options: CuflOptions) -> None:
        self.options = options
        self.scale = options.init_scale
        self.history: list[float] = []
        self.best = float("inf")
        self.num_good = self.num_bad = 0
        self.increase = True

    def observe(self, val_loss: float) -> None:
        """One round's validation loss (lower is better: ``prefer_larger: false``)."""
        o = self.options
        self.history = (self.history + [val_loss])[-o.scale_window:]
        mean = float(np.mean(self.history))
        if mean < self.best:
            self.best, self.num_good, self.num_bad = mean, self.num_good + 1, 0
        else:
            self.num_good, self.num_bad = 0, self.num_bad + 1
        if self.num_good >= o.scale_patience:
            self._move()
            self.num_good = 0
        elif self.num_bad >= o.scale_patience:
            self.increase = not self.increase
            self._move()
            self.num_bad = 0
        self.scale = min(max(self.scale, o.min_scale), o.max_scale)

    def _move(self) -> None:
        f = self.options.scale_factor
        self.scale = self.scale * f if self.increase else self.scale / f

    def state(self) -> dict[str, Any]:
        """Everything to resume it."""
        return {"scale": self.scale, "history": list(self.history), "best": self.best,
                "num_good": self.num_good, "num_bad": self.num_bad, "increase": self.increase}

    def load(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.scale, self.history, self.best = state["scale"], list(state["history"]), state["best"]
        self.num_good, self.num_bad = state["num_good"], state["num_bad"]
        self.increase = state["increase"]


def proxy_graph(num_features: int, options: CuflOptions, seed: int) -> Data:
    """The server's random proxy graph, a pure function of (seed, sizes, feature width):
    ``cufl-proxy-graphs`` blocks of ``cufl-proxy-nodes`` nodes, undirected edges with
    probability ``cufl-proxy-p`` inside a block, none across; x ~ N(0, 1) [N, d]."""
    n_graphs, n_nodes = options.proxy_graphs, options.proxy_nodes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probs = torch.eye(n_graphs) * options.proxy_p
        edge_index = stochastic_blockmodel_graph([n_nodes] * n_graphs, probs, directed=False)
        x = torch.randn(n_nodes * n_graphs, num_features)
    return Data(x=x, edge_index=edge_index)


def edge_confidence(logits: torch.Tensor, data: Data, options: CuflOptions) -> torch.Tensor:
    """c_uv = d_u d_v [m], d = exp(scale · CE) normalised by its min (or sum), 1 off the
    training nodes: hard edges get small weights (the code's ``init_state``)."""
    ce = F.cross_entropy(logits, data.y, reduction="none").detach()
    d = torch.exp(options.confidence_scale * ce)
    d = d / (d.min() if options.confidence_norm == "min" else d.sum())
    d = torch.where(data.train_mask, d, torch.ones_like(d))
    return d[data.edge_index[0]] * d[data.edge_index[1]]


class CuflTrainer(FedPubTrainer):
    """Masked GCN trained on its curriculum's edges; signs with its proxy curriculum."""

    options_class = CuflOptions  # type: ignore[assignment]  # FedPub's trainer, CUFL's keys
    options: CuflOptions  # type: ignore[assignment]
    curriculum: Curriculum | None = None
    proxy_curriculum: Curriculum | None = None
    confidence: torch.Tensor | None = None

    @classmethod
    def build_model(  # type: ignore[override]  # FED-PUB's training, the code's own model
            cls, num_features: int, num_classes: int, config: ClientConfig) -> CuflGCN:
        """The code's MaskedGCN (:class:`CuflGCN`)."""
        return CuflGCN(num_features, config.hidden, num_classes, num_layers=config.num_layers)

    @classmethod
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfig
                         ) -> dict[str, tuple[int, ...]]:
        """One value per proxy edge (the server's graph) and the scale λ."""
        options = cast(CuflOptions, config.options)
        edges = int(proxy_graph(num_features, options, config.seed).edge_index.shape[1])
        return {PROXY_KEY: (edges,), SCALE_KEY: (1,)}

    def __init__(self, data: Data, config: ClientConfig, num_classes: int,
                 device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        self.scheduler = ScaleScheduler(self.options)
        self.proxy = proxy_graph(int(data.num_features), self.options, config.seed).to(device)
        self.pd = self.options.warmup_pd

    def _start(self) -> None:
        """Before round 1 (the code's ``init_state``): pretrain a difficulty model, derive
        the edge confidences, warm the client curriculum up on its features."""
        o, data = self.options, self.data
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed + 1)
            pretrained = self.build_model(int(data.num_features), self.num_classes,
                                          self.config).to(self.device)
        opt = torch.optim.Adam(pretrained.parameters(), lr=self.config.lr,
                               weight_decay=self.config.weight_decay)
        pretrained.train()
        for _ in range(o.pretrain_epochs):
            opt.zero_grad()
            logits = pretrained(data.x, data.edge_index)
            F.cross_entropy(logits[data.train_mask], data.y[data.train_mask]).backward()
            opt.step()
        pretrained.eval()
        with torch.no_grad():
            self.confidence = edge_confidence(pretrained(data.x, data.edge_index), data, o)
            z = pretrained(data.x, data.edge_index, embed=True)
        wd = self.config.weight_decay
        self.curriculum = Curriculum(int(data.edge_index.shape[1]), o.spcl_lr, wd, self.device)
        self.proxy_curriculum = Curriculum(int(self.proxy.edge_index.shape[1]), o.proxy_lr, wd,
                                           self.device)
        self.curriculum.fit(decode(z, data.edge_index, o.decoder), o.warmup_pd, o.warmup_epochs)

    def _training_graph(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The selected edges [2, m_sel] and their weights [m_sel]."""
        assert self.curriculum is not None and self.confidence is not None
        chosen, weight = self.curriculum.selection(self.options.select_threshold)
        if self.options.use_confidence:
            weight = weight / self.confidence[chosen]
        return self.data.edge_index[:, chosen], weight

    def train(self, epochs: int) -> dict[str, float]:
        """λ from the received model's validation loss, local epochs on the curriculum's
        graph, then the curriculum and proxy-curriculum updates of this round."""
        if self.curriculum is None:
            self._start()
        assert self.curriculum is not None and self.proxy_curriculum is not None
        o, data = self.options, self.data
        r = max(self.config.server_round - 1, 0)  # the code's 0-based round
        self.model.eval()
        with torch.no_grad():  # the code's validate(mode="local"): full graph, val nodes
            logits = self.model(data.x, data.edge_index)
            self.scheduler.observe(float(F.cross_entropy(logits[data.val_mask],
                                                         data.y[data.val_mask])))
        edge_index, edge_weight = self._training_graph()
        self.model.train()
        loss_value = float("nan")
        for _ in range(epochs):
            self.optimizer.zero_grad()
            logits = self.model(data.x, edge_index, edge_weight)
            loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            loss = loss + self.extra_loss()
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.detach())
        self.pd = personalization_degree(o.pd_rule, o.base_pd, o.warmup_pd, o.pd_rounds, r)
        self.model.eval()
        if r % o.train_cycle == 0:
            with torch.no_grad():
                z = self.model(data.x, edge_index, edge_weight, embed=True)
            self.curriculum.fit(decode(z, data.edge_index, o.decoder), self.pd, o.spcl_epochs)
            self.curriculum.record(o.select_threshold)
        if r % o.proxy_cycle == 0:
            proxy = self.proxy
            chosen, weight = self.proxy_curriculum.selection(o.select_threshold)
            with torch.no_grad():
                z = self.model(proxy.x, proxy.edge_index[:, chosen], weight, embed=True)
            self.proxy_curriculum.fit(decode(z, proxy.edge_index, o.decoder), self.pd,
                                      o.spcl_epochs)
            self.proxy_curriculum.record(o.select_threshold)
        return {"train_loss": loss_value, "mask_sparsity": self.mask_sparsity(),
                "curriculum_edges": float(edge_index.shape[1] / max(data.edge_index.shape[1], 1)),
                "scale": float(self.scheduler.scale), "pd": float(self.pd)}

    def signature(self) -> Arrays:
        """The proxy curriculum's mean mask, bottom quantile zeroed [proxy edges], and λ [1]."""
        if self.proxy_curriculum is None:  # before any training (a shape check)
            vector = np.zeros(int(self.proxy.edge_index.shape[1]), dtype=np.float32)
        else:
            vector = (self.proxy_curriculum.s_sum / self.proxy_curriculum.updates).cpu().numpy()
            vector = transfer_vector(vector.astype(np.float64), self.options).astype(np.float32)
        return {PROXY_KEY: vector, SCALE_KEY: np.array([self.scheduler.scale], dtype=np.float32)}

    def local_state(self) -> dict[str, Any]:
        """The model, optimizers, curricula, confidences, pd and the λ scheduler."""
        state = super().local_state()
        if self.curriculum is not None and self.proxy_curriculum is not None:
            state |= {"curriculum": self.curriculum.state(),
                      "proxy_curriculum": self.proxy_curriculum.state(),
                      "confidence": self.confidence}
        return state | {"scheduler": self.scheduler.state(), "pd": self.pd}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`local_state`."""
        super().load_local_state(state)
        if "curriculum" in state:
            o, wd = self.options, self.config.weight_decay
            self.curriculum = Curriculum(int(self.data.edge_index.shape[1]), o.spcl_lr, wd,
                                         self.device)
            self.curriculum.load(state["curriculum"])
            self.proxy_curriculum = Curriculum(int(self.proxy.edge_index.shape[1]), o.proxy_lr,
                                               wd, self.device)
            self.proxy_curriculum.load(state["proxy_curriculum"])
            self.confidence = state["confidence"].to(self.device)
        self.scheduler.load(state["scheduler"])
        self.pd = float(state["pd"])


def transfer_vector(vector: np.ndarray, options: CuflOptions) -> np.ndarray:
    """Entries below the ``cufl-transfer-ratio`` quantile (or ``cufl-transfer-threshold``)
    set to 0 (the code's ``transfer_to_server``)."""
    out = vector.copy()
    if options.transfer_method == "ratio":
        out[out < np.quantile(out, options.transfer_ratio)] = 0.0
    else:
        out[out < options.transfer_threshold] = 0.0
    return out


def cufl_weights(vectors: np.ndarray, scales: np.ndarray, options: CuflOptions) -> np.ndarray:
    """Row-stochastic [K, K]: ``exp(λ_i cos(v_i, v_j))`` (or the cosine itself with
    ``linear``), optionally zeroed below the row mean, each row divided by its sum (the
    code's ``get_sim_matrix``)."""
    sim = cosine_similarity(vectors, clip=False)
    if options.agg_metric == "exp":
        logits = scales[:, None] * sim
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))  # same ratios, no overflow
    else:
        weights = sim.copy()
    if options.filter:
        weights[weights < weights.mean(axis=1, keepdims=True)] = 0.0
    return weights / weights.sum(axis=1, keepdims=True)


class CuflAggregator(Aggregator):
    """Personalized averages weighted by the proxy-curriculum similarity (exp(λ S), rows)."""

    options_class = CuflOptions
    options: CuflOptions

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Each client's model mixed by its row of :func:`cufl_weights`."""
        ids = sorted(updates)
        plan = self.mixing_plan(server_round, updates)
        mixed = mix(plan.matrices[0], [updates[c].arrays for c in ids], self.mix_dtype)
        return AggregateResult(payloads=dict(zip(ids, mixed)), diagnostics=plan.diagnostics,
                               metrics=plan.metrics)

    def mixing_plan(self, server_round: int, updates: dict[int, ClientUpdate]) -> MixingPlan:
        """The weights from the signatures alone (proxy vectors and λ)."""
        o = self.options
        ids = sorted(updates)
        vectors = np.stack([np.asarray(updates[c].signature[PROXY_KEY], dtype=np.float64)
                            for c in ids])
        # λ is the client's word: held to the scheduler's own range, as a hostile one could
        # send any number.
        scales = np.clip([float(np.asarray(updates[c].signature[SCALE_KEY]).reshape(-1)[0])
                          for c in ids], o.min_scale, o.max_scale)
        weights = cufl_weights(vectors, np.asarray(scales, dtype=np.float64), o)
        sim = cosine_similarity(vectors, clip=False)
        off_diag = sim[~np.eye(len(ids), dtype=bool)]
        return MixingPlan(
            ids, weights[None],
            diagnostics={"similarity": sim, "mixing": weights},
            metrics={"mean-similarity": float(off_diag.mean()) if off_diag.size else 1.0,
                     "mean-self-weight": float(np.diag(weights).mean()),
                     "mean-scale": float(np.mean(scales))},
        )


ALGORITHM = Algorithm("cufl", CuflTrainer, CuflAggregator, CuflOptions)
