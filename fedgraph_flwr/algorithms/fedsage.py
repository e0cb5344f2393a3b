"""FedSage+ (Zhang et al., NeurIPS 2021): subgraph federated learning with missing-neighbour generation.

Official code followed: ``zkhku/fedsage`` at 5b3429a (``src/train_locSagePlus.py``: impairing,
targets, local NeighGen; ``src/fedsage_plus.py``: ``train_fedgen``, ``train_fedSagePC``;
``src/models/models.py``; ``src/models/feat_loss.py``; ``src/utils/mending_graph.py``
``fill_graph``; ``src/classifiers.py``; ``src/utils/config.py``), with OpenFGL's
``openfgl/flcore/fedsage_plus/{client,server,locsage_plus,_utils}.py`` read for comparison
(docs/reading/fedsage.md).

Stages, on the engine's phases (``pretrain`` before round 1; then every round ``gen_send``,
``gen_grad``, ``gen_step`` and ``train``; a phase whose stage is over is a no-op that sends
and returns nothing):

0. ``pretrain`` (before round 1): each client hides ⌊``hidden-portion`` · |val|⌋ random
   validation nodes (:func:`impair`: OpenFGL's rule; the code's "half of what is neither
   train nor test" is the same set under the project's train/val/test split), computes for
   every remaining node v its number of hidden neighbours ñ_v and the features of up to P
   of them (zero-padded), and trains its NeighGen (:class:`~fedgraph_flwr.nn.neighgen.NeighGen`)
   for ``pretrain-epochs`` full-batch Adam steps on the training nodes of the impaired graph:
   L = λ_d·SmoothL1(n̂, ñ) + λ_f·L_f + λ_c·CE(classifier(mend(G')), y), where L_f is the
   greedy matching loss (:func:`greedy_feature_loss`) and mend(G') attaches
   min(P, ⌊n̂_v⌋) generated leaves to each node (:func:`generated_leaves`, :func:`attach_leaves`).
1. Rounds 1..``gen-rounds``: one federated generator epoch per round, the paper's per-vector
   relay. ``gen_send``: client m runs NeighGen (its noise and dropout drawn from a seed it
   keeps) and sends, for its training nodes with at least one counted slot, the generated
   vectors ĝ [n_sel, P, d] (uncounted slots zeroed) and the slot counts
   (``min(P, ⌊n̂_v⌋)``, 0 where ñ_v = 0). ``gen_grad``: the server hands each client j every
   other client's vectors; j returns d/dĝ of its feature loss for each of them
   (:func:`nearest_feature_loss` or the code's random neighbourhoods,
   :func:`random_neighbourhood_targets`), never its features. ``gen_step``: the server
   sums, per m, the gradients of the j that answered and sends them back; m recomputes the
   same forward (same seed) and takes one Adam step on
   (1/M)·[λ_d L_d + λ_f L_f + λ_c L_c + λ_f Σ_j L_f^(j)], M = 1 + the number of j, where
   L_f^(j) enters through its relayed gradient (scaled by 1/(n_train·P) as the codes' mean).
   The ``train`` phase of these rounds trains nothing and reports NaN val/test metrics, so
   the best-validation round is always a classifier round.
2. Mending (the first classifier round, once per client): NeighGen in eval mode (noise
   still on, as the codes) → every node gets min(P, ⌊n̂_v⌋) generated leaves, unlabelled
   (y = −1) and in no mask; NeighGen and its optimisers are then dropped.
3. Rounds ``gen-rounds``+1..R: FedSage, the GraphSAGE classifier
   (:class:`~fedgraph_flwr.nn.sage_classifier.SageClassifier`) trained on the mended graph
   (Adam, common ``lr``/``weight-decay``, mini-batches of ``batch-size`` training nodes per
   step with a whole-graph forward, ``local-epochs`` epochs) and averaged uniformly (1/K,
   both codes). Evaluation: each client's val/test nodes on its own mended graph.

What leaves a client: in a generator round, ``vectors`` [n_sel, P, d] + ``slots`` [n_sel]
(+ ``true_counts`` [n_sel] with ``cross-targets=random``) in ``gen_send`` and ``grads``
[Σ_m n_sel(m), P, d] in ``gen_grad``: per-node values, the method's own published protocol
(``per_node_arrays``; FedAux excludes such methods; docs/reading/fedsage.md §3). Every round: the
classifier's parameters (in generator rounds unchanged, so the average is the initial
model). A few scalar losses and counts as metrics.

Switches where paper and code differ (docs/reading/fedsage.md §6; default first):

- ``fedsage-encoder`` sage | gcn: NeighGen's encoder and inner classifier. The paper and
  OpenFGL use GraphSAGE; the official code uses 2-layer row-normalised GCNs (with a ReLU
  on their outputs).
- ``fedsage-fed-train`` fgen | all: what the federated generator rounds train. The code
  freezes encoder, dGen and inner classifier (eval mode) and trains fGen with a new Adam;
  OpenFGL trains everything with its running optimiser. Generators are never averaged.
- ``fedsage-cross-targets`` nearest | random: the cross-client feature loss. The paper:
  each counted slot is matched to the nearest feature vector among all of j's nodes
  (min over u ∈ V_j of MSE). Both codes: per node of m, one random non-isolated node of j
  and P random neighbours of it (with replacement), greedy-matched with m's ñ_v.
- ``fedsage-greedy-match`` min | code: the greedy matching. ``min`` is the paper's (and the
  codes' evident intent) min over the true hidden neighbours. ``code`` reproduces the
  codes' loop as written: it starts at the last true neighbour's MSE and replaces it by
  the k-th whenever MSE_k < d · current (it compares a scalar with the sum of a
  d-vector holding the current value d times), which in practice keeps the last k.
- ``fedsage-mend-input`` impaired | full: which graph NeighGen reads when mending. Both
  codes run it on the impaired graph G' and attach the leaves to G''s nodes *inside the
  full local graph* (``fill_graph`` takes the original nodes and edges; hidden nodes get no
  leaves). ``full`` runs it on the whole local graph, so every node gets leaves [I]. (Where
  docs/reading/fedsage.md §3 says [C] "mends the impaired graph", that is the inner
  classifier's training-time mend, which both codes and we do on G'.)

The published figures (FedIIH/FedAux, copied from FED-PUB) come from FED-PUB's own FedSage+
run, whose settings are not available (docs/reading/fedsage.md §5); the paper's own numbers
come from the official code (``encoder=gcn``, ``fed-train=fgen``, ``cross-targets=random``,
``greedy-match=code``, ``mend-input=impaired``). Other differences from the code: the
classifier runs on the whole graph (no [5, 5] neighbour sampling) with PyG's SAGEConv
(summed, not concatenated, self and neighbour halves); a round is one generator epoch (the
code's ``gen_epochs`` = 20 federated epochs = ``gen-rounds`` 20); slot counts are ⌊n̂⌋
everywhere (the code's LocSage+ evaluation rounds, its FedSage+ truncates).

Hyperparameters (code's ``config.py``): P = 5, hidden portion 0.5, NeighGen hidden 32,
latent 128, dropout 0.5, Adam lr 1e-3 and weight decay 1e-4, 20 pre-training epochs, 20
federated generator epochs, λ_d = λ_f = λ_c = 1; classifier layers [64, 32], batch 32, Adam
lr 1e-3 (no weight decay, no dropout: stellargraph's defaults), 1 local epoch
(``configs/fedsage/``).
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
from torch_geometric.utils import coalesce, remove_self_loops

from ..core.mixing import average
from ..core.options import Options, option
from ..core.phases import (
    TRAIN_PHASE,
    AggregateResult,
    Arrays,
    ArraySpec,
    ClientUpdate,
    Phase,
    PhaseReply,
    ReplySpec,
)
from ..core.registry import Algorithm
from ..nn.neighgen import CONVS, NeighGen
from ..nn.sage_classifier import SageClassifier
from .base import Aggregator
from .supervised import SupervisedTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

PRETRAIN = Phase("pretrain", when="before-first-round")
GEN_SEND = Phase("gen_send")
GEN_GRAD = Phase("gen_grad")
GEN_STEP = Phase("gen_step")

VECTORS, SLOTS, TRUE_COUNTS, GRADS, SOURCE, CONTRIBUTORS = (
    "vectors", "slots", "true_counts", "grads", "source", "contributors")

FED_TRAIN = ("fgen", "all")
CROSS_TARGETS = ("nearest", "random")
GREEDY_MATCH = ("min", "code")
MEND_INPUT = ("impaired", "full")
NEAREST_CHUNK = 1024  # rows of generated vectors compared with j's features at once


# `fedsage-reproduce`: the profiles, the default first (docs/methods/fedsage.md).
# `default`: the paper's matching with the official code's generator training.
PUBLISHED = (
    "The FedIIH paper's cells on this page ran configs/fedsage/cora-disjoint-10.yaml, which is "
    "`default`."
)
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "official": {
        "encoder": "gcn", "fed_train": "fgen", "cross_targets": "random", "greedy_match": "code",
    },
    "openfgl": {
        "encoder": "sage", "fed_train": "all", "cross_targets": "random", "greedy_match": "code",
    },
    "paper": {"encoder": "sage", "cross_targets": "nearest", "greedy_match": "min"},
}


@dataclass(frozen=True)
class FedSageOptions(Options, prefix="fedsage", profiles=PROFILES, published=PUBLISHED):
    """FedSage+'s knobs (``fedsage-*``); defaults = the official code's hyperparameters."""

    gen_rounds: int = option(20, "federated NeighGen rounds (1 generator epoch each) before "
                             "the classifier rounds", low=0)
    pretrain_epochs: int = option(20, "local NeighGen epochs before round 1", low=0)
    num_pred: int = option(5, "P: generated neighbours per node at most", low=1)
    hidden_portion: float = option(0.5, "share of the validation nodes hidden to build the "
                                   "impaired graph", low=0.0, high=1.0)
    gen_hidden: int = option(32, "NeighGen encoder / inner classifier hidden width", low=1)
    latent_dim: int = option(128, "NeighGen latent width", low=1)
    fgen_hidden: int = option(256, "fGen's first hidden layer", low=1)
    fgen_width: int = option(2048, "fGen's second hidden layer", low=1)
    gen_dropout: float = option(0.5, "NeighGen dropout", low=0.0, high=1.0, high_inclusive=False)
    gen_lr: float = option(1e-3, "NeighGen Adam learning rate", low=0.0, low_inclusive=False)
    gen_weight_decay: float = option(1e-4, "NeighGen Adam weight decay", low=0.0)
    loss_degree: float = option(1.0, "λ_d: weight of dGen's SmoothL1", low=0.0)
    loss_feat: float = option(1.0, "λ_f: weight of the greedy feature losses (local and "
                              "cross-client)", low=0.0)
    loss_class: float = option(1.0, "λ_c: weight of the inner classifier's cross-entropy", low=0.0)
    encoder: str = option("sage", "NeighGen encoder and inner classifier: sage (paper, OpenFGL) "
                          "| gcn (official code)", choices=CONVS)
    fed_train: str = option("fgen", "trained in the generator rounds: fgen (official code) | "
                            "all (OpenFGL)", choices=FED_TRAIN)
    cross_targets: str = option("nearest", "cross-client targets: nearest (paper: min over j's "
                                "nodes) | random (codes: random neighbourhoods)",
                                choices=CROSS_TARGETS)
    greedy_match: str = option("min", "greedy matching: min (paper) | code (the codes' "
                               "comparison as written)", choices=GREEDY_MATCH)
    mend_input: str = option("impaired", "graph NeighGen reads when mending: impaired (both "
                             "codes) | full [I]", choices=MEND_INPUT)
    classifier_layers: str = option("64,32", "GraphSAGE classifier layer sizes, comma-separated")
    batch_size: int = option(32, "training nodes per classifier step (0: full batch)", low=0)

    def check(self) -> None:
        """Reject classifier layer sizes that are not positive integers."""
        try:
            sizes = self.layer_sizes
        except ValueError:
            raise self.invalid("classifier_layers", "use comma-separated positive integers") from None
        if not sizes or min(sizes) < 1:
            raise self.invalid("classifier_layers", "use comma-separated positive integers")

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        """The classifier's hidden layer sizes, parsed from ``classifier_layers``."""
        return tuple(int(s) for s in self.classifier_layers.split(",") if s.strip())


