"""FedLit (Xie, Xiong and Yang, "Federated node classification over graphs with latent
link-type heterogeneity", WWW 2023): latent link types found by EM clustering of edge
embeddings, one GCN channel per type, types aligned across clients by the server.

Official code followed: ``Oxfordblue7/FedLIT`` at ``ddef491`` (DGL; re-implemented with
PyG): ``src/models/models.py`` (``multichannel_GCN``), ``src/models/client.py`` (EM
clustering, training, download), ``src/models/server.py`` (centroid alignment,
aggregation), ``src/utils/util.py`` (``_subgraph_byLinktype``), ``src/utils/setup_devices.py``
and ``src/trainers/FedLIT_trainer.py`` (the loop), ``run_FedLIT_trainer.sh`` (settings);
docs/reading/fedlit.md.

Model (:class:`~fedgraph_flwr.nn.multichannel_gcn.MultiChannelGCN`): a shared projection
h = feature1(x), K channels (Linear + L GCN layers, each on the subgraph of the edges of
its type), their outputs summed per node, a shared classifier.

Client, each local epoch (E = 1 in the paper), :meth:`FedLitTrainer.train`:

1. h = feature1(x); edge embeddings e_uv = [h_u ‖ h_v] with u < v (:func:`edge_embeddings`),
   so both directions of an edge share a type; computed on the detached h.
2. First call (no centroids yet): MiniBatchKMeans (K clusters, batch 1024, max_iter 1,
   random_state = seed; :func:`kmeans_init`) gives the centroids μ_k ∈ R^{2h} and the types.
   Later calls: ``fedlit-em-iterations`` (1) EM steps (:func:`em_step`): each edge to
   argmax_k cos(e_uv, μ_k) (:func:`assign_types`), μ_k ← mean of its edges
   (:func:`update_centroids`; an empty cluster keeps its previous μ_k instead of the code's
   NaN, docs/reading/fedlit.md §6.4).
3. The channels run on the K edge subgraphs; cross-entropy on the training nodes; one Adam
   step. The Adam state persists across rounds (the code builds it once per client).
4. Per cluster, the number of training nodes in its edge subgraph (``cluster_train``).

Evaluation assigns every edge to its most cosine-similar centroid (no centroid update).

Server, each round (:class:`FedLitAggregator`):

1. Alignment (:func:`greedy_match`). First round: the global centres are the first
   client's centroids (the lowest id of the round), which keeps the identity map. Every
   other client (every client in later rounds) is matched one-to-one to the centres: take
   the largest entry of its K×K cosine matrix (clusters × centres), remove that row and
   column, repeat. New centres = the mean of the matched client centroids
   (:func:`matched_centres`).
2. ``feature1`` and ``classifier``: averaged weighted by the clients' training-set sizes.
3. Channels: global channel g = the unweighted mean of the client channels matched to g
   whose cluster has >= 1 training node; with none, g keeps its previous value.
4. Download (:meth:`FedLitAggregator.payload_for`): the shared layers; in local slot k the
   global channel g = map(k) and the centroid μ_k ← centre g: a per-client permutation.

The server keeps the global model (channels by global type), the centres (K × 2h) and
each client's map local type -> global type, in :meth:`~FedLitAggregator.state_dict`
(checkpoint/resume). Clients that sat a round out receive the new global channels under
their last map.

What leaves a client each round: every model parameter (d·h + h + K·(h² + h + L·(h² + h))
+ h·C + C floats) and, as the signature, the K centroids (K × 2h floats: means of edge
embeddings, i.e. embedding-derived aggregate statistics) and K per-cluster training-node
counts; the total training-set size is the engine's ``num-train``. Nothing scales with the
node count.

Switches (default = the method as the paper describes it / the intended code, the other
value = what the official code does):

- ``fedlit-download`` (own): ``last-client`` reproduces the code's download loop, which runs
  over every (client, cluster) -> group entry of the server, not only the client's own
  (docs/reading/fedlit.md §6.1): every client gets, in slot k, the global channel and centre of the
  mapping of the last client in the server's map (the order clients were first matched).
- ``fedlit-match-map`` (matched): ``inverse`` reproduces the code's matcher, which stacks
  the cosine matrix as centres × clusters (``torch.stack([cos(client.centroids, cen) for
  cen in centers])``) but unpacks ``argmax`` as (cluster, centre), so it stores the inverse
  of the greedy permutation (identical for the identity and for swaps, not for 3-cycles);
  the centres, the channel averages and the download all follow the stored map. Not in
  docs/reading/fedlit.md; its commented-out sklearn line ``cosine_similarity(client.centroids, centers)``
  had the right orientation.
- ``fedlit-evaluate`` (after-train): ``before-train`` scores the model (and centres) the
  server sent, before local training, as the code's loop does (it evaluates right after
  the download). after-train is the project's (FED-PUB's) protocol.

No paper numbers exist on the project's protocol (docs/reading/fedlit.md §7); the paper's runs are
PubMed-diabetes with oracle link types, and their settings (K = 4, 2 GCN layers, hidden
64, lr 0.01, weight decay 5e-4, dropout 0.5, 1 local epoch, 100 rounds,
``run_FedLIT_trainer.sh``) are in ``configs/fedlit/``. Exact code:
``fedlit-download=last-client``, ``fedlit-match-map=inverse``, ``fedlit-evaluate=before-train``.
``fedlit-gnn`` (gcn) swaps each channel's layers for SGC or GraphSAGE, for FedSpray's
protocol table (its columns GCN / SGC / SAGE).

Other code details: the code reports the *final* round's test accuracy and evaluates "val"
on the training mask (docs/reading/fedlit.md §6.2): the engine's protocol (best-val round) is used instead.
On CPU, the code's evaluation clusters the edges as stored (u, v) rather than (min, max),
so the two directions of an edge can get different types there; we use (min, max)
everywhere, as its GPU path does. Its partial participation (``frac`` < 1) would fail (the
server's map keeps ``[]`` for the clients not sampled); here a round aligns its
participants only. sklearn's MiniBatchKMeans ``n_init`` defaulted to 3 in the versions of
the code's time; it is 3 here (sklearn >= 1.4 defaults to 1). K-means runs on one thread,
so its result does not depend on the machine.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from ..core.mixing import average, cosine_similarity
from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.multichannel_gcn import CHANNEL_CONVS, CHANNEL_PREFIX, SHARED_PREFIXES, MultiChannelGCN
from .base import Aggregator
from .supervised import EVALUATE_POINTS, EvaluatesReceivedModel, SupervisedTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

DOWNLOADS = ("own", "last-client")
MATCH_MAPS = ("matched", "inverse")
CENTROIDS_KEY = "centroids"  # signature [K, 2h] and payload [K, 2h] (the client's centres)
CLUSTER_TRAIN_KEY = "cluster_train"  # signature [K]: training nodes per edge subgraph
KMEANS_BATCH = 1024  # the code's MiniBatchKMeans settings
KMEANS_MAX_ITER = 1
KMEANS_N_INIT = 3  # sklearn's default when the code was written


# `fedlit-reproduce`: the profiles, the default first (docs/methods/fedlit.md).
# `default`: the paper's reading, scored after local training.
PUBLISHED = (
    "No paper has Cora figures for FedLit; this page's figures ran `default`."
)
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "official": {"download": "last-client", "match_map": "inverse", "evaluate": "before-train"},
}


@dataclass(frozen=True)
class FedLitOptions(Options, prefix="fedlit", profiles=PROFILES, published=PUBLISHED):
    """FedLit's knobs (``fedlit-*``); defaults = the paper's settings, intended behaviour."""

    link_types: int = option(4, "number of latent link types K (channels, centroids)", low=1)
    em_iterations: int = option(1, "EM iterations of the edge clustering per local step "
                                "(code: num_iterEM)", low=1)
    download: str = option("own", "own (each client its own type map) | last-client (the "
                           "code's loop: every client gets the last client's map)",
                           choices=DOWNLOADS)
    match_map: str = option("matched", "matched (local type -> the centre it matched) | "
                            "inverse (the code's transposed argmax: the inverse permutation)",
                            choices=MATCH_MAPS)
    gnn: str = option("gcn", "each channel's layers: gcn (paper, code) | sgc | sage (FedSpray's "
                      "Table 2 columns; see nn/multichannel_gcn.py)", choices=CHANNEL_CONVS)
    evaluate: str = option("after-train", "after-train (FED-PUB protocol) | before-train (the "
                           "code: the received model and centres)", choices=EVALUATE_POINTS)


# --- client maths -----------------------------------------------------------------------
def undirected_pairs(edge_index: torch.Tensor) -> torch.Tensor:
    """[2, m]: each edge as (min(u, v), max(u, v)), in ``edge_index``'s order."""
    return torch.stack([edge_index.min(dim=0).values, edge_index.max(dim=0).values])


