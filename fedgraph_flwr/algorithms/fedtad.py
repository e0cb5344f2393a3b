"""FedTAD (Zhu et al., IJCAI 2024): topology-aware data-free knowledge distillation for subgraph FL.

Clients train their GCN as in FedAvg. Once, each client measures its class-wise knowledge
reliability (CKR): for every training node i, the mean cosine similarity between its
feature-and-topology embedding and those of its neighbours (itself counted as 1),
``(Σ_j cos(e_i, e_j) + 1)/(deg_i + 1)``, summed per class; e = [x, w] with w the node ids
visited by random walks of lengths 1..L from the node. The server first averages the
models (FedAvg, weights ∝ training nodes), then for ``fedtad-glb-epochs`` epochs:

1. trains a class-conditional generator (:class:`~fedgraph_flwr.nn.fedtad_generator.ConditionalGenerator`)
   on ``λ₁·Σ_k Σ_c r_kc·CE(f_k(G), c) − Σ_k Σ_c r_kc·|f(G) − f_k(G)|₁,c + λ₂·K·L_div``:
   pseudo nodes each client's model classifies as their class (weighted by its CKR r_kc),
   on which the global model f disagrees with the clients, and diverse (L_div: exp of
   minus the mean product of pairwise noise and feature distances); G is a top-k cosine
   graph over the generated features;
2. distils the clients into the global model: ``fedtad-it-d`` Adam steps on
   ``Σ_k Σ_c r_kc·|f(G) − f_k(G)|₁,c`` (per-class mean absolute difference of logits, or
   of the last layer's output on generated hidden features with ``fedtad-distill=rep``).

Leaves the client each round: the GCN's weights and its CKR [C] (the signature, one
number per class): nothing per node.

Official code: zyl24/FedTAD @ 3285d54 (``train_fedtad.py``, ``util/task_util.py``; its
defaults: 5 server epochs of 1 generator and 5 model steps, Adam 1e-3 for both, 100
pseudo nodes, noise 32, top-5, λ₁ = λ₂ = 1, walks up to 5). Also read: OpenFGL's
``flcore/fedtad`` (openfgl-lib 1.1.0), the same algorithm. Switches where they differ or
where the code differs from what it describes:

- ``fedtad-ckr-norm``: ``clients`` (default; official: r_kc = CKR_kc / Σ_k' CKR_k'c, each
  class's reliability shared out over the clients) | ``classes`` (OpenFGL: each client's
  CKR divided by its own sum over classes).
- ``fedtad-evaluate``: ``before-train`` (default; the official code scores the server's
  distilled model on each client before local training) | ``after-train`` (OpenFGL: the
  locally trained model).
- ``fedtad-walk``: ``code`` (default; both codes build the walk's transition as the
  elementwise product A ∘ D⁺, which keeps only the diagonal 1/d_i, and then draw the next
  node from a softmax over that row: it stays with probability e^{1/d}/(e^{1/d} + N − 1)
  and otherwise jumps to a uniformly drawn other node, so w is mostly random node ids)
  | ``transition`` (a walk along the client's edges, D⁻¹A with self-loops, what the
  code's names describe). The walks use a generator seeded by the run's seed and the
  partition, so the CKR is reproducible (the codes draw from torch's global stream).

Not carried over: the official GCN applies dropout even in eval mode (``F.dropout``
without ``training=``); here, as in OpenFGL, the server's client models run in eval mode.
The codes weight FedAvg by node count; here by training nodes (the same under a fixed
per-client split ratio).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv
from torch_geometric.utils import add_self_loops

from ..core.options import ConfigError, Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.fedtad_generator import ConditionalGenerator, knn_pseudo_graph
from ..nn.gcn import GCN
from .base import Aggregator
from .fedavg import GCNTrainer, client_weights
from .supervised import EVALUATE_POINTS, EvaluatesReceivedModel

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

CKR_KEY = "ckr"
#: Edges per chunk of the CKR's cosine similarities (bounds memory at chunk × features).
EDGE_CHUNK = 65536


# `fedtad-reproduce`: the profiles, the default first (docs/methods/fedtad.md).
PUBLISHED = (
    "configs/paper/openfgl-side-by-side-cora.yaml runs both on OpenFGL's files: `official` as "
    "shipped (the server's model scored) and `openfgl`."
)
PROFILES: dict[str, dict[str, Any]] = {
    "official": {"walk": "code", "ckr_norm": "clients", "evaluate": "before-train"},
    "openfgl": {"ckr_norm": "classes", "evaluate": "after-train"},
}


@dataclass(frozen=True)
class FedTADOptions(Options, prefix="fedtad", profiles=PROFILES, published=PUBLISHED):
    """FedTAD's knobs (``fedtad-*``), the official code's defaults."""

    glb_epochs: int = option(5, "server distillation epochs a round (official --glb_epochs)", low=0)
    it_g: int = option(1, "generator steps per server epoch (--it_g)", low=0)
    it_d: int = option(5, "global-model steps per server epoch (--it_d)", low=0)
    lr_g: float = option(1e-3, "generator Adam lr (--lr_g)", low=0.0, low_inclusive=False)
    lr_d: float = option(1e-3, "global-model Adam lr on the server (--lr_d)", low=0.0,
                         low_inclusive=False)
    num_gen: int = option(100, "pseudo nodes per server epoch (--num_gen)", low=1)
    noise_dim: int = option(32, "generator noise width", low=1)
    topk: int = option(5, "neighbours per pseudo node in the pseudo graph (--topk)", low=1)
    lam1: float = option(1.0, "weight λ₁ of the generator's semantic loss (--lam1)", low=0.0)
    lam2: float = option(1.0, "weight λ₂ of the generator's diversity loss (--lam2)", low=0.0)
    distill: str = option("raw", "what is distilled: raw (logits on generated features) | rep "
                          "(the last layer on generated hidden features) (--fedtad_mode)",
                          choices=("raw", "rep"))
    walk_length: int = option(5, "longest random walk of the CKR's topology embedding", low=1)
    walk: str = option("code", "CKR walk: code (the codes' A∘D⁺ softmax: near-uniform jumps) | "
                       "transition (along the edges)", choices=("code", "transition"))
    ckr_norm: str = option("clients", "CKR normalisation: clients (official: per class over "
                           "clients) | classes (OpenFGL: per client over classes)",
                           choices=("clients", "classes"))
    evaluate: str = option("before-train", "scored model: before-train (official: the server's) | "
                           "after-train (OpenFGL: the locally trained one)", choices=EVALUATE_POINTS)


def random_walk_ids(edge_index: torch.Tensor, num_nodes: int, max_length: int, walk: str,
                    generator: torch.Generator) -> torch.Tensor:
    """[N, L(L+1)/2] node ids of one walk of each length 1..L from every node (the start
    first), as the codes' ``cal_topo_emb``; ``walk`` as ``fedtad-walk``."""
    loops, _ = add_self_loops(edge_index, num_nodes=num_nodes)
    row, col = loops
    degree = torch.bincount(row, minlength=num_nodes)  # the dense A's row sums
    if walk == "code":
        self_weight = torch.bincount(row[row == col], minlength=num_nodes).double()
        stay_logit = self_weight / degree.double()  # diag(A ∘ D⁺)
        stay = stay_logit.exp() / (stay_logit.exp() + (num_nodes - 1))
    else:
        order = torch.argsort(row * num_nodes + col)
        targets = col[order]
        start = torch.cumsum(degree, 0) - degree
    columns = []
    nodes = torch.arange(num_nodes)
    for length in range(1, max_length + 1):
        current = nodes
        columns.append(current)
        for _ in range(length - 1):
            u = torch.rand(num_nodes, generator=generator, dtype=torch.float64)
            if walk == "code":
                other = torch.randint(0, max(num_nodes - 1, 1), (num_nodes,), generator=generator)
                other = other + (other >= current).long()  # uniform over the other nodes
                current = torch.where(u < stay[current], current, other) if num_nodes > 1 else current
            else:
                pick = (u * degree[current].double()).long().clamp_max(degree[current] - 1)
                current = targets[start[current] + pick]
            columns.append(current)
    return torch.stack(columns, dim=1)


