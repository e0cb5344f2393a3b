"""AdaFGL (Li et al., ICDE 2024): decoupled two-step personalised federated graph learning.

Official code followed: ``xkLi-Allen/AdaFGL`` at ``1ea2b20`` (``fedKnowledge_main.py``,
``roles/server.py``, ``roles/client.py``, ``tasks/node_cls.py``: step 1; ``main.py``,
``models/my_model.py``, ``models/label_propagation_models.py``, ``models/gcn.py``,
``models/base_op.py``, ``utils.py``: step 2; docs/reading/adafgl.md). OpenFGL's
``openfgl/flcore/adafgl`` read for comparison ([O] below).

Step 1, rounds 1..R1 (``adafgl-rounds-step1``): federated knowledge extractor.
  Phase ``extract``: the server sends the global extractor θ_(r−1) (round 1: nothing, every
  client builds the same initial model from the seed); the client scores it on its
  validation nodes, trains it ``local-epochs`` full-batch Adam epochs (a new Adam each
  round, as the code: ``adafgl-fresh-optimizer``) and uploads it; the server averages the
  uploads weighted by node count (the code's ``num_nodes``) into θ_r. The extractor is a
  2-layer ChebNet with K = 2 (the code's ``gmodel``; :mod:`fedgraph_flwr.nn.chebnet`) or the
  project's GCN (``adafgl-extractor=gcn``, as FedIIH probably ran it).
  Checkpoint (``adafgl-checkpoint``): ``best`` keeps the θ_r with the best node-weighted
  validation score Σ n_k·val_k / Σ n_k over r = 1..R1 (the code saves the global model
  whenever that improves). Clients score θ_r when they receive it, in round r+1, so θ_R1 is
  scored in an extra round R1+1 (its extract phase only evaluates) and the chosen model is
  delivered in round R1+2. ``final`` delivers θ_R1 in round R1+1 (the paper's wording).
  The train phase of these rounds trains nothing and reports NaN validation/test metrics,
  so the evaluation protocols score step 2 only (as the code reports step 2); the received
  global model's scores are logged as ``global_val_metric`` / ``global_test_metric``.

Step 2, from the delivery round D on: local only. The delivered model is sent once; after
  it the extract phase carries nothing either way and the train phase uploads nothing.
  On its first step-2 train call a client precomputes (:meth:`AdaFGLTrainer.prepare_step2`):
  P_g = softmax(f_g(X, A)); the HCS (:func:`homophily_confidence`: LP from a random half of
  the training nodes, 10 steps, α = 0.5, accuracy on the other half); the similarity graph
  S of P_g (:func:`similarity_support`); the rewired adjacency Ã = α·A + (1−α)·S; the
  smoothed features X_s = [X ‖ ÂX ‖ Â²X ‖ Â³X] on Ã (r = 0.5, self-loops). Then it trains
  the homophilous module (:class:`~fedgraph_flwr.nn.adafgl_homo.HomoPropagation`,
  CE + MSE to P_g, prediction ½(softmax z_s + softmax P_g)) and/or the heterophilous one
  (:class:`~fedgraph_flwr.nn.adafgl_hete.HeteroPropagation`, three CE terms, prediction the
  mean of three softmaxes) with Adam (``lr``, ``weight-decay``) for ``adafgl-epochs`` epochs.
  ``adafgl-combine``: ``switch`` trains and predicts with the homophilous module iff
  HCS >= ``adafgl-threshold`` (0.9), else the heterophilous one [C]; ``soft`` trains both
  jointly (summed losses) and predicts HCS·homo + (1−HCS)·hete [O].
  ``adafgl-schedule`` (docs/reading/adafgl.md §5.4): ``one-round`` runs all step-2 epochs in round D,
  evaluating after every epoch (eval mode) and reporting the epoch of best validation
  score (the code's per-client selection); the client then holds that epoch's predictions
  and reports them in any later round. ``epoch-per-round`` runs one epoch per round from D
  on (OpenFGL's cadence) and reports the model after it; the engine's protocols then pick
  the round. Rounds needed: D (one-round) or D + epochs − 1; fewer and no round is scored.

What leaves a client: step 1, each round, the extractor's parameters (ChebNet, Cora:
2·1433·64 + 64 + 2·64·7 + 7 floats) plus three scalars (the received model's validation
and test scores, the node count); round R1+1 under ``best``, the three scalars; step 2,
nothing (empty replies; the protocol's scalar metrics only). Nothing scales with the node
count.

Memory (docs/reading/adafgl.md §5.1): the code's similarity S = getre(P_g) and the relation matrix R of
the heterophilous head are dense n × n. Here (``adafgl-similarity=topk``, the default, a
deviation) both live on a sparse support Ω: each node's ``adafgl-topk`` most similar
nodes under P_g plus ``adafgl-random-pairs`` uniformly drawn ones, symmetrised; S is Ω's
pairs above the 0.999 threshold (so S's degree is capped, where the code's S links every
pair of equally confident same-class predictions), and R's sums run over Ω
(:mod:`fedgraph_flwr.nn.signed_propagation`; its mean is exact). ``dense`` is the code's
computation (Ω = every pair), refused above ``adafgl-dense-max-nodes`` nodes.

Paper / code switches ([C] = official code, [O] = OpenFGL; defaults are [C], the code
being what produced the paper's numbers; docs/reading/adafgl.md §4):
- ``adafgl-checkpoint``: best [C] | final (the paper's text).
- ``adafgl-fresh-optimizer``: true [C] (new Adam each round) | false (persisting).
- ``adafgl-combine``: switch [C] | soft [O].
- ``adafgl-alpha``: 0.05 [C] ([O] 0.5); ``adafgl-beta``: 0.2 [C] ([O] 0).
- ``adafgl-rounds-step1``: 100 [C] ([O] ``num_rounds_vanilla`` 50). The option's default
  is 98, so that the engine's default ``rounds=100`` holds step 1, the round that scores
  its last model and step 2; ``configs/adafgl/`` run the code's 100 with ``rounds: 102``.
  A ``rounds`` too small for step 2 is refused before any client is contacted.
- ``adafgl-extractor``: chebnet [C] | gcn (FedIIH, probably).
- ``adafgl-lp-train-boost``: true [C] (F[seed] += F⁰[seed] after each LP step, as
  FedGTA's code) | false (the plain recursion).
- ``adafgl-schedule``: one-round (the code's loop) | epoch-per-round ([O]'s cadence).
- ``adafgl-similarity``: topk (ours) | dense [C].
Code quirks kept: P_g is softmaxed again inside getre and in the homophilous prediction;
the MSE compares z_s's logits with P_g's probabilities; R's rescale maps R ∈ [0, μ] to
−R/μ (see :mod:`fedgraph_flwr.nn.signed_propagation`); one PReLU is shared across MLPs.
HCS: nodes outside the seed half start uniform (the code leaves nodes outside
train/val/test at their one-hot labels; its splits cover every node). Binary tasks need no
adapter: every model here emits C = 2 logits, so P_g and LP have two columns (docs/reading/adafgl.md §5.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from ..core.mixing import average
from ..core.options import ConfigError, Options, option
from ..core.phases import (
    TRAIN_PHASE,
    AggregateResult,
    Arrays,
    ArraySpec,
    ClientUpdate,
    MetricSpec,
    Phase,
    PhaseReply,
    ReplySpec,
)
from ..core.registry import Algorithm
from ..metrics import score
from ..nn.adafgl_hete import HeteroPropagation
from ..nn.adafgl_homo import HomoPropagation
from ..nn.chebnet import ChebNet
from ..nn.gamlp import normalized_adjacency, propagate_hops
from ..nn.gcn import GCN
from .base import Aggregator
from .fedgta import label_propagation
from .supervised import SupervisedTrainer, evaluation_metrics

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

EXTRACT = Phase("extract")
EXTRACTORS = ("chebnet", "gcn")
CHECKPOINTS = ("best", "final")
SCHEDULES = ("one-round", "epoch-per-round")
COMBINES = ("switch", "soft")
SIMILARITIES = ("topk", "dense")
PROB_FLOOR = 1e-12  # log of a probability, for the metrics' cross-entropy
BLOCK_ELEMENTS = 1 << 22  # similarity rows are scored in blocks of at most this many entries
NODES_KEY = "num-nodes"
GLOBAL_VAL, GLOBAL_TEST = "global_val_metric", "global_test_metric"


# `adafgl-reproduce`: the profiles, the default first (docs/methods/adafgl.md).
# `default`: the official code's, but a sparse top-k similarity (the code's is dense).
PUBLISHED = (
    "The FedIIH paper's cells on this page ran configs/adafgl/cora-disjoint-10.yaml, which is "
    "`default`; `openfgl` is the cell compared with OpenFGL on its files "
    "(configs/paper/openfgl-side-by-side-cora.yaml, with num-layers=2 and rounds=100)."
)
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "official": {
        "extractor": "chebnet", "checkpoint": "best", "fresh_optimizer": True,
        "schedule": "one-round", "combine": "switch", "lp_train_boost": True, "alpha": 0.05,
        "beta": 0.2, "similarity": "dense",
    },
    "openfgl": {
        "extractor": "gcn", "checkpoint": "final", "fresh_optimizer": False,
        "schedule": "epoch-per-round", "combine": "soft", "alpha": 0.5, "beta": 0.0,
        "similarity": "dense", "rounds_step1": 50, "epochs": 50,
    },
    "paper": {"checkpoint": "final"},
}


@dataclass(frozen=True)
class AdaFGLOptions(Options, prefix="adafgl", profiles=PROFILES, published=PUBLISHED):
    """AdaFGL's knobs (``adafgl-*``); defaults = the official code's ``config.py``."""

    rounds_step1: int = option(98, "R1: federated rounds of the knowledge extractor (code 100 "
                               "with rounds=102, as configs/adafgl; OpenFGL 50); rounds must be "
                               ">= R1+2 (best) or R1+1 (final): 98 fits the default 100", low=1)
    extractor: str = option("chebnet", "step-1 model: chebnet (code, K = cheb-k) | gcn (the "
                            "project's GCN, num-layers; FedIIH)", choices=EXTRACTORS)
    cheb_k: int = option(2, "ChebNet's K (Chebyshev terms per layer)", low=1)
    checkpoint: str = option("best", "model sent to step 2: best (node-weighted global val, "
                             "code) | final (round R1, the paper)", choices=CHECKPOINTS)
    fresh_optimizer: bool = option(True, "step 1: a new Adam every round (code) instead of "
                                   "one persisting across rounds")
    epochs: int = option(200, "step-2 training epochs", low=1)
    schedule: str = option("one-round", "step 2: one-round (all epochs in round D, best-val "
                           "epoch reported) | epoch-per-round (OpenFGL)", choices=SCHEDULES)
    combine: str = option("switch", "switch (homophilous module iff HCS >= threshold, code) | "
                          "soft (both, weighted by HCS, OpenFGL)", choices=COMBINES)
    threshold: float = option(0.9, "HCS threshold of the switch", low=0.0, high=1.0)
    lp_steps: int = option(10, "HCS label-propagation steps", low=0)
    lp_alpha: float = option(0.5, "HCS label-propagation α: F <- α ÂF + (1-α) F0",
                             low=0.0, high=1.0)
    lp_train_boost: bool = option(True, "HCS LP adds F0 to the seed rows after each step (code)")
    prop_steps: int = option(3, "K of the smoothed features [X, ÂX, ..., Â^K X]", low=0)
    r: float = option(0.5, "exponent r of Â = D^(r-1) (A+I) D^(-r) (extractor, LP, smoothing)",
                      low=0.0, high=1.0)
    alpha: float = option(0.05, "rewiring Ã = α A + (1-α) S (code 0.05, OpenFGL 0.5)",
                          low=0.0, high=1.0)
    beta: float = option(0.2, "hetero head R = β S + (1-β) getre(e) (code 0.2, OpenFGL 0)",
                         low=0.0, high=1.0)
    similarity_threshold: float = option(0.999, "S links pairs whose prediction cosine exceeds "
                                         "this", low=-1.0, high=1.0)
    similarity: str = option("topk", "S and R support: topk (sparse, ours) | dense (the code, "
                             "every pair; <= dense-max-nodes)", choices=SIMILARITIES)
    topk: int = option(32, "topk support: most similar nodes per node", low=1)
    random_pairs: int = option(32, "topk support: random nodes per node (R's negatives)", low=0)
    dense_max_nodes: int = option(4096, "largest client the dense support accepts", low=1)

    @property
    def delivery_round(self) -> int:
        """Round D in which the chosen extractor reaches the clients (step 2 begins)."""
        return self.rounds_step1 + (2 if self.checkpoint == "best" else 1)

    def rounds_needed(self) -> int:
        """The smallest ``rounds`` that runs every step-2 epoch."""
        extra = 0 if self.schedule == "one-round" else self.epochs - 1
        return self.delivery_round + extra

    def check_run(self, config: RunConfig) -> None:
        """Step 2 must fit in the run: otherwise no round would be scored."""
        rounds, needed = config.rounds, self.rounds_needed()
        if rounds < needed:
            raise ConfigError(
                f"rounds={rounds} leaves no room for AdaFGL's step 2: it needs rounds >= {needed} "
                f"(adafgl-rounds-step1={self.rounds_step1}, adafgl-checkpoint={self.checkpoint}, "
                f"adafgl-schedule={self.schedule}); set rounds={needed} or "
                f"adafgl-rounds-step1={self.rounds_step1 - (needed - rounds)}")


# --- client maths -----------------------------------------------------------------------
def hcs_split(train_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(seed mask, held-out mask): a random half (rounded down) of the training nodes as LP
    seeds, the others held out (torch's global generator draws the permutation)."""
    train = train_mask.nonzero().view(-1)
    perm = train[torch.randperm(train.numel(), device=train.device)]
    seeds = torch.zeros_like(train_mask)
    held = torch.zeros_like(train_mask)
    seeds[perm[: train.numel() // 2]] = True
    held[perm[train.numel() // 2:]] = True
    return seeds, held


def homophily_confidence(labels: torch.Tensor, seed_mask: torch.Tensor, held_mask: torch.Tensor,
                         adjacency: torch.Tensor, num_classes: int, steps: int, alpha: float,
                         train_boost: bool = True) -> float:
    """HCS: accuracy on ``held_mask`` of label propagation from the ``seed_mask`` labels.

    F⁰ = one-hot labels on the seeds, 1/C on every other node; FedGTA's recursion
    (:func:`~fedgraph_flwr.algorithms.fedgta.label_propagation`) over Â, ``steps`` times;
    prediction = argmax (ties: the lowest class). 0 when nothing is held out.
    """
    if int(held_mask.sum()) == 0:
        return 0.0
    n = labels.numel()
    uniform = torch.full((n, num_classes), 1.0 / num_classes, device=labels.device)
    propagated, _ = label_propagation(uniform, labels, seed_mask, adjacency, steps, alpha,
                                      1.0, train_boost)
    pred = propagated.argmax(dim=1)
    return float((pred[held_mask] == labels[held_mask]).float().mean())


def prediction_directions(probs: torch.Tensor) -> torch.Tensor:
    """u_i = softmax(P_i) / ‖softmax(P_i)‖ [n, C]: getre's cosine form (the code softmaxes
    the already-softmaxed P_g again); S_ij = 1 iff u_i·u_j > threshold."""
    q = F.softmax(probs, dim=1)
    return q / q.norm(dim=1, keepdim=True).clamp_min(1e-9)


def top_similar(u: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each node's k most similar other nodes by u_i·u_j: (row, col), each [n·k'] with
    k' = min(k, n−1); rows scored in blocks (memory ~BLOCK_ELEMENTS, never n × n)."""
    n = u.size(0)
    k = min(k, n - 1)
    if k <= 0:
        empty = torch.zeros(0, dtype=torch.long, device=u.device)
        return empty, empty
    block = max(1, BLOCK_ELEMENTS // max(n, 1))
    rows, cols = [], []
    for start in range(0, n, block):
        idx = torch.arange(start, min(start + block, n), device=u.device)
        sim = u[idx] @ u.t()  # [b, n]
        sim[torch.arange(idx.numel(), device=u.device), idx] = -math.inf
        cols.append(sim.topk(k, dim=1).indices.reshape(-1))
        rows.append(idx.repeat_interleave(k))
    return torch.cat(rows), torch.cat(cols)


def similarity_support(probs: torch.Tensor, threshold: float, mode: str = "topk", topk: int = 32,
                       random_pairs: int = 32, dense_max_nodes: int = 4096
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, col, prior): the support Ω of S and R, ordered off-diagonal pairs sorted by
    (row, col), and S on them (1.0 where u_i·u_j > ``threshold``, else 0.0).

    ``dense``: Ω = every pair i ≠ j (the code's dense S and R; n <= ``dense_max_nodes``).
    ``topk``: Ω = each node's ``topk`` most similar nodes and ``random_pairs`` uniform
    draws among the others (torch's global generator), with every pair's reverse; S is
    symmetric either way.
    """
    n = probs.size(0)
    u = prediction_directions(probs)
    if mode == "dense":
        if n > dense_max_nodes:
            raise ValueError(f"adafgl-similarity=dense builds n × n pairs; this client has "
                             f"{n} nodes > adafgl-dense-max-nodes={dense_max_nodes}")
        idx = torch.arange(n, device=probs.device)
        row, col = idx.repeat_interleave(n), idx.repeat(n)
        keep = row != col
        row, col = row[keep], col[keep]
    elif mode == "topk":
        row, col = top_similar(u, topk)
        m = min(random_pairs, n - 1)
        if m > 0:
            src = torch.arange(n, device=probs.device).repeat_interleave(m)
            offset = torch.randint(1, n, (n * m,), device=probs.device)
            row, col = torch.cat([row, src]), torch.cat([col, (src + offset) % n])
        keys = torch.unique(torch.cat([row * n + col, col * n + row]))  # sorted, no repeats
        row, col = keys // n, keys % n
    else:
        raise ValueError(f"similarity {mode!r}; valid: {', '.join(SIMILARITIES)}")
    prior = ((u[row] * u[col]).sum(dim=1) > threshold).to(probs.dtype)
    return row, col, prior


def rewired_adjacency(edge_index: torch.Tensor, num_nodes: int, s_row: torch.Tensor,
                      s_col: torch.Tensor, alpha: float, r: float) -> torch.Tensor:
    """Â of Ã = α·A + (1−α)·S (S's edges ``s_row`` -> ``s_col``, weight 1), r-normalised
    with self-loops, sparse CSR [n, n]."""
    edges = torch.cat([edge_index, torch.stack([s_row, s_col])], dim=1)
    weight = torch.cat([torch.full((edge_index.size(1),), alpha, device=edge_index.device),
                        torch.full((s_row.numel(),), 1.0 - alpha, device=edge_index.device)])
    return normalized_adjacency(edges, num_nodes, r, edge_weight=weight)


def smoothed_features(x: torch.Tensor, adjacency: torch.Tensor, steps: int) -> torch.Tensor:
    """X_s = [X ‖ ÂX ‖ … ‖ Â^K X]: x [n, d] -> [n, (K+1)·d]."""
    return torch.cat(list(propagate_hops(x, adjacency, steps)), dim=1)


def nan_metrics(keys) -> dict[str, float]:
    """NaN for each of ``keys``: a metric not measured this round."""
    return {k: float("nan") for k in keys}


# --- the algorithm ------------------------------------------------------------------------
class AdaFGLTrainer(SupervisedTrainer):
    """Step 1: the federated extractor (phase ``extract``); step 2: local modules (``train``)."""

    options_class = AdaFGLOptions
    options: AdaFGLOptions
    phases = (EXTRACT, TRAIN_PHASE)

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        self.adjacency = normalized_adjacency(self.data.edge_index, self.data.num_nodes,
                                              self.options.r)
        self.step1_loss = float("nan")
        self.delivered = False
        # Step 2 (built by prepare_step2 on the first step-2 train call).
        self.step2: dict[str, torch.Tensor] | None = None
        self.homo: HomoPropagation | None = None
        self.hete: HeteroPropagation | None = None
        self.step2_optimizer: torch.optim.Optimizer | None = None
        self.epochs_done = 0
        self.step2_loss = float("nan")
        self.held_probs: torch.Tensor | None = None  # the predictions the client reports
        self.held_val = -math.inf
        self._smooth: torch.Tensor | None = None

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """The step-1 knowledge extractor: ChebNet (code) or the project's GCN."""
        opts = config.options_of(AdaFGLOptions)
        hidden, dropout = config.hidden, config.dropout
        if opts.extractor == "gcn":
            return GCN(num_features, hidden, num_classes, num_layers=config.num_layers,
                       dropout=dropout)
        return ChebNet(num_features, hidden, num_classes, k=opts.cheb_k, num_layers=2,
                       dropout=dropout)

    def forward(self) -> torch.Tensor:
        """The extractor's logits [n, C] on the normalised adjacency."""
        if self.options.extractor == "gcn":
            return self.model(self.data.x, self.data.edge_index)
        return self.model(self.data.x, self.adjacency)

    # --- what travels: the extractor, in the extract phase only ---------------------
    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """Nothing: every client builds the same initial extractor from the seed."""
        # The train phase never carries a model (step 2 uploads nothing); round 1's extract
        # request is empty too: every client builds the same initial extractor from the seed.
        return {}

    def upload(self) -> Arrays:
        """Nothing in the train phase: the extractor travels in the step-1 phases."""
        return {}

    def load_payload(self, arrays: Arrays) -> None:
        """Nothing to apply: the extractor arrives in the step-1 phases."""
        return None  # the train phase's payload is always empty

    def model_arrays(self) -> Arrays:
        """The extractor's parameters (what the base trainer would upload)."""
        return SupervisedTrainer.upload(self)

    def load_model(self, arrays: Arrays) -> None:
        """Load the extractor's parameters (as the base trainer's load_payload)."""
        SupervisedTrainer.load_payload(self, arrays)

    @torch.no_grad()
    def model_scores(self) -> dict[str, float]:
        """The extractor's validation and test metric (eval mode)."""
        self.model.eval()
        logits = self.forward()
        data = self.data
        return {GLOBAL_VAL: score(logits, data.y, data.val_mask, self.metric),
                GLOBAL_TEST: score(logits, data.y, data.test_mask, self.metric)}

    @classmethod
    def phase_reply_spec(cls, phase: Phase, request: Arrays, num_features: int,
                         num_classes: int, config: ClientConfig) -> ReplySpec:
        """extract: the node count (within the handshake's; not under dp=client) and the
        received extractor's scores, and in step 1 the trained extractor's parameters, as
        :meth:`build_model` makes them (built on the meta device: shapes only, no memory
        and no draw from the random generator)."""
        if phase != EXTRACT:
            return ReplySpec()
        scores = {GLOBAL_VAL: MetricSpec(0.0, 1.0, nan=True),
                  GLOBAL_TEST: MetricSpec(0.0, 1.0, nan=True)}
        if config.dp != "client":
            scores[NODES_KEY] = MetricSpec(1.0, fact="num-nodes")
        if config.server_round > config.options_of(AdaFGLOptions).rounds_step1:
            return ReplySpec(metrics=scores)
        with torch.device("meta"):
            model = cls.build_model(num_features, num_classes, config)
        return ReplySpec({k: ArraySpec(tuple(v.shape), str(v.dtype).removeprefix("torch."))
                          for k, v in model.state_dict().items()
                          if not any(f in k for f in cls.local_keys)}, scores)

    def run_phase(self, phase: Phase, arrays: Arrays) -> PhaseReply:
        """Step 1 (federated extractor training) and the delivery of the chosen extractor."""
        if phase != EXTRACT:
            return super().run_phase(phase, arrays)
        opts = self.options
        server_round = self.config.server_round
        metrics: dict[str, float] = {NODES_KEY: float(self.data.num_nodes)}
        if arrays:
            self.load_model(arrays)
        if server_round <= opts.rounds_step1:
            metrics.update(self.model_scores())  # θ_(r-1), before local training
            if opts.fresh_optimizer:
                self.optimizer = self.build_optimizer()
            self.step1_loss = SupervisedTrainer.train(self, self.config.local_epochs)[
                "train_loss"]
            return PhaseReply(arrays=self.model_arrays(), metrics=metrics)
        if arrays and opts.checkpoint == "best" and server_round == opts.rounds_step1 + 1:
            metrics.update(self.model_scores())  # θ_R1, scored only
        elif arrays:  # the chosen extractor: step 2 starts
            self.delivered = True
            self.step2 = None
            metrics.update(self.model_scores())
        else:
            metrics.update(nan_metrics((GLOBAL_VAL, GLOBAL_TEST)))
        return PhaseReply(metrics=metrics)

    # --- step 2 -----------------------------------------------------------------------
    def uses(self) -> tuple[bool, bool]:
        """(homophilous module trained, heterophilous module trained)."""
        if self.options.combine == "soft":
            return True, True
        assert self.step2 is not None  # step 2 prepared (prepare_step2 or load_local_state)
        homo = float(self.step2["hcs"]) >= self.options.threshold
        return homo, not homo

    @torch.no_grad()
    def prepare_step2(self) -> None:
        """P_g, HCS, the similarity support and the step-2 modules and optimizer."""
        opts, data = self.options, self.data
        self.model.eval()
        probs = F.softmax(self.forward(), dim=1)  # P_g [n, C]
        seeds, held = hcs_split(data.train_mask)
        hcs = homophily_confidence(data.y, seeds, held, self.adjacency, self.num_classes,
                                   opts.lp_steps, opts.lp_alpha, opts.lp_train_boost)
        row, col, prior = similarity_support(probs, opts.similarity_threshold, opts.similarity,
                                             opts.topk, opts.random_pairs, opts.dense_max_nodes)
        self.step2 = {"probs": probs, "hcs": torch.tensor(hcs), "row": row, "col": col,
                      "prior": prior}
        self._smooth = None
        self.build_step2_modules()
        self.epochs_done, self.step2_loss = 0, float("nan")
        self.held_probs, self.held_val = None, -math.inf

    def build_step2_modules(self) -> None:
        """The step-2 homophilous/heterophilous modules that :meth:`uses` picks, and their Adam."""
        opts = self.options
        d = self.data.num_features
        smooth = (opts.prop_steps + 1) * d
        hidden, dropout = self.config.hidden, self.config.dropout
        use_homo, use_hete = self.uses()
        self.homo = (HomoPropagation(smooth, hidden, self.num_classes, 2, dropout)
                     .to(self.device) if use_homo else None)
        self.hete = (HeteroPropagation(d, smooth, hidden, self.num_classes, 3, dropout, opts.beta)
                     .to(self.device) if use_hete else None)
        params = [p for m in (self.homo, self.hete) if m is not None for p in m.parameters()]
        self.step2_optimizer = torch.optim.Adam(params, lr=self.config.lr,
                                                weight_decay=self.config.weight_decay)

    @property
    def smooth(self) -> torch.Tensor:
        """X_s on the rewired graph [n, (K+1)·d], recomputed from the support when needed."""
        if self._smooth is None:
            opts, s = self.options, self.step2
            assert s is not None  # step 2 prepared (prepare_step2 or load_local_state)
            linked = s["prior"] > 0
            adjacency = rewired_adjacency(self.data.edge_index, self.data.num_nodes,
                                          s["row"][linked], s["col"][linked], opts.alpha, opts.r)
            self._smooth = smoothed_features(self.data.x, adjacency, opts.prop_steps)
        return self._smooth

    def step2_outputs(self) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...] | None]:
        """Logits of the homophilous module and the heterophilous module's three heads (None if unused)."""
        s = self.step2
        assert s is not None  # step 2 prepared (prepare_step2 or load_local_state)
        homo = self.homo(self.smooth) if self.homo is not None else None
        hete = (self.hete(self.data.x, self.smooth, s["row"], s["col"], s["prior"])
                if self.hete is not None else None)
        return homo, hete

    def step2_epoch(self) -> float:
        """One step-2 training epoch; returns its loss."""
        data, s = self.data, self.step2
        assert s is not None and self.step2_optimizer is not None  # step 2 prepared
        train, y = data.train_mask, data.y
        for m in (self.homo, self.hete):
            if m is not None:
                m.train()
        self.step2_optimizer.zero_grad()
        homo, hete = self.step2_outputs()
        loss = torch.zeros((), device=self.device)
        if homo is not None:
            loss = loss + F.cross_entropy(homo[train], y[train]) + F.mse_loss(homo, s["probs"])
        if hete is not None:
            loss = loss + sum(F.cross_entropy(z[train], y[train]) for z in hete)
        loss.backward()
        self.step2_optimizer.step()
        self.epochs_done += 1
        return float(loss.detach())

    @torch.no_grad()
    def step2_probs(self) -> torch.Tensor:
        """The step-2 prediction [n, C] (eval mode)."""
        assert self.step2 is not None  # step 2 prepared (prepare_step2 or load_local_state)
        for m in (self.homo, self.hete):
            if m is not None:
                m.eval()
        homo, hete = self.step2_outputs()
        homo_p = (None if homo is None else
                  0.5 * (F.softmax(homo, dim=1) + F.softmax(self.step2["probs"], dim=1)))
        hete_p = (None if hete is None else  # hete is non-empty: a tensor, not sum()'s 0
                  cast(torch.Tensor, sum(F.softmax(z, dim=1) for z in hete)) / 3.0)
        if homo_p is None:
            assert hete_p is not None  # uses() trains at least one module
            return hete_p
        if hete_p is None:
            return homo_p
        hcs = float(self.step2["hcs"])
        return hcs * homo_p + (1.0 - hcs) * hete_p

    def train(self, epochs: int) -> dict[str, float]:
        """Step 1: the extractor's loss; step 2: the round's epochs, keeping the best-val prediction."""
        if not self.delivered:
            loss = self.step1_loss
            if not math.isfinite(loss):  # never trained in step 1: the held model's CE
                with torch.no_grad():
                    self.model.eval()
                    mask = self.data.train_mask
                    loss = float(F.cross_entropy(self.forward()[mask], self.data.y[mask]))
            return {"train_loss": loss}
        if self.step2 is None:
            self.prepare_step2()
        opts = self.options
        todo = opts.epochs - self.epochs_done
        if opts.schedule == "epoch-per-round":
            todo = min(todo, 1)
        for _ in range(todo):
            self.step2_loss = self.step2_epoch()
            probs = self.step2_probs()
            if opts.schedule == "epoch-per-round":
                self.held_probs = probs
                continue
            val = score(probs, self.data.y, self.data.val_mask, self.metric)
            if self.held_probs is None or not math.isfinite(val) or val > self.held_val:
                # the code's strict '>' (no validation nodes: the last epoch)
                self.held_probs, self.held_val = probs, val
        return {"train_loss": self.step2_loss}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Step 2's held prediction scored (NaN during step 1), plus the extractor's scores and the HCS."""
        extractor = self.model_scores()
        if not self.delivered or self.held_probs is None:
            # Step 1: the protocols score step 2 only (the code reports step 2).
            self.model.eval()
            metrics = nan_metrics(evaluation_metrics(self.forward(), self.data, self.metric))
            hcs, homo = float("nan"), float("nan")
        else:
            logits = torch.log(self.held_probs.clamp_min(PROB_FLOOR))
            metrics = evaluation_metrics(logits, self.data, self.metric)
            assert self.step2 is not None  # delivered and held_probs: step 2 ran
            hcs = float(self.step2["hcs"])
            use_homo, use_hete = self.uses()
            homo = 1.0 if use_homo and not use_hete else 0.0 if use_hete and not use_homo else 0.5
        return {**metrics, "extractor_val_metric": extractor[GLOBAL_VAL],
                "extractor_test_metric": extractor[GLOBAL_TEST], "hcs": hcs,
                "homophilous": homo, "step2_epochs": float(self.epochs_done)}

    # --- local state -------------------------------------------------------------------
    def local_state(self) -> dict[str, Any]:
        """What persists between rounds on this client, beyond the base trainer's."""
        state = {**super().local_state(), "step1_loss": self.step1_loss,
                 "delivered": self.delivered}
        if self.step2 is not None:
            assert self.step2_optimizer is not None  # built with step2 (build_step2_modules)
            state["step2"] = {
                "tensors": dict(self.step2),
                "homo": None if self.homo is None else self.homo.state_dict(),
                "hete": None if self.hete is None else self.hete.state_dict(),
                "optimizer": self.step2_optimizer.state_dict(),
                "epochs_done": self.epochs_done, "loss": self.step2_loss,
                "held_probs": self.held_probs, "held_val": self.held_val,
            }
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.step1_loss = float(state.get("step1_loss", float("nan")))
        self.delivered = bool(state.get("delivered", False))
        step2 = state.get("step2")
        if step2 is None:
            return
        self.step2 = {k: v.to(self.device) for k, v in step2["tensors"].items()}
        self._smooth = None
        self.build_step2_modules()
        if self.homo is not None:
            self.homo.load_state_dict(step2["homo"])
        if self.hete is not None:
            self.hete.load_state_dict(step2["hete"])
        assert self.step2_optimizer is not None  # just built
        self.step2_optimizer.load_state_dict(step2["optimizer"])
        self.epochs_done = int(step2["epochs_done"])
        self.step2_loss = float(step2["loss"])
        held = step2["held_probs"]
        self.held_probs = None if held is None else held.to(self.device)
        self.held_val = float(step2["held_val"])


class AdaFGLAggregator(Aggregator):
    """Step 1: node-weighted FedAvg and the checkpoint; then one delivery per client."""

    options_class = AdaFGLOptions
    options: AdaFGLOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        self.global_arrays: Arrays = {}  # θ_r; empty before round 1 (clients build θ_0)
        self.best_arrays: Arrays = {}
        self.best_score = -math.inf
        self.best_round = 0
        self.delivered: set[int] = set()

    def chosen(self) -> Arrays:
        """The extractor step 2 starts from."""
        if self.options.checkpoint == "best" and self.best_arrays:
            return self.best_arrays
        return self.global_arrays

    def configure(self, phase: Phase, server_round: int, clients: list[int]) -> dict[int, Arrays]:
        """Each client's extractor for the phase (nothing for clients already delivered)."""
        if phase != EXTRACT:
            return super().configure(phase, server_round, clients)
        opts = self.options
        if server_round <= opts.rounds_step1 or (
                opts.checkpoint == "best" and server_round == opts.rounds_step1 + 1):
            return {c: self.global_arrays for c in clients}
        chosen = self.chosen()
        return {c: ({} if c in self.delivered else chosen) for c in clients}

    def step(self, phase: Phase, server_round: int, updates: dict[int, ClientUpdate]
             ) -> AggregateResult | None:
        """FedAvg of the extractors in step 1; keeps the best by node-weighted validation."""
        if phase != EXTRACT:
            return None
        opts = self.options
        ids = sorted(updates)
        metrics: dict[str, float] = {}
        scored = [c for c in ids if math.isfinite(updates[c].metrics.get(GLOBAL_VAL, math.nan))]
        if scored:
            nodes = self._node_weights(updates, scored)
            vals = np.array([updates[c].metrics[GLOBAL_VAL] for c in scored])
            tests = np.array([updates[c].metrics.get(GLOBAL_TEST, math.nan) for c in scored])
            metrics["global_val"] = float(nodes @ vals / nodes.sum())
            metrics["global_test"] = float(np.nansum(nodes * tests) / nodes.sum())
        # The received model θ_(r-1) was scored this round (round 1 scores θ_0, not a candidate).
        scores_candidate = 2 <= server_round <= opts.rounds_step1 + 1
        if scores_candidate and scored and metrics["global_val"] > self.best_score:
            self.best_score, self.best_round = metrics["global_val"], server_round - 1
            self.best_arrays = self.global_arrays
        if server_round <= opts.rounds_step1 and ids:
            nodes = self._node_weights(updates, ids)
            self.global_arrays = average(nodes / nodes.sum(), [updates[c].arrays for c in ids],
                                         self.mix_dtype)
        elif server_round >= opts.delivery_round:
            self.delivered.update(ids)
        metrics.update({"best_round": float(self.best_round), "delivered": float(len(self.delivered))})
        return AggregateResult(payloads={}, metrics=metrics)

    def _node_weights(self, updates: dict[int, ClientUpdate], ids: list[int]) -> np.ndarray:
        """Each client's node count, or 1 each under dp=client, where counts never leave
        a client (privacy/counts.py)."""
        if self.config.dp == "client":
            return np.ones(len(ids))
        return np.array([updates[c].metrics[NODES_KEY] for c in ids], dtype=np.float64)

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Nothing to combine: step 2 is local."""
        # The train phase carries nothing either way: step 1 travels in the extract phase.
        return AggregateResult(payloads={c: {} for c in updates})

    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the payloads, for checkpoint/resume."""
        return {"global": self.global_arrays, "best": self.best_arrays,
                "best_score": self.best_score, "best_round": self.best_round,
                "delivered": sorted(self.delivered)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.global_arrays = dict(state["global"])
        self.best_arrays = dict(state["best"])
        self.best_score = float(state["best_score"])
        self.best_round = int(state["best_round"])
        self.delivered = {int(c) for c in state["delivered"]}


ALGORITHM = Algorithm("adafgl", AdaFGLTrainer, AdaFGLAggregator, AdaFGLOptions)
