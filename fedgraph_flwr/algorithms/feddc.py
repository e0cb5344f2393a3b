"""FedDC (Gao et al., CVPR 2022): federated learning with local drift decoupling and correction.

Client i keeps a local drift h_i (the sum of its past updates θ_i − w) and a gradient
correction g_i; the server keeps the global model w and a global correction g. A client
starts from w and trains on

    CE + (α_i/2)·||θ + h_i − w||² + ⟨θ, g/ω_i − g_i⟩,

with α_i = α/ω_i and ω_i = n_i·N/Σ_j n_j (its share of the training nodes, N clients).
After K local steps of rate η it sets Δθ = θ − w, h_i ← h_i + Δθ and
g_i ← g_i − g/ω_i − Δθ/(K·η), and sends θ_i and h_i. The server sets
g ← g + (1/N)·Σ_i (−g − ω_i·Δθ_i/(K·η)) (the official code's Δg_i, which the server
computes from θ_i, so the client need not send it) and
w ← mean over the round's clients of θ_i + mean over all clients of h_i (h_j = 0 for a
client not yet seen; ω over the clients whose node counts the server has seen).

Leaves the client each round: its model θ_i and its drift h_i (``drift.<name>``), one
array per parameter of the same shape: twice the model, nothing per node. The server
sends client i, beside w, g/ω_i (``correction.<name>``) and ω_i (``feddc.share``); in
round 1 (before the server has seen node counts) a client takes ω_i = 1 and g = 0.

Official code: gaoliang13/FedDC @ 13440c2 (``utils_methods_FedDC.py`` ``train_FedDC``,
``utils_general.py`` ``train_model_FedDC``; ``alpha_coef`` 1e-2, plain SGD with the
gradient norm clipped to 10). Also read: OpenFGL's ``flcore/feddc`` (openfgl-lib 1.1.0).
``feddc-flavour`` picks between them:

- ``official`` (default): as above; the gradient norm is clipped to
  ``feddc-max-grad-norm`` (10) before each step.
- ``openfgl``: no ω (α the same for all clients); no regulariser at all in round 1; the
  correction term is ``(1/(η·E))·Σ(θ ⊙ Δθ_i^{prev} − Δ̄)``, Δθ_i^{prev} the client's
  previous update and Δ̄ the clients' mean update (a constant: it adds no gradient, so
  the server here does not send it); h_i grows by the *previous* round's update (its
  loop adds the value it has just replaced: the drift lags one round); the server's
  w = Σ_i (n_i/Σn)(θ_i + h_i) over the round's clients; no gradient clipping.

``feddc-optimizer``: ``sgd`` (default; the official code's plain steps) or ``adam``
(OpenFGL, as most methods here train), with the run's lr and weight decay. The official
correction needs SGD: g_i is built from Δθ/(K·η), the mean gradient only under plain
steps; under Adam every coordinate's Δθ/(K·η) is about ±1 whatever its gradient, and the
official flavour drifts away (Cora-10 on OpenFGL's files, seed 0: 75.3 at round 1, 54.7
at round 100, against 85.5–86.0 with SGD at lr 0.01–0.5; docs/methods/feddc.md).
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
from .fedavg import GCNTrainer
from .supervised import OPTIMIZERS, ChoosesOptimizer

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

DRIFT_PREFIX = "drift."
CORRECTION_PREFIX = "correction."
SHARE_KEY = "feddc.share"
FLAVOURS = ("official", "openfgl")


def drift_key(name: str) -> str:
    """The upload key of parameter ``name``'s local drift h_i."""
    return DRIFT_PREFIX + name


def correction_key(name: str) -> str:
    """The payload key of parameter ``name``'s global correction g/ω_i."""
    return CORRECTION_PREFIX + name


# `feddc-reproduce`: the profiles, the default first (docs/methods/feddc.md).
PUBLISHED = (
    "`openfgl` (α 0.1, Adam) is the one compared with OpenFGL on its Cora METIS-10 files (this "
    "page)."
)
PROFILES: dict[str, dict[str, Any]] = {
    "official": {"flavour": "official", "alpha": 0.01, "optimizer": "sgd"},
    "openfgl": {"flavour": "openfgl", "alpha": 0.1, "optimizer": "adam"},
}


@dataclass(frozen=True)
class FedDCOptions(Options, prefix="feddc", profiles=PROFILES, published=PUBLISHED):
    """FedDC's knobs (``feddc-*``)."""

    alpha: float = option(0.01, "weight α of the drift penalty (α/2)||θ + h_i − w||² (official "
                          "alpha_coef 1e-2; OpenFGL 0.1)", low=0.0)
    flavour: str = option("official", "official (gaoliang13/FedDC) | openfgl (OpenFGL's "
                          "flcore/feddc): see the module docstring", choices=FLAVOURS)
    optimizer: str = option("sgd", "local optimizer: sgd (the official code) | adam (OpenFGL)",
                            choices=OPTIMIZERS)
    max_grad_norm: float = option(10.0, "official flavour: clip each step's gradient to this L2 "
                                  "norm (the official max_norm)", low=0.0, low_inclusive=False)


