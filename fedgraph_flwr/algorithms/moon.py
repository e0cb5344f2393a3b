"""MOON (Li, He and Song, CVPR 2021): model-contrastive federated learning.

Each local step adds ``μ · ℓ_con`` to the cross-entropy, where for a node's
representation z (this model), z_glob (the global model received this round) and
z_prev (this client's model at the end of its previous round):
``ℓ_con = −log( e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ}) )``,
averaged over the nodes. The global and previous models are frozen and in eval mode;
in a client's first round there is no previous model and the term is 0 (the official
code's empty model pool gives a one-column softmax, whose loss is 0). The server is
FedAvg.

Leaves the client each round: the model, nothing else; nothing per node.

Official code: QinbinLi/MOON @ 8fcba3c (``main.py``, ``train_net_fedcon``; defaults
``--mu 1 --temperature 0.5 --model_buffer_size 1``). Also read: OpenFGL's ``flcore/moon``
(openfgl-lib 1.1.0), which adapts it to node classification. Switches where they differ:

- ``moon-nodes``: ``train`` (default; the official code contrasts the training samples
  of each batch) or ``all`` (OpenFGL contrasts every node of the subgraph).
- The representation: the official image model puts a two-layer projection head
  between encoder and classifier and contrasts its output. On a GCN, as in OpenFGL, z
  is the last hidden layer (after ReLU and dropout; z_glob and z_prev without dropout):
  a projection head has no counterpart in any graph code of MOON we know of and is not
  built.
- The server: FedAvg weighted by training nodes (the official code weights by samples,
  OpenFGL by nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..core.options import ConfigError, Options, option
from ..core.phases import Arrays
from ..core.registry import Algorithm
from ..nn.gcn import GCN
from .fedavg import FedAvgAggregator, GCNTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

NODE_SETS = ("train", "all")


# `moon-reproduce`: the profiles, the default first (docs/methods/moon.md).
PUBLISHED = (
    "`openfgl` is the one compared with OpenFGL on its Cora METIS-10 files (this page)."
)
PROFILES: dict[str, dict[str, Any]] = {
    "official": {"nodes": "train"},
    "openfgl": {"nodes": "all"},
}


@dataclass(frozen=True)
class MOONOptions(Options, prefix="moon", profiles=PROFILES, published=PUBLISHED):
    """MOON's knobs (``moon-*``), the official code's defaults."""

    mu: float = option(1.0, "weight μ of the model-contrastive term", low=0.0)
    temperature: float = option(0.5, "temperature τ of the contrastive softmax", low=0.0,
                                low_inclusive=False)
    nodes: str = option("train", "nodes contrasted: train (the official code: training "
                        "samples) | all (OpenFGL)", choices=NODE_SETS)


def model_contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor,
                           temperature: float) -> torch.Tensor:
    """mean_i −log softmax([cos(z_i, zg_i), cos(z_i, zp_i)] / τ)[0]; z* [n, d] -> scalar."""
    positive = F.cosine_similarity(z, z_global, dim=-1)
    negative = F.cosine_similarity(z, z_previous, dim=-1)
    logits = torch.stack([positive, negative], dim=1) / temperature  # [n, 2]
    return F.cross_entropy(logits, torch.zeros(z.size(0), dtype=torch.long, device=z.device))


class MOONTrainer(GCNTrainer):
    """A GCN trained with cross-entropy plus μ · the model-contrastive term."""

    options_class = MOONOptions
    options: MOONOptions
    model: GCN

    def __init__(self, data: Any, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        self.global_state: dict[str, torch.Tensor] | None = None
        self.previous_state: dict[str, torch.Tensor] | None = None

    def load_payload(self, arrays: Arrays) -> None:
        """The global model, also kept frozen as the positive's model."""
        super().load_payload(arrays)
        self.global_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def representation(self, training: bool) -> torch.Tensor:
        """z [n, hidden]: the last hidden layer of the GCN (dropout only when ``training``)."""
        x, edge_index = self.data.x, self.message_graph()
        convs = self.model.convs
        for conv in convs[:-1]:
            x = F.relu(conv(x, edge_index))
            x = F.dropout(x, p=self.model.dropout, training=training)
        return x

    @torch.no_grad()
    def frozen_representation(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """z of a frozen model (eval mode), computed with this trainer's model and restored."""
        current = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(state)
        z = self.representation(training=False)
        self.model.load_state_dict(current)
        return z

    def train(self, epochs: int) -> dict[str, float]:
        """Full-batch Adam on CE + μ · ℓ_con (ℓ_con = 0 without a previous model)."""
        data = self.data
        opts = self.options
        contrast = False
        if self.previous_state is not None and self.global_state is not None and opts.mu > 0:
            contrast = True
            nodes = data.train_mask if opts.nodes == "train" else slice(None)
            z_global = self.frozen_representation(self.global_state)[nodes]
            z_previous = self.frozen_representation(self.previous_state)[nodes]
        self.model.train()
        loss_value, con_value = float("nan"), 0.0
        for _ in range(epochs):
            self.optimizer.zero_grad()
            z = self.representation(training=True)
            logits = self.model.convs[-1](z, self.message_graph())
            loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            if contrast:
                con = model_contrastive_loss(z[nodes], z_global, z_previous, opts.temperature)
                loss = loss + opts.mu * con
                con_value = float(con.detach())
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.detach())
        self.previous_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return {"train_loss": loss_value, "contrastive_loss": con_value}

    def local_state(self) -> dict[str, Any]:
        """The base state plus the previous round's model (z_prev's)."""
        return {**super().local_state(), "previous": self.previous_state}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.previous_state = state["previous"]


class MOONAggregator(FedAvgAggregator):
    """The MOON server is FedAvg (weighted by training nodes)."""

    options_class = MOONOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        if config.gnn != "gcn" or config.num_layers < 2:  # refused before round 1, as FGSSL's
            raise ConfigError("moon contrasts the last hidden layer of a GCN: gnn=gcn and "
                              "num-layers >= 2")


ALGORITHM = Algorithm("moon", MOONTrainer, MOONAggregator, MOONOptions)
