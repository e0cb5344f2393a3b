"""FedGL (Chen et al., Information Sciences 2024; arXiv 2105.03170): federated graph
learning with global self-supervision. **Per-node predictions leave the client.**

Clients train a GCN as in FedAvg. They also upload, for every node they hold, its
prediction and its embedding (both the model's logits, as in OpenFGL), keyed by the node's
global id. The server fuses them over the clients that hold each node and sends back:

1. **global pseudo labels**: each client's softmax with every entry below
   ``fedgl-threshold`` set to 0, averaged over the node's holders (weights ``fedgl-rate``);
   a node whose fused row is not all zero gets its argmax as pseudo label. A client adds
   ``fedgl-ssl-weight`` · CE on its pseudo-labelled nodes outside its training set to its loss;
2. **a global pseudo graph** (only with ``fedgl-graph-weight`` > 0; OpenFGL's default is 0):
   over the fused embeddings E of every node seen, Z = top-``fedgl-topk`` per row of
   max(E Eᵀ, 0), rows normalised to 1, a column left empty gets 0.1 in a random row, the
   diagonal set to 1; P = D^-1/2 Zᵀ D^-1/2 with D Z's row sums (OpenFGL's
   ``normalize_server_adj`` transposes). Each client receives w·P restricted to pairs of
   its own nodes and adds it to its adjacency. Built in row blocks (:func:`pseudo_graph`):
   memory O(N·k), never the dense N×N matrix OpenFGL builds.

On a disjoint partition (METIS) every node has one holder, so the fused labels are the
client's own thresholded predictions (self-training) and the pseudo graph links only a
client's own nodes; on an overlapping one the holders' predictions are combined.

The round is three engine phases (the phase contract has the server speak first):

- ``predict``: on a round that refreshes the pseudo labels (from round 2, every
  ``fedgl-update-every`` rounds) the server asks; the client replies with the keyed hashes
  of its nodes' global ids (``node_hash`` [n] int64, :func:`~.fedgnn.hash_ids` with
  ``fedgl-salt``) and the logits [n, C] of the model it trained last round, in eval mode
  (OpenFGL sends the same right after training). Otherwise the reply is empty. With
  ``fedgl-node-ids=local`` (client files without global ids, as a deployment's) no hashes
  are sent and every client's nodes count as its own: the fusion of a disjoint partition.
- ``label``: the server sends each client its refreshed pseudo labels ``pseudo_label`` [n]
  (−1: none) and, with the pseudo graph, ``graph_source``/``graph_target``/``graph_weight``
  (its local edges of w·P); the reply is empty. The client keeps them until the next refresh.
- ``train``: E epochs of full-batch Adam on CE + ssl term; FedAvg of the weights by
  training nodes (OpenFGL: by node count, the same under a fixed split ratio).

Leaves the client each round: the GCN's weights, and on refresh rounds ``node_hash`` [n]
and ``logits`` [n, C] (per node: the published design, named in ``per_node_arrays``;
README discloses it). The server learns which (hashed) nodes each client holds and its
predictions for them. The hash salt comes from the run config, which the server holds:
it hides ids from observers, not from the server (as FedGNN's).

Sources: no code by the authors was found; this follows OpenFGL's ``flcore/fedgl``
(openfgl-lib 1.1.0; its defaults: ssl weight 0.1, threshold 0.5, graph weight 0, k 100,
refresh every round, rates by sampling share). Switches where OpenFGL differs from the
paper's description or from itself:

- ``fedgl-labels``: ``refresh`` (default; the paper: labels and graph recomputed on every
  refresh) | ``first`` (OpenFGL: the server appends each refresh to lists it never clears
  and clients read entry ``client_id``, so every client keeps its first refresh for the rest
  of the run).
- ``fedgl-propagation``: ``gcn`` (default; the paper's GCN: symmetric normalisation of
  A + I, plus w·P) | ``openfgl`` (OpenFGL's ``FedGCN`` layer: ``spmm(A + w·P, XW) + b`` over
  the raw adjacency, no self-loops, no normalisation).
- ``fedgl-rate``: ``sampling-rate`` (default, OpenFGL: a holder's share of the replying
  clients' nodes) | ``mean`` (every holder 1).

Not carried over: when a client has no pseudo-labelled node outside its training set,
OpenFGL adds the CE of one uniformly drawn node against label 0 (the placeholder of an
unlabelled node); here the term is left out. OpenFGL's columns left empty draw their row
from numpy's global stream; here from a generator seeded by the run's seed and the round.
OpenFGL's layers initialise uniform(±1/√out) with zero bias; here PyG's GCNConv (Glorot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv
from torch_geometric.utils import add_remaining_self_loops, coalesce

from ..core.options import ConfigError, Options, option
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
from ..nn.gcn import GCN
from .fedavg import FedAvgAggregator, GCNTrainer
from .fedgnn import hash_ids, rows_by_node

if TYPE_CHECKING:
    from torch_geometric.data import Data

    from ..config import ClientConfig, RunConfig

PREDICT = Phase("predict")
LABEL = Phase("label")
#: The per-node arrays of the ``predict`` reply (the method's published design).
PER_NODE = frozenset({"node_hash", "logits"})
#: Rows of E·Eᵀ per block of the pseudo graph (bounds memory at block × nodes).
GRAPH_BLOCK_ENTRIES = 1 << 22
NO_LABEL = -1


# `fedgl-reproduce`: the profiles, the default first (docs/methods/fedgl.md).
PUBLISHED = (
    "`openfgl` is the one compared with OpenFGL on its Cora METIS-10 files (this page); no code "
    "by the authors was found."
)
PROFILES: dict[str, dict[str, Any]] = {
    "paper": {"labels": "refresh", "propagation": "gcn"},
    "openfgl": {"labels": "first", "propagation": "openfgl"},
}


@dataclass(frozen=True)
class FedGLOptions(Options, prefix="fedgl", profiles=PROFILES, published=PUBLISHED):
    """FedGL's knobs (``fedgl-*``): OpenFGL's defaults (module docstring)."""

    ssl_weight: float = option(0.1, "weight of the pseudo-label cross-entropy (ssl_loss_weight)",
                               low=0.0)
    threshold: float = option(0.5, "softmax entries below this count as 0 in the fused "
                              "prediction (probability_threshold)", low=0.0, high=1.0)
    graph_weight: float = option(0.0, "weight w of the global pseudo graph; 0 switches it off "
                                 "(pseudo_graph_weight)", low=0.0)
    topk: int = option(100, "neighbours per node in the pseudo graph (k)", low=1)
    update_every: int = option(1, "rounds between pseudo-label refreshes "
                               "(pseudo_labels_update_epoch)", low=1)
    rate: str = option("sampling-rate", "a holder's weight in the fusion: sampling-rate (its "
                       "share of nodes) | mean (pred_weight)", choices=("sampling-rate", "mean"))
    labels: str = option("refresh", "refresh (paper: every refresh replaces them) | first "
                         "(OpenFGL: the first refresh is kept)", choices=("refresh", "first"))
    propagation: str = option("gcn", "gcn (normalised A + I) | openfgl (raw A, no self-loops)",
                              choices=("gcn", "openfgl"))
    salt: str = option("fedgl", "federation-wide key of the node-id hash (the server knows it)")
    node_ids: str = option("global", "global (nodes matched across clients by their global ids: "
                           "the files must hold them) | local (no ids sent: each client's nodes "
                           "are its own, for files without global ids)", choices=("global", "local"))


# --- the server's fusion -----------------------------------------------------------------
@dataclass
class Fusion:
    """The clients' predictions fused per distinct node (rows follow ``hashes``)."""

    hashes: np.ndarray  # [U] int64, sorted
    rows: dict[int, np.ndarray]  # client -> [n_c] its nodes' rows
    labels: torch.Tensor  # [U] int64, NO_LABEL where the fused prediction is all zero
    embedding: torch.Tensor  # [U, C] float64: rate-weighted mean of the logits