def share_of(num_train: dict[int, int]) -> dict[int, float]:
    """ω_i = n_i·N/Σn over the clients whose node counts the server has seen."""
    total = float(sum(num_train.values()))
    return {c: n * len(num_train) / total for c, n in num_train.items()}


class FedDCTrainer(ChoosesOptimizer, GCNTrainer):
    """A GCN trained with FedDC's drift penalty and gradient correction; keeps h_i and g_i."""

    options_class = FedDCOptions
    options: FedDCOptions

    def __init__(self, data: Any, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        params = dict(self.model.named_parameters())
        self.drift = {n: torch.zeros_like(p) for n, p in params.items()}  # h_i
        self.local_correction = {n: torch.zeros_like(p) for n, p in params.items()}  # g_i
        self.previous_update = {n: torch.zeros_like(p) for n, p in params.items()}  # openfgl's Δθ^prev
        self.global_correction = {n: torch.zeros_like(p) for n, p in params.items()}  # g/ω_i
        self.share = 1.0  # ω_i
        self.received: dict[str, torch.Tensor] = {}  # w

    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """The initial model and h = 0 beside it (the upload's schema)."""
        arrays = super().initial_arrays(num_features, num_classes, config)
        model_arrays = dict(arrays)
        arrays.update({drift_key(n): np.zeros_like(v) for n, v in model_arrays.items()})
        return arrays

    def load_payload(self, arrays: Arrays) -> None:
        """w into the model (and kept); g/ω_i and ω_i where the server sent them."""
        super().load_payload({n: v for n, v in arrays.items()
                              if not n.startswith((DRIFT_PREFIX, CORRECTION_PREFIX))})
        if SHARE_KEY in arrays:
            self.share = float(np.asarray(arrays[SHARE_KEY]).reshape(-1)[0])
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                self.received[name] = param.detach().clone()
                if correction_key(name) in arrays:
                    self.global_correction[name] = torch.as_tensor(
                        np.asarray(arrays[correction_key(name)]), dtype=param.dtype,
                        device=self.device).clone()

    @property
    def regularised(self) -> bool:
        """Whether this round's loss carries FedDC's terms (OpenFGL's has none in round 1)."""
        return self.options.flavour == "official" or self.config.server_round > 1

    def extra_loss(self) -> torch.Tensor | float:
        """(α_i/2)·||θ + h_i − w||² plus the correction's ⟨θ, ·⟩ (see the module docstring)."""
        if not self.regularised or not self.received:
            return 0.0
        official = self.options.flavour == "official"
        alpha = self.options.alpha / self.share if official else self.options.alpha
        scale = 1.0 / (self.config.lr * self.config.local_epochs)
        penalty: torch.Tensor | float = 0.0
        correction: torch.Tensor | float = 0.0
        for name, param in self.model.named_parameters():
            penalty = penalty + (param + self.drift[name] - self.received[name]).pow(2).sum()
            direction = (self.global_correction[name] - self.local_correction[name] if official
                         else scale * self.previous_update[name])
            correction = correction + (param * direction).sum()
        return 0.5 * alpha * penalty + correction

    def train(self, epochs: int) -> dict[str, float]:
        """``epochs`` full-batch steps on CE + FedDC's terms, then the drift and correction
        updates; reports the cross-entropy."""
        data = self.data
        self.model.train()
        if not self.received:  # not in the engine's flow: start from the current model
            self.received = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        clip = self.options.flavour == "official"
        loss_value = float("nan")
        for _ in range(epochs):
            self.optimizer.zero_grad()
            logits = self.forward()
            ce = torch.nn.functional.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            (ce + self.extra_loss()).backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.max_grad_norm)
            self.optimizer.step()
            loss_value = float(ce.detach())  # the linear correction term has no floor
        if epochs > 0:
            self.update_drift(epochs)
        return {"train_loss": loss_value}

    @torch.no_grad()
    def update_drift(self, steps: int) -> None:
        """official: h_i += Δθ, g_i ← g_i − g/ω_i − Δθ/(K·η); openfgl: h_i += Δθ^prev."""
        beta = 1.0 / (steps * self.config.lr)
        for name, param in self.model.named_parameters():
            delta = param.detach() - self.received[name]
            if self.options.flavour == "official":
                self.drift[name] += delta
                self.local_correction[name] = (self.local_correction[name]
                                               - self.global_correction[name] - beta * delta)
            else:
                self.drift[name] += self.previous_update[name]
                self.previous_update[name] = delta

    def upload(self) -> Arrays:
        """θ_i and h_i (``drift.<name>``)."""
        arrays = super().upload()
        arrays.update({drift_key(n): h.cpu().numpy().astype(np.float32)
                       for n, h in self.drift.items()})
        return arrays

    def local_state(self) -> dict[str, Any]:
        """The base state plus h_i, g_i and OpenFGL's previous update."""
        state = super().local_state()
        state.update({"drift": self.drift, "local_correction": self.local_correction,
                      "previous_update": self.previous_update})
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        for key in ("drift", "local_correction", "previous_update"):
            setattr(self, key, {n: t.to(self.device) for n, t in state[key].items()})


