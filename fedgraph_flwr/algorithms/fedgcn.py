"""FedGCN (Yao et al., NeurIPS 2023), as the Ray-based library FedGraph runs it
(``fedgraph`` 0.2.5, ``run_NC``). **Per-node neighbour sums leave the client, once.**

Before round 1 the clients and the server compute A·X, the sum of every node's neighbours'
features over the whole graph, without any client revealing a raw feature row on its own:

1. ``neighbour_sums`` (before the first round): each client holds its own nodes, its
   1-hop halo (the nodes of other clients one edge away, ``data.halo_global_id``, and the
   edges among own and halo nodes, ``data.halo_edge_index``: the partition cache writes
   both). It sums, for every one of its own and halo nodes v, the features of v's
   neighbours that it owns: S[v] = Σ_{u ∈ N(v), u own} x_u. It sends the keyed hashes of
   those nodes' global ids (``node_hash`` [n + h] int64, :func:`~.fedgnn.hash_ids` with
   ``fedgcn-salt``) and S (``sums`` [n + h, d]).
2. ``halo_sums`` (before the first round): the server adds the clients' rows by node, which
   counts every edge once, by the owner of its far end, so the total is (A·X)[v]. It sends
   each client the rows of its own and halo nodes; the reply is empty.

Then every round, as FedAvg: E local steps of full-batch SGD on cross-entropy over the
client's training nodes, with FedGraph's ``AggreGCN``
(:class:`~fedgraph_flwr.nn.fedgcn_net.AggreGCN`: a linear layer on (A·X) rows, then a
GCNConv over the halo subgraph, own and halo nodes), and the server's unweighted mean of
the models (FedGraph's; ``fedgcn-weighting=train`` weighs by training nodes).
``fedgcn-hops=0`` is FedGraph's FedAvg: no exchange, a plain 2-layer GCN on the client's
own subgraph.

What leaves a client: once, ``node_hash`` and ``sums`` (per node: the method's published
design, named in ``per_node_arrays``; README discloses it). A sum over a single neighbour
is that neighbour's raw feature row, so the server learns some rows exactly, as in
FedGraph (its plaintext path sends a dense N×d matrix per trainer; here only the n + h
rows a client has). Every round, the model's weights. The hashes' salt comes from the run
config, which the server holds: they hide ids from observers, not from the server.

Sources read (docs/reading/fedgcn.md): FedGraph 0.2.5 (``federated_methods.py`` ``run_NC``,
``trainer_class.py``, ``utils_nc.py``, ``gnn_models.py``) and the official yh-yao/FedGCN @
378438d. FedGraph's defaults: hidden 16, plain SGD lr 0.5, weight decay 5e-4, dropout 0.5,
3 local steps, 100 rounds, unweighted averaging, the global model scored after each round
(``fedgcn-evaluate=before-train``: the model the client received). Where the codes differ:

- The official code sends nothing: it hands each trainer the raw features of its L-hop
  halo and trains a plain GCN on that subgraph. FedGraph exchanges the sums, as here.
- FedGraph's ``num_hops`` 1 and 2 run the same (a 1-hop halo); ``fedgcn-hops`` offers 0 and 1.
- FedGraph's halo edges include those between two halo nodes (other clients' edges), as
  the cache's ``halo_edge_index`` does.
- FedGraph never seeds its partition (Dirichlet over labels); here the run's partition.

Refused (one line, before round 1): an overlapping partition (a node held twice would be
summed twice) and, with ``fedgcn-hops=1``, client data without the halo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

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
from ..nn.fedgcn_net import AggreGCN
from ..nn.gcn import GCN
from .fedavg import FedAvgAggregator
from .fedgnn import hash_ids, rows_by_node
from .supervised import (
    EVALUATE_POINTS,
    OPTIMIZERS,
    ChoosesOptimizer,
    EvaluatesReceivedModel,
    SupervisedTrainer,
)

if TYPE_CHECKING:
    from torch_geometric.data import Data

    from ..config import ClientConfig, RunConfig

SUMS = Phase("neighbour_sums", when="before-first-round")
HALO_SUMS = Phase("halo_sums", when="before-first-round")
#: The per-node arrays of the ``neighbour_sums`` reply (the method's published design).
PER_NODE = frozenset({"node_hash", "sums"})


@dataclass(frozen=True)
class FedGCNOptions(Options, prefix="fedgcn"):
    """FedGCN's knobs (``fedgcn-*``): FedGraph's defaults (module docstring)."""

    hops: int = option(1, "1: exchange the neighbour sums (FedGraph's num_hops 1 and 2) | 0: "
                       "FedAvg of a plain GCN, no exchange", choices=(0, 1))
    optimizer: str = option("sgd", "local optimizer: sgd (FedGraph: plain, no momentum) | adam",
                            choices=OPTIMIZERS)
    weighting: str = option("uniform", "server mean: uniform (FedGraph) | train (by training "
                            "nodes)", choices=("uniform", "train"))
    evaluate: str = option("before-train", "scored model: before-train (FedGraph: the global "
                           "model) | after-train (the locally trained one)", choices=EVALUATE_POINTS)
    salt: str = option("fedgcn", "federation-wide key of the node-id hash (the server knows it)")


def neighbour_sums(x: torch.Tensor, edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """S [num_nodes, d]: row v sums x_u over the edges (v, u) whose u is one of the
    ``x.size(0)`` own nodes (ids 0..n-1; ids from n on are halo nodes, whose x is unknown)."""
    src, dst = edge_index
    keep = dst < x.size(0)
    return torch.zeros(num_nodes, x.size(1), dtype=x.dtype, device=x.device).index_add_(
        0, src[keep], x[dst[keep]])


class FedGCNTrainer(ChoosesOptimizer, EvaluatesReceivedModel, SupervisedTrainer):
    """FedGraph's AggreGCN on the client's halo subgraph (or a GCN with ``fedgcn-hops=0``)."""

    options_class = FedGCNOptions
    options: FedGCNOptions
    phases = (SUMS, HALO_SUMS, TRAIN_PHASE)
    per_node_arrays = PER_NODE
    reads_halo: ClassVar[bool] = True

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        self.features: torch.Tensor | None = None  # (A·X) rows [n + h, d], from the server
        self._graph: torch.Tensor | None = None

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """AggreGCN (hops 1) or a plain GCN (hops 0), FedGraph's two models."""
        options = config.options
        if isinstance(options, FedGCNOptions) and options.hops == 0:
            return GCN(num_features, config.hidden, num_classes, num_layers=config.num_layers,
                       dropout=config.dropout)
        return AggreGCN(num_features, config.hidden, num_classes, num_layers=config.num_layers,
                        dropout=config.dropout)

    def halo_graph(self) -> torch.Tensor:
        """[2, e]: the client's own edges and its halo edges, over own then halo nodes."""
        if self._graph is None:
            self._graph = torch.cat((self.data.edge_index, self.data.halo_edge_index), dim=1)
        return self._graph

    def forward(self) -> torch.Tensor:
        """Logits [n, C] of the client's own nodes."""
        if self.options.hops == 0:
            return self.model(self.data.x, self.data.edge_index)
        if self.features is None:
            raise RuntimeError("fedgcn: no neighbour sums from the server yet (phase halo_sums)")
        return self.model(self.features, self.halo_graph())[: self.data.num_nodes]

    def train(self, epochs: int) -> dict[str, float]:
        """Score the received model (``before-train``), then train as FedAvg."""
        self.score_received_model()
        return super().train(epochs)

    @classmethod
    def phase_reply_spec(cls, phase: Phase, request: Arrays, num_features: int,
                         num_classes: int, config: ClientConfig) -> ReplySpec:
        """neighbour_sums: hashed ids [n] and this client's share of A·X [n, F] (its nodes
        and halo; nothing with fedgcn-hops=0); halo_sums: nothing."""
        if phase != SUMS or config.options_of(FedGCNOptions).hops == 0:
            return ReplySpec()
        return ReplySpec({"node_hash": ArraySpec(("n",), "int64"),
                          "sums": ArraySpec(("n", num_features), "float32")})

    def run_phase(self, phase: Phase, arrays: Arrays) -> PhaseReply:
        """NEIGHBOUR_SUMS: hashed ids and this client's share of A·X; HALO_SUMS: keep A·X."""
        if self.options.hops == 0:
            return PhaseReply()
        if phase == SUMS:
            data = self.data
            if "halo_global_id" not in data or "global_id" not in data:
                raise ValueError("fedgcn needs the client's global ids and 1-hop halo "
                                 "(global_id, halo_global_id, halo_edge_index: the partition "
                                 "cache writes them); or run with fedgcn-hops=0")
            ids = torch.cat((data.global_id, data.halo_global_id)).cpu().numpy()
            sums = neighbour_sums(data.x, self.halo_graph(), ids.size)
            return PhaseReply(arrays={"node_hash": hash_ids(ids, self.options.salt),
                                      "sums": sums.cpu().numpy().astype(np.float32)})
        if phase == HALO_SUMS:
            rows = self.data.num_nodes + self.data.halo_global_id.numel()
            received = np.asarray(arrays.get("sums", np.zeros((0, 0))), dtype=np.float32)
            if received.shape != (rows, self.data.num_features):
                raise ValueError(f"neighbour sums of shape {received.shape} do not fit "
                                 f"{rows} nodes × {self.data.num_features} features")
            self.features = torch.as_tensor(received, device=self.device)
            return PhaseReply()
        return super().run_phase(phase, arrays)

    def local_state(self) -> dict[str, Any]:
        """The base state plus the neighbour sums."""
        return {**super().local_state(), "features": self.features}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        features = state.get("features")
        self.features = None if features is None else features.to(self.device)


