"""SCAFFOLD (Karimireddy et al., ICML 2020): FedAvg with control variates that correct client drift.

Client ``i`` receives the global model x and the server's control variate c, and starts
from x. Each local step's gradient is corrected by ``c − c_i`` before the optimizer
step (``y ← y − η(g(y) − c_i + c)`` for SGD). After K full-batch steps of rate η its
control variate is updated by the paper's option II,
``c_i⁺ = c_i − c + (x − y_i) / (K·η)``, and it sends y_i and Δc_i = c_i⁺ − c_i, the
latter as ``control.<name>`` = c + Δc_i: an update of the c it received, as the model
is of x, so that ``dp=client`` clips and noises Δc_i itself. The server sets
``x ← x + η_g Σ_i w_i (y_i − x)`` and ``c ← c + (|S|/N) · mean_i Δc_i``
(S the round's clients, N all clients).

Leaves the client each round: the model y_i and c + Δc_i, one array per parameter of
the same shape: twice the model, nothing per node.

No official code: the paper's authors released none. Followed: the paper's Algorithm 1
(option II) and OpenFGL's ``flcore/scaffold`` (openfgl-lib 1.1.0), which differ in:

- ``scaffold-optimizer``: ``adam`` (default; OpenFGL, as every method here trains)
  applies the corrected gradient through Adam, where option II's (x − y)/(Kη) is no
  longer the mean gradient; ``sgd``: the paper's plain steps.
- ``scaffold-weighting``: ``train`` (default; OpenFGL and FedAvg here weight by
  samples) or ``uniform`` (the paper's mean).
- the server's c: OpenFGL sets it to the mean of the round's clients' c_i; the paper adds
  (|S|/N)·mean Δc_i. With c starting at 0 and every client in every round the two are
  the same c; under partial participation this follows the paper.
- ``scaffold-global-lr`` η_g (paper; OpenFGL has none, i.e. 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from .base import Aggregator
from .fedavg import GCNTrainer, client_weights
from .supervised import OPTIMIZERS, ChoosesOptimizer

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

CONTROL_PREFIX = "control."


def control_key(name: str) -> str:
    """The payload / upload key of parameter ``name``'s control variate."""
    return CONTROL_PREFIX + name


# `scaffold-reproduce`: the profiles, the default first (docs/methods/scaffold.md).
PUBLISHED = (
    "`openfgl` (the default) is the one compared with OpenFGL on its Cora METIS-10 files (this "
    "page)."
)
PROFILES: dict[str, dict[str, Any]] = {
    "openfgl": {"optimizer": "adam", "weighting": "train"},
    "paper": {"optimizer": "sgd", "weighting": "uniform"},
}


@dataclass(frozen=True)
class ScaffoldOptions(Options, prefix="scaffold", profiles=PROFILES, published=PUBLISHED):
    """SCAFFOLD's knobs (``scaffold-*``)."""

    optimizer: str = option("adam", "local optimizer the corrected gradient goes through: adam "
                            "(OpenFGL) | sgd (the paper)", choices=OPTIMIZERS)
    weighting: str = option("train", "server's client weights: train (∝ training nodes; "
                            "OpenFGL) | uniform (the paper)", choices=("train", "uniform"))
    global_lr: float = option(1.0, "server step η_g: x ← x + η_g Σ w_i (y_i − x)", low=0.0,
                              low_inclusive=False)


