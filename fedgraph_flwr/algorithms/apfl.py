"""APFL (Deng et al. 2020): adaptive personalized FL by mixing a local and a global model.

Each client keeps a personal GCN ``v`` and a mixing weight ``α ∈ [0, 1]`` (local
state) next to the shared GCN ``w``. Its personalized model is the parameter
mixture ``v̄ = α v + (1 - α) w``. Each local step (APFL Alg. 1, Adam instead of
SGD for ``w`` and ``v`` as for every baseline here):

1. ``v`` descends CE(v̄) with ``w`` held fixed;
2. ``α`` descends the same loss, ``∂/∂α = ⟨v - w, ∇_v̄ CE⟩``, by plain SGD at
   ``apfl-alpha-lr`` and is clipped to [0, 1] (APFL's adaptive α);
3. ``w`` descends CE(w), as in FedAvg.

Only ``w`` is uploaded; the server is FedAvg. Evaluation scores ``v̄``.

Knobs: ``apfl-alpha`` (initial α, 0.25: the smallest of the fixed α values APFL reports),
``apfl-alpha-lr`` (α's step size; default 0.01 = the common ``lr`` default),
``apfl-adaptive`` (learn α; false keeps it fixed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch_geometric.data import Data

from ..core.options import Options, option
from ..core.registry import Algorithm
from .fedavg import FedAvgAggregator, GCNTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig


@dataclass(frozen=True)
class APFLOptions(Options, prefix="apfl"):
    """APFL's knobs (``apfl-*``)."""

    alpha: float = option(0.25, "initial mixing weight α of the personal model (α v + (1 - α) w)",
                          low=0.0, high=1.0)
    alpha_lr: float = option(0.01, "SGD step size of α", low=0.0)
    adaptive: bool = option(True, "learn α (APFL's adaptive α); false keeps it fixed")


class APFLTrainer(GCNTrainer):
    """Shared GCN ``w`` (``self.model``), personal GCN ``v`` and a learned mixing weight α."""

    options_class = APFLOptions
    options: APFLOptions

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        # v starts from the same initial model as w (same seed), as in APFL.
        torch.manual_seed(config.seed)
        self.local_model = self.build_model(data.num_features, num_classes, config).to(device)
        self.local_optimizer = torch.optim.Adam(
            self.local_model.parameters(), lr=config.lr,
            weight_decay=config.weight_decay)
        self.alpha = torch.tensor(self.options.alpha, device=device)

    def mixed_params(self, alpha: torch.Tensor, detach_global: bool = True) -> dict[str, torch.Tensor]:
        """``α v + (1 - α) w`` for every parameter (``w`` detached: only v and α learn from it)."""
        w = dict(self.model.named_parameters())
        return {
            name: alpha * v + (1 - alpha) * (w[name].detach() if detach_global else w[name])
            for name, v in self.local_model.named_parameters()
        }

    def forward(self) -> torch.Tensor:
        """Logits [n, C] of the personalized (mixed) model; used by :meth:`evaluate`."""
        params = self.mixed_params(self.alpha)
        return functional_call(self.model, params, (self.data.x, self.data.edge_index))

    def train(self, epochs: int) -> dict[str, float]:
        """APFL's step: the global model w, then the personal model v on α v + (1 - α) w, then α."""
        data, mask = self.data, self.data.train_mask
        adaptive, alpha_lr = self.options.adaptive, self.options.alpha_lr
        self.model.train()
        self.local_model.train()
        loss_value = mixed_value = float("nan")
        for _ in range(epochs):
            # 1-2: personal model and α on the mixed model's loss (w fixed).
            alpha = self.alpha.clone().requires_grad_(adaptive)
            self.local_optimizer.zero_grad()
            logits = functional_call(self.model, self.mixed_params(alpha), (data.x, data.edge_index))
            mixed_loss = F.cross_entropy(logits[mask], data.y[mask])
            mixed_loss.backward()
            self.local_optimizer.step()
            if adaptive and alpha.grad is not None:
                self.alpha = (self.alpha - alpha_lr * alpha.grad.detach()).clamp(0.0, 1.0)
            mixed_value = float(mixed_loss.detach())
            # 3: the shared model on its own loss (FedAvg's local step).
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(data.x, data.edge_index)[mask], data.y[mask])
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.detach())
        return {"train_loss": mixed_value, "global_train_loss": loss_value,
                "apfl_alpha": float(self.alpha)}

    def local_state(self) -> dict[str, Any]:
        """The base state plus the personal model and α."""
        state = super().local_state()
        state.update({"local_model": self.local_model.state_dict(),
                      "local_optimizer": self.local_optimizer.state_dict(),
                      "alpha": self.alpha.detach().clone()})
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        self.local_model.load_state_dict(state["local_model"])
        self.local_optimizer.load_state_dict(state["local_optimizer"])
        self.alpha = state["alpha"].to(self.device).detach().clone()


class APFLAggregator(FedAvgAggregator):
    """APFL's server is FedAvg over the shared model ``w``."""

    options_class = APFLOptions


ALGORITHM = Algorithm("apfl", APFLTrainer, APFLAggregator, APFLOptions)
