"""FedGTA (Li et al., VLDB 2024): topology-aware averaging for federated graph learning.

Official code followed: ``xkLi-Allen/FedGTA`` (``federated/fedgta/``, ``gnn_model/``,
``operators/``; docs/reading/fedgta.md); OpenFGL's ``openfgl/flcore/fedgta`` read for comparison.

Client, each round (``train(E)`` then ``signature()``):

1. Load the personalised model θ_i the server sent (round 1: the common initial model)
   and run E full-batch Adam steps of cross-entropy on the training nodes. The Adam state
   persists across rounds (the code builds the optimizer once per client).
2. P = softmax(logits) of every node, eval mode (:func:`label_propagation`): F⁰ = one-hot
   labels on the training nodes, P elsewhere; K_lp times F ← α·Â F + (1−α)·F⁰ with the
   same Â as the backbone's (r-normalised, self-loops); P_raw = softmax(F),
   P_dis = softmax(F / T); both with the training rows reset to the one-hot labels.
3. Moments (:func:`moments`): m_p = mean over nodes of P_raw^p (raw) and/or of
   (P_raw − mean)^p (central), p = 1..P, per class; the signature s_i is their
   flattening (P·C or 2·P·C floats).
4. Local smoothing confidence (:func:`smoothing_confidence`):
   w_i = Σ_v deg(v) · (C/e + Σ_c P_dis[v,c] log P_dis[v,c]) >= 0, deg = edge count of v.

Server (:func:`accept_weights`): A_i = {j : cos(s_i, s_j) > τ} ∪ {i};
θ_i ← Σ_{j∈A_i} w_j θ_j / Σ_{j∈A_i} w_j (uniform over A_i if those w sum to 0), sent to
client i only (the engine keeps each client's last personalised model).

What leaves a client each round: every model parameter (GAMLP: hop gate, MLP, PReLU), the
moment signature (2·P·C floats for ``hybrid``, P·C otherwise) and one scalar w_i. Nothing
scales with the node count; the moments reveal the client's predicted label distribution.

Backbone (``fedgta-backbone``): ``gamlp`` (default; the code's ``SimGAMLP``: hops
X, ÂX, …, Â^K X precomputed in the constructor, a learned per-node hop attention and a
3-layer PReLU MLP, :class:`~fedgraph_flwr.nn.gamlp.GAMLP`; FedIIH's numbers) or ``gcn``
(the project's GCN; FedAux re-ran FedGTA on the FED-PUB GCN and OpenFGL runs it on its
default GCN, docs/reading/fedgta.md §6.4). Hop features are recomputed from the data when a trainer is
rebuilt (a pure function of the subgraph; (K+1)·n·d floats are not worth carrying).

Switches (default = the paper / GAMLP's definition, other value = the official code):

- ``fedgta-lp-train-boost`` (False): True adds F⁰ to the training rows after every LP
  step (``F[train] += F⁰[train]``, the code), instead of the plain recursion.
- ``fedgta-lp`` (code): ``openfgl`` is OpenFGL's label propagation (PyG's
  ``LabelPropagation``): F⁰ = the model's probabilities on the training rows and 0
  elsewhere, Â = D^(−1/2) A D^(−1/2) without self-loops, F clamped to [0, 1] after each
  step. For the side by side with OpenFGL only; neither the paper nor the code does this.
- ``fedgta-gate-layout`` (node): ``code`` reproduces the code's reshape of the hop-major
  gate scores, which hands node i other nodes' scores (see :mod:`fedgraph_flwr.nn.gamlp`).
- ``fedgta-evaluate`` (after-train): ``before-train`` reports the model the server sent,
  before local training, as the code's trainer does (its round-r figures are then those of
  the round r−1 aggregate; round 1 scores the initial model). after-train is the project's
  (FED-PUB's) protocol. The code's headline averages clients weighted by node count; the
  project's evaluation averages them unweighted (docs/reading/fedgta.md §6.1); that is the engine's choice.

Hyperparameters: LP steps 5, α 0.5, T 20, r 0.5, K 3, MLP layers 3 (code's ``config.py``);
moments ``hybrid``, P = 6, τ = 0.5 are the code's Cora settings (CiteSeer: hybrid, 20, 0.6;
PubMed: raw ("origin"), 13, 0.65; OpenFGL: hybrid, 10, 0.5). The common keys of the paper's
runs (hidden 64, lr 0.01, weight decay 5e-4, dropout 0.5, 3 local epochs, 100 rounds) are in
``configs/fedgta/``. Exact code: ``fedgta-lp-train-boost=true``, ``fedgta-gate-layout=code``,
``fedgta-evaluate=before-train``.

Notes: docs/reading/fedgta.md §2/§4 mention a "decay" max(0.8·(A+I), I) in Â; the code's LP
(``utils.homo_adj_to_symmetric_norm``) and GAMLP (``operators.utils.adj_to_symmetric_norm``)
do not apply it (only ``gnn_model/gm.py``'s unused ``propagate`` does), so neither do we.
The degree in w_i is the row sum of A as in the code (OpenFGL counts in + out degree, twice
that on an undirected graph; the factor cancels in the weights). Binary tasks need no
adapter: every backbone here emits C = 2 logits, so P has two columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from ..core.mixing import cosine_similarity, mix
from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.gamlp import GAMLP, GATE_LAYOUTS, normalized_adjacency, propagate_hops
from ..nn.gcn import GCN
from .base import Aggregator
from .supervised import EVALUATE_POINTS, EvaluatesReceivedModel, SupervisedTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig

BACKBONES = ("gamlp", "gcn")
LP_VARIANTS = ("code", "openfgl")
MOMENT_TYPES = ("raw", "central", "hybrid")
MOMENTS_KEY = "moments"
CONFIDENCE_KEY = "confidence"
LOG_EPS = 1e-8  # the code's eps inside log(p + eps)


# `fedgta-reproduce`: the profiles, the default first (docs/methods/fedgta.md).
# `default`: the official backbone and label propagation, the FED-PUB protocol's scoring.
PUBLISHED = (
    "The FedIIH paper's cells on this page ran configs/fedgta/cora-disjoint-10.yaml, which is "
    "`default`; configs/paper/openfgl-on-fediih-cora.yaml runs `openfgl`'s backbone, moments and "
    "label propagation (with num-layers=2)."
)
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "official": {
        "backbone": "gamlp", "gate_layout": "code", "lp_train_boost": True, "lp": "code",
        "evaluate": "before-train",
    },
    "openfgl": {"backbone": "gcn", "lp": "openfgl", "num_moments": 10},
}


@dataclass(frozen=True)
class FedGTAOptions(Options, prefix="fedgta", profiles=PROFILES, published=PUBLISHED):
    """FedGTA's knobs (``fedgta-*``); defaults = the paper with the code's Cora settings."""

    backbone: str = option("gamlp", "gamlp (official code, FedIIH) | gcn (FedAux's re-run, "
                           "OpenFGL's default)", choices=BACKBONES)
    prop_steps: int = option(3, "GAMLP propagation steps K (hops X, ÂX, ..., Â^K X)", low=0)
    mlp_layers: int = option(3, "GAMLP MLP layers", low=2)
    r: float = option(0.5, "exponent r of Â = D^(r-1) (A+I) D^(-r) (GAMLP and LP)",
                      low=0.0, high=1.0)
    gate_layout: str = option("node", "GAMLP hop attention: node (per node, GAMLP) | code "
                              "(the official reshape that mixes nodes)", choices=GATE_LAYOUTS)
    lp_steps: int = option(5, "label-propagation steps", low=0)
    lp_alpha: float = option(0.5, "label-propagation α: F <- α ÂF + (1-α) F0",
                             low=0.0, high=1.0)
    lp_train_boost: bool = option(False, "add F0 to the training rows after each LP step (code)")
    lp: str = option("code", "code (F0: one-hot train rows, P elsewhere; Â with self-loops) | "
                     "openfgl (PyG's LabelPropagation: F0 = P on train rows, 0 elsewhere; "
                     "Â without self-loops; F clamped to [0, 1] after each step)",
                     choices=LP_VARIANTS)
    temperature: float = option(20.0, "temperature T of P_dis = softmax(F / T)", low=0.0,
                                low_inclusive=False)
    moment_type: str = option("hybrid", "raw (code: origin) | central (code: mean) | hybrid "
                              "(both; Cora, CiteSeer)", choices=MOMENT_TYPES)
    num_moments: int = option(6, "moment orders P (code: Cora 6, CiteSeer 20, PubMed 13)", low=1)
    accept: float = option(0.5, "τ: j joins i's average if cos(s_i, s_j) > τ (code: Cora 0.5, "
                           "CiteSeer 0.6, PubMed 0.65)", low=-1.0, high=1.0)
    evaluate: str = option("after-train", "after-train (FED-PUB protocol) | before-train (the "
                           "code: the received model)", choices=EVALUATE_POINTS)

    def check(self) -> None:
        """Reject the code's LP train boost with ``fedgta-lp=openfgl``."""
        if self.lp == "openfgl" and self.lp_train_boost:
            raise self.invalid("lp_train_boost", "the code's boost has no place in fedgta-lp=openfgl")