def class_knowledge_reliability(x: torch.Tensor, edge_index: torch.Tensor, y: torch.Tensor,
                                train_mask: torch.Tensor, num_classes: int, walk_ids: torch.Tensor
                                ) -> torch.Tensor:
    """CKR [C]: Σ over training nodes i of class c of (Σ_{(i,j)} cos(e_i, e_j) + 1)/(deg_i + 1),
    e = [x, walk ids], (i, j) the edges leaving i (the codes' ``edge_index[0] == i``)."""
    emb = torch.cat((x.double(), walk_ids.double()), dim=1)
    src, dst = edge_index
    cos = torch.empty(src.numel(), dtype=torch.float64)
    for lo in range(0, src.numel(), EDGE_CHUNK):
        s, d = src[lo:lo + EDGE_CHUNK], dst[lo:lo + EDGE_CHUNK]
        cos[lo:lo + EDGE_CHUNK] = F.cosine_similarity(emb[s], emb[d], dim=1)
    n = x.size(0)
    total = torch.zeros(n, dtype=torch.float64).index_add_(0, src, cos)
    degree = torch.bincount(src, minlength=n).double()
    node_kr = (total + 1.0) / (degree + 1.0)
    train = train_mask.nonzero().view(-1)
    return torch.zeros(num_classes, dtype=torch.float64).index_add_(0, y[train], node_kr[train])