def edge_embeddings(h: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """e_uv = [h_u ‖ h_v] for each (u, v) of ``pairs`` [2, m]: h [n, d] -> [m, 2d]."""
    return torch.cat([h[pairs[0]], h[pairs[1]]], dim=1)


def assign_types(embeddings: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Each edge's type: argmax_k cos(e, μ_k) (ties: the lowest k). [m, D], [K, D] -> [m]."""
    cos = F.normalize(embeddings, dim=1) @ F.normalize(centroids.to(embeddings.dtype), dim=1).t()
    return cos.argmax(dim=1)


def update_centroids(embeddings: torch.Tensor, types: torch.Tensor, previous: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ [K, D], edges per cluster [K]): μ_k = mean of the embeddings of type k; a cluster
    without edges keeps ``previous[k]`` (the code's mean of nothing is NaN)."""
    num_types = previous.size(0)
    sums = embeddings.new_zeros(num_types, embeddings.size(1)).index_add_(0, types, embeddings)
    counts = torch.bincount(types, minlength=num_types)
    means = sums / counts.clamp(min=1).unsqueeze(1).to(sums.dtype)
    return torch.where(counts.unsqueeze(1) > 0, means, previous.to(means.dtype)), counts


def em_step(embeddings: torch.Tensor, centroids: torch.Tensor, iterations: int = 1
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(centroids, types) after ``iterations`` rounds of assign-then-average (the code's
    ``_update_clusters``: the types are those of the last assignment)."""
    types = assign_types(embeddings, centroids)
    centroids, _ = update_centroids(embeddings, types, centroids)
    for _ in range(iterations - 1):
        types = assign_types(embeddings, centroids)
        centroids, _ = update_centroids(embeddings, types, centroids)
    return centroids, types


def kmeans_init(embeddings: torch.Tensor, num_types: int, seed: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(centroids [K, D], types [m]) of MiniBatchKMeans as the code runs it (batch 1024,
    max_iter 1, random_state = seed). Fewer edges than K: the centroids are the edges'
    embeddings repeated in turn (zeros without edges), each edge its own type."""
    m, dim = embeddings.shape
    if m < num_types:
        if m == 0:
            return embeddings.new_zeros(num_types, dim), torch.zeros(0, dtype=torch.long,
                                                                     device=embeddings.device)
        index = torch.arange(num_types, device=embeddings.device) % m
        return embeddings[index].clone(), torch.arange(m, device=embeddings.device)
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.exceptions import ConvergenceWarning
    from threadpoolctl import threadpool_limits

    kmeans = MiniBatchKMeans(n_clusters=num_types, random_state=seed, batch_size=KMEANS_BATCH,
                             max_iter=KMEANS_MAX_ITER, n_init=KMEANS_N_INIT)
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # fewer distinct points than K
        kmeans.fit(embeddings.detach().cpu().numpy())
    centroids = torch.as_tensor(kmeans.cluster_centers_, dtype=embeddings.dtype)
    types = torch.as_tensor(kmeans.labels_, dtype=torch.long)
    return centroids.to(embeddings.device), types.to(embeddings.device)


def cluster_train_counts(edge_index: torch.Tensor, types: torch.Tensor, train_mask: torch.Tensor,
                         num_types: int) -> torch.Tensor:
    """[K]: the training nodes among the endpoints of the edges of each type."""
    counts = torch.zeros(num_types, dtype=torch.long, device=edge_index.device)
    for k in range(num_types):
        nodes = torch.unique(edge_index[:, types == k])
        counts[k] = train_mask[nodes].sum()
    return counts


# --- server maths -----------------------------------------------------------------------
def greedy_match(centroids: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(map [K] int64, cosine [K]): map[k] = the centre client cluster k is matched to.

    Greedy one-to-one on S = cos(centroids, centres) [K, K] (clusters × centres): take the
    largest entry (ties: the first in row-major order), remove its row and column, repeat.
    ``cosine[k]`` = S[k, map[k]].
    """
    centroids = np.asarray(centroids, np.float64)
    k_local = len(centroids)
    similarity = cosine_similarity(np.concatenate([centroids, np.asarray(centres, np.float64)]))
    similarity = similarity[:k_local, k_local:]
    work = similarity.copy()
    mapping = np.full(k_local, -1, dtype=np.int64)
    for _ in range(min(work.shape)):
        k, g = np.unravel_index(int(np.argmax(work)), work.shape)
        mapping[k] = g
        work[k, :] = -np.inf
        work[:, g] = -np.inf
    return mapping, similarity[np.arange(k_local), mapping]


def matched_centres(centroids: list[np.ndarray], maps: list[np.ndarray],
                    previous: np.ndarray) -> np.ndarray:
    """Centre g = the mean of the client centroids mapped to g ([K, D] float64); a centre
    no centroid maps to keeps ``previous[g]``."""
    sums = np.zeros_like(previous, dtype=np.float64)
    counts = np.zeros(len(previous))
    for own, mapping in zip(centroids, maps):
        np.add.at(sums, mapping, np.asarray(own, np.float64))
        np.add.at(counts, mapping, 1.0)
    return np.where(counts[:, None] > 0, sums / np.maximum(counts, 1.0)[:, None], previous)


def channel_names(arrays: Arrays, k: int) -> dict[str, str]:
    """{suffix: name} of channel k's arrays (``channels.{k}.<suffix>``)."""
    prefix = f"{CHANNEL_PREFIX}{k}."
    return {name[len(prefix):]: name for name in arrays if name.startswith(prefix)}


# --- the algorithm ------------------------------------------------------------------------
class FedLitTrainer(EvaluatesReceivedModel, SupervisedTrainer):
    """Multi-channel GCN over EM-clustered latent link types; uploads everything plus the
    centroids and per-cluster training counts."""

    options_class = FedLitOptions
    options: FedLitOptions
    model: MultiChannelGCN
    restore_without_init = True  # local_state holds the whole model; no other randomness

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        self.pairs = undirected_pairs(self.data.edge_index)
        self.centroids: torch.Tensor | None = None  # [K, 2h]; None until the first k-means
        self.cluster_train = torch.zeros(self.options.link_types, dtype=torch.long,
                                         device=self.device)

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """The multi-channel GCN, one channel per latent link type."""
        opts = config.options_of(FedLitOptions)
        return MultiChannelGCN(num_features, config.hidden, num_classes,
                               num_link_types=opts.link_types,
                               num_layers=config.num_layers,
                               dropout=config.dropout, conv=opts.gnn)

    def edge_types(self, h: torch.Tensor, update: bool) -> torch.Tensor:
        """Each edge's type [m] from h [n, d] (detached here). ``update``: the training
        step's clustering (k-means the first time, else EM; keeps the centroids);
        otherwise the assignment to the current centroids (k-means, not kept, before any)."""
        embeddings = edge_embeddings(h.detach(), self.pairs)
        opts = self.options
        if self.centroids is None:
            centroids, types = kmeans_init(embeddings, opts.link_types, self.config.seed)
            if update:
                self.centroids = centroids
            return types
        if not update:
            return assign_types(embeddings, self.centroids)
        self.centroids, types = em_step(embeddings, self.centroids, opts.em_iterations)
        return types

    def forward(self) -> torch.Tensor:
        """Logits [n, C] with each edge routed to its current link type."""
        data = self.data
        h = self.model.project(data.x)
        types = self.edge_types(h, update=False)
        return self.model.classify(self.model.propagate(h, data.edge_index, types))

    def train(self, epochs: int) -> dict[str, float]:
        """Full-batch steps, each with the EM edge clustering first."""
        self.score_received_model()
        self.model.train()
        data = self.data
        loss_value = float("nan")
        for _ in range(epochs):
            self.optimizer.zero_grad()
            h = self.model.project(data.x)
            types = self.edge_types(h, update=True)
            self.cluster_train = cluster_train_counts(data.edge_index, types, data.train_mask,
                                                      self.options.link_types)
            logits = self.model.classify(self.model.propagate(h, data.edge_index, types))
            loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.detach())
        return {"train_loss": loss_value}

    def load_payload(self, arrays: Arrays) -> None:
        """The shared layers, the channels in this client's slots and its centres."""
        super().load_payload(arrays)
        if CENTROIDS_KEY in arrays:
            self.centroids = torch.as_tensor(np.asarray(arrays[CENTROIDS_KEY]),
                                             dtype=torch.float32, device=self.device).clone()

    @classmethod
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfig
                         ) -> dict[str, tuple[int, ...]]:
        """The centroids [K, 2·hidden] and the training count of each type [K]."""
        types = config.options_of(FedLitOptions).link_types
        return {CENTROIDS_KEY: (types, 2 * config.hidden), CLUSTER_TRAIN_KEY: (types,)}

    def signature(self) -> Arrays:
        """The link-type centroids and the training count of each type."""
        if self.centroids is None:  # never trained: k-means of the current model, not kept
            h = self.model.project(self.data.x)
            centroids, _ = kmeans_init(edge_embeddings(h.detach(), self.pairs),
                                       self.options.link_types, self.config.seed)
        else:
            centroids = self.centroids
        return {CENTROIDS_KEY: centroids.detach().cpu().numpy().astype(np.float32),
                CLUSTER_TRAIN_KEY: self.cluster_train.cpu().numpy().astype(np.float32)}

    def local_state(self) -> dict[str, Any]:
        """The base state plus the link types' training counts and centroids."""
        state = {**super().local_state(), "cluster_train": self.cluster_train}
        if self.centroids is not None:
            state["centroids"] = self.centroids
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.cluster_train = state["cluster_train"].to(self.device)
        if "centroids" in state:
            self.centroids = state["centroids"].to(self.device)


class FedLitAggregator(Aggregator):
    """Greedy centroid alignment; shared layers ∝ training nodes; per-type channel means;
    a per-client permutation of the global channels back."""

    options_class = FedLitOptions
    options: FedLitOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        self.global_arrays: Arrays = dict(initial)  # channels indexed by global type
        self.centres: np.ndarray | None = None  # [K, 2h] float64
        self.maps: dict[int, np.ndarray] = {}  # client -> [K] global type of local type k

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Match each client's link types to the global centres, average channels by type."""
        opts = self.options
        num_types = opts.link_types
        ids = sorted(updates)
        centroids = {c: np.asarray(updates[c].signature[CENTROIDS_KEY], np.float64) for c in ids}
        counts = {c: np.asarray(updates[c].signature[CLUSTER_TRAIN_KEY]).reshape(-1) for c in ids}
        # 1. Alignment to the current centres (the first client's centroids in round 1).
        maps: dict[int, np.ndarray] = {}
        cosines = []
        if self.centres is None:
            self.centres = centroids[ids[0]].copy()
            maps[ids[0]] = np.arange(num_types, dtype=np.int64)
        for c in ids:
            if c not in maps:
                maps[c], cos = greedy_match(centroids[c], self.centres)
                cosines.append(cos)
                if opts.match_map == "inverse":
                    maps[c] = np.argsort(maps[c]).astype(np.int64)
        self.maps.update(maps)  # first-matched order is kept (the code's dict order)
        self.centres = matched_centres([centroids[c] for c in ids], [maps[c] for c in ids],
                                       self.centres)
        # 2. Shared layers, weighted by training-set size.
        shared = [{k: v for k, v in updates[c].arrays.items() if k.startswith(SHARED_PREFIXES)}
                  for c in ids]
        sizes = np.array([updates[c].num_train for c in ids], dtype=np.float64)
        weights = sizes / sizes.sum() if sizes.sum() > 0 else np.full(len(ids), 1 / len(ids))
        self.global_arrays.update(average(weights, shared, self.mix_dtype))
        # 3. Channels: per global type, the plain mean of the matched channels with training nodes.
        empty = 0
        for g in range(num_types):
            target = channel_names(self.global_arrays, g)
            members = []
            for c in ids:
                for k in np.flatnonzero(maps[c] == g):
                    if counts[c][k] > 0:
                        names = channel_names(updates[c].arrays, int(k))
                        members.append({s: updates[c].arrays[names[s]] for s in target})
                    else:
                        empty += 1
            if members:
                mean = average(None, members, self.mix_dtype)
                self.global_arrays.update({target[s]: mean[s] for s in target})
        # 4. Every client with a map gets the new global model under its (or the code's) map.
        payloads = {c: self.payload_for(c) for c in self.maps}
        identity = np.mean([np.array_equal(maps[c], np.arange(num_types)) for c in ids])
        return AggregateResult(
            payloads=payloads,
            metrics={"matched_cosine_mean": float(np.mean(cosines)) if cosines else 1.0,
                     "identity_map_fraction": float(identity),
                     "empty_cluster_fraction": empty / (len(ids) * num_types)},
        )

    def payload_for(self, client: int) -> Arrays:
        """The global model with global channel map[k] in local slot k, and the centres
        map[k] as the client's centroids (map: the client's own, or under
        ``fedlit-download=last-client`` the last client's in the server's order)."""
        if self.centres is None:
            raise RuntimeError("no centres before the first aggregation")
        owner = client if self.options.download == "own" else next(reversed(self.maps))
        mapping = self.maps[owner]
        payload = {k: v for k, v in self.global_arrays.items() if not k.startswith(CHANNEL_PREFIX)}
        for k, g in enumerate(mapping):
            source = channel_names(self.global_arrays, int(g))
            slot = channel_names(self.global_arrays, k)
            payload.update({slot[s]: self.global_arrays[source[s]] for s in slot})
        payload[CENTROIDS_KEY] = self.centres[mapping].astype(np.float32)
        return payload

    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the payloads, for checkpoint/resume."""
        ids = list(self.maps)
        num_types = self.options.link_types
        return {"global": dict(self.global_arrays), "centres": self.centres,
                "map_ids": np.array(ids, dtype=np.int64),
                "maps": (np.stack([self.maps[c] for c in ids]) if ids
                         else np.zeros((0, num_types), dtype=np.int64))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.global_arrays = {k: np.asarray(v) for k, v in state["global"].items()}
        centres = state["centres"]
        self.centres = None if centres is None else np.asarray(centres, dtype=np.float64)
        ids = np.asarray(state["map_ids"]).reshape(-1).tolist()
        maps = np.asarray(state["maps"], dtype=np.int64)
        self.maps = {int(c): maps[i].copy() for i, c in enumerate(ids)}


ALGORITHM = Algorithm("fedlit", FedLitTrainer, FedLitAggregator, FedLitOptions)