class FedGCNAggregator(FedAvgAggregator):
    """Sums the clients' neighbour sums by node once; then FedAvg (unweighted by default)."""

    options_class = FedGCNOptions
    options: FedGCNOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        if config.partition == "metis-overlapping":
            raise ConfigError("fedgcn needs disjoint clients: on an overlapping partition a "
                              "node held twice would be summed twice")
        if self.options.hops == 1 and config.num_layers < 2:
            raise ConfigError("fedgcn (hops 1) needs num-layers >= 2: a linear layer and a convolution")
        self.rows: dict[int, np.ndarray] = {}  # client -> its nodes' rows of the total
        self.total: np.ndarray | None = None  # [U, d] float64: (A·X) by node

    def weighting(self) -> str:
        """``fedgcn-weighting``."""
        return self.options.weighting

    def configure(self, phase: Phase, server_round: int, clients: list[int]) -> dict[int, Arrays]:
        """HALO_SUMS: each client's rows of A·X."""
        if phase == HALO_SUMS:
            if self.total is None:
                return {c: {} for c in clients}
            return {c: {"sums": self.total[self.rows[c]].astype(np.float32)} if c in self.rows
                    else {} for c in clients}
        return super().configure(phase, server_round, clients)

    def step(self, phase: Phase, server_round: int, updates: dict[int, ClientUpdate]
             ) -> AggregateResult | None:
        """NEIGHBOUR_SUMS: add the clients' rows by node; HALO_SUMS: delivered, freed."""
        if phase == HALO_SUMS:
            self.total, self.rows = None, {}
            return None
        if phase != SUMS:
            return None
        uploads = {c: u.arrays for c, u in sorted(updates.items()) if "sums" in u.arrays}
        if not uploads:
            return None
        hashes, inverse, self.rows = rows_by_node({c: a["node_hash"] for c, a in uploads.items()})
        sums = np.concatenate([np.asarray(a["sums"], np.float64) for a in uploads.values()])
        total = torch.zeros(hashes.size, sums.shape[1], dtype=torch.float64).index_add_(
            0, torch.as_tensor(inverse), torch.as_tensor(sums))
        self.total = total.numpy()
        return AggregateResult(payloads={}, metrics={"nodes": float(hashes.size)})


ALGORITHM = Algorithm("fedgcn", FedGCNTrainer, FedGCNAggregator, FedGCNOptions)
