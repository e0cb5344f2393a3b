"""FedDEP (Zhang et al., SDM 2024): subgraph FL with deep efficient private neighbour
generation. **Per-node generated embeddings and their gradients leave the client.**

Official code followed: ``zkzhangke/FedDEP`` at cf50e38 (``federatedscope/gfl/feddep/``
``utils.py`` embeddings, prototypes and hiding, ``trainer.py`` losses and ``cal_grad``,
``worker.py`` schedule; ``gfl/model/feddep.py``, ``gfl/model/sage.py``;
``gfl/loss/reconstruction_loss.py``; ``feddep_on_cora5.yaml``), with OpenFGL's
``openfgl/flcore/feddep/`` (openfgl-lib 1.1.0) read beside it; reading notes with
file:line references in ``docs/reading/feddep.md``.

Stages, on FedSage+'s relay phases (``pretrain`` before round 1; then every round
``gen_send``, ``gen_grad``, ``gen_step`` and ``train``; a phase whose stage is over is a
no-op that sends nothing):

0. ``pretrain`` (before round 1), all local:

   a. a GraphSAGE encoder (:class:`~fedgraph_flwr.nn.feddep_encoder.EmbeddingEncoder`) is
      trained on the training nodes with per-hop neighbour sampling (``neighbours``
      per node and layer, batches of ``encoder-batch``, Adam) and embeds every node
      (eval mode, sampled neighbourhoods) → emb [n, e];
   b. SDAE + DEC (:func:`~fedgraph_flwr.nn.dec_clustering.dec_clusters`) cluster emb
      into K = ``num-protos`` clusters; each node's prototype is its cluster's mean emb;
   c. ⌊``hidden-portion``·|val|⌋ random validation nodes are hidden; every node gets ñ, its
      number of hidden neighbours, and the clusters of its first P of them (in the order
      they were drawn; :func:`hidden_neighbours`). The impaired graph G' drops the hidden
      nodes; its targets are those neighbours' prototypes;
   d. the generator (:class:`~fedgraph_flwr.nn.feddep_generator.DepGenerator`) takes
      ``pretrain-steps`` full-batch steps on G''s training nodes of
      L = β_d·SmoothL1(n̂, ñ) + β_c·CE(classifier(x, z̄), y) + β_n·L_rec, where L_rec is the
      min-MSE of each slot p < clip(round(n̂), 0, P) to the node's true targets, summed
      over n_train·P (both codes' ``LocalRecLoss``; :func:`local_reconstruction`).
1. Rounds 1..``gen-rounds``: one federated generator update each. ``gen_send``: client i
   runs the generator on G' (its noise and dropout drawn from a seed it keeps) and sends,
   for its nodes with ⌊n̂⌋ > 0, the generated embeddings ĝ [n_sel, P, e] (slots
   p >= ⌊n̂⌋ zeroed) and the slot counts ⌊n̂⌋ (clipped to P). ``gen_grad``: client j draws
   for every row a random node c of its own and P random slots of c's hidden-neighbour
   table with replacement; an empty slot falls back to c's own prototype
   (:meth:`FedDEPTrainer.cross_targets`); it returns d/dĝ of the min-MSE of every
   counted slot to those P targets (both codes' ``FedRecLoss``; never its prototypes).
   ``gen_step``: i recomputes the same forward and steps on (1/M)·L +
   (β_n/M)·Σ_j L_rec^(j) / (n'·P), M = 1 + the number of j that answered, where L_rec^(j)
   enters through its relayed gradient. The ``train`` phase of these rounds trains
   nothing and reports NaN metrics.
2. Mending (the first classifier round, once): the generator on G' (train mode, noise
   and dropout on, as both codes leave it) gives each kept node z̄ = mean over the P
   slots of its first round(n̂) generated embeddings; hidden nodes get 0. The graph is
   not changed: no nodes or edges are added. The generator is then dropped.
3. Classifier rounds: :class:`~fedgraph_flwr.nn.feddep_classifier.DepClassifier` reads
   (x, z̄) on the client's graph, trained on mini-batches of ``batch-size`` training nodes
   with ``neighbours`` sampled in-neighbours per node and layer (both codes' [5, 5]
   NeighborSampler), ``local-epochs`` epochs per round, then averaged (``weighting``).
   Evaluation: each client's val/test nodes, full neighbourhoods, with z̄ or zeros
   (``eval-emb``).

What leaves a client: in a generator round, ``vectors`` [n_sel, P, e] + ``slots`` [n_sel]
in ``gen_send`` and ``grads`` [Σ n_sel, P, e] in ``gen_grad``: per-node values, the
method's own published protocol (``per_node_arrays``; the official code sends more: the
whole generator and every node's encoder output). Every round: the classifier's
parameters (in generator rounds unchanged). A few scalar losses and counts as metrics.

The codes' gradient bookkeeping is not reproduced: neither zeroes ``.grad`` before the
cross-client backward (stale gradients ride along), the official one hands back live
``.grad`` aliases, and OpenFGL's in-place accumulation doubles the relayed gradient once
per extra client. Here every gradient is computed fresh. The relay uses i's own noise
draw for j's term (the official code's j draws its own on i's model).

Switches where the codes differ (default: the official code; OpenFGL second):

- ``feddep-fed-train`` gen | all: what the generator rounds train. The official code
  freezes encoder, count regressor and inner classifier; OpenFGL trains everything.
- ``feddep-fed-step`` twice | once: the official client takes an SGD step on its own
  loss, then adds the relayed gradients and steps again with the same own gradient;
  OpenFGL takes one step on the sum.
- ``feddep-gen-rounds``: the official yaml's ``feddep_epoch: 3`` runs one generator update
  (its server tests the undoubled count); OpenFGL runs 3.
- ``feddep-gen-optimizer`` sgd | adam with ``gen-lr``/``gen-weight-decay``: the official
  code's FederatedScope default SGD(0.1); OpenFGL's Adam(0.01, 5e-4), kept across steps.
- ``feddep-pretrain-steps``: 1 (official) | 2 (OpenFGL).
- ``feddep-eval-emb`` zeros | mended: the official evaluation never sees the generated
  embeddings (its graph has no ``mend_emb``, the branch reads zeros); OpenFGL evaluates
  with them.
- ``feddep-weighting`` train | uniform: FedAvg by training nodes (official) or 1/K (OpenFGL).
- ``feddep-empty-slot`` count | sum: when a drawn target slot is empty. ``count``: slot
  k >= ñ_c (the evident intent); ``sum``: the codes' test ``sum(prototype) < 1e-15``, which
  also discards filled slots whose prototype sums to a negative number.
- ``feddep-emb-branch`` chained | direct: both codes chain the classifier's embedding
  linears; the appendix feeds z̄ to every layer.
- Widths: the official yaml's embedding width and hidden width are 128 (``emb-dim``,
  ``hidden``); OpenFGL's 64. The encoder batch is 32 (official) or 64 (OpenFGL).

Hyperparameters (official yaml): K = 5 prototypes, P = 5 slots, hidden portion 0.5,
embedding width 128, generator latent 128, dropout 0.5, encoder 50 epochs of batch 32 with
Adam(0.01, 5e-4), DEC batch 32 with 2 / 3 / 5 pre-training / fine-tuning / DEC epochs,
β_d = β_c = β_n = 1, classifier: SGD lr 0.1, batch 64, [5, 5] neighbours, 1 epoch per
round (``configs/feddep/``).
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

from ..core.mixing import MixingPlan
from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ArraySpec, ClientUpdate, PhaseReply
from ..core.registry import Algorithm
from ..nn.dec_clustering import dec_clusters
from ..nn.feddep_classifier import BRANCHES, DepClassifier
from ..nn.feddep_encoder import EmbeddingEncoder, sample_in_edges
from ..nn.feddep_generator import DepGenerator, mended_mean
from .fedavg import WEIGHTINGS, client_weights, weighted_average
from .fedsage import (
    GRADS,
    SLOTS,
    VECTORS,
    FedSageAggregator,
    GeneratorRelayTrainer,
    greedy_feature_loss,
    simple_edges,
)
from .supervised import OPTIMIZERS, ChoosesOptimizer

if TYPE_CHECKING:
    from ..config import ClientConfig

FED_TRAIN = ("gen", "all")
FED_STEP = ("twice", "once")
EVAL_EMB = ("zeros", "mended")
EMPTY_SLOT = ("count", "sum")
EMPTY_SUM = 1e-15  # the codes' test for an empty target slot


# `feddep-reproduce`: the profiles, the default first (docs/methods/feddep.md).
# `default`: the official code's, but an empty slot found by count.
PUBLISHED = (
    "`openfgl` (with OpenFGL's widths and rounds: configs/paper/openfgl-side-by-side-cora.yaml) "
    "is the one compared with OpenFGL on its files (this page); no published FedDEP figure fits "
    "these partitions."
)
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "official": {
        "gen_optimizer": "sgd", "fed_train": "gen", "fed_step": "twice", "empty_slot": "sum",
        "emb_branch": "chained", "eval_emb": "zeros", "optimizer": "sgd", "weighting": "train",
    },
    "openfgl": {
        "gen_optimizer": "adam", "fed_train": "all", "fed_step": "once", "empty_slot": "sum",
        "eval_emb": "mended", "optimizer": "adam", "weighting": "uniform", "emb_dim": 64,
        "encoder_batch": 64, "pretrain_steps": 2, "gen_rounds": 3, "gen_lr": 0.01,
        "gen_weight_decay": 5.0e-4,
    },
    "paper": {"emb_branch": "direct"},
}


@dataclass(frozen=True)
class FedDEPOptions(Options, prefix="feddep", profiles=PROFILES, published=PUBLISHED):
    """FedDEP's knobs (``feddep-*``); defaults = the official code's ``feddep_on_cora5.yaml``."""

    gen_rounds: int = option(1, "federated generator rounds (one update each) before the "
                             "classifier rounds", low=0)
    pretrain_steps: int = option(1, "full-batch generator steps before round 1", low=0)
    num_protos: int = option(5, "K: prototypes (DEC clusters) per client", low=1)
    num_pred: int = option(5, "P: generated neighbour embeddings per node at most", low=1)
    hidden_portion: float = option(0.5, "share of the validation nodes hidden to build the "
                                   "impaired graph", low=0.0, high=1.0)
    emb_dim: int = option(128, "embedding width e (encoder, prototypes, generated slots; also "
                          "the generator's hidden width)", low=1)
    latent_dim: int = option(128, "the generator's latent width", low=1)
    dropout: float = option(0.5, "dropout of the encoder and the generator", low=0.0, high=1.0,
                            high_inclusive=False)
    neighbours: int = option(5, "sampled in-neighbours per node and layer (encoder and "
                             "classifier training; 0: all)", low=0)
    encoder_epochs: int = option(50, "encoder training epochs", low=0)
    encoder_batch: int = option(32, "encoder training nodes per step", low=1)
    encoder_lr: float = option(0.01, "encoder Adam learning rate", low=0.0, low_inclusive=False)
    encoder_weight_decay: float = option(5e-4, "encoder Adam weight decay", low=0.0)
    dec_batch: int = option(32, "SDAE / DEC batch size", low=1)
    ae_pretrain_epochs: int = option(2, "SDAE layer-wise pre-training epochs", low=0)
    ae_finetune_epochs: int = option(3, "SDAE fine-tuning epochs", low=0)
    dec_epochs: int = option(5, "DEC epochs", low=0)
    gen_optimizer: str = option("sgd", "generator optimizer: sgd (official) | adam (OpenFGL)",
                                choices=OPTIMIZERS)
    gen_lr: float = option(0.1, "generator learning rate", low=0.0, low_inclusive=False)
    gen_weight_decay: float = option(0.0, "generator weight decay", low=0.0)
    fed_train: str = option("gen", "trained in the generator rounds: gen (official) | all "
                            "(OpenFGL)", choices=FED_TRAIN)
    fed_step: str = option("twice", "generator-round update: twice (official: own step, then "
                           "own + relayed) | once (OpenFGL)", choices=FED_STEP)
    loss_degree: float = option(1.0, "β_d: weight of the count SmoothL1", low=0.0)
    loss_rec: float = option(1.0, "β_n: weight of the embedding reconstruction losses", low=0.0)
    loss_class: float = option(1.0, "β_c: weight of the inner classifier's cross-entropy", low=0.0)
    empty_slot: str = option("count", "an empty cross-client target slot: count (k >= ñ) | sum "
                             "(the codes' sum < 1e-15)", choices=EMPTY_SLOT)
    emb_branch: str = option("chained", "classifier embedding branch: chained (codes) | direct "
                             "(appendix)", choices=BRANCHES)
    eval_emb: str = option("zeros", "embeddings the evaluation reads: zeros (official) | "
                           "mended (OpenFGL)", choices=EVAL_EMB)
    optimizer: str = option("sgd", "classifier optimizer with the common lr / weight-decay: "
                            "sgd (official) | adam (OpenFGL)", choices=OPTIMIZERS)
    batch_size: int = option(64, "training nodes per classifier step (0: full batch)", low=0)
    weighting: str = option("train", "server mean: train (official) | uniform (OpenFGL)",
                            choices=WEIGHTINGS)


# --- the method's maths (pure functions) ----------------------------------------------------
def cluster_means(emb: torch.Tensor, clusters: torch.Tensor, num_clusters: int) -> torch.Tensor:
    """Prototypes [K, e]: each cluster's mean embedding (0 for an empty cluster)."""
    sums = emb.new_zeros(num_clusters, emb.size(1)).index_add_(0, clusters, emb)
    counts = torch.bincount(clusters, minlength=num_clusters).clamp(min=1)
    return sums / counts.unsqueeze(1).to(emb.dtype)


