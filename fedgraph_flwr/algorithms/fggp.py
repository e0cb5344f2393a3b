"""FGGP (Wan et al., AAAI 2024): a second, global-kNN view of each graph and prototypes
clustered on the server. **Each client holds dense n×n matrices (a named memory exemption).**

Wan, Huang, Shao, Ye and Du, "Federated Graph Learning under Domain Shift with
Generalizable Prototypes". FedAvg whose clients train on their graph and on a second view
of it, and align the class prototypes of the two views. The server clusters each class's
prototypes (FINCH) into a queue that classifies nodes by their nearest prototypes.

Each round a client:

1. every ``fggp-knn-every`` rounds, builds the second view's edges: its edges joined with
   a k-nearest-neighbour graph (cosine, k = ``fggp-knn-k``, each node its own neighbour)
   of the received model's hidden features;
2. trains, per local epoch, on ``CE(G) + CE(G2) + L_PA + L_GA`` (every weight 1):
   - G2's graph is sampled from the view by an augmenter;
   - L_GA is a weighted BCE of the augmenter's edge logits against the view's adjacency;
   - L_PA is an InfoNCE between the two views' class prototypes: confidence-weighted class
     means of the hidden features, pseudo-labels (argmax) on unlabelled nodes, true
     labels with weight 1 on training nodes;
3. sends its model and its class prototypes, computed from the last epoch.

The server averages the models and clusters each class's prototypes with FINCH (the
last, coarsest partition). The cluster means join a ring-buffer queue of
``C · fggp-queue-size`` normalised prototypes, which persists across rounds.

Leaves the client each round: the model (the official flavour leaves out the classifier)
and ``prototypes`` [C, hidden], one weighted class mean each: nothing per node. The
server sends back the model and the queue [C · queue-size, hidden] with its labels.

**Memory: FGGP's named exemption.** Both codes' second view is dense: every pair of nodes
is an edge drawn with probability > 0 (official), or a row softmax (OpenFGL). So the
client holds a few [n, n] matrices while it trains (:attr:`FGGPTrainer.dense_nodes`).
``fggp-dense-limit`` (20,000 nodes, 1.6 GB per float32 matrix) refuses a larger client
in one line before anything is allocated.

Official code: GuanchengWan/FGGP @ fedced9 (``Code/models/fggp.py``, ``backbone/gnn/pmlp.py``,
``backbone/knn.py``, ``utils/util.py``). Also read: OpenFGL's ``flcore/fggp`` (@ 5483768).
``docs/reading/fggp.md`` lists their 14 differences. ``fggp-flavour`` picks one code's:

- ``official`` (default): the model is ``PMLP_GCN`` (``nn/pmlp_gcn.py``, with
  ``num-layers`` linears, the official 3 by its class default). The augmenter is learned:
  a 2-layer GCN over the view gives edge logits L = h hᵀ; the edge probabilities
  α·L/max L + (1−α)·A are sampled by a straight-through relaxed Bernoulli, symmetrised,
  given self-loops and normalised. G2's hidden layers propagate over that sample, its
  classifier over the view's edges. L_GA trains the augmenter. L_PA L2-normalises the
  prototypes and its negatives are both views' other classes. The kNN features come from
  the received model in train mode (dropout on). The upload's prototypes come from the
  last epoch's pseudo-labels, with features recomputed after its step. The classifier
  (the last linear) is not sent: the server sends its initial value every round, as the
  official server skips ``fcs.2`` and every client loads the global state.
- ``openfgl``: the model is OpenFGL's 2-layer GCN over the raw adjacency
  (``nn/dense_adjacency_gcn.py``). The augmenter has no parameters: G2's graph is a
  Gumbel row-softmax (τ ``fggp-gumbel-tau``) of F Fᵀ. F is the model's hidden features
  (no gradient) over the previous epoch's sample (the raw graph at the round's first
  epoch), so L_GA is a constant. G2 propagates over the sample in every layer. L_PA's
  negatives are raw dot products between the views. The kNN features come from the
  received model in eval mode. The upload's prototypes are taken in eval mode after
  training, with confidences read from raw logits. All parameters are averaged.

Switches beside the flavour, the official code's value first:

- ``fggp-evaluate``: ``queue`` scores the received global model with the server's queue
  (cosine top-k, softmax at ``fggp-queue-temperature``). The official code does the same
  after aggregation, so round r here reports the official round r−1; round 1 sees the
  queue's random initial entries, labelled 0. ``logits`` scores the locally trained
  model's own classifier (OpenFGL's ``local_model_on_local_data``).
- ``fggp-optimizer``: ``sgd`` is SGD with momentum ``fggp-momentum``, made anew every
  round; ``adam`` is Adam kept across rounds (OpenFGL).
- ``fggp-knn-every``: the official code rebuilds the view every 20 rounds (10 in its
  citation and twitch settings); OpenFGL rebuilds it every round (1).
- ``fggp-proto-keys``: ``code`` keys the prototypes by their row in ``unique(ŷ)``, as both
  codes do; it matters only when a class has no (pseudo-)label. ``class`` keys them by
  class id.

Kept from both codes: ``fggp-queue-k`` (30) larger than the queue is cut to the queue's
size, where the official code would raise (a binary task's queue holds 20). The clients'
weights are their training nodes (OpenFGL's; the official server weighs node counts).
Not reproduced: the official code's unused terms (``com_distillation_loss``, the
projection head, the server prototypes' other uses), which never reach the loss.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.neighbors import kneighbors_graph
from torch import nn
from torch_geometric.utils import coalesce

from ..core.options import ConfigError, Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.dense_adjacency_gcn import DenseAdjacencyGCN, gumbel_row_softmax, raw_adjacency
from ..nn.pmlp_gcn import PMLPGCN, gcn_propagation, row_normalised
from .fedavg import FedAvgAggregator, weighted_average
from .supervised import OPTIMIZERS, EvaluatesReceivedModel, SupervisedTrainer, evaluation_metrics

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

FLAVOURS = ("official", "openfgl")
EVALUATIONS = ("queue", "logits")
PROTO_KEYS = ("code", "class")
PROTOTYPES_KEY = "prototypes"
QUEUE_KEY, QUEUE_LABELS_KEY = "queue", "queue_labels"


# `fggp-reproduce`: the profiles, the default first (docs/methods/fggp.md).
PUBLISHED = (
    "`openfgl` (with num-layers=2, Adam: configs/paper/openfgl-side-by-side-cora.yaml) is the one"
    " compared with OpenFGL on its Cora files (this page); the paper's Twitch-domain figures are "
    "not run here."
)
PROFILES: dict[str, dict[str, Any]] = {
    "official": {"flavour": "official", "evaluate": "queue", "optimizer": "sgd", "knn_every": 20},
    "openfgl": {"flavour": "openfgl", "evaluate": "logits", "optimizer": "adam", "knn_every": 1},
}


@dataclass(frozen=True)
class FGGPOptions(Options, prefix="fggp", profiles=PROFILES, published=PUBLISHED):
    """FGGP's knobs (``fggp-*``), the official code's values."""

    flavour: str = option("official", "official (GuanchengWan/FGGP) | openfgl (OpenFGL's "
                          "flcore/fggp): see the module docstring", choices=FLAVOURS)
    evaluate: str = option("queue", "queue (the received model's features, scored by the "
                           "server's prototype queue; official) | logits (the local model's "
                           "classifier; OpenFGL)", choices=EVALUATIONS)
    optimizer: str = option("sgd", "sgd (momentum, made anew each round; official) | adam "
                            "(kept across rounds; OpenFGL)", choices=OPTIMIZERS)
    momentum: float = option(0.9, "momentum of fggp-optimizer=sgd", low=0.0, high=1.0)
    knn_k: int = option(3, "neighbours per node of the second view's kNN graph", low=1)
    knn_every: int = option(20, "rounds between rebuilds of the second view (OpenFGL: 1)", low=1)
    tau: float = option(0.5, "temperature of the prototype alignment", low=0.0, low_inclusive=False)
    aug_alpha: float = option(0.5, "official augmenter: weight of its logits in the edge "
                              "probabilities", low=0.0, high=1.0)
    aug_temperature: float = option(1.0, "official augmenter: relaxed-Bernoulli temperature",
                                    low=0.0, low_inclusive=False)
    gumbel_tau: float = option(0.5, "openfgl augmenter: Gumbel-softmax temperature",
                               low=0.0, low_inclusive=False)
    queue_size: int = option(10, "server queue: prototypes per class", low=1)
    queue_k: int = option(30, "queue evaluation: nearest prototypes voting", low=1)
    queue_temperature: float = option(0.1, "queue evaluation: softmax temperature",
                                      low=0.0, low_inclusive=False)
    proto_keys: str = option("code", "code (row in unique(ŷ), both codes) | class (class id)",
                             choices=PROTO_KEYS)
    dense_limit: int = option(20000, "largest client (nodes) whose dense [n, n] second view "
                              "is built", low=1)


# --- the method's steps, on tensors ---------------------------------------------------------
def knn_view_edges(features: torch.Tensor, edge_index: torch.Tensor, k: int) -> torch.Tensor:
    """The second view's edges [2, m']: ``edge_index`` joined with the directed cosine
    k-NN graph of ``features`` [n, h] with a self-loop per node (sklearn's
    ``kneighbors_graph``, then ``setdiag(1)``), duplicates removed."""
    n = features.size(0)
    knn = kneighbors_graph(features.detach().cpu().numpy(), min(k, n - 1), metric="cosine")
    knn.setdiag(1)
    knn = knn.tocoo()
    knn_edges = torch.from_numpy(np.vstack([knn.row, knn.col])).long().to(edge_index.device)
    return coalesce(torch.cat([edge_index, knn_edges], dim=1), num_nodes=n)


def weighted_class_prototypes(h: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                              num_classes: int) -> torch.Tensor:
    """Row c: Σ_i w_i 1[y_i = c] h_i / (Σ_i w_i 1[y_i = c] + 1e-6), both codes'
    ``get_proto_norm_weighted`` before its row selection; h [n, d] -> [C, d]."""
    sums = torch.zeros(num_classes, h.size(1), dtype=h.dtype, device=h.device)
    sums = sums.index_add(0, labels, weights[:, None] * h)
    mass = torch.zeros(num_classes, dtype=h.dtype, device=h.device).index_add(0, labels, weights)
    return sums / (mass[:, None] + 1e-6)


def pseudo_labels(probs: torch.Tensor, labels: torch.Tensor, train_mask: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ŷ, w): argmax and max of ``probs`` [n, C] (not detached), the true label with
    weight 1 on training nodes."""
    confidence, predicted = probs.max(1)
    predicted = torch.where(train_mask, labels, predicted)
    confidence = torch.where(train_mask, torch.ones_like(confidence), confidence)
    return predicted, confidence