class FedTADTrainer(EvaluatesReceivedModel, GCNTrainer):
    """A GCN trained as in FedAvg; signs its CKR [C], measured once."""

    options_class = FedTADOptions
    options: FedTADOptions
    ckr: torch.Tensor | None = None

    def train(self, epochs: int) -> dict[str, float]:
        """Score the received model (``before-train``), then train as FedAvg."""
        self.score_received_model()
        return super().train(epochs)

    def class_reliability(self) -> torch.Tensor:
        """The CKR [C] of this client (computed on first use, then kept in the local state)."""
        if self.ckr is None:
            data = self.data.cpu() if self.data.x.is_cuda else self.data
            rng = torch.Generator().manual_seed(
                int(self.config.seed) * 1_000_003 + max(int(self.config.partition_id), 0))
            walks = random_walk_ids(data.edge_index, data.num_nodes, self.options.walk_length,
                                    self.options.walk, rng)
            self.ckr = class_knowledge_reliability(data.x, data.edge_index, data.y, data.train_mask,
                                                   self.num_classes, walks)
        return self.ckr

    @classmethod
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfig
                         ) -> dict[str, tuple[int, ...]]:
        """The CKR [C]."""
        return {CKR_KEY: (num_classes,)}

    def signature(self) -> Arrays:
        """The CKR, un-normalised (the server normalises it by ``fedtad-ckr-norm``)."""
        return {CKR_KEY: self.class_reliability().numpy().astype(np.float32)}

    def local_state(self) -> dict[str, Any]:
        """The base state plus the CKR."""
        return {**super().local_state(), "ckr": self.class_reliability()}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.ckr = state["ckr"]


def server_gcn(num_features: int, hidden: int, num_classes: int, num_layers: int, dropout: float) -> GCN:
    """The clients' GCN without the cached adjacency (every pseudo graph is new)."""
    return GCN(num_features, hidden, num_classes, num_layers=num_layers, dropout=dropout,
               conv=lambda a, b: GCNConv(a, b, cached=False))


def normalised_reliability(ckr: np.ndarray, norm: str) -> np.ndarray:
    """r [K, C] from the clients' CKRs [K, C] (negative entries, from dp noise, count as 0)."""
    ckr = np.clip(ckr.astype(np.float64), 0.0, None)
    axis = 0 if norm == "clients" else 1
    total = ckr.sum(axis=axis, keepdims=True)
    return np.divide(ckr, total, out=np.zeros_like(ckr), where=total > 0)