class FedDCAggregator(Aggregator):
    """w from the clients' models and drifts; g from their updates; g/ω_i and ω_i to each."""

    options_class = FedDCOptions
    options: FedDCOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        self.model = {n: np.asarray(v, np.float64) for n, v in initial.items()
                      if not n.startswith(DRIFT_PREFIX)}
        self.correction = {n: np.zeros_like(v) for n, v in self.model.items()
                           if np.issubdtype(v.dtype, np.floating)}  # g
        self.drifts: dict[int, dict[str, np.ndarray]] = {}  # the last h_i of every client
        self.num_train: dict[int, int] = {}

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """One w for all; each client its own g/ω_i and ω_i (official)."""
        ids = sorted(updates)
        for c in ids:
            self.num_train[c] = updates[c].num_train
            self.drifts[c] = {n: np.asarray(updates[c].arrays[drift_key(n)], np.float64)
                              for n in self.correction}
        if self.options.flavour == "official":
            self._official_step(ids, updates)
        else:
            self._openfgl_step(ids, updates)
        payloads: dict[int, Arrays] = {}
        shares = share_of(self.num_train)
        for c in self.client_ids:
            payload = {n: v.astype(self.initial[n].dtype) for n, v in self.model.items()}
            if self.options.flavour == "official":
                share = shares.get(c, 1.0)
                payload.update({correction_key(n): (g / share).astype(self.initial[n].dtype)
                                for n, g in self.correction.items()})
                payload[SHARE_KEY] = np.asarray([share], np.float64)
            payloads[c] = payload
        norm = float(np.sqrt(sum(float((g ** 2).sum()) for g in self.correction.values())))
        return AggregateResult(payloads=payloads, metrics={"correction-norm": norm})

    def _official_step(self, ids: list[int], updates: dict[int, ClientUpdate]) -> None:
        """g ← g + (1/N)Σ_i(−g − ω_i Δθ_i/(Kη)); w ← mean_i θ_i + mean over all h_j."""
        beta = 1.0 / (self.config.local_epochs * self.config.lr)
        shares = share_of(self.num_train)
        total = len(self.client_ids)
        for name, w in self.model.items():
            thetas = [np.asarray(updates[c].arrays[name], np.float64) for c in ids]
            if name not in self.correction:  # a non-float array stays as it was
                continue
            g = self.correction[name]
            step = sum(-g - shares[c] * beta * (theta - w) for c, theta in zip(ids, thetas))
            self.correction[name] = g + step / total
            # the official mean is over all clients, h_j = 0 for one not yet seen
            mean_drift = sum(d[name] for d in self.drifts.values()) / total
            self.model[name] = np.mean(thetas, axis=0) + mean_drift

    def _openfgl_step(self, ids: list[int], updates: dict[int, ClientUpdate]) -> None:
        """w ← Σ_i (n_i/Σn)(θ_i + h_i) over the round's clients."""
        counts = np.array([updates[c].num_train for c in ids], np.float64)
        weights = counts / counts.sum()
        for name in self.correction:
            self.model[name] = sum(
                wt * (np.asarray(updates[c].arrays[name], np.float64) + self.drifts[c][name])
                for wt, c in zip(weights, ids))

    def state_dict(self) -> dict[str, Any]:
        """w, g, every client's last h_i and node count (float64), for checkpoint and resume."""
        return {"model": self.model, "correction": self.correction,
                "drifts": {str(c): d for c, d in self.drifts.items()},
                "num_train": {str(c): n for c, n in self.num_train.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.model = {n: np.asarray(v, np.float64) for n, v in state["model"].items()}
        self.correction = {n: np.asarray(v, np.float64) for n, v in state["correction"].items()}
        self.drifts = {int(c): {n: np.asarray(v, np.float64) for n, v in d.items()}
                       for c, d in state["drifts"].items()}
        self.num_train = {int(c): int(n) for c, n in state["num_train"].items()}


ALGORITHM = Algorithm("feddc", FedDCTrainer, FedDCAggregator, FedDCOptions)