def official_alignment(view: torch.Tensor, own: torch.Tensor, tau: float) -> torch.Tensor:
    """The official ``proto_align_loss(view, own, τ)`` over K prototypes [K, d]: with ĝ, ô
    the L2-normalised rows, mean_k CE over [ĝ_k·ô_k, ĝ_k·ĝ_j (j≠k), ĝ_k·ô_j (j≠k)] / τ
    with the first as the target (0 when K = 1). A zero prototype (every member's
    features 0) stays 0, where the official division by its norm gives NaN."""
    g, o = F.normalize(view, dim=-1), F.normalize(own, dim=-1)
    k = g.size(0)
    off = ~torch.eye(k, dtype=torch.bool, device=g.device)
    positive = (g * o).sum(-1, keepdim=True)
    negatives = torch.cat([(g @ g.t())[off].view(k, -1), (g @ o.t())[off].view(k, -1)], dim=1)
    logits = torch.cat([positive, negatives], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(k, dtype=torch.long, device=g.device))


def openfgl_alignment(view: torch.Tensor, own: torch.Tensor, tau: float) -> torch.Tensor:
    """OpenFGL's ``proto_align_loss(view, own, τ)``: mean_k −log(e^{p_k} / (e^{p_k} +
    Σ_{j≠k} e^{view_k·own_j/τ})), p_k = cos(view_k, own_k)/τ; the negatives are raw dot
    products. Taken as logsumexp − p_k, the same value without its overflow."""
    k = view.size(0)
    positive = F.cosine_similarity(view, own, dim=1) / tau
    negatives = (view @ own.t() / tau).masked_fill(
        torch.eye(k, dtype=torch.bool, device=view.device), float("-inf"))
    return (torch.logsumexp(torch.cat([positive[:, None], negatives], dim=1), dim=1) - positive).mean()