class ScaffoldTrainer(ChoosesOptimizer, GCNTrainer):
    """A GCN whose every local step is corrected by c − c_i; keeps c_i between rounds."""

    options_class = ScaffoldOptions
    options: ScaffoldOptions

    def __init__(self, data: Any, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        params = dict(self.model.named_parameters())
        self.local_control = {n: torch.zeros_like(p) for n, p in params.items()}  # c_i
        self.global_control = {n: torch.zeros_like(p) for n, p in params.items()}  # c
        self.received: dict[str, torch.Tensor] = {}  # x
        self.control_delta = {n: torch.zeros_like(p) for n, p in params.items()}  # Δc_i

    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """The initial model and c = 0 beside it (what a fresh client uploads: Δc_i = 0)."""
        arrays = super().initial_arrays(num_features, num_classes, config)
        model = cls._meta_model(num_features, num_classes, config)  # the shapes only
        arrays.update({control_key(n): np.zeros(tuple(p.shape), np.float32)
                       for n, p in model.named_parameters()})
        return arrays

    def load_payload(self, arrays: Arrays) -> None:
        """x into the model (and kept), c into :attr:`global_control`."""
        super().load_payload({n: v for n, v in arrays.items() if not n.startswith(CONTROL_PREFIX)})
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                self.received[name] = param.detach().clone()
                if control_key(name) in arrays:
                    self.global_control[name] = torch.as_tensor(
                        np.asarray(arrays[control_key(name)]), dtype=param.dtype,
                        device=self.device).clone()

    def train(self, epochs: int) -> dict[str, float]:
        """K = ``epochs`` corrected full-batch steps, then option II's c_i update."""
        data = self.data
        self.model.train()
        loss_value = float("nan")
        params = dict(self.model.named_parameters())
        if not self.received:  # not in the engine's flow: start from the current model
            self.received = {n: p.detach().clone() for n, p in params.items()}
        for _ in range(epochs):
            self.optimizer.zero_grad()
            logits = self.forward()
            loss = torch.nn.functional.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            loss.backward()
            with torch.no_grad():
                for name, param in params.items():
                    if param.grad is not None:
                        param.grad.add_(self.global_control[name] - self.local_control[name])
            self.optimizer.step()
            loss_value = float(loss.detach())
        if epochs > 0:
            self.update_control(epochs)
        return {"train_loss": loss_value}

    @torch.no_grad()
    def update_control(self, steps: int) -> None:
        """c_i⁺ = c_i − c + (x − y_i)/(K·η); Δc_i = c_i⁺ − c_i."""
        scale = 1.0 / (steps * self.config.lr)
        for name, param in self.model.named_parameters():
            new = self.local_control[name] - self.global_control[name] + (
                self.received[name] - param.detach()) * scale
            self.control_delta[name] = new - self.local_control[name]
            self.local_control[name] = new

    def upload(self) -> Arrays:
        """y_i and c + Δc_i (``control.<name>``)."""
        arrays = super().upload()
        arrays.update({control_key(n): (self.global_control[n] + d).cpu().numpy().astype(np.float32)
                       for n, d in self.control_delta.items()})
        return arrays

    def local_state(self) -> dict[str, Any]:
        """The base state plus c_i (and this round's x, c and Δc_i for the upload)."""
        state = super().local_state()
        state.update({"local_control": self.local_control, "global_control": self.global_control,
                      "received": self.received, "control_delta": self.control_delta})
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        for key in ("local_control", "global_control", "received", "control_delta"):
            setattr(self, key, {n: t.to(self.device) for n, t in state[key].items()})


class ScaffoldAggregator(Aggregator):
    """x ← x + η_g Σ w_i (y_i − x); c ← c + (|S|/N) mean Δc_i; both sent to every client."""

    options_class = ScaffoldOptions
    options: ScaffoldOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        self.model = {n: np.asarray(v, np.float64) for n, v in initial.items()
                      if not n.startswith(CONTROL_PREFIX)}
        self.control = {n: np.asarray(v, np.float64) for n, v in initial.items()
                        if n.startswith(CONTROL_PREFIX)}

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """One global model and one control variate for every client."""
        ids = sorted(updates)
        weights = client_weights(updates, self.options.weighting)
        eta = self.options.global_lr
        for name, x in self.model.items():
            if not np.issubdtype(np.asarray(updates[ids[0]].arrays[name]).dtype, np.floating):
                continue
            step = sum(w * (np.asarray(updates[c].arrays[name], np.float64) - x)
                       for w, c in zip(weights, ids))
            self.model[name] = x + eta * step
        share = len(ids) / len(self.client_ids)
        for name, c in self.control.items():  # each upload is c + Δc_i
            mean_delta = np.mean([np.asarray(updates[i].arrays[name], np.float64) for i in ids],
                                 axis=0) - c
            self.control[name] = c + share * mean_delta
        payload = {n: v.astype(self.initial[n].dtype) for n, v in {**self.model, **self.control}.items()}
        norm = float(np.sqrt(sum(float((v ** 2).sum()) for v in self.control.values())))
        return AggregateResult(payloads={c: payload for c in self.client_ids},
                               metrics={"control-norm": norm})

    def state_dict(self) -> dict[str, Any]:
        """x and c (float64), for checkpoint and resume."""
        return {"model": self.model, "control": self.control}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.model = {n: np.asarray(v, np.float64) for n, v in state["model"].items()}
        self.control = {n: np.asarray(v, np.float64) for n, v in state["control"].items()}


ALGORITHM = Algorithm("scaffold", ScaffoldTrainer, ScaffoldAggregator, ScaffoldOptions)