def pseudo_labels(num_gen: int, num_classes: int) -> torch.Tensor:
    """[num_gen] class ids, ⌊num_gen/C⌋ per class in order, the remainder to the last class."""
    per_class = num_gen // num_classes
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    return torch.cat((labels, torch.full((num_gen - labels.numel(),), num_classes - 1)))


def diversity_loss(noise: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """exp(−mean_ij d_noise(i, j)·d_feat(i, j)): d_noise the mean squared difference of the
    noises, d_feat the mean absolute difference of the features (the codes' ``DiversityLoss('l1')``)."""
    noise_dist = torch.cdist(noise, noise).pow(2) / noise.size(1)
    feature_dist = torch.cdist(features, features, p=1) / features.size(1)
    return torch.exp(torch.mean(-noise_dist * feature_dist))


def classwise_l1(global_pred: torch.Tensor, local_pred: torch.Tensor, masks: list[torch.Tensor],
                 weights: torch.Tensor) -> torch.Tensor:
    """Σ_c weights_c · mean over class c's rows of the mean |global − local| over dimensions."""
    diff = (global_pred - local_pred).abs().mean(dim=1)
    return sum(weights[c] * diff[m].mean() for c, m in enumerate(masks))  # type: ignore[return-value]


class FedTADAggregator(Aggregator):
    """FedAvg, then data-free distillation of the clients' models into the global one."""

    options_class = FedTADOptions
    options: FedTADOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        opts = self.options
        if config.gnn != "gcn" or config.num_layers < 2:
            raise ConfigError("fedtad distils a GCN of at least 2 layers (gnn=gcn, num-layers >= 2)")
        first, last = initial["convs.0.lin.weight"], initial[f"convs.{config.num_layers - 1}.lin.weight"]
        self.num_features, self.num_classes = int(first.shape[1]), int(last.shape[0])
        if opts.num_gen < self.num_classes:
            raise ConfigError(f"fedtad-num-gen must be at least the number of classes "
                              f"({self.num_classes}), got {opts.num_gen}")
        if opts.topk > opts.num_gen:
            raise ConfigError(f"fedtad-topk must be at most fedtad-num-gen ({opts.num_gen})")
        width = self.num_features if opts.distill == "raw" else config.hidden
        with torch.random.fork_rng(devices=[]):  # the generator's initial weights, by the seed
            torch.manual_seed(config.seed)
            self.model = self.build_gcn()
            self.generator = ConditionalGenerator(opts.noise_dim, self.num_classes, width)
        self.model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in initial.items()})
        self.model_optimizer = torch.optim.Adam(self.model.parameters(), lr=opts.lr_d,
                                                weight_decay=config.weight_decay)
        self.generator_optimizer = torch.optim.Adam(self.generator.parameters(), lr=opts.lr_g,
                                                    weight_decay=config.weight_decay)

    def build_gcn(self) -> GCN:
        """A GCN of the clients' shape."""
        cfg = self.config
        return server_gcn(self.num_features, cfg.hidden, self.num_classes, cfg.num_layers, cfg.dropout)

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """FedAvg of the models, then ``glb-epochs`` of generator and distillation steps."""
        ids = sorted(updates)
        weights = client_weights(updates, "train")
        with torch.no_grad():
            for name, param in self.model.state_dict().items():
                mean = sum(w * np.asarray(updates[c].arrays[name], np.float64) for w, c in zip(weights, ids))
                param.copy_(torch.as_tensor(mean, dtype=param.dtype))
        ckr = np.stack([np.asarray(updates[c].signature[CKR_KEY], np.float64) for c in ids])
        reliability = torch.as_tensor(normalised_reliability(ckr, self.options.ckr_norm),
                                      dtype=torch.float32)
        teachers = []
        for c in ids:
            with torch.device("meta"):  # no initialisation: the client's weights overwrite it
                teacher = self.build_gcn()
            teacher = teacher.to_empty(device="cpu")
            teacher.load_state_dict({k: torch.as_tensor(np.asarray(updates[c].arrays[k]))
                                     for k in teacher.state_dict()})
            teacher.eval().requires_grad_(False)
            teachers.append(teacher)
        # The server's own draws (noise, the global model's dropout), isolated from the
        # process's stream and fixed by the run's seed and the round, so resume repeats them.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed * 1_000_003 + server_round)
            losses = self.distill(teachers, reliability)
        payload = {n: p.detach().cpu().numpy().astype(self.initial[n].dtype)
                   for n, p in self.model.state_dict().items()}
        return AggregateResult(payloads={c: payload for c in self.client_ids}, metrics=losses)

    def predict(self, model: GCN, features: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Logits of ``model`` on the pseudo graph (raw), or its last layer's output (rep)."""
        if self.options.distill == "rep":
            return model.convs[-1](features, edge_index)
        return model(features, edge_index)

    def distill(self, teachers: list[GCN], reliability: torch.Tensor) -> dict[str, float]:
        """The official server loop; returns the last generator loss and the round's first
        and last distillation losses."""
        opts = self.options
        labels = pseudo_labels(opts.num_gen, self.num_classes)
        masks = [labels == c for c in range(self.num_classes)]
        loss_g = loss_d = torch.zeros(())
        first_d: float | None = None
        for _ in range(opts.glb_epochs):
            z = torch.randn(opts.num_gen, opts.noise_dim)
            self.generator.train()
            self.model.eval()
            for _ in range(opts.it_g):
                self.generator_optimizer.zero_grad()
                features = self.generator(z, labels)
                graph = knn_pseudo_graph(features, opts.topk)
                global_pred = self.predict(self.model, features, graph)
                semantic = divergence = torch.zeros(())
                for k, teacher in enumerate(teachers):
                    local_pred = self.predict(teacher, features, graph)
                    per_class_ce = torch.stack([F.cross_entropy(local_pred[m], labels[m]) for m in masks])
                    semantic = semantic + (reliability[k] * per_class_ce).sum()
                    divergence = divergence - classwise_l1(global_pred, local_pred.detach(), masks,
                                                           reliability[k])
                diversity = len(teachers) * diversity_loss(z, features)
                loss_g = opts.lam1 * semantic + divergence + opts.lam2 * diversity
                loss_g.backward()
                self.generator_optimizer.step()
            self.generator.eval()
            self.model.train()
            with torch.no_grad():
                features = self.generator(z, labels)
                graph = knn_pseudo_graph(features, opts.topk)
                local_preds = [self.predict(t, features, graph) for t in teachers]
            for _ in range(opts.it_d):
                self.model_optimizer.zero_grad()
                global_pred = self.predict(self.model, features, graph)
                loss_d = sum(classwise_l1(global_pred, lp, masks, reliability[k])  # type: ignore[assignment]
                             for k, lp in enumerate(local_preds))
                loss_d.backward()
                self.model_optimizer.step()
                first_d = float(loss_d.detach()) if first_d is None else first_d
        last_d = float(loss_d.detach())
        return {"generator-loss": float(loss_g.detach()), "distill-loss": last_d,
                "distill-loss-first": last_d if first_d is None else first_d}

    def state_dict(self) -> dict[str, Any]:
        """The global model, the generator and both Adam states."""
        return {"model": self.model.state_dict(), "generator": self.generator.state_dict(),
                "model_adam": self.model_optimizer.state_dict(),
                "generator_adam": self.generator_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.generator.load_state_dict(state["generator"])
        self.model_optimizer.load_state_dict(state["model_adam"])
        self.generator_optimizer.load_state_dict(state["generator_adam"])


ALGORITHM = Algorithm("fedtad", FedTADTrainer, FedTADAggregator, FedTADOptions)