def fuse(uploads: dict[int, tuple[np.ndarray, np.ndarray]], rate: str, threshold: float
         ) -> Fusion:
    """Fuse ``{client: (node_hash [n], logits [n, C])}`` as OpenFGL's server (module doc)."""
    ids = sorted(uploads)
    sizes = np.array([uploads[c][0].size for c in ids], dtype=np.float64)
    rates = sizes / sizes.sum() if rate == "sampling-rate" else np.ones(len(ids))
    hashes, inverse, rows = rows_by_node({c: uploads[c][0] for c in ids})
    index = torch.as_tensor(inverse, dtype=torch.long)
    logits = torch.cat([torch.as_tensor(uploads[c][1], dtype=torch.float64) for c in ids])
    holder_rate = torch.as_tensor(np.repeat(rates, sizes.astype(np.int64)))
    num, classes = hashes.size, logits.size(1)
    weight = torch.zeros(num, dtype=torch.float64).index_add_(0, index, holder_rate)
    weight[weight == 0] = 1.0
    prob = torch.softmax(logits, dim=1)
    prob = torch.where(prob < threshold, torch.zeros_like(prob), prob)
    fused = torch.zeros(num, classes, dtype=torch.float64).index_add_(
        0, index, holder_rate[:, None] * prob) / weight[:, None]
    labels = torch.where(fused.sum(dim=1) > 0, fused.argmax(dim=1),
                         torch.full((num,), NO_LABEL, dtype=torch.long))
    embedding = torch.zeros(num, classes, dtype=torch.float64).index_add_(
        0, index, holder_rate[:, None] * logits) / weight[:, None]
    return Fusion(hashes, rows, labels, embedding)