# --- client maths -----------------------------------------------------------------------
def label_propagation(probs: torch.Tensor, labels: torch.Tensor, train_mask: torch.Tensor,
                      adjacency: torch.Tensor, steps: int, alpha: float, temperature: float,
                      train_boost: bool = False, variant: str = "code"
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """FedGTA's non-parametric LP: (P_raw, P_dis), each [n, C].

    probs [n, C] (the model's soft labels), labels [n] (read on the training rows only),
    train_mask [n] bool, adjacency Â sparse [n, n] (CSR or COO). F⁰ = one-hot on train, probs
    elsewhere; F ← α·Â F + (1−α)·F⁰, ``steps`` times (``train_boost``: then also
    F[train] += F⁰[train], the code); P_raw = softmax(F), P_dis = softmax(F/T), training
    rows reset to the one-hot labels.

    ``variant="openfgl"`` is OpenFGL's (PyG's ``LabelPropagation`` with ``mask``): F⁰ = probs
    on the training rows, 0 elsewhere, F clamped to [0, 1] after each step; the caller
    passes Â without self-loops, as PyG's ``gcn_norm(add_self_loops=False)`` builds it.
    """
    if variant not in LP_VARIANTS:
        raise ValueError(f"LP variant {variant!r}; valid: {', '.join(LP_VARIANTS)}")
    num_classes = probs.size(1)
    onehot = F.one_hot(labels[train_mask], num_classes).to(probs.dtype)
    if variant == "openfgl":
        start = torch.zeros_like(probs)
        start[train_mask] = probs[train_mask]
    else:
        start = probs.clone()
        start[train_mask] = onehot
    out = start
    for _ in range(steps):
        out = alpha * torch.sparse.mm(adjacency, out) + (1.0 - alpha) * start
        if train_boost:
            out[train_mask] += start[train_mask]
        if variant == "openfgl":
            out = out.clamp(0.0, 1.0)
    raw = F.softmax(out, dim=1)
    sharp = F.softmax(out / temperature, dim=1)
    raw[train_mask] = onehot
    sharp[train_mask] = onehot
    return raw, sharp


def moments(probs: torch.Tensor, num_moments: int, kind: str = "hybrid") -> torch.Tensor:
    """The moment signature: [P·C] (raw or central) or [2·P·C] (hybrid: raw rows first).

    Row p−1 of each block holds, per class c, mean_v probs[v, c]^p (raw) or
    mean_v (probs[v, c] − mean_u probs[u, c])^p (central), p = 1..P.
    """
    if kind not in MOMENT_TYPES:
        raise ValueError(f"moment type {kind!r}; valid: {', '.join(MOMENT_TYPES)}")
    powers = torch.arange(1, num_moments + 1, dtype=probs.dtype, device=probs.device)
    blocks = []
    if kind in ("raw", "hybrid"):
        blocks.append(probs.unsqueeze(0).pow(powers.view(-1, 1, 1)).mean(dim=1))  # [P, C]
    if kind in ("central", "hybrid"):
        centred = probs - probs.mean(dim=0, keepdim=True)
        blocks.append(centred.unsqueeze(0).pow(powers.view(-1, 1, 1)).mean(dim=1))
    return torch.cat(blocks).reshape(-1)


def smoothing_confidence(sharp: torch.Tensor, degree: torch.Tensor) -> torch.Tensor:
    """w = Σ_v deg(v)·(C/e + Σ_c p_vc log(p_vc + 1e-8)), a 0-d tensor (>= 0 up to the eps).

    Each class term p log p is >= −1/e, so C/e makes a node's bracket non-negative; it is
    C/e − entropy, largest for confident (one-hot) rows.
    """
    num_classes = sharp.size(1)
    neg_entropy = (sharp * torch.log(sharp + LOG_EPS)).sum(dim=1)  # [n]
    degree = degree.to(sharp.dtype)
    return degree.sum() * num_classes / math.e + (degree * neg_entropy).sum()


# --- server maths -----------------------------------------------------------------------
def accept_sets(similarity: np.ndarray, threshold: float) -> np.ndarray:
    """A [K, K] bool: A_ij = S_ij > threshold, and every client accepts itself."""
    accept = np.asarray(similarity) > threshold
    np.fill_diagonal(accept, True)
    return accept


def accept_weights(signatures: np.ndarray, confidences: np.ndarray, threshold: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(W, S): FedGTA's mixing weights W [K, K] and the moment similarity S [K, K].

    S_ij = cos(s_i, s_j); A_i = {j : S_ij > threshold} ∪ {i};
    W_ij = w_j / Σ_{k∈A_i} w_k for j ∈ A_i, else 0 (uniform over A_i if that sum is 0).
    """
    similarity = cosine_similarity(signatures)
    accept = accept_sets(similarity, threshold)
    w = np.maximum(np.asarray(confidences, dtype=np.float64).reshape(-1), 0.0)
    weights = accept * w[None, :]
    totals = weights.sum(axis=1, keepdims=True)
    uniform = accept / accept.sum(axis=1, keepdims=True)
    weights = np.where(totals > 0, weights / np.where(totals > 0, totals, 1.0), uniform)
    return weights, similarity


# --- the algorithm ------------------------------------------------------------------------
class FedGTATrainer(EvaluatesReceivedModel, SupervisedTrainer):
    """GAMLP (or GCN) trained locally; reports LP moments and a smoothing confidence."""

    options_class = FedGTAOptions
    options: FedGTAOptions
    restore_without_init = True  # local_state holds the whole model; no other randomness

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        opts = self.options
        data = self.data
        self.adjacency = normalized_adjacency(data.edge_index, data.num_nodes, opts.r)
        # OpenFGL's LP runs on PyG's D^(-1/2) A D^(-1/2) (r = 0.5, no self-loops), whatever
        # the backbone's r; the backbone keeps its own Â.
        self.lp_adjacency = (normalized_adjacency(data.edge_index, data.num_nodes, 0.5,
                                                  self_loops=False)
                             if opts.lp == "openfgl" else self.adjacency)
        self.degree = torch.bincount(data.edge_index[0], minlength=data.num_nodes)
        self.hops = (propagate_hops(data.x, self.adjacency, opts.prop_steps)
                     if opts.backbone == "gamlp" else None)

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """The ``backbone``: GAMLP over precomputed hops, or the project's GCN."""
        opts = config.options_of(FedGTAOptions)
        hidden, dropout = config.hidden, config.dropout
        if opts.backbone == "gcn":
            return GCN(num_features, hidden, num_classes, num_layers=config.num_layers,
                       dropout=dropout)
        return GAMLP(num_features, hidden, num_classes, num_hops=opts.prop_steps,
                     num_layers=opts.mlp_layers, dropout=dropout, gate_layout=opts.gate_layout)

    def forward(self) -> torch.Tensor:
        """Logits [n, C] of the backbone."""
        if self.hops is None:
            return self.model(self.data.x, self.data.edge_index)
        return self.model(self.hops)

    def train(self, epochs: int) -> dict[str, float]:
        """Local training for ``epochs`` epochs; ``train_loss`` and this method's extras."""
        self.score_received_model()
        if self.hops is None:
            return super().train(epochs)
        # GAMLP is node-wise: only the training rows are fed in (as the code does, which
        # matters for gate_layout=code).
        self.model.train()
        data = self.data
        loss_value = float("nan")
        for _ in range(epochs):
            self.optimizer.zero_grad()
            logits = self.model(self.hops, data.train_mask)
            loss = F.cross_entropy(logits, data.y[data.train_mask])
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.detach())
        return {"train_loss": loss_value}

    @torch.no_grad()
    def topology_summary(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(moment signature [P·C or 2·P·C], confidence w [1]) of the current model."""
        opts = self.options
        self.model.eval()
        probs = F.softmax(self.forward(), dim=1)
        raw, sharp = label_propagation(probs, self.data.y, self.data.train_mask,
                                       self.lp_adjacency, opts.lp_steps, opts.lp_alpha,
                                       opts.temperature, opts.lp_train_boost, opts.lp)
        return (moments(raw, opts.num_moments, opts.moment_type),
                smoothing_confidence(sharp, self.degree).reshape(1))

    @classmethod
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfig
                         ) -> dict[str, tuple[int, ...]]:
        """The moments [P·C] ([2·P·C] hybrid) and the confidence [1]."""
        opts = config.options_of(FedGTAOptions)
        blocks = 2 if opts.moment_type == "hybrid" else 1
        return {MOMENTS_KEY: (blocks * opts.num_moments * num_classes,), CONFIDENCE_KEY: (1,)}

    def signature(self) -> Arrays:
        """Label-propagation moments and the mean confidence, which the server compares clients by."""
        signature, confidence = self.topology_summary()
        return {MOMENTS_KEY: signature.cpu().numpy().astype(np.float32),
                CONFIDENCE_KEY: confidence.cpu().numpy().astype(np.float32)}


class FedGTAAggregator(Aggregator):
    """Per client: confidence-weighted average over the clients with similar moments."""

    options_class = FedGTAOptions
    options: FedGTAOptions

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Each client's average over the clients whose moments are similar enough (cos > τ)."""
        ids = sorted(updates)
        signatures = np.stack([np.asarray(updates[c].signature[MOMENTS_KEY], np.float64)
                               .reshape(-1) for c in ids])
        confidences = np.array([np.asarray(updates[c].signature[CONFIDENCE_KEY], np.float64)
                                .reshape(-1)[0] for c in ids])
        weights, similarity = accept_weights(signatures, confidences, self.options.accept)
        mixed = mix(weights, [updates[c].arrays for c in ids], self.mix_dtype)
        accepted = accept_sets(similarity, self.options.accept).sum(axis=1)
        return AggregateResult(
            payloads=dict(zip(ids, mixed)),
            diagnostics={"similarity": similarity, "weights": weights},
            metrics={"accept_size_mean": float(accepted.mean()),
                     "accept_size_min": float(accepted.min()),
                     "accept_size_max": float(accepted.max()),
                     "self_weight_mean": float(np.mean(np.diag(weights))),
                     "confidence_mean": float(confidences.mean())},
        )


ALGORITHM = Algorithm("fedgta", FedGTATrainer, FedGTAAggregator, FedGTAOptions)
