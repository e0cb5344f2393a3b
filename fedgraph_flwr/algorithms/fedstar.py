"""FedStar (Tan et al., AAAI 2023): federated learning on graphs with shared structural knowledge.

Official code followed: ``yuetan031/FedStar`` (``lib/models.py`` ``GIN_dc``,
``lib/utils.py`` ``init_structure_encoding``, ``lib/server.py`` ``aggregate_weights_se``,
``lib/client.py``; docs/reading/fedstar.md); OpenFGL's ``openfgl/flcore/fedstar`` read for
comparison. Both are for graph classification; this is the node-level adaptation FedSpray
compares against (its Appendix B.2 gives no details; docs/reading/fedstar.md §3 [I]).

Each client holds a feature-structure decoupled GNN
(:class:`~fedgraph_flwr.nn.fedstar_net.FedStarNet`): a **feature branch** on [h ‖ s] at every
layer plus the output head (personal, never leaves the client) and a **structure branch**
(a linear embedding of the structure encoding, then GCN layers with tanh) that is shared.
The structure encoding (:func:`~fedgraph_flwr.nn.fedstar_net.structure_encoding`) is
computed from the client's own topology alone: random-walk landing probabilities
diag((A D⁻¹)^k), k = 1..16, and a one-hot degree in 16 slots. It is computed once, on first
use, and kept in the client's local state (n × 32 floats).

Each round: the client loads the global structure branch, trains every parameter for E
full-batch Adam epochs on the training nodes' cross-entropy (the code's log-softmax + NLL),
and uploads the structure branch only; the server averages it weighted by training-node
counts (``aggregate_weights_se``) and sends it to every client. The Adam state persists
across rounds (the code builds it once per client).

What leaves a client each round: the structure branch's parameters
(``structure_embed.*``: h × (R+G) + h; ``structure_convs.*``: L × (h × h + h)). Nothing
that scales with the node count, fewer floats than FedAvg. (FedAux's paper excludes FedStar
as "leaking node embeddings, connectivities, or local gradients"; neither the code nor this
implementation uploads anything per node: docs/reading/fedstar.md §4 records that as their judgement.)

Options: ``fedstar-gnn`` picks the feature branch's layers: ``gcn`` (default) or ``sage`` as
in FedSpray's node-level table (its SGC column has no counterpart: the decoupled design
concatenates s at every layer), or ``gin`` as in the official (graph-level) code.
``fedstar-rw-steps`` / ``fedstar-degree-slots`` / ``fedstar-encoding`` are the code's
``n_rw``, ``n_dg`` and ``type_init``. The shared set is named explicitly
(:data:`~fedgraph_flwr.nn.fedstar_net.STRUCTURE_PREFIXES`) rather than by the code's
substring test ``"_s" in name`` (docs/reading/fedstar.md §6.1).

Paper/code differences are those of the adaptation: no graph pooling (the code's ``Whp``
-> add-pool -> ``post`` -> readout becomes ``combine`` -> ``post`` -> readout per node) and full
batch instead of mini-batches of 128 graphs. All clients start from the same seed (the code
draws each client's personal branch independently; the shared branch is overwritten by the
server's in both). The paper's hyperparameters (3 layers, hidden 64, lr 0.001, weight decay
5e-4, dropout 0.5, 1 local epoch, 200 rounds) are in ``configs/fedstar/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch_geometric.data import Data

from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.fedstar_net import (
    ENCODINGS,
    FEATURE_CONVS,
    STRUCTURE_PREFIXES,
    FedStarNet,
    encoding_width,
    structure_encoding,
)
from .base import Aggregator
from .fedavg import weighted_average
from .supervised import SupervisedTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig


@dataclass(frozen=True)
class FedStarOptions(Options, prefix="fedstar"):
    """FedStar's knobs (``fedstar-*``); defaults = the official code's."""

    gnn: str = option("gcn", "feature-branch layers: gcn | sage (FedSpray's node-level columns) "
                      "| gin (the official graph-level code)", choices=FEATURE_CONVS)
    rw_steps: int = option(16, "random-walk encoding length n_rw (diag of (AD^-1)^k, k=1..n_rw)",
                           low=1)
    degree_slots: int = option(16, "degree encoding slots n_dg (one-hot of min(max(deg,1),n_dg))",
                               low=1)
    encoding: str = option("rw_dg", "structure encoding: rw_dg (both) | rw | dg", choices=ENCODINGS)


def is_structure(name: str) -> bool:
    """True for a parameter of the shared structure branch."""
    return name.startswith(STRUCTURE_PREFIXES)


class FedStarTrainer(SupervisedTrainer):
    """Decoupled GNN; only the structure branch travels."""

    options_class = FedStarOptions
    options: FedStarOptions
    restore_without_init = True  # local_state holds the whole model; no other randomness

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        self._structure: torch.Tensor | None = None

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """FedStar's two-branch network: features and structure encodings."""
        opts = config.options_of(FedStarOptions)
        return FedStarNet(num_features, config.hidden, num_classes,
                          structure_channels=encoding_width(opts.rw_steps, opts.degree_slots,
                                                            opts.encoding),
                          num_layers=config.num_layers, dropout=config.dropout,
                          conv=opts.gnn)

    @property
    def structure(self) -> torch.Tensor:
        """The client's structure encoding [n, R+G], computed on first use."""
        if self._structure is None:
            opts = self.options
            self._structure = structure_encoding(self.data.edge_index, self.data.num_nodes,
                                                 opts.rw_steps, opts.degree_slots, opts.encoding)
        return self._structure

    def forward(self) -> torch.Tensor:
        """Logits [n, C] from the features and the structure encoding."""
        return self.model(self.data.x, self.structure, self.data.edge_index)

    def is_local(self, name: str) -> bool:
        """Everything but the structure branch stays local."""
        return not is_structure(name)

    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """The initial structure branch (the only shared part)."""
        torch.manual_seed(config.seed)
        model = cls.build_model(num_features, num_classes, config)
        return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()
                if is_structure(k)}

    def local_state(self) -> dict[str, Any]:
        """The base state plus the structure encoding."""
        return {**super().local_state(), "structure": self.structure}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        if "structure" in state:
            self._structure = state["structure"].to(self.device)


class FedStarAggregator(Aggregator):
    """FedAvg of the structure branch, weighted by training nodes, sent to every client."""

    options_class = FedStarOptions
    options: FedStarOptions

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """FedAvg of the structure branches, sent to every client."""
        shared = weighted_average(updates, "train", self.mix_dtype)
        # One global structure branch: every client (also one that sat this round out) gets it.
        clients = sorted(set(self.client_ids) | set(updates))
        return AggregateResult(payloads={c: shared for c in clients})


ALGORITHM = Algorithm("fedstar", FedStarTrainer, FedStarAggregator, FedStarOptions)