def pseudo_graph(embedding: torch.Tensor, topk: int, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised pseudo graph P of the module docstring, sparse: (edge_index [2, m]
    with row = the node that aggregates, values [m] float64)."""
    num = embedding.size(0)
    k = min(topk, num)
    block = max(1, GRAPH_BLOCK_ENTRIES // max(num, 1))
    rows, cols, vals = [], [], []
    for lo in range(0, num, block):
        scores = (embedding[lo:lo + block] @ embedding.T).clamp_(min=0.0)  # [b, U]
        top, where = scores.topk(k, dim=1)
        top = top / top.sum(dim=1, keepdim=True)  # OpenFGL: Z /= Z.sum(axis=1)
        keep = top > 0
        rows.append((torch.arange(lo, lo + top.size(0))[:, None].expand_as(where))[keep])
        cols.append(where[keep])
        vals.append(top[keep])
    row, col, val = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    empty = torch.bincount(col, minlength=num) == 0
    empty_cols = empty.nonzero().view(-1)
    if empty_cols.numel():  # OpenFGL: a column nobody chose gets 0.1 in a random row
        row = torch.cat((row, torch.randint(0, num, (empty_cols.numel(),), generator=generator)))
        col = torch.cat((col, empty_cols))
        val = torch.cat((val, torch.full((empty_cols.numel(),), 0.1, dtype=val.dtype)))
    off = row != col  # np.fill_diagonal(Z, 1): the diagonal is 1, whatever was chosen
    diagonal = torch.arange(num)
    row = torch.cat((row[off], diagonal))
    col = torch.cat((col[off], diagonal))
    val = torch.cat((val[off], torch.ones(num, dtype=val.dtype)))
    (row, col), val = coalesce(torch.stack((row, col)), val, num_nodes=num, reduce="sum")
    degree = torch.zeros(num, dtype=val.dtype).index_add_(0, row, val)
    d = degree.pow(-0.5)
    d[torch.isinf(d)] = 0.0
    # P = D Zᵀ D: entry (j, i) carries d_j Z_ij d_i, node j aggregating from node i.
    return torch.stack((col, row)), d[col] * val * d[row]


def client_graph(graph: tuple[torch.Tensor, torch.Tensor], rows: np.ndarray, num_nodes: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The entries of ``graph`` between nodes of one client (``rows``: its nodes' global
    rows, in its order), in its local indices: (source, target, value)."""
    (target, source), value = graph
    local = torch.full((num_nodes,), -1, dtype=torch.long)
    local[torch.as_tensor(rows, dtype=torch.long)] = torch.arange(len(rows))
    keep = (local[target] >= 0) & (local[source] >= 0)
    return (local[source[keep]].numpy(), local[target[keep]].numpy(),
            value[keep].numpy().astype(np.float32))


# --- client -------------------------------------------------------------------------------
class FedGLTrainer(GCNTrainer):
    """A GCN trained on cross-entropy plus the server's pseudo labels (and pseudo graph)."""

    options_class = FedGLOptions
    options: FedGLOptions
    phases = (PREDICT, LABEL, TRAIN_PHASE)
    per_node_arrays = PER_NODE

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        n = self.data.num_nodes
        self.pseudo_label = torch.full((n,), NO_LABEL, dtype=torch.long, device=device)
        self.graph_edges = torch.zeros(2, 0, dtype=torch.long, device=device)  # [2, m]
        self.graph_values = torch.zeros(0, device=device)  # [m]
        self._propagation: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """A GCN whose layers take edge weights: normalised (``gcn``) or raw (``openfgl``)."""
        if config.gnn != "gcn":
            raise ConfigError("fedgl trains a GCN (gnn=gcn)")
        options = config.options
        normalise = not isinstance(options, FedGLOptions) or options.propagation == "gcn"
        return GCN(num_features, config.hidden, num_classes, num_layers=config.num_layers,
                   dropout=config.dropout,
                   conv=lambda a, b: GCNConv(a, b, normalize=normalise, add_self_loops=False))

    def propagation(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(edge_index, edge_weight): the client's edges (with self-loops under ``gcn``),
        weight 1, plus the pseudo graph's, duplicates summed (built once per graph)."""
        if self._propagation is None:
            edge_index = self.data.edge_index
            weight = torch.ones(edge_index.size(1), device=edge_index.device)
            if self.options.propagation == "gcn":
                edge_index, weight = add_remaining_self_loops(edge_index, weight,
                                                              num_nodes=self.data.num_nodes)
            edge_index = torch.cat((edge_index, self.graph_edges), dim=1)
            weight = torch.cat((weight, self.graph_values))
            self._propagation = coalesce(edge_index, weight, num_nodes=self.data.num_nodes,
                                         reduce="sum")
        return self._propagation

    def forward(self) -> torch.Tensor:
        """Logits [n, C] over the client's graph plus the pseudo graph."""
        edge_index, weight = self.propagation()
        return self.model(self.data.x, edge_index, weight)

    def train(self, epochs: int) -> dict[str, float]:
        """Full-batch Adam on CE over the training nodes + ssl-weight · CE over the
        pseudo-labelled nodes outside them."""
        self.model.train()
        data = self.data
        pseudo = (self.pseudo_label >= 0) & ~data.train_mask
        use_pseudo = self.options.ssl_weight > 0 and bool(pseudo.any())
        loss_value = float("nan")
        for _ in range(epochs):
            self.optimizer.zero_grad()
            logits = self.forward()
            loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            if use_pseudo:
                loss = loss + self.options.ssl_weight * F.cross_entropy(
                    logits[pseudo], self.pseudo_label[pseudo])
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.detach())
        return {"train_loss": loss_value, "pseudo-labelled": float(pseudo.sum())}

    def node_hash(self) -> np.ndarray:
        """Keyed hashes [n] of this client's global node ids."""
        if "global_id" not in self.data:
            raise ValueError("fedgl needs each client's global node ids (global_id): the "
                             "partition cache has them; a subgraph file must include them, "
                             "or run with fedgl-node-ids=local")
        return hash_ids(self.data.global_id.cpu().numpy(), self.options.salt)

    @classmethod
    def phase_reply_spec(cls, phase: Phase, request: Arrays, num_features: int,
                         num_classes: int, config: ClientConfig) -> ReplySpec:
        """predict, when asked: logits [n, C] (and hashed ids [n] with global node ids);
        label: nothing."""
        if phase != PREDICT or not request:
            return ReplySpec()
        specs = {"logits": ArraySpec(("n", num_classes), "float32")}
        if config.options_of(FedGLOptions).node_ids == "global":
            specs["node_hash"] = ArraySpec(("n",), "int64")
        return ReplySpec(specs)

    def run_phase(self, phase: Phase, arrays: Arrays) -> PhaseReply:
        """PREDICT: hashed ids and logits when asked; LABEL: keep the pseudo labels (and graph)."""
        if phase == PREDICT:
            if not arrays:
                return PhaseReply()
            self.model.eval()
            with torch.no_grad():
                logits = self.forward()
            reply = {"logits": logits.cpu().numpy().astype(np.float32)}
            if self.options.node_ids == "global":
                reply["node_hash"] = self.node_hash()
            return PhaseReply(arrays=reply)
        if phase == LABEL:
            if arrays:
                self.receive(arrays)
            return PhaseReply()
        return super().run_phase(phase, arrays)

    def receive(self, arrays: Arrays) -> None:
        """Keep the server's pseudo labels [n] and pseudo-graph edges."""
        n, device = self.data.num_nodes, self.device
        labels = np.asarray(arrays["pseudo_label"], dtype=np.int64)
        if labels.shape != (n,) or labels.max(initial=NO_LABEL) >= self.num_classes:
            raise ValueError(f"pseudo labels of shape {labels.shape} do not fit {n} nodes")
        self.pseudo_label = torch.as_tensor(labels, device=device)
        source = np.asarray(arrays.get("graph_source", np.zeros(0)), dtype=np.int64)
        target = np.asarray(arrays.get("graph_target", np.zeros(0)), dtype=np.int64)
        value = np.asarray(arrays.get("graph_weight", np.zeros(0)), dtype=np.float32)
        if not (source.shape == target.shape == value.shape) or source.ndim != 1 or (
                source.size and max(int(source.max()), int(target.max())) >= n):
            raise ValueError("pseudo-graph arrays do not fit this client")
        self.graph_edges = torch.as_tensor(np.stack((source, target)), device=device)
        self.graph_values = torch.as_tensor(value, device=device)
        self._propagation = None

    def local_state(self) -> dict[str, Any]:
        """The base state plus the pseudo labels and pseudo-graph edges."""
        return {**super().local_state(), "pseudo_label": self.pseudo_label,
                "graph_edges": self.graph_edges, "graph_values": self.graph_values}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.pseudo_label = state["pseudo_label"].to(self.device)
        self.graph_edges = state["graph_edges"].to(self.device)
        self.graph_values = state["graph_values"].to(self.device)
        self._propagation = None


# --- server -------------------------------------------------------------------------------
class FedGLAggregator(FedAvgAggregator):
    """FedAvg of the GCNs; fuses the clients' predictions into pseudo labels (and graph)."""

    options_class = FedGLOptions
    options: FedGLOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        self.outgoing: dict[int, Arrays] = {}  # this round's refreshed labels, by client
        self.kept: dict[int, Arrays] = {}  # fedgl-labels=first: what each client got first

    def refreshes(self, server_round: int) -> bool:
        """Whether ``server_round`` refreshes the labels (from the round after the first)."""
        return server_round >= 2 and (server_round - 2) % self.options.update_every == 0

    def configure(self, phase: Phase, server_round: int, clients: list[int]) -> dict[int, Arrays]:
        """PREDICT: ask for predictions on refresh rounds; LABEL: each client's labels."""
        if phase == PREDICT:
            ask = {"refresh": np.ones(1, np.int8)} if self.refreshes(server_round) else {}
            return {c: dict(ask) for c in clients}
        if phase == LABEL:
            return {c: self.outgoing.get(c, {}) for c in clients}
        return super().configure(phase, server_round, clients)

    def step(self, phase: Phase, server_round: int, updates: dict[int, ClientUpdate]
             ) -> AggregateResult | None:
        """PREDICT: fuse the predictions into each client's labels; LABEL: delivered."""
        if phase == LABEL:
            self.outgoing = {}
            return None
        if phase != PREDICT:
            return None
        opts = self.options
        uploads, offset = {}, 0
        for c, update in sorted(updates.items()):
            if "logits" not in update.arrays:
                continue
            logits = np.asarray(update.arrays["logits"])
            if opts.node_ids == "global":
                hashes = np.asarray(update.arrays["node_hash"], np.int64)
            else:  # every client's nodes its own: distinct rows
                hashes = np.arange(offset, offset + logits.shape[0], dtype=np.int64)
                offset += logits.shape[0]
            uploads[c] = (hashes, logits)
        if not uploads:
            return None
        fusion = fuse(uploads, opts.rate, opts.threshold)
        graph = None
        if opts.graph_weight > 0:
            generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + server_round)
            edges, values = pseudo_graph(fusion.embedding, opts.topk, generator)
            graph = (edges, opts.graph_weight * values)
        labelled = 0
        for c, rows in fusion.rows.items():
            out: Arrays = {"pseudo_label": fusion.labels[rows].numpy()}
            if graph is not None:
                source, target, value = client_graph(graph, rows, fusion.hashes.size)
                out |= {"graph_source": source, "graph_target": target, "graph_weight": value}
            if opts.labels == "first":
                out = self.kept.setdefault(c, out)
            self.outgoing[c] = out
            labelled += int((out["pseudo_label"] >= 0).sum())
        return AggregateResult(payloads={}, metrics={
            "nodes": float(fusion.hashes.size), "pseudo-labelled": float(labelled)})

    def state_dict(self) -> dict[str, Any]:
        """The labels kept under ``fedgl-labels=first`` (the rest live one round)."""
        return {"kept": {int(c): dict(a) for c, a in self.kept.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.kept = {int(c): {k: np.asarray(v) for k, v in a.items()}
                     for c, a in state.get("kept", {}).items()}


ALGORITHM = Algorithm("fedgl", FedGLTrainer, FedGLAggregator, FedGLOptions)