# --- the method's maths (pure functions) ----------------------------------------------------
@dataclass
class ImpairedGraph:
    """The client's subgraph without its hidden nodes, with the generator's targets.

    ``keep`` [n'] original ids of the remaining nodes (ascending); ``x`` [n', d],
    ``edge_index`` [2, m'] relabelled; ``y``, ``train_mask`` [n']; ``missing`` [n'] ñ, the
    number of hidden neighbours; ``targets`` [n', P, d] the features of the first P of them
    (ascending id), zero-padded.
    """

    keep: torch.Tensor
    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor
    missing: torch.Tensor
    targets: torch.Tensor


def simple_edges(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Each directed edge once, no self-loops (neighbour *sets*, as both codes use)."""
    return coalesce(remove_self_loops(edge_index)[0], num_nodes=num_nodes)


def impair(data: Data, hidden: torch.Tensor, num_pred: int) -> ImpairedGraph:
    """G' = the subgraph induced by the nodes not in ``hidden`` [n] bool, and its targets."""
    n = data.num_nodes
    edges = simple_edges(data.edge_index, n)
    src, dst = edges
    keep = (~hidden).nonzero().view(-1)
    new_id = torch.full((n,), -1, dtype=torch.long, device=hidden.device)
    new_id[keep] = torch.arange(keep.numel(), device=hidden.device)
    inside = ~hidden[src] & ~hidden[dst]
    edge_index = new_id[edges[:, inside]]
    # Edges from a kept node to a hidden one: its missing neighbours (sorted by src, then dst).
    lost = ~hidden[src] & hidden[dst]
    owner, neighbour = new_id[src[lost]], dst[lost]
    missing = torch.bincount(owner, minlength=keep.numel())
    start = torch.cumsum(missing, 0) - missing
    rank = torch.arange(owner.numel(), device=owner.device) - start[owner]
    first = rank < num_pred
    targets = data.x.new_zeros(keep.numel(), num_pred, data.num_features)
    targets[owner[first], rank[first]] = data.x[neighbour[first]]
    return ImpairedGraph(keep, data.x[keep], edge_index, data.y[keep], data.train_mask[keep],
                         missing, targets)


def slot_counts(degree: torch.Tensor, num_pred: int) -> torch.Tensor:
    """min(P, ⌊n̂⌋) per node [n] long (n̂ >= 0 after dGen's ReLU)."""
    return torch.floor(degree.detach()).clamp(0, num_pred).long()


def counted_slots(counts: torch.Tensor, missing: torch.Tensor) -> torch.Tensor:
    """The slots the greedy loss counts per node: min(P, ⌊n̂⌋), or 0 where ñ = 0 (codes)."""
    return torch.where(missing > 0, counts, torch.zeros_like(counts))


def greedy_feature_loss(generated: torch.Tensor, targets: torch.Tensor, pred_counts: torch.Tensor,
                        true_counts: torch.Tensor, match: str = "min") -> torch.Tensor:
    """The greedy matching loss per slot, [n, P] (zero where not counted).

    generated [n, P, d], targets [n, K, d]; slot p of node v counts if p < pred_counts[v]
    (clipped to P) and true_counts[v] > 0; its loss is min over k < min(K, true_counts[v])
    of MSE(generated[v, p], targets[v, k]) (``match="min"``), or the codes' loop as written
    (``"code"``: start at k_last = min(K, true)−1, replace by MSE_k when MSE_k < d · current).
    Squared distances come from one batched product (memory n·P·K, no loop over nodes).
    The codes' scalar is the mean of this over all n·P slots.
    """
    if match not in GREEDY_MATCH:
        raise ValueError(f"match {match!r}; valid: {', '.join(GREEDY_MATCH)}")
    n, num_pred, dim = generated.shape
    num_true = targets.size(1)
    if n == 0:
        return generated.new_zeros(0, num_pred)
    sq = ((generated * generated).sum(-1, keepdim=True)  # [n, P, 1]
          + (targets * targets).sum(-1).unsqueeze(1)  # [n, 1, K]
          - 2.0 * torch.bmm(generated, targets.transpose(1, 2)))  # [n, P, K]
    mse = sq.clamp(min=0.0) / dim
    true = true_counts.clamp(0, num_true).view(n, 1, 1)
    valid = torch.arange(num_true, device=generated.device).view(1, 1, -1) < true  # [n, 1, K]
    if match == "min":
        best = torch.where(valid, mse, torch.full_like(mse, math.inf)).min(dim=-1).values
    else:
        last = (true.view(n, 1, 1) - 1).clamp(min=0).expand(n, num_pred, 1)
        best = mse.gather(-1, last).squeeze(-1)  # [n, P]
        for k in range(num_true):
            better = valid[:, :, k] & (mse[:, :, k] < dim * best.detach())
            best = torch.where(better, mse[:, :, k], best)
    slot = torch.arange(num_pred, device=generated.device).view(1, -1)
    counted = (slot < pred_counts.clamp(0, num_pred).view(-1, 1)) & (true_counts.view(-1, 1) > 0)
    return torch.where(counted, best, torch.zeros_like(best))


def nearest_feature_loss(generated: torch.Tensor, slots: torch.Tensor, features: torch.Tensor,
                         chunk: int = NEAREST_CHUNK) -> torch.Tensor:
    """The paper's cross-client term per slot, [R, P]: for counted slots (p < slots[r]),
    min over the rows u of ``features`` [n_j, d] of MSE(generated[r, p], x_u); else 0.

    The nearest row is found without gradient in chunks of ``chunk`` slots (memory
    chunk · n_j); the returned MSE to it is differentiable in ``generated``.
    """
    rows, num_pred, dim = generated.shape
    counted = torch.arange(num_pred, device=generated.device).view(1, -1) < slots.view(-1, 1)
    out = generated.new_zeros(rows, num_pred)
    flat = generated[counted]  # [S, d]
    if flat.numel() == 0 or features.size(0) == 0:
        return out
    with torch.no_grad():
        norms = (features * features).sum(-1)
        nearest = torch.cat([
            (norms.unsqueeze(0) - 2.0 * block @ features.t()).argmin(dim=1)
            for block in flat.detach().split(chunk)])
    out = out.masked_scatter(counted, ((flat - features[nearest]) ** 2).mean(-1))
    return out


def random_neighbourhood_targets(num_rows: int, num_pred: int, edge_index: torch.Tensor,
                                 features: torch.Tensor) -> torch.Tensor:
    """The codes' cross-client targets [R, P, d]: per row, a uniformly drawn non-isolated
    node of this client and P of its neighbours drawn with replacement (global torch RNG)."""
    n = features.size(0)
    src, dst = simple_edges(edge_index, n)  # sorted by src
    degree = torch.bincount(src, minlength=n)
    candidates = (degree > 0).nonzero().view(-1)
    if candidates.numel() == 0:
        return features.new_zeros(num_rows, num_pred, features.size(1))
    start = torch.cumsum(degree, 0) - degree
    centre = candidates[torch.randint(candidates.numel(), (num_rows,), device=features.device)]
    reach = degree[centre].unsqueeze(1)  # [R, 1], >= 1
    offset = torch.minimum((torch.rand(num_rows, num_pred, device=features.device) * reach).long(),
                           reach - 1)
    return features[dst[start[centre].unsqueeze(1) + offset]]


def generated_leaves(counts: torch.Tensor, generated: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(owner [g], features [g, d]): slot p of node v for every p < counts[v], v-major."""
    num_pred = generated.size(1)
    used = torch.arange(num_pred, device=generated.device).view(1, -1) < counts.view(-1, 1)
    owner = torch.arange(counts.numel(), device=generated.device).view(-1, 1).expand_as(used)[used]
    return owner, generated[used]


def attach_leaves(x: torch.Tensor, edge_index: torch.Tensor, anchors: torch.Tensor,
                  leaves: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, d] + leaves [g, d] as nodes n..n+g−1, each joined to its anchor [g] both ways."""
    n, g = x.size(0), leaves.size(0)
    new = torch.arange(n, n + g, device=x.device)
    extra = torch.stack([torch.cat([anchors, new]), torch.cat([new, anchors])])
    return torch.cat([x, leaves.to(x.dtype)]), torch.cat([edge_index, extra], dim=1)


def mended_data(data: Data, anchors: torch.Tensor, leaves: torch.Tensor) -> Data:
    """The client's graph plus generated leaves: unlabelled (y = −1), in no mask."""
    x, edge_index = attach_leaves(data.x, data.edge_index, anchors, leaves)
    g = leaves.size(0)

    def pad(mask: torch.Tensor) -> torch.Tensor:
        return torch.cat([mask, mask.new_zeros(g)])

    return Data(x=x, edge_index=edge_index, y=torch.cat([data.y, data.y.new_full((g,), -1)]),
                train_mask=pad(data.train_mask), val_mask=pad(data.val_mask),
                test_mask=pad(data.test_mask),
                generated=torch.arange(x.size(0), device=x.device) >= data.num_nodes)


# --- the client -------------------------------------------------------------------------------
@dataclass
class GeneratorPass:
    """One NeighGen forward on the impaired graph, with its local losses."""

    rows: torch.Tensor  # [k] impaired-graph ids that fGen ran on (train ∪ mended)
    generated: torch.Tensor  # [k, P, d]
    slots: torch.Tensor  # [k] counted slots per row (0 where ñ = 0)
    degree_loss: torch.Tensor
    feat_loss: torch.Tensor
    class_loss: torch.Tensor


def in_generator_stage(server_round: int, gen_rounds: int) -> bool:
    """Whether ``server_round`` belongs to the federated generator stage (1..``gen_rounds``):
    the clients' relay handlers and the server's phase schedule both ask this."""
    return 1 <= server_round <= gen_rounds


class GeneratorRelayTrainer(SupervisedTrainer):
    """The client side of FedSage+'s generator relay, which FedDEP shares: pre-training
    before round 1, then in rounds 1..``gen-rounds`` send, answer and step; after that the
    relay phases are no-ops. Subclasses define ``_ensure_generator`` (pre-train, unless
    done; returns metrics), ``_generator_pass`` (one forward with its losses) and the three
    handlers ``_send_vectors``, ``_answer_vectors`` and ``_generator_step``."""

    phases = (PRETRAIN, GEN_SEND, GEN_GRAD, GEN_STEP, TRAIN_PHASE)
    options: Any  # the algorithm's options: they have ``gen_rounds`` and ``num_pred``
    gen_seed: int | None  # the forward of this round's gen_send, for gen_step

    def generator_round(self) -> bool:
        """Whether this round belongs to the federated generator stage."""
        return in_generator_stage(self.config.server_round, self.options.gen_rounds)

    def _seeded_pass(self, seed: int) -> Any:
        """``_generator_pass`` with its noise and dropout drawn from ``seed`` (gen_send's
        forward, recomputed by gen_step), leaving the global stream as it was."""
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return self._generator_pass()

    @classmethod
    def phase_reply_spec(cls, phase: Phase, request: Arrays, num_features: int,
                         num_classes: int, config: ClientConfig) -> ReplySpec:
        """In the generator rounds, gen_send: :meth:`sent_specs`; gen_grad: one gradient
        for each vector this client was sent (float32, the vectors' shape); otherwise
        nothing."""
        opts: Any = config.options_of(cls.options_class)  # FedSage's or FedDEP's
        if not in_generator_stage(config.server_round, opts.gen_rounds):
            return ReplySpec()
        if phase == GEN_SEND:
            return ReplySpec(cls.sent_specs(num_features, config))
        if phase == GEN_GRAD and VECTORS in request:
            return ReplySpec({GRADS: ArraySpec(tuple(request[VECTORS].shape), "float32")})
        return ReplySpec()

    @classmethod
    def sent_specs(cls, num_features: int, config: ClientConfig) -> dict[str, ArraySpec]:
        """gen_send's arrays: the generated vectors [m, P, d] of m nodes with a counted slot,
        and those counts [m] in 1..P."""
        raise NotImplementedError

    def run_phase(self, phase: Phase, arrays: Arrays) -> PhaseReply:
        """Pre-training and the federated generator phases (send, gradients, step)."""
        if phase == PRETRAIN:
            return PhaseReply(metrics=self._ensure_generator())
        if not self.generator_round():
            return PhaseReply()  # the generator stage is over: a no-op
        self._ensure_generator()
        if phase == GEN_SEND:
            return self._send_vectors()
        if phase == GEN_GRAD:
            return self._answer_vectors(arrays)
        if phase == GEN_STEP:
            return self._generator_step(arrays)
        return super().run_phase(phase, arrays)

    def _ensure_generator(self) -> dict[str, float]:
        raise NotImplementedError

    def _generator_pass(self) -> Any:
        raise NotImplementedError

    def _send_vectors(self) -> PhaseReply:
        raise NotImplementedError

    def _answer_vectors(self, arrays: Arrays) -> PhaseReply:
        raise NotImplementedError

    def _generator_step(self, arrays: Arrays) -> PhaseReply:
        raise NotImplementedError

    # --- the relay's shared glue ------------------------------------------------------------
    def _relayed_vectors(self, arrays: Arrays) -> tuple[torch.Tensor, torch.Tensor] | None:
        """gen_grad's request: the foreign vectors (to differentiate against) and their slot
        counts, or None when this client was sent none."""
        if VECTORS not in arrays:
            return None
        vectors = torch.as_tensor(arrays[VECTORS], dtype=torch.float32,
                                  device=self.device).requires_grad_(True)
        return vectors, torch.as_tensor(arrays[SLOTS], dtype=torch.long, device=self.device)

    def _answer(self, vectors: torch.Tensor, slots: torch.Tensor,
                per_slot: torch.Tensor) -> PhaseReply:
        """gen_grad's reply: the gradient of ``per_slot``'s sum for every foreign vector,
        and that sum's mean over the counted slots."""
        (grads,) = torch.autograd.grad(per_slot.sum(), vectors)
        counted = max(int(slots.clamp(max=self.options.num_pred).sum()), 1)
        return PhaseReply(arrays={GRADS: grads.cpu().numpy().astype(np.float32)},
                          metrics={"cross_feat_loss": per_slot.sum().item() / counted})

    def _step_inputs(self, arrays: Arrays) -> tuple[int, int, Arrays]:
        """gen_step's forward seed (gen_send's), contributor count and relayed arrays; with no
        gen_send this round, a fresh seed and a local step only (no contributors, nothing
        relayed)."""
        contributors = int(np.asarray(arrays.get(CONTRIBUTORS, [0])).reshape(-1)[0])
        if self.gen_seed is None:
            self.gen_seed, contributors, arrays = int(torch.randint(2**31 - 1, ())), 0, {}
        return self.gen_seed, contributors, arrays

    def _relayed_gradients(self, arrays: Arrays, generated: torch.Tensor,
                           rows: torch.Tensor) -> torch.Tensor:
        """The other clients' gradients for this round's sent rows of ``generated``."""
        grads = torch.as_tensor(arrays[GRADS], dtype=generated.dtype, device=self.device)
        if grads.shape != (rows.numel(), *generated.shape[1:]):
            raise RuntimeError(f"{self.options.prefix}: relayed gradients {tuple(grads.shape)} "
                               f"do not match this round's {rows.numel()} sent nodes")
        return grads

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The classifier's scores; NaN in generator rounds (no classifier yet: never a
        best-validation round)."""
        metrics = super().evaluate()
        if self.generator_round():
            return {k: float("nan") for k in metrics}
        return metrics


class FedSageTrainer(GeneratorRelayTrainer):
    """NeighGen stages on the client, then the GraphSAGE classifier on the mended graph."""

    options_class = FedSageOptions
    options: FedSageOptions
    #: The paper's protocol relays generated neighbour features and their gradients per node.
    per_node_arrays = frozenset({VECTORS, SLOTS, TRUE_COUNTS, GRADS})

    @classmethod
    def sent_specs(cls, num_features: int, config: ClientConfig) -> dict[str, ArraySpec]:
        """Generated features [m, P, F], counted slots [m] in 1..P (and the true counts of
        missing neighbours [m] in 0..P with random cross-client targets)."""
        opts = config.options_of(FedSageOptions)
        specs = {VECTORS: ArraySpec(("m", opts.num_pred, num_features), "float32"),
                 SLOTS: ArraySpec(("m",), "int64", low=1, high=opts.num_pred)}
        if opts.cross_targets == "random":
            specs[TRUE_COUNTS] = ArraySpec(("m",), "int64", low=0, high=opts.num_pred)
        return specs

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        self.hidden: torch.Tensor | None = None  # [n] bool, the hidden validation nodes
        self._impaired: ImpairedGraph | None = None
        self.neighgen: NeighGen | None = None
        self.gen_optimizer: torch.optim.Optimizer | None = None  # pre-training (and fed-train=all)
        self.fed_optimizer: torch.optim.Optimizer | None = None  # fed-train=fgen: fGen only
        self.gen_seed = None
        self.gen_loss = float("nan")
        self.mended: Data | None = None

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """The GraphSAGE classifier trained on the mended graph."""
        opts = config.options_of(FedSageOptions)
        return SageClassifier(num_features, opts.layer_sizes, num_classes,
                              dropout=config.dropout)

    # --- stage bookkeeping ------------------------------------------------------------------
    @property
    def impaired(self) -> ImpairedGraph:
        """The impaired graph NeighGen learns to mend (hidden validation nodes removed)."""
        if self._impaired is None:
            assert self.hidden is not None
            self._impaired = impair(self.data, self.hidden, self.options.num_pred)
        return self._impaired

    def _build_neighgen(self) -> None:
        opts = self.options
        self.neighgen = NeighGen(self.data.num_features, self.num_classes, opts.gen_hidden,
                                 opts.latent_dim, opts.num_pred, opts.gen_dropout, opts.encoder,
                                 opts.fgen_hidden, opts.fgen_width).to(self.device)
        self.gen_optimizer = self._adam(self.neighgen.parameters())

    def _adam(self, params) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=self.options.gen_lr,
                                weight_decay=self.options.gen_weight_decay)

    def _ensure_generator(self) -> dict[str, float]:
        """Impair and pre-train, unless done (a client that missed ``pretrain``)."""
        if self.neighgen is not None:
            return {}
        data = self.data
        val = data.val_mask.nonzero().view(-1)
        k = int(self.options.hidden_portion * val.numel())
        self.hidden = torch.zeros(data.num_nodes, dtype=torch.bool, device=self.device)
        self.hidden[val[torch.randperm(val.numel(), device=self.device)[:k]]] = True
        self._impaired = None
        self._build_neighgen()
        assert self.neighgen is not None and self.gen_optimizer is not None
        losses: dict[str, float] = {}
        for _ in range(self.options.pretrain_epochs):
            self.neighgen.train()
            self.gen_optimizer.zero_grad()
            out = self._generator_pass()
            total = self._local_loss(out)
            total.backward()
            self.gen_optimizer.step()
            losses = {"pretrain_loss": total.item(), "pretrain_degree_loss": out.degree_loss.item(),
                      "pretrain_feat_loss": out.feat_loss.item(),
                      "pretrain_class_loss": out.class_loss.item()}
        if self.options.fed_train == "fgen":
            # The federated rounds train fGen with their own Adam; this one's moments (two
            # copies of NeighGen, fGen alone 2048·P·d floats) would only weigh on the state.
            self.gen_optimizer = None
        return losses

    def _generator_pass(self) -> GeneratorPass:
        assert self.neighgen is not None
        g, opts = self.impaired, self.options
        train = g.train_mask

        def used(degree: torch.Tensor) -> torch.Tensor:  # rows whose ĝ any loss reads
            return (train | (slot_counts(degree, opts.num_pred) > 0)).nonzero().view(-1)

        degree, rows, generated = self.neighgen(g.x, g.edge_index, used)
        counts = slot_counts(degree[rows], opts.num_pred)
        owner, leaves = generated_leaves(counts, generated)
        x, edge_index = attach_leaves(g.x, g.edge_index, rows[owner], leaves)
        logits = self.neighgen.classifier(x, edge_index)[: g.x.size(0)]
        on_train = train[rows]
        tr = rows[on_train]
        feat = greedy_feature_loss(generated[on_train], g.targets[tr], counts[on_train],
                                   g.missing[tr], opts.greedy_match)
        return GeneratorPass(
            rows=rows, generated=generated, slots=counted_slots(counts, g.missing[rows]),
            degree_loss=F.smooth_l1_loss(degree[train], g.missing[train].to(degree.dtype)),
            feat_loss=feat.sum() / max(feat.numel(), 1),
            class_loss=F.cross_entropy(logits[train], g.y[train]))

    def _local_loss(self, out: GeneratorPass) -> torch.Tensor:
        opts = self.options
        return (opts.loss_degree * out.degree_loss + opts.loss_feat * out.feat_loss
                + opts.loss_class * out.class_loss)

    def _fed_mode(self) -> list[nn.Parameter]:
        """Modes and trainable parameters of the generator rounds; returns the trained ones."""
        assert self.neighgen is not None
        if self.options.fed_train == "all":
            self.neighgen.train()
            self.neighgen.requires_grad_(True)
            return list(self.neighgen.parameters())
        self.neighgen.eval()
        self.neighgen.requires_grad_(False)
        self.neighgen.fgen.train()
        self.neighgen.fgen.requires_grad_(True)
        return list(self.neighgen.fgen.parameters())

    def _sent_rows(self, out: GeneratorPass) -> torch.Tensor:
        """The impaired graph's training nodes with a counted slot (what gen_send sends)."""
        return (self.impaired.train_mask[out.rows] & (out.slots > 0)).nonzero().view(-1)

    # --- phases -----------------------------------------------------------------------------
    def _send_vectors(self) -> PhaseReply:
        self._fed_mode()
        self.gen_seed = int(torch.randint(2**31 - 1, ()))
        with torch.no_grad():
            out = self._seeded_pass(self.gen_seed)
        rows = self._sent_rows(out)
        slots = out.slots[rows]
        used = torch.arange(self.options.num_pred, device=self.device).view(1, -1) < slots.view(-1, 1)
        vectors = out.generated[rows] * used.unsqueeze(-1)
        arrays: Arrays = {VECTORS: vectors.cpu().numpy().astype(np.float32),
                  SLOTS: slots.cpu().numpy().astype(np.int64)}
        if self.options.cross_targets == "random":
            missing = self.impaired.missing[out.rows[rows]].clamp(max=self.options.num_pred)
            arrays[TRUE_COUNTS] = missing.cpu().numpy().astype(np.int64)
        assert self.neighgen is not None  # run_phase's _ensure_generator built it
        self.neighgen.requires_grad_(True)
        return PhaseReply(arrays=arrays, metrics={
            "degree_loss": float(out.degree_loss), "feat_loss": float(out.feat_loss),
            "class_loss": float(out.class_loss), "sent_slots": float(slots.sum())})

    def _answer_vectors(self, arrays: Arrays) -> PhaseReply:
        """Client j: the gradient of its feature loss for every foreign vector it was sent."""
        request = self._relayed_vectors(arrays)
        if request is None:
            return PhaseReply()
        vectors, slots = request
        if self.options.cross_targets == "nearest":
            per_slot = nearest_feature_loss(vectors, slots, self.data.x)
        else:
            targets = random_neighbourhood_targets(vectors.size(0), self.options.num_pred,
                                                   self.data.edge_index, self.data.x)
            true = torch.as_tensor(arrays[TRUE_COUNTS], dtype=torch.long, device=self.device)
            per_slot = greedy_feature_loss(vectors, targets, slots, true, self.options.greedy_match)
        return self._answer(vectors, slots, per_slot)

    def _generator_step(self, arrays: Arrays) -> PhaseReply:
        """Client m: recompute gen_send's forward and take one Adam step with the relayed
        gradients of the other clients' feature losses."""
        opts = self.options
        trained = self._fed_mode()
        optimizer: torch.optim.Optimizer | None
        if opts.fed_train == "fgen":
            if self.fed_optimizer is None:
                self.fed_optimizer = self._adam(trained)
            optimizer = self.fed_optimizer
        else:
            optimizer = self.gen_optimizer
        assert optimizer is not None and self.neighgen is not None
        seed, contributors, arrays = self._step_inputs(arrays)
        optimizer.zero_grad()
        out = self._seeded_pass(seed)
        local = self._local_loss(out)
        scale = 1.0 / (1 + contributors)
        total = scale * local
        if GRADS in arrays:
            rows = self._sent_rows(out)
            grads = self._relayed_gradients(arrays, out.generated, rows)
            num_train = int(self.impaired.train_mask.sum())
            total = total + (scale * opts.loss_feat / (num_train * opts.num_pred)
                             * (out.generated[rows] * grads).sum())
        total.backward()
        optimizer.step()
        self.neighgen.requires_grad_(True)
        self.gen_seed = None
        self.gen_loss = local.item()
        return PhaseReply(metrics={"local_loss": self.gen_loss, "contributors": float(contributors)})

    # --- the classifier -----------------------------------------------------------------------
    def _ensure_mended(self) -> dict[str, float]:
        if self.mended is not None:
            return {}
        self._ensure_generator()
        assert self.neighgen is not None
        self.neighgen.eval()
        with torch.no_grad():
            if self.options.mend_input == "impaired":
                graph, keep = self.impaired, self.impaired.keep
            else:
                graph, keep = self.data, None
            num_pred = self.options.num_pred
            degree, rows, generated = self.neighgen(
                graph.x, graph.edge_index,
                lambda d: (slot_counts(d, num_pred) > 0).nonzero().view(-1))
            owner, leaves = generated_leaves(slot_counts(degree[rows], num_pred), generated)
            anchors = rows[owner] if keep is None else keep[rows[owner]]
        self.mended = mended_data(self.data, anchors, leaves)
        # The generator's work is done: free it (fGen alone is 2048·P·d floats).
        self.neighgen = self.gen_optimizer = self.fed_optimizer = None
        return {}

    @property
    def graph(self) -> Data:
        """The graph the classifier sees: the mended one once it exists."""
        return self.mended if self.mended is not None else self.data

    def forward(self) -> torch.Tensor:
        """Logits [n, C] of the client's own nodes (generated leaves left out)."""
        graph = self.graph
        return self.model(graph.x, graph.edge_index)[: self.data.num_nodes]

    def train(self, epochs: int) -> dict[str, float]:
        """Generator rounds: NeighGen's loss only; then the classifier on the mended graph."""
        if self.generator_round():
            return {"train_loss": self.gen_loss if math.isfinite(self.gen_loss) else 0.0,
                    "generated_nodes": float("nan")}
        self._ensure_mended()
        assert self.mended is not None
        graph, data = self.mended, self.data
        train_nodes = data.train_mask.nonzero().view(-1)
        size = max(self.options.batch_size or train_nodes.numel(), 1)
        self.model.train()
        loss_value = float("nan")
        for _ in range(epochs):
            order = train_nodes[torch.randperm(train_nodes.numel(), device=self.device)]
            for batch in order.split(size):
                self.optimizer.zero_grad()
                logits = self.model(graph.x, graph.edge_index)
                loss = F.cross_entropy(logits[batch], data.y[batch])
                loss.backward()
                self.optimizer.step()
                loss_value = float(loss.detach())
        return {"train_loss": loss_value,
                "generated_nodes": float(graph.num_nodes - data.num_nodes)}

    # --- state ----------------------------------------------------------------------------------
    def local_state(self) -> dict[str, Any]:
        """The base state plus NeighGen, its optimizers and the mended graph."""
        state = {**super().local_state(), "hidden": self.hidden, "gen_seed": self.gen_seed,
                 "gen_loss": self.gen_loss, "neighgen": None, "gen_optimizer": None,
                 "fed_optimizer": None, "mended": None}
        if self.neighgen is not None:
            state["neighgen"] = self.neighgen.state_dict()
            if self.gen_optimizer is not None:  # dropped after pre-training under fed-train=fgen
                state["gen_optimizer"] = self.gen_optimizer.state_dict()
            if self.fed_optimizer is not None:
                state["fed_optimizer"] = self.fed_optimizer.state_dict()
        if self.mended is not None:
            n = self.data.num_nodes
            state["mended"] = {"anchors": self.mended.edge_index[0, self.mended.edge_index[1] >= n],
                               "leaves": self.mended.x[n:]}
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.hidden = state.get("hidden")
        self._impaired = None
        self.gen_seed = state.get("gen_seed")
        self.gen_loss = float(state.get("gen_loss", float("nan")))
        self.neighgen = self.gen_optimizer = self.fed_optimizer = None
        if state.get("neighgen") is not None:
            self._build_neighgen()
            assert self.neighgen is not None and self.gen_optimizer is not None
            self.neighgen.load_state_dict(state["neighgen"])
            if state.get("gen_optimizer") is None:
                self.gen_optimizer = None
            else:
                self.gen_optimizer.load_state_dict(state["gen_optimizer"])
            if state.get("fed_optimizer") is not None:
                self.fed_optimizer = self._adam(self.neighgen.fgen.parameters())
                self.fed_optimizer.load_state_dict(state["fed_optimizer"])
        mended = state.get("mended")
        self.mended = None if mended is None else mended_data(
            self.data, mended["anchors"].to(self.device), mended["leaves"].to(self.device))


# --- the server -------------------------------------------------------------------------------
class FedSageAggregator(Aggregator):
    """Relays generated vectors and their gradients; uniform FedAvg of the classifier."""

    options_class = FedSageOptions
    options: FedSageOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        self.outbox: dict[int, Arrays] = {}  # gen_send's replies, by sender m
        self.layout: dict[int, list[tuple[int, int, int]]] = {}  # per j: (m, first, stop) rows
        self.inbox: dict[int, np.ndarray] = {}  # per m: the summed gradients
        self.contributors: dict[int, int] = {}

    def configure(self, phase: Phase, server_round: int, clients: list[int]) -> dict[int, Arrays]:
        """Each generator phase's request: the vectors or gradients to relay."""
        if phase == GEN_GRAD:
            return {j: self._foreign_vectors(j) for j in clients}
        if phase == GEN_STEP:
            out = {}
            for m in clients:
                count = self.contributors.get(m, 0)
                arrays: Arrays = {CONTRIBUTORS: np.array([count], dtype=np.int64)}
                if m in self.inbox:
                    arrays[GRADS] = self.inbox[m]
                out[m] = arrays
            self.outbox, self.inbox, self.contributors, self.layout = {}, {}, {}, {}
            return out
        return super().configure(phase, server_round, clients)

    def runs_phase(self, phase: Phase, server_round: int) -> bool:
        """The generator phases only in the generator rounds (1..``gen-rounds``)."""
        if phase in (GEN_SEND, GEN_GRAD, GEN_STEP):
            return in_generator_stage(server_round, self.options.gen_rounds)
        return True

    def _foreign_vectors(self, j: int) -> Arrays:
        """Every other sender's vectors stacked for client j, with each row's source."""
        senders = [m for m in sorted(self.outbox) if m != j and VECTORS in self.outbox[m]
                   and len(self.outbox[m][VECTORS])]
        self.layout[j], first = [], 0
        for m in senders:
            rows = len(self.outbox[m][VECTORS])
            self.layout[j].append((m, first, first + rows))
            first += rows
        if not senders:
            return {}
        names = [name for name in (VECTORS, SLOTS, TRUE_COUNTS) if name in self.outbox[senders[0]]]
        out = {name: np.concatenate([self.outbox[m][name] for m in senders]) for name in names}
        out[SOURCE] = np.concatenate([np.full(len(self.outbox[m][VECTORS]), m, dtype=np.int64)
                                      for m in senders])
        return out

    def step(self, phase: Phase, server_round: int, updates: dict[int, ClientUpdate]
             ) -> AggregateResult | None:
        """Relay the generator phases' vectors and gradients between clients."""
        if phase == GEN_SEND:
            self.outbox = {c: u.arrays for c, u in updates.items() if u.arrays}
            return self._phase_metrics(updates, ("degree_loss", "feat_loss", "class_loss",
                                                 "sent_slots"))
        if phase == GEN_GRAD:
            # M − 1 for each sender m: the other clients that answered this relay.
            self.contributors = {m: len(set(updates) - {m}) for m in self.outbox}
            for j, update in updates.items():
                if GRADS not in update.arrays:
                    continue
                grads = update.arrays[GRADS]
                for m, first, stop in self.layout.get(j, []):
                    if stop > len(grads):
                        continue  # a malformed reply: this j does not count for m
                    part = grads[first:stop].astype(np.float32)
                    self.inbox[m] = self.inbox[m] + part if m in self.inbox else part
            return self._phase_metrics(updates, ("cross_feat_loss",))
        if phase == GEN_STEP:
            return self._phase_metrics(updates, ("local_loss", "contributors"))
        return self._phase_metrics(updates, ("pretrain_loss", "pretrain_degree_loss",
                                             "pretrain_feat_loss", "pretrain_class_loss"))

    @staticmethod
    def _phase_metrics(updates: dict[int, ClientUpdate], names: tuple[str, ...]) -> AggregateResult:
        metrics = {}
        for name in names:
            values = [u.metrics[name] for u in updates.values() if name in u.metrics]
            if values:
                metrics[f"{name}_mean"] = float(np.mean(values))
        return AggregateResult(payloads={}, metrics=metrics)

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Uniform FedAvg of the updates, sent to every client."""
        ids = sorted(updates)
        global_arrays = average(np.full(len(ids), 1.0 / len(ids)),
                                [updates[c].arrays for c in ids], self.mix_dtype)
        clients = sorted(set(self.client_ids) | set(updates))
        return AggregateResult(payloads={c: global_arrays for c in clients})


ALGORITHM = Algorithm("fedsage", FedSageTrainer, FedSageAggregator, FedSageOptions)
