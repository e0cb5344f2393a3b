"""FedGNN (Wu et al., 2021, arXiv 2102.04925), as FED-PUB / FedIIH adapted it to subgraph
node classification. **A leaky baseline: per-node ids and embeddings leave the client.**

Sources. The original method is federated *recommendation*: ``wuch15/FedPerGNN``
(``run.py``, ``expansion.py``, ``const.py``, ``encrypt.py``) was read for the expansion and
the LDP. No adaptation code exists (FED-PUB released only FedAvg and FED-PUB; OpenFGL has no
FedGNN); FED-PUB/FedIIH describe it in one sentence, so this follows the reconstruction of
docs/reading/fedgnn.md §2 [I]. The backbone is FED-PUB's ``models/nets.py`` ``GCN`` (2 GCN
layers + a linear classifier, :class:`~fedgraph_flwr.nn.fedgnn_net.FedGNNNet`) trained as
FED-PUB's ``models/fedavg`` (full-batch Adam, persisting across rounds; FedAvg by training
size).

A round is three engine phases (two exchanges of the protocol, docs/reading/fedgnn.md §2):

1. ``embed`` (the expansion's upload). The server sends the current global model (round 1:
   the initial one; ``fedgnn-embed-model=local``: nothing, the client uses the model it
   holds). The client replies with, for each of its n nodes, a keyed hash of its global node
   id (``node_hash`` [n] int64), the hashed endpoints of each of its e directed edges
   (``edge_hash`` [2, e] int64) and the node's embedding h¹ = relu(conv1(x)) under that
   model in eval mode (``embedding`` [n, h] float32): 8n + 16e + 4nh bytes.
2. ``expand`` (the expansion's answer; its reply is empty). The server, as trusted matcher
   (:func:`match_expansion`), finds every node v held by this client and by another client
   that has an edge (v, u) to a node u this client does not hold, and sends this client,
   per distinct such u, one *virtual* node whose embedding is the mean of u's embeddings
   over the clients that hold u (``virtual_embedding`` [m, h] float32), plus the links
   (``virtual_source`` [k]: virtual index, ``virtual_target`` [k]: the hash of v). The
   client enters them at GCN layer 2 as fixed, feature-less nodes (module doc of
   :mod:`~fedgraph_flwr.nn.fedgnn_net`), for this round's training and evaluation.
3. ``train``: E epochs of full-batch Adam on cross-entropy over the expanded graph; upload
   every parameter; FedAvg weighted by training nodes (``fedgnn-weighting=train``, FED-PUB's
   FedAvg server) or uniformly; the average goes to every client.

The engine's phase contract has the server speak first in every exchange, so the
expansion's download rides on the request of a second phase (``expand``) whose reply is
empty; on the wire that is one more (empty) round trip, not another upload.

Where nodes are shared: only in the *overlapping* partitions (clients are random halves
of the same METIS part). On disjoint partitions no node is held twice, the expansion is
empty and FedGNN is FedAvg on FED-PUB's GCN (docs/reading/fedgnn.md §3.1); the ``embed`` upload is still
sent, as the protocol cannot know that in advance.

Ids. A client knows its nodes' global ids from its subgraph (``data.global_id``, written
by the partition cache; a subgraph file without them cannot run FedGNN: error). They are
hashed with a federation-wide salt (``fedgnn-salt``) by a keyed 64-bit bijection
(:func:`hash_ids`: two splitmix64 rounds around the salt's keys), so raw ids never leave
the client and distinct ids never collide. The original signs ids with an RSA key the
server never sees (``encrypt.py``); here the salt comes from the run config, which the
server also holds, so the hashes hide ids from observers, not from the server. Ids of a
public graph are dictionary-attackable whoever holds the key, in the original too.

What leaves a client each round: the ``embed`` reply above (per node: the published
leak, named in ``per_node_arrays``; README discloses it as an exemption), and
every model parameter (conv1 h·d + h, conv2 h² + h, clsif C·h + C). The server learns,
per client, which (hashed) nodes and edges it holds and their embeddings. What a client
receives: the global model twice (``embed`` and ``train`` requests; once with
``fedgnn-embed-model=local``) and its expansion, 4mh + 16k bytes. Measured on Cora, 10
overlapping clients of ~620 nodes (h = 128): ~410 virtual nodes and ~850 links per client
per round; on the disjoint partition none.

Choices where the sources are silent or differ (all [I] unless marked):

- Expansion depth: one hop of foreign neighbours, recomputed every round from the
  embeddings under the current global model (``run.py`` reads the global user-embedding
  table at each round's start: ``fedgnn-embed-model=global``, the default; ``local``: the
  model the client holds, i.e. its own post-training model of its last round).
- A foreign neighbour held by several other clients is one virtual node carrying the
  mean of their embeddings; the original appends each co-interacting user's embedding
  separately, at most 100 (``NEIGHBOR_LEN``) per item, shuffled, and includes the user
  itself (``cipher2userid`` is not filtered); we never send a client a node it holds.
- Virtual nodes enter conv2 only, linked both ways, with GCN normalisation over the
  expanded graph; the received embeddings get no gradient.
- Only this round's sampled clients take part in the matching (all of them by default).
- LDP (``fedgnn-ldp``; default ``off``: FED-PUB/FedIIH do not say it was used, and their
  disjoint FedGNN numbers sit next to FedAvg's): ``code`` follows ``run.py``: after every
  local optimiser step add Laplace(0, lr·2·clip/(√B·ε)) noise to every parameter, where
  B, the code's batch size, is the client's number of training nodes (full batch); the
  code never clips, it uses clip only in that scale. ``paper`` follows the paper's
  g̃ = clip(g, δ) + Laplace(0, λ) with ε = 2δ/λ: every gradient clipped elementwise to
  [−δ, δ] (δ = ``fedgnn-ldp-clip``), then Laplace(0, 2δ/ε) noise added, before the step.
  The pseudo-interacted-item noise of the original is recommendation-specific: left out.
  Both default constants are ``const.py``'s: clip 0.1, ε 1.
- Hyperparameters: FED-PUB's (hidden 128, Adam lr 0.01, weight decay 1e-6, dropout 0.5,
  1 local epoch, 100 rounds on Cora), in ``configs/fedgnn/``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

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
from ..nn.fedgnn_net import FedGNNNet
from .base import Aggregator
from .fedavg import WEIGHTINGS, weighted_average
from .supervised import SupervisedTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

EMBED = Phase("embed")
EXPAND = Phase("expand")
EMBED_MODELS = ("global", "local")
LDP_MODES = ("off", "code", "paper")

#: The per-node arrays of the ``embed`` upload (the method's published leak).
PER_NODE = frozenset({"node_hash", "edge_hash", "embedding"})


@dataclass(frozen=True)
class FedGNNOptions(Options, prefix="fedgnn"):
    """FedGNN's knobs (``fedgnn-*``); module docstring for each choice."""

    expand: bool = option(True, "exchange embeddings and expand subgraphs (false: FedAvg on "
                          "FED-PUB's GCN, nothing per node is sent)")
    embed_model: str = option("global", "model whose layer-1 embeddings are exchanged: global "
                              "(the round's global model, as run.py) | local (the client's own)",
                              choices=EMBED_MODELS)
    salt: str = option("fedgnn", "federation-wide key of the node-id hash (the server knows it)")
    weighting: str = option("train", "FedAvg weights: train (∝ training nodes, FED-PUB) | uniform",
                            choices=WEIGHTINGS)
    ldp: str = option("off", "local differential privacy: off | code (run.py: Laplace noise on "
                      "the weights after each step) | paper (clip + Laplace noise on gradients)",
                      choices=LDP_MODES)
    ldp_clip: float = option(0.1, "LDP clipping threshold δ (const.py CLIP)", low=0.0,
                             low_inclusive=False)
    ldp_epsilon: float = option(1.0, "LDP privacy budget ε (const.py EPS)", low=0.0,
                                low_inclusive=False)