def graph_augmentation_loss(logits: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
    """norm_w · BCEWithLogits(L, A, pos_weight) over all n² entries, with
    norm_w = n² / (2 (n² − ΣA)) and pos_weight = (n² − ΣA) / ΣA (both codes)."""
    total = float(adjacency.numel())
    edges = float(adjacency.sum())
    norm_w = total / (2.0 * (total - edges))
    pos_weight = torch.tensor([(total - edges) / edges], device=logits.device)
    return norm_w * F.binary_cross_entropy_with_logits(logits, adjacency, pos_weight=pos_weight)


def queue_scores(features: torch.Tensor, memory: torch.Tensor, memory_labels: torch.Tensor,
                 num_classes: int, k: int, temperature: float) -> torch.Tensor:
    """The official ``MomentumQueue.forward``: cosine similarities to the queue [Q, h],
    the top k softmaxed at ``temperature`` and summed per label, + 1e-5, clamped at 1.
    features [n, h] -> scores [n, C]."""
    similarity = F.normalize(features, dim=1) @ memory.t()
    top, index = similarity.topk(min(k, memory.size(0)), dim=1)
    weight = F.softmax(top / temperature, dim=1)
    scores = torch.zeros(features.size(0), num_classes, dtype=weight.dtype, device=weight.device)
    scores = scores.scatter_add(1, memory_labels[index], weight)
    return (scores + 1e-5).clamp(max=1.0)


def cluster_class_prototypes(prototypes: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Both servers' ``proto_aggregation``: per key, the FINCH clusters (cosine, last
    partition) of the clients' prototypes, each replaced by its members' mean.

    prototypes [K, C, d], a row present where not all zero -> [(class, centres [m, d])] in
    the order keys first appear (clients in order, each one's rows in order)."""
    with warnings.catch_warnings():  # finch-clust warns that its optional pynndescent is absent
        warnings.simplefilter("ignore", UserWarning)
        from finch import FINCH

    order: list[int] = []
    for client in prototypes:
        order += [int(c) for c in np.flatnonzero(np.abs(client).sum(-1) > 0) if c not in order]
    clustered = []
    for c in order:
        members = prototypes[:, c][np.abs(prototypes[:, c]).sum(-1) > 0]
        if len(members) == 1:
            clustered.append((int(c), members))
            continue
        partitions, _, _ = FINCH(members, initial_rank=None, req_clust=None, distance="cosine",
                                 ensure_early_exit=False, verbose=False)
        last = partitions[:, -1]
        clustered.append((int(c), np.stack([members[last == i].mean(0) for i in np.unique(last)])))
    return clustered


def unsent_classifier(config: ClientConfig) -> str | None:
    """The name prefix of the parameters the official flavour never sends (its classifier,
    the last linear), or None (OpenFGL's flavour sends everything)."""
    if config.options_of(FGGPOptions).flavour != "official":
        return None
    return f"fcs.{config.num_layers - 1}."


@dataclass
class SecondView:
    """The second view's graph: its edges and what each flavour builds from them."""

    edge_index: torch.Tensor  # [2, m'] edges ∪ kNN
    adjacency: torch.Tensor  # dense 0/1 [n, n], A[row, col] = 1 (L_GA's target)
    norm_adjacency: torch.Tensor | None  # official: sparse D^-1/2 A D^-1/2 (the augmenter's)
    propagation: torch.Tensor | None  # official: the classifier's Â over the view's edges


class FGGPTrainer(EvaluatesReceivedModel, SupervisedTrainer):
    """Two views, prototype alignment and graph augmentation (module docstring)."""

    options_class = FGGPOptions
    options: FGGPOptions
    model: Any  # PMLPGCN or DenseAdjacencyGCN, by flavour

    dense_nodes = True  # its second view is a dense [n, n] graph (module docstring)

    def __init__(self, data: Any, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        options = config.options_of(FGGPOptions)
        if data.num_nodes > options.dense_limit:
            raise ConfigError(f"fggp: a client of {data.num_nodes} nodes exceeds fggp-dense-limit="
                              f"{options.dense_limit} (its second view is a dense n×n graph)")
        super().__init__(data, config, num_classes, device)
        n, edge_index = self.data.num_nodes, self.data.edge_index
        self.official = self.options.flavour == "official"
        self.propagation = (gcn_propagation(edge_index, n) if self.official
                            else raw_adjacency(edge_index, n))
        self.view: SecondView | None = None
        self.queue: torch.Tensor | None = None
        self.queue_labels: torch.Tensor | None = None
        self.local_prototypes = torch.zeros(num_classes, config.hidden, device=device)
        # The classifier as seeded (built with the run's seed, like every client's).
        self.initial_classifier = ([p.detach().clone() for p in self.model.fcs[-1].parameters()]
                                   if self.official else [])

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """PMLP_GCN with its augmenter (official), or OpenFGL's raw-adjacency GCN."""
        if config.num_layers < 2:  # the prototypes are a hidden layer's
            raise ConfigError(f"fggp needs num-layers >= 2 (got {config.num_layers})")
        opts = config.options_of(FGGPOptions)
        if opts.flavour == "official":
            return PMLPGCN(num_features, config.hidden, num_classes, num_layers=config.num_layers,
                           dropout=config.dropout, aug_alpha=opts.aug_alpha,
                           aug_temperature=opts.aug_temperature)
        return DenseAdjacencyGCN(num_features, config.hidden, num_classes,
                                 num_layers=config.num_layers, dropout=config.dropout)

    def is_local(self, name: str) -> bool:
        """The official flavour's classifier (the last linear) is never sent."""
        prefix = unsent_classifier(self.config)
        return prefix is not None and name.startswith(prefix)

    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """The seeded model (less the official classifier) and zero prototypes."""
        torch.manual_seed(config.seed)
        model = cls.build_model(num_features, num_classes, config)
        unsent = unsent_classifier(config)
        arrays = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()
                  if unsent is None or not k.startswith(unsent)}
        arrays[PROTOTYPES_KEY] = np.zeros((num_classes, config.hidden), np.float32)
        return arrays

    # --- payload and state -------------------------------------------------------------------
    def load_payload(self, arrays: Arrays) -> None:
        """The global model, the official classifier reset to its initial value (the
        official server never averages it and every client loads the global state), and
        the queue."""
        super().load_payload(arrays)
        if self.official:
            with torch.no_grad():
                for param, initial in zip(self.model.fcs[-1].parameters(), self.initial_classifier):
                    param.copy_(initial)
        if QUEUE_KEY in arrays:
            self.queue = torch.as_tensor(np.asarray(arrays[QUEUE_KEY]), device=self.device)
            self.queue_labels = torch.as_tensor(np.asarray(arrays[QUEUE_LABELS_KEY]),
                                                device=self.device).long()

    def upload(self) -> Arrays:
        """The model (less the official classifier) and the [C, hidden] prototypes."""
        return {**super().upload(),
                PROTOTYPES_KEY: self.local_prototypes.cpu().numpy().astype(np.float32)}

    def local_state(self) -> dict[str, Any]:
        """Model, optimizer, the view's edges and the prototypes (the queue comes with
        every payload)."""
        return {**super().local_state(), "local_prototypes": self.local_prototypes,
                "view_edges": None if self.view is None else self.view.edge_index}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.local_prototypes = state["local_prototypes"].to(self.device)
        if state["view_edges"] is not None:
            self.set_view(state["view_edges"].to(self.device))

    # --- the second view ---------------------------------------------------------------------
    def set_view(self, edge_index: torch.Tensor) -> None:
        """Build what the flavour needs of the view with edges ``edge_index``."""
        n = self.data.num_nodes
        adjacency = torch.zeros(n, n, device=self.device)
        adjacency[edge_index[0], edge_index[1]] = 1.0
        self.view = SecondView(
            edge_index, adjacency,
            row_normalised(edge_index, n) if self.official else None,
            gcn_propagation(edge_index, n) if self.official else None)

    def hidden_features(self) -> torch.Tensor:
        """[n, hidden] in the model's current mode: PMLP_GCN's ``features()`` (official),
        or the hidden layer after dropout (OpenFGL's model)."""
        data = self.data
        if self.official:
            return self.model.features(data.x, self.propagation)
        return self.model(data.x, self.propagation)[0]

    def refresh_view(self) -> None:
        """The view's edges from the received model's features: in train mode as the
        official ``global_net``, in eval mode as OpenFGL's."""
        self.model.train(self.official)
        with torch.no_grad():
            features = self.hidden_features()
        self.set_view(knn_view_edges(features, self.data.edge_index, self.options.knn_k))

    # --- training ----------------------------------------------------------------------------
    def build_optimizer(self) -> torch.optim.Optimizer:
        """SGD with momentum (official) or Adam, with the run's lr and weight decay."""
        if self.options.optimizer == "sgd":
            return torch.optim.SGD(self.model.parameters(), lr=self.config.lr,
                                   momentum=self.options.momentum,
                                   weight_decay=self.config.weight_decay)
        return super().build_optimizer()

    def official_step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One epoch's loss, its L_PA, and the clean view's probabilities (official)."""
        data, view = self.data, self.view
        assert view is not None and view.norm_adjacency is not None and view.propagation is not None
        mask, y = data.train_mask, data.y
        logits = self.model(data.x, self.propagation)
        sampled, edge_logits = self.model.aug(data.x, view.norm_adjacency, view.adjacency)
        logits2 = self.model(data.x, view.propagation, hidden_propagation=sampled)
        ga = graph_augmentation_loss(edge_logits, view.adjacency)
        ce, ce2 = F.cross_entropy(logits[mask], y[mask]), F.cross_entropy(logits2[mask], y[mask])
        feat = self.model.features(data.x, self.propagation)
        feat2 = self.model.features(data.x, sampled)
        probs = F.softmax(logits, dim=1)
        pa = self.alignment(feat, feat2, probs, official_alignment)
        return ce + ce2 + pa + ga, pa, probs

    def openfgl_step(self, sampled_graph: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One epoch's loss, its L_PA, and G2's sampled graph (OpenFGL)."""
        data, opts, view = self.data, self.options, self.view
        assert view is not None
        mask, y = data.train_mask, data.y
        hidden, logits = self.model(data.x, self.propagation)
        with torch.no_grad():
            features, _ = self.model(data.x, sampled_graph)
        edge_logits = features @ features.t()
        sampled = gumbel_row_softmax(edge_logits, opts.gumbel_tau)
        hidden2, logits2 = self.model(data.x, sampled)
        ga = graph_augmentation_loss(edge_logits, view.adjacency)
        ce, ce2 = F.cross_entropy(logits[mask], y[mask]), F.cross_entropy(logits2[mask], y[mask])
        pa = self.alignment(hidden, hidden2, F.softmax(logits, dim=1), openfgl_alignment)
        return ce + ga + ce2 + pa, pa, sampled

    def alignment(self, feat: torch.Tensor, feat2: torch.Tensor, probs: torch.Tensor,
                  loss: Any) -> torch.Tensor:
        """L_PA between the two views' prototypes over the present (pseudo-)labels."""
        data = self.data
        labels, weights = pseudo_labels(probs, data.y, data.train_mask)
        present = torch.unique(labels)
        own = weighted_class_prototypes(feat, labels, weights, self.num_classes)[present]
        view = weighted_class_prototypes(feat2, labels, weights, self.num_classes)[present]
        return loss(view, own, self.options.tau)

    def train(self, epochs: int) -> dict[str, float]:
        """Rebuild the view when due; ``epochs`` full-batch steps; then the prototypes."""
        opts = self.options
        self.score_received_model()
        if self.view is None or (self.config.server_round - 1) % opts.knn_every == 0:
            self.refresh_view()
        if opts.optimizer == "sgd":
            self.optimizer = self.build_optimizer()
        self.model.train()
        loss_value, pa_value = float("nan"), float("nan")
        probs: torch.Tensor | None = None
        sampled_graph = self.propagation  # OpenFGL's first epoch samples from the raw graph
        for _ in range(epochs):
            self.optimizer.zero_grad()
            if self.official:
                loss, pa, probs = self.official_step()
            else:
                loss, pa, sampled_graph = self.openfgl_step(sampled_graph)
                sampled_graph = sampled_graph.detach()
            loss.backward()
            self.optimizer.step()
            loss_value, pa_value = float(loss.detach()), float(pa.detach())
        self.local_prototypes = self.upload_prototypes(probs)
        return {"train_loss": loss_value, "alignment_loss": pa_value}

    @torch.no_grad()
    def upload_prototypes(self, last_probs: torch.Tensor | None) -> torch.Tensor:
        """[C, hidden]: the official last epoch's pseudo-labels with features recomputed in
        train mode, or OpenFGL's eval-mode pass with raw-logit confidences; rows keyed by
        ``fggp-proto-keys``; an absent class's row is 0."""
        data = self.data
        if self.official and last_probs is not None:
            feat = self.model.features(data.x, self.propagation)
            labels, weights = pseudo_labels(last_probs, data.y, data.train_mask)
        else:
            self.model.eval()
            feat, logits = self.model(data.x, self.propagation)
            labels, weights = pseudo_labels(logits, data.y, data.train_mask)
        present = torch.unique(labels)
        rows = weighted_class_prototypes(feat, labels, weights, self.num_classes)
        prototypes = torch.zeros_like(rows)
        keys = (torch.arange(len(present), device=rows.device)
                if self.options.proto_keys == "code" else present)
        prototypes[keys] = rows[present]
        return prototypes

    # --- evaluation --------------------------------------------------------------------------
    @torch.no_grad()
    def queue_metrics(self) -> dict[str, float]:
        """The current model's features scored by the queue (log scores as logits)."""
        self.model.eval()
        data = self.data
        if self.queue is None or self.queue_labels is None:  # round 1: no queue yet, all 0
            return evaluation_metrics(torch.zeros(data.num_nodes, self.num_classes,
                                                  device=self.device), data, self.metric)
        scores = queue_scores(self.hidden_features(), self.queue, self.queue_labels, self.num_classes,
                              self.options.queue_k, self.options.queue_temperature)
        return evaluation_metrics(scores.log(), data, self.metric)

    def forward(self) -> torch.Tensor:
        """The model's logits over the client's graph."""
        out = self.model(self.data.x, self.propagation)
        return out if self.official else out[1]

    def scores_received_model(self) -> bool:
        """``queue``: the round reports the received model, scored by the queue; ``logits``:
        the local model's classifier after training."""
        return self.options.evaluate == "queue"

    def received_model_metrics(self) -> dict[str, float]:
        """The received model's features scored by the queue."""
        return self.queue_metrics()


class FGGPAggregator(FedAvgAggregator):
    """FedAvg of the models; FINCH clusters of each class's prototypes into the queue."""

    options_class = FGGPOptions
    options: FGGPOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        num_classes, hidden = initial[PROTOTYPES_KEY].shape
        size = num_classes * self.options.queue_size
        bound = 1.0 / np.sqrt(hidden / 3)
        with torch.random.fork_rng(devices=[]):  # the official queue's random initial entries
            torch.manual_seed(config.seed)
            self.queue = torch.rand(size, hidden).mul_(2 * bound).add_(-bound).numpy()
        self.queue_labels = np.zeros(size, np.int64)
        self.queue_index = 0

    def push(self, centres: np.ndarray, label: int) -> None:
        """Write L2-normalised ``centres`` [m, h] at the ring buffer's index (the official
        ``MomentumQueue.update_queue``)."""
        norms = np.maximum(np.linalg.norm(centres, axis=1, keepdims=True), 1e-12)
        slots = (np.arange(len(centres)) + self.queue_index) % len(self.queue)
        self.queue[slots] = centres / norms
        self.queue_labels[slots] = label
        self.queue_index = (self.queue_index + len(centres)) % len(self.queue)

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """The models' average and the queue, updated with this round's clusters."""
        ids = sorted(updates)
        models = {c: replace(updates[c], arrays={k: v for k, v in updates[c].arrays.items()
                                                 if k != PROTOTYPES_KEY}) for c in ids}
        global_arrays = weighted_average(models, "train", self.mix_dtype)
        prototypes = np.stack([np.asarray(updates[c].arrays[PROTOTYPES_KEY], np.float64) for c in ids])
        clustered = cluster_class_prototypes(prototypes)
        for label, centres in clustered:
            self.push(centres.astype(np.float32), label)
        payload = {**global_arrays, QUEUE_KEY: self.queue.astype(np.float32).copy(),
                   QUEUE_LABELS_KEY: self.queue_labels.copy()}
        return AggregateResult(payloads={c: payload for c in self.client_ids},
                               metrics={"prototype-clusters": float(sum(len(c) for _, c in clustered))})

    def state_dict(self) -> dict[str, Any]:
        """The queue and its index."""
        return {"queue": self.queue, "queue_labels": self.queue_labels, "queue_index": self.queue_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.queue = np.asarray(state["queue"], np.float32).copy()
        self.queue_labels = np.asarray(state["queue_labels"], np.int64).copy()
        self.queue_index = int(state["queue_index"])


ALGORITHM = Algorithm("fggp", FGGPTrainer, FGGPAggregator, FGGPOptions)