def hidden_neighbours(edge_index: torch.Tensor, num_nodes: int, hidden_order: torch.Tensor,
                      num_pred: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every node: (ñ [n], its number of hidden neighbours; first [n, P], the ids of its
    first P hidden neighbours in ``hidden_order``'s order, −1 padded). Neighbour sets, no
    self-loops (the codes go through networkx)."""
    src, dst = simple_edges(edge_index, num_nodes)
    position = torch.full((num_nodes,), -1, dtype=torch.long, device=src.device)
    position[hidden_order] = torch.arange(hidden_order.numel(), device=src.device)
    lost = position[dst] >= 0
    src, dst = src[lost], dst[lost]
    order = torch.argsort(src * max(hidden_order.numel(), 1) + position[dst])
    src, dst = src[order], dst[order]
    missing = torch.bincount(src, minlength=num_nodes)
    start = torch.cumsum(missing, 0) - missing
    rank = torch.arange(src.numel(), device=src.device) - start[src]
    first = torch.full((num_nodes, num_pred), -1, dtype=torch.long, device=src.device)
    keep = rank < num_pred
    first[src[keep], rank[keep]] = dst[keep]
    return missing, first


def reconstruction_loss(generated: torch.Tensor, targets: torch.Tensor, slots: torch.Tensor,
                        true_counts: torch.Tensor) -> torch.Tensor:
    """Σ over counted slots (p < ``slots``) of the min-MSE to the first ``true_counts``
    targets, divided by n·P: the codes' ``LocalRecLoss`` / ``FedRecLoss`` mean."""
    n, num_pred = generated.shape[:2]
    per_slot = greedy_feature_loss(generated, targets, slots, true_counts, "min")
    return per_slot.sum() / max(n * num_pred, 1)


def local_slots(degree: torch.Tensor, num_pred: int) -> torch.Tensor:
    """clip(round(n̂), 0, P): the local loss's and the mend's slot count."""
    return torch.round(degree.detach()).clamp(0, num_pred).long()


def cross_slots(degree: torch.Tensor, num_pred: int) -> torch.Tensor:
    """clip(⌊n̂⌋, 0, P): the cross-client loss's slot count (``int(n̂)`` in the codes)."""
    return torch.floor(degree.detach()).clamp(0, num_pred).long()


@dataclass
class Preparation:
    """What ``pretrain`` derives from the client's graph (kept for the generator rounds).

    ``clusters`` [n], ``prototypes`` [K, e], ``hidden_order`` [h] (node ids as drawn),
    ``missing`` [n] ñ, ``slot_clusters`` [n, P] the clusters of the first P hidden
    neighbours (−1 padded); ``keep`` [n'] the impaired graph's nodes, ``edge_index`` its
    edges (relabelled), ``targets`` [n', P, e] their hidden neighbours' prototypes.
    """

    clusters: torch.Tensor
    prototypes: torch.Tensor
    hidden_order: torch.Tensor
    missing: torch.Tensor
    slot_clusters: torch.Tensor
    keep: torch.Tensor
    edge_index: torch.Tensor
    targets: torch.Tensor

    @classmethod
    def build(cls, data: Data, clusters: torch.Tensor, prototypes: torch.Tensor,
              hidden_order: torch.Tensor, num_pred: int) -> Preparation:
        """Hidden-neighbour tables and the impaired graph from the clusters and hidden nodes."""
        n = data.num_nodes
        missing, first = hidden_neighbours(data.edge_index, n, hidden_order, num_pred)
        slot_clusters = torch.where(first >= 0, clusters[first.clamp(min=0)], -1)
        hidden = torch.zeros(n, dtype=torch.bool, device=clusters.device)
        hidden[hidden_order] = True
        keep = (~hidden).nonzero().view(-1)
        new_id = torch.full((n,), -1, dtype=torch.long, device=clusters.device)
        new_id[keep] = torch.arange(keep.numel(), device=clusters.device)
        edges = simple_edges(data.edge_index, n)
        edge_index = new_id[edges[:, ~hidden[edges[0]] & ~hidden[edges[1]]]]
        table = slot_clusters[keep]
        targets = prototypes[table.clamp(min=0)] * (table >= 0).unsqueeze(-1)
        return cls(clusters, prototypes, hidden_order, missing, slot_clusters, keep, edge_index,
                   targets)


@dataclass
class GeneratorPass:
    """One generator forward on the impaired graph, with its local losses."""

    degree: torch.Tensor  # [n'] n̂
    generated: torch.Tensor  # [n', P, e]
    degree_loss: torch.Tensor
    rec_loss: torch.Tensor
    class_loss: torch.Tensor


# --- the client -------------------------------------------------------------------------------
class FedDEPTrainer(ChoosesOptimizer, GeneratorRelayTrainer):
    """Embeddings, prototypes and the generator on the client; then the classifier with z̄."""

    options_class = FedDEPOptions
    options: FedDEPOptions
    #: The paper's protocol relays generated neighbour embeddings and their gradients per node.
    per_node_arrays = frozenset({VECTORS, SLOTS, GRADS})

    @classmethod
    def sent_specs(cls, num_features: int, config: ClientConfig) -> dict[str, ArraySpec]:
        """Generated embeddings [m, P, emb-dim] and counted slots [m] in 1..P."""
        opts = config.options_of(FedDEPOptions)
        return {VECTORS: ArraySpec(("m", opts.num_pred, opts.emb_dim), "float32"),
                SLOTS: ArraySpec(("m",), "int64", low=1, high=opts.num_pred)}

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        self.prep: Preparation | None = None
        self.generator: DepGenerator | None = None
        self.gen_optimizer: torch.optim.Optimizer | None = None
        self.gen_seed = None
        self.gen_loss = float("nan")
        self.mend: torch.Tensor | None = None  # [n, e] z̄ once mended

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """The classifier with its embedding branch (``hidden``, ``num-layers``, ``dropout``)."""
        opts = config.options_of(FedDEPOptions)
        return DepClassifier(num_features, opts.emb_dim, config.hidden, num_classes,
                             config.num_layers, config.dropout, opts.emb_branch)

    # --- the generator: preparation, passes and losses ---------------------------------------
    def _build_generator(self) -> None:
        opts = self.options
        self.generator = DepGenerator(self.data.num_features, self.num_classes, opts.emb_dim,
                                      opts.latent_dim, opts.num_pred, opts.dropout,
                                      opts.emb_branch).to(self.device)
        params = self.generator.parameters()
        if opts.gen_optimizer == "adam":
            self.gen_optimizer = torch.optim.Adam(params, lr=opts.gen_lr,
                                                  weight_decay=opts.gen_weight_decay)
        else:  # stateless: the official code rebuilds it every step, the same thing
            self.gen_optimizer = torch.optim.SGD(params, lr=opts.gen_lr,
                                                 weight_decay=opts.gen_weight_decay)

    def node_embeddings(self) -> torch.Tensor:
        """Train the embedding encoder with sampled neighbourhoods; emb [n, e] of every node."""
        opts, data = self.options, self.data
        n = data.num_nodes
        encoder = EmbeddingEncoder(data.num_features, opts.emb_dim, self.num_classes,
                                   opts.dropout).to(self.device)
        optimizer = torch.optim.Adam(encoder.parameters(), lr=opts.encoder_lr,
                                     weight_decay=opts.encoder_weight_decay)
        train_nodes = data.train_mask.nonzero().view(-1)
        encoder.train()
        for _ in range(opts.encoder_epochs):
            order = train_nodes[torch.randperm(train_nodes.numel(), device=self.device)]
            for batch in order.split(opts.encoder_batch):
                edges = [sample_in_edges(data.edge_index, n, opts.neighbours) for _ in range(2)]
                loss = F.cross_entropy(encoder(data.x, edges)[batch], data.y[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        encoder.eval()
        with torch.no_grad():
            edges = [sample_in_edges(data.edge_index, n, opts.neighbours) for _ in range(2)]
            return encoder.embed(data.x, edges)

    def _ensure_generator(self) -> dict[str, float]:
        """Embeddings, prototypes, hiding and generator pre-training, unless done."""
        if self.generator is not None:
            return {}
        opts, data = self.options, self.data
        emb = self.node_embeddings()
        k = min(opts.num_protos, data.num_nodes)
        clusters = dec_clusters(emb, k, opts.dec_batch, opts.ae_pretrain_epochs,
                                opts.ae_finetune_epochs, opts.dec_epochs)
        val = data.val_mask.nonzero().view(-1)
        drawn = torch.randperm(val.numel(), device=self.device)
        hidden_order = val[drawn[: int(opts.hidden_portion * val.numel())]]
        self.prep = Preparation.build(data, clusters, cluster_means(emb, clusters, k),
                                      hidden_order, opts.num_pred)
        self._build_generator()
        assert self.generator is not None and self.gen_optimizer is not None
        self.generator.train()
        losses: dict[str, float] = {}
        for _ in range(opts.pretrain_steps):
            self.gen_optimizer.zero_grad()
            out = self._generator_pass()
            total = self._local_loss(out)
            total.backward()
            self.gen_optimizer.step()
            losses = {"pretrain_loss": total.item(), "pretrain_degree_loss": out.degree_loss.item(),
                      "pretrain_feat_loss": out.rec_loss.item(),
                      "pretrain_class_loss": out.class_loss.item()}
        return losses

    def _generator_pass(self) -> GeneratorPass:
        assert self.generator is not None and self.prep is not None
        prep, data, num_pred = self.prep, self.data, self.options.num_pred
        keep = prep.keep
        degree, generated, logits = self.generator(data.x[keep], prep.edge_index)
        train = data.train_mask[keep]
        missing = prep.missing[keep][train]
        return GeneratorPass(
            degree=degree, generated=generated,
            degree_loss=F.smooth_l1_loss(degree[train], missing.to(degree.dtype)),
            rec_loss=reconstruction_loss(generated[train], prep.targets[train],
                                         local_slots(degree[train], num_pred), missing),
            class_loss=F.cross_entropy(logits[train], data.y[keep][train]))

    def _local_loss(self, out: GeneratorPass) -> torch.Tensor:
        opts = self.options
        return (opts.loss_degree * out.degree_loss + opts.loss_rec * out.rec_loss
                + opts.loss_class * out.class_loss)

    def _fed_mode(self) -> list[nn.Parameter]:
        """Train mode (both codes) and the trained parameters of the generator rounds."""
        assert self.generator is not None
        self.generator.train()
        self.generator.requires_grad_(self.options.fed_train == "all")
        self.generator.gen.requires_grad_(True)
        return [p for p in self.generator.parameters() if p.requires_grad]

    def _sent_rows(self, out: GeneratorPass) -> torch.Tensor:
        """The impaired graph's nodes with ⌊n̂⌋ > 0 (what gen_send sends)."""
        return (cross_slots(out.degree, self.options.num_pred) > 0).nonzero().view(-1)

    def cross_targets(self, num_rows: int) -> torch.Tensor:
        """Client j's targets [R, P, e] for R foreign rows: per row a random node c and P
        random slots of c's hidden-neighbour table (with replacement); an empty slot (see
        ``empty-slot``) gives c's own prototype. Global torch RNG."""
        assert self.prep is not None
        prep, num_pred = self.prep, self.options.num_pred
        n = prep.clusters.numel()
        centre = torch.randint(n, (num_rows,), device=self.device)
        slot = torch.randint(num_pred, (num_rows, num_pred), device=self.device)
        drawn = prep.slot_clusters[centre.unsqueeze(1), slot]  # [R, P], −1 where empty
        filled = drawn >= 0
        if self.options.empty_slot == "sum":
            filled &= prep.prototypes[drawn.clamp(min=0)].sum(-1) >= EMPTY_SUM
        own = prep.clusters[centre].unsqueeze(1).expand_as(drawn)
        return prep.prototypes[torch.where(filled, drawn, own)]

    # --- phases -----------------------------------------------------------------------------
    def _send_vectors(self) -> PhaseReply:
        self._fed_mode()
        self.gen_seed = int(torch.randint(2**31 - 1, ()))
        with torch.no_grad():
            out = self._seeded_pass(self.gen_seed)
        rows = self._sent_rows(out)
        slots = cross_slots(out.degree[rows], self.options.num_pred)
        used = torch.arange(self.options.num_pred, device=self.device).view(1, -1) < slots.view(-1, 1)
        vectors = out.generated[rows] * used.unsqueeze(-1)
        return PhaseReply(
            arrays={VECTORS: vectors.cpu().numpy().astype(np.float32),
                    SLOTS: slots.cpu().numpy().astype(np.int64)},
            metrics={"degree_loss": float(out.degree_loss), "feat_loss": float(out.rec_loss),
                     "class_loss": float(out.class_loss), "sent_slots": float(slots.sum())})

    def _answer_vectors(self, arrays: Arrays) -> PhaseReply:
        """Client j: the gradient of its reconstruction loss for every foreign vector."""
        request = self._relayed_vectors(arrays)
        if request is None:
            return PhaseReply()
        vectors, slots = request
        num_pred = self.options.num_pred
        if vectors.dim() != 3 or vectors.shape[1:] != (num_pred, self.options.emb_dim):
            raise RuntimeError(f"feddep: relayed vectors {tuple(vectors.shape)}, expected "
                               f"[rows, {num_pred}, {self.options.emb_dim}]")
        targets = self.cross_targets(vectors.size(0))
        everything = torch.full_like(slots, num_pred)
        per_slot = greedy_feature_loss(vectors, targets, slots, everything, "min")
        return self._answer(vectors, slots, per_slot)

    def _generator_step(self, arrays: Arrays) -> PhaseReply:
        """Client i: recompute gen_send's forward and step with the relayed gradients."""
        opts = self.options
        params = self._fed_mode()
        assert self.gen_optimizer is not None and self.generator is not None and self.prep is not None
        seed, contributors, arrays = self._step_inputs(arrays)
        out = self._seeded_pass(seed)
        local = self._local_loss(out)
        scale = 1.0 / (1 + contributors)
        own = torch.autograd.grad(scale * local, params, retain_graph=GRADS in arrays,
                                  allow_unused=True)
        cross: tuple[torch.Tensor | None, ...] = (None,) * len(params)
        if GRADS in arrays:
            rows = self._sent_rows(out)
            grads = self._relayed_gradients(arrays, out.generated, rows)
            norm = self.prep.keep.numel() * opts.num_pred
            relayed = scale * opts.loss_rec / norm * (out.generated[rows] * grads).sum()
            cross = torch.autograd.grad(relayed, params, allow_unused=True)
        if opts.fed_step == "twice":
            self._apply(params, own)
        self._apply(params, tuple(o if c is None else c if o is None else o + c
                                  for o, c in zip(own, cross)))
        self.generator.requires_grad_(True)
        self.gen_seed = None
        self.gen_loss = local.item()
        return PhaseReply(metrics={"local_loss": self.gen_loss, "contributors": float(contributors)})

    def _apply(self, params: list[nn.Parameter], grads: tuple[torch.Tensor | None, ...]) -> None:
        assert self.gen_optimizer is not None
        self.gen_optimizer.zero_grad()
        for p, g in zip(params, grads):
            p.grad = None if g is None else g.clone()
        self.gen_optimizer.step()

    # --- the classifier -----------------------------------------------------------------------
    def _ensure_mended(self) -> None:
        if self.mend is not None:
            return
        self._ensure_generator()
        assert self.generator is not None and self.prep is not None
        self.generator.train()  # both codes mend in train mode: noise and dropout on
        with torch.no_grad():
            degree, generated, _ = self.generator(self.data.x[self.prep.keep], self.prep.edge_index)
            mend = generated.new_zeros(self.data.num_nodes, generated.size(-1))
            mend[self.prep.keep] = mended_mean(generated, degree)
        self.mend = mend
        # The generator's work is done: free it and the tables (gen alone is 2048·P·e floats).
        self.generator = self.gen_optimizer = self.prep = None

    def embeddings(self, training: bool) -> torch.Tensor:
        """z̄ [n, e] for the classifier: the mended one, or zeros before mending and (with
        ``eval-emb=zeros``) in evaluation."""
        data = self.data
        if self.mend is None or (not training and self.options.eval_emb == "zeros"):
            return data.x.new_zeros(data.num_nodes, self.options.emb_dim)
        return self.mend

    def forward(self) -> torch.Tensor:
        """Evaluation logits [n, C]: full neighbourhoods."""
        return self.model(self.data.x, self.embeddings(training=False), self.data.edge_index)

    def train(self, epochs: int) -> dict[str, float]:
        """Generator rounds: the generator's loss only; then the classifier on (x, z̄)."""
        if self.generator_round():
            return {"train_loss": self.gen_loss if math.isfinite(self.gen_loss) else 0.0}
        self._ensure_mended()
        data, opts = self.data, self.options
        emb = self.embeddings(training=True)
        train_nodes = data.train_mask.nonzero().view(-1)
        size = max(opts.batch_size or train_nodes.numel(), 1)
        layers = len(self.model.convs)  # type: ignore[arg-type]
        self.model.train()
        loss_value = float("nan")
        for _ in range(epochs):
            order = train_nodes[torch.randperm(train_nodes.numel(), device=self.device)]
            for batch in order.split(size):
                edges = [sample_in_edges(data.edge_index, data.num_nodes, opts.neighbours)
                         for _ in range(layers)]
                self.optimizer.zero_grad()
                loss = F.cross_entropy(self.model(data.x, emb, edges)[batch], data.y[batch])
                loss.backward()
                self.optimizer.step()
                loss_value = float(loss.detach())
        return {"train_loss": loss_value}

    # --- state ----------------------------------------------------------------------------------
    def local_state(self) -> dict[str, Any]:
        """The base state plus the preparation, the generator and its optimizer, or z̄."""
        state: dict[str, Any] = {**super().local_state(), "gen_seed": self.gen_seed,
                                 "gen_loss": self.gen_loss, "mend": self.mend, "prep": None,
                                 "generator": None, "gen_optimizer": None}
        if self.prep is not None:
            state["prep"] = {"clusters": self.prep.clusters, "prototypes": self.prep.prototypes,
                             "hidden_order": self.prep.hidden_order}
        if self.generator is not None and self.gen_optimizer is not None:
            state["generator"] = self.generator.state_dict()
            state["gen_optimizer"] = self.gen_optimizer.state_dict()
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.gen_seed = state.get("gen_seed")
        self.gen_loss = float(state.get("gen_loss", float("nan")))
        mend = state.get("mend")
        self.mend = None if mend is None else mend.to(self.device)
        self.prep = self.generator = self.gen_optimizer = None
        prep = state.get("prep")
        if prep is not None:
            self.prep = Preparation.build(self.data, prep["clusters"].to(self.device),
                                          prep["prototypes"].to(self.device),
                                          prep["hidden_order"].to(self.device),
                                          self.options.num_pred)
        if state.get("generator") is not None:
            self._build_generator()
            assert self.generator is not None and self.gen_optimizer is not None
            self.generator.load_state_dict(state["generator"])
            self.gen_optimizer.load_state_dict(state["gen_optimizer"])


# --- the server -------------------------------------------------------------------------------
class FedDEPAggregator(FedSageAggregator):
    """FedSage+'s relay of generated vectors and gradients; FedAvg of the classifier."""

    options_class = FedDEPOptions  # type: ignore[assignment]
    options: FedDEPOptions  # type: ignore[assignment]

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """One average of the updates by ``weighting``, sent to every client that uploaded."""
        global_arrays = weighted_average(updates, self.options.weighting, self.mix_dtype)
        return AggregateResult(payloads={c: global_arrays for c in updates})

    def mixing_plan(self, server_round: int, updates: dict[int, ClientUpdate]) -> MixingPlan:
        """Every client's row is the same weights: one global model."""
        w = client_weights(updates, self.options.weighting)
        return MixingPlan(sorted(updates), np.tile(w, (len(w), 1))[None])


ALGORITHM = Algorithm("feddep", FedDEPTrainer, FedDEPAggregator, FedDEPOptions)