# --- ids -------------------------------------------------------------------------------------
def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hash_ids(ids: np.ndarray, salt: str) -> np.ndarray:
    """Keyed hashes [n] int64 of non-negative integer ids [n]: mix(mix(id ⊕ k0) + k1) with
    (k0, k1) from BLAKE2b(salt). A bijection of 64-bit integers: distinct ids, distinct hashes."""
    ids = np.asarray(ids)
    if ids.size and int(ids.min()) < 0:
        raise ValueError("node ids must be non-negative")
    key = hashlib.blake2b(salt.encode(), digest_size=16).digest()
    k0 = np.uint64(int.from_bytes(key[:8], "little"))
    k1 = np.uint64(int.from_bytes(key[8:], "little"))
    with np.errstate(over="ignore"):
        out = _mix64(_mix64(ids.astype(np.uint64) ^ k0) + k1)
    return out.view(np.int64)


def rows_by_node(hashes: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    """Match clients' node hashes: the distinct hashes [U] (sorted), every uploaded node's
    row among them (the clients' arrays concatenated in sorted client order), and each
    client's rows [n_c] in its own order."""
    ids = sorted(hashes)
    unique, inverse = np.unique(np.concatenate([np.asarray(hashes[c], np.int64) for c in ids]),
                                return_inverse=True)
    ends = np.cumsum([np.asarray(hashes[c]).size for c in ids])
    return unique, inverse, dict(zip(ids, np.split(inverse, ends[:-1])))


# --- the server's matching -------------------------------------------------------------------
def empty_expansion(hidden: int) -> Arrays:
    """The EXPAND payload with no foreign neighbours (``hidden``-wide embeddings)."""
    return {"virtual_embedding": np.zeros((0, hidden), np.float32),
            "virtual_source": np.zeros(0, np.int64), "virtual_target": np.zeros(0, np.int64)}


def check_upload(arrays: Arrays, hidden: int) -> str | None:
    """Why an ``embed`` upload cannot be matched, or None."""
    try:
        node_hash, edge_hash, embedding = (arrays[k] for k in ("node_hash", "edge_hash", "embedding"))
    except KeyError as missing:
        return f"missing {missing}"
    if node_hash.dtype != np.int64 or node_hash.ndim != 1:
        return "node_hash must be int64 [n]"
    if np.unique(node_hash).size != node_hash.size:
        return "node_hash repeats a node"
    if edge_hash.dtype != np.int64 or edge_hash.ndim != 2 or edge_hash.shape[0] != 2:
        return "edge_hash must be int64 [2, e]"
    if embedding.shape != (node_hash.size, hidden):
        return f"embedding must be [{node_hash.size}, {hidden}], got {embedding.shape}"
    if not np.isin(edge_hash, node_hash).all():
        return "an edge ends outside the client's nodes"
    return None


def match_expansion(uploads: dict[int, Arrays], hidden: int) -> tuple[dict[int, Arrays], dict[str, float]]:
    """The trusted matcher: per client, the foreign neighbours of its shared nodes.

    ``uploads[c]``: ``node_hash`` [n_c], ``edge_hash`` [2, e_c], ``embedding`` [n_c, h] (checked
    by :func:`check_upload`). For client c the answer holds one virtual node per hash u that
    c does not hold while another client d holds an edge (v, u) with v held by c; its
    embedding is the mean of u's embeddings over every client that holds u. Returns
    ``{c: {virtual_embedding [m, h] float32, virtual_source [k] (index into it),
    virtual_target [k] (the hash of v)}}`` with the links sorted by (u, v), and counts.
    Sort-and-search throughout: no loop over nodes or edges, memory linear in the uploads.
    """
    ids = sorted(uploads)
    out = {c: empty_expansion(hidden) for c in ids}
    stats = {"shared_nodes": 0.0, "virtual_nodes": 0.0, "virtual_edges": 0.0}
    if not ids:
        return out, stats
    sizes = np.array([uploads[c]["node_hash"].size for c in ids], dtype=np.int64)
    all_hash = np.concatenate([uploads[c]["node_hash"] for c in ids])
    uniq, dense = np.unique(all_hash, return_inverse=True)  # U distinct nodes
    u_count = uniq.size
    holder = np.repeat(np.arange(len(ids), dtype=np.int64), sizes)  # client position per row
    counts = np.bincount(dense, minlength=u_count)
    stats["shared_nodes"] = float((counts >= 2).sum())
    if u_count == 0 or not (counts >= 2).any():
        return out, stats
    # Mean embedding of each distinct node over its holders (rows grouped by node).
    order = np.argsort(dense, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    embedding = np.concatenate([uploads[c]["embedding"] for c in ids]).astype(np.float64)
    mean = np.add.reduceat(embedding[order], starts, axis=0) / counts[:, None]
    holders_by_node = holder[order]  # the holders of node j: holders_by_node[starts[j]:+counts[j]]
    held = np.sort(holder * u_count + dense)  # (client, node) memberships as keys

    edge_sizes = np.array([uploads[c]["edge_hash"].shape[1] for c in ids], dtype=np.int64)
    edges = np.concatenate([uploads[c]["edge_hash"] for c in ids], axis=1)
    owner = np.repeat(np.arange(len(ids), dtype=np.int64), edge_sizes)
    src = np.searchsorted(uniq, edges[0])
    dst = np.searchsorted(uniq, edges[1])
    # Join each edge (v, u) of client d with every holder c of v; keep c != d.
    fan = counts[src]
    edge_of = np.repeat(np.arange(src.size), fan)
    within = np.arange(edge_of.size) - np.repeat(np.cumsum(fan) - fan, fan)
    requester = holders_by_node[starts[src][edge_of] + within]
    keep = requester != owner[edge_of]
    requester, edge_of = requester[keep], edge_of[keep]
    v, u = src[edge_of], dst[edge_of]
    # ... and drop the u that c holds itself.
    keys = requester * u_count + u
    pos = np.clip(np.searchsorted(held, keys), 0, held.size - 1)
    foreign = held[pos] != keys
    requester, u, v = requester[foreign], u[foreign], v[foreign]
    # Distinct (requester, u, v), sorted in that order (lexsort: last key first).
    order = np.lexsort((v, u, requester))
    requester, u, v = requester[order], u[order], v[order]
    first = np.ones(requester.size, dtype=bool)
    first[1:] = (np.diff(requester) != 0) | (np.diff(u) != 0) | (np.diff(v) != 0)
    triples = np.stack([requester[first], u[first], v[first]], axis=1)
    bounds = np.searchsorted(triples[:, 0], np.arange(len(ids) + 1))
    for i, c in enumerate(ids):  # a loop over clients only
        rows = triples[bounds[i]:bounds[i + 1]]
        if rows.size == 0:
            continue
        virtual, source = np.unique(rows[:, 1], return_inverse=True)
        out[c] = {"virtual_embedding": mean[virtual].astype(np.float32),
                  "virtual_source": source.astype(np.int64).reshape(-1),
                  "virtual_target": uniq[rows[:, 2]].astype(np.int64)}
        stats["virtual_nodes"] += float(virtual.size)
        stats["virtual_edges"] += float(rows.shape[0])
    return out, stats


# --- client ----------------------------------------------------------------------------------
class FedGNNTrainer(SupervisedTrainer):
    """FED-PUB's GCN on the client's subgraph expanded by foreign neighbours."""

    options_class = FedGNNOptions
    options: FedGNNOptions
    model: FedGNNNet
    phases = (EMBED, EXPAND, TRAIN_PHASE)
    per_node_arrays = PER_NODE
    restore_without_init = True  # local_state holds the whole model; no other randomness

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        hidden = config.hidden
        self.virtual = torch.zeros(0, hidden, device=device)  # [m, h]
        self.virtual_edges = torch.zeros(2, 0, dtype=torch.long, device=device)  # [2, k]
        self._node_hash: np.ndarray | None = None

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """FED-PUB's GCN that also reads the virtual (foreign) neighbours."""
        return FedGNNNet(num_features, config.hidden, num_classes,
                         dropout=config.dropout)

    @property
    def node_hash(self) -> np.ndarray:
        """Keyed hashes [n] of this client's global node ids (computed once)."""
        if self._node_hash is None:
            if "global_id" not in self.data:
                raise ValueError("fedgnn needs each client's global node ids (global_id): the "
                                 "partition cache has them; a subgraph file must include them")
            self._node_hash = hash_ids(self.data.global_id.cpu().numpy(), self.options.salt)
        return self._node_hash

    def forward(self) -> torch.Tensor:
        """Logits [n, C] on the subgraph expanded by the virtual neighbours."""
        return self.model(self.data.x, self.data.edge_index, self.virtual, self.virtual_edges)

    # --- the expansion's two legs ------------------------------------------------------------
    @classmethod
    def phase_reply_spec(cls, phase: Phase, request: Arrays, num_features: int,
                         num_classes: int, config: ClientConfig) -> ReplySpec:
        """embed: hashed ids [n], hashed edges [2, e] and layer-1 embeddings [n, hidden]
        (nothing with fedgnn-expand off); expand: nothing."""
        if phase != EMBED or not config.options_of(FedGNNOptions).expand:
            return ReplySpec()
        return ReplySpec({"node_hash": ArraySpec(("n",), "int64"),
                          "edge_hash": ArraySpec((2, "e"), "int64"),
                          "embedding": ArraySpec(("n", config.hidden), "float32")})

    def run_phase(self, phase: Phase, arrays: Arrays) -> PhaseReply:
        """EMBED: send hashed ids and layer-1 embeddings; EXPAND: take the foreign neighbours."""
        if phase == EMBED:
            return self.embed_reply(arrays)
        if phase == EXPAND:
            return self.expand(arrays)
        return super().run_phase(phase, arrays)

    def embed_reply(self, arrays: Arrays) -> PhaseReply:
        """Hashed node ids, hashed edges and layer-1 embeddings (nothing with ``fedgnn-expand``
        off)."""
        if not self.options.expand:
            return PhaseReply()
        if arrays:
            self.load_payload(arrays)  # the round's global model
        self.model.eval()
        with torch.no_grad():
            h = self.model.embed(self.data.x, self.data.edge_index)
        node_hash = self.node_hash
        edge_index = self.data.edge_index.cpu().numpy()
        return PhaseReply(arrays={
            "node_hash": node_hash,
            "edge_hash": node_hash[edge_index].reshape(2, -1),
            "embedding": h.cpu().numpy().astype(np.float32),
        })

    def expand(self, arrays: Arrays) -> PhaseReply:
        """Keep the server's virtual neighbours for this round's training and evaluation."""
        hidden = self.config.hidden
        virtual = arrays.get("virtual_embedding", np.zeros((0, hidden), np.float32))
        source = np.asarray(arrays.get("virtual_source", np.zeros(0, np.int64)), dtype=np.int64)
        target_hash = np.asarray(arrays.get("virtual_target", np.zeros(0, np.int64)), dtype=np.int64)
        if virtual.ndim != 2 or virtual.shape[1] != hidden or source.shape != target_hash.shape:
            raise ValueError(f"expansion arrays of shapes {virtual.shape}, {source.shape}, "
                             f"{target_hash.shape} do not fit hidden={hidden}")
        if source.size and (source.min() < 0 or source.max() >= virtual.shape[0]):
            raise ValueError("virtual_source points outside virtual_embedding")
        target = np.zeros(0, np.int64)
        if source.size:
            node_hash = self.node_hash
            order = np.argsort(node_hash)
            pos = np.clip(np.searchsorted(node_hash[order], target_hash), 0, node_hash.size - 1)
            if not (node_hash[order][pos] == target_hash).all():
                raise ValueError("virtual_target names a node this client does not hold")
            target = order[pos]
        self.virtual = torch.as_tensor(np.asarray(virtual, np.float32), device=self.device)
        self.virtual_edges = torch.as_tensor(np.stack([source, target]), dtype=torch.long,
                                             device=self.device).reshape(2, -1)
        return PhaseReply(metrics={"virtual_nodes": float(virtual.shape[0]),
                                   "virtual_edges": float(source.size)})

    # --- training with optional LDP ---------------------------------------------------------
    def ldp_scale(self) -> float:
        """Laplace scale of ``fedgnn-ldp`` (0 when off)."""
        opts = self.options
        if opts.ldp == "code":
            batch = max(int(self.data.train_mask.sum()), 1)
            return self.config.lr * 2 * opts.ldp_clip / math.sqrt(batch) / opts.ldp_epsilon
        if opts.ldp == "paper":
            return 2 * opts.ldp_clip / opts.ldp_epsilon
        return 0.0

    @staticmethod
    def _laplace(like: torch.Tensor, scale: float) -> torch.Tensor:
        """Laplace(0, scale) noise shaped like ``like``, from the round-seeded global RNG."""
        zero = torch.zeros((), dtype=like.dtype, device=like.device)
        return torch.distributions.Laplace(zero, zero + scale).sample(like.shape)

    def train(self, epochs: int) -> dict[str, float]:
        """Local training for ``epochs`` epochs; ``train_loss`` and this method's extras."""
        self.model.train()
        data = self.data
        mode, scale = self.options.ldp, self.ldp_scale()
        params = [p for p in self.model.parameters() if p.requires_grad]
        loss_value = float("nan")
        for _ in range(epochs):
            self.optimizer.zero_grad()
            logits = self.forward()
            loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            loss.backward()
            if mode == "paper":
                with torch.no_grad():
                    for p in params:
                        if p.grad is not None:
                            p.grad.clamp_(-self.options.ldp_clip, self.options.ldp_clip)
                            p.grad.add_(self._laplace(p.grad, scale))
            self.optimizer.step()
            if mode == "code":
                with torch.no_grad():
                    for p in params:
                        p.add_(self._laplace(p, scale))
            loss_value = float(loss.detach())
        return {"train_loss": loss_value, "virtual_nodes": float(self.virtual.size(0)),
                "virtual_edges": float(self.virtual_edges.size(1))}

    def local_state(self) -> dict[str, Any]:
        """The base state plus the virtual neighbours and their edges."""
        return {**super().local_state(), "virtual": self.virtual,
                "virtual_edges": self.virtual_edges}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        if "virtual" in state:
            self.virtual = state["virtual"].to(self.device)
            self.virtual_edges = state["virtual_edges"].to(self.device)


# --- server ----------------------------------------------------------------------------------
class FedGNNAggregator(Aggregator):
    """FedAvg plus the node-id matching service (keeps the round's expansions)."""

    options_class = FedGNNOptions
    options: FedGNNOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        self.global_arrays: Arrays = initial
        self.hidden = config.hidden
        self.expansions: dict[int, Arrays] = {}

    def configure(self, phase: Phase, server_round: int, clients: list[int]) -> dict[int, Arrays]:
        """EMBED: the global model; EXPAND: each client's matched foreign neighbours."""
        if phase == EMBED:
            send = self.options.expand and self.options.embed_model == "global"
            return {c: self.global_arrays if send else {} for c in clients}
        if phase == EXPAND:
            empty = empty_expansion(self.hidden)
            return {c: self.expansions.get(c, empty) for c in clients}
        return super().configure(phase, server_round, clients)

    def step(self, phase: Phase, server_round: int, updates: dict[int, ClientUpdate]
             ) -> AggregateResult | None:
        """Match hashed ids across clients and keep each client's foreign neighbours for EXPAND."""
        if phase == EXPAND:
            self.expansions = {}  # delivered: the table lives one round only
            return None
        if phase != EMBED:
            return None
        uploads, rejected = {}, 0
        for c, update in updates.items():
            if not update.arrays:  # fedgnn-expand off
                continue
            if check_upload(update.arrays, self.hidden) is None:
                uploads[c] = update.arrays
            else:
                rejected += 1
        self.expansions, stats = match_expansion(uploads, self.hidden)
        return AggregateResult(payloads={}, metrics={**stats, "rejected_uploads": float(rejected)})

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """FedAvg of the updates, sent to every client."""
        self.global_arrays = weighted_average(updates, self.options.weighting, self.mix_dtype)
        clients = sorted(set(self.client_ids) | set(updates))
        return AggregateResult(payloads={c: self.global_arrays for c in clients})

    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the payloads, for checkpoint/resume."""
        return {"global": self.global_arrays}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.global_arrays = dict(state["global"])


ALGORITHM = Algorithm("fedgnn", FedGNNTrainer, FedGNNAggregator, FedGNNOptions)
