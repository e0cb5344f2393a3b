"""FedSpray (Fu et al., KDD 2024): federated graph learning with structure proxy alignment.

Each client keeps a **personalized GNN** f(θ^(k)) that never leaves it (local state only)
and shares a **feature-structure encoder** g(ω) = {g_e, g_p, g_q} plus **class-wise
structure proxies** S [d_c, d_s]. One client round (``train(E)``):

1. *Teacher* (no gradient), from the global ω_{r-1} and S_{r-1}:
   e = g_e(x), q = softmax(g_q(e)); unlabelled nodes get s_i = q_i S (Eq. 10 + docs/reading/fedspray.md §2.3);
   labelled nodes get s_i = S[y_i] (paper) or keep their local proxy (switch below);
   p = softmax(g_p(e + s)) for every node.
2. *Phase 1* (E Adam steps on θ): L_G = CE(y, ŷ) over V_L + λ1 · KL(p ‖ ŷ) over the KD set
   (Eqs. 5-7). With λ1 = 0 the KD term is skipped, so this is exactly Local training.
3. *Phase 2* (E steps, one Adam step on ω and one on the labelled nodes' proxies each):
   L_F = CE(y, q) + λ2 · KL(ŷ ‖ p) over V_L, ŷ from the new GNN, detached (Eqs. 11-13).
4. *Class proxies*: S^(k)_j = mean of the labelled proxies of class j (0 if the class has no
   labelled node here).

Upload: ω only (``encoder.*``; never a GNN parameter). Signature: ``class_proxies``
[d_c, d_s] and ``class_ratios`` [d_c] (fractions of labelled nodes per class). Server:
ω ← Σ_k N_k/N ω_k with N_k = training nodes (Eq. 14); S_j ← Σ_k a_j^k S_j^k / Σ_k a_j^k
(Eq. 15); a class no client holds keeps its previous global proxy. Every client receives
the global ω plus ``proxies`` (S). Three Adam optimizers (GNN, encoder, proxies) keep
their state across rounds. The KL terms have no temperature and are averaged over the
nodes of their set (``batchmean``), as in the official code.

Only labelled nodes' proxies are stored: unlabelled ones are overwritten from S every
round and never receive gradient, so keeping them would change nothing.

Switches (defaults = the paper; the official code ``xbfu/FedSpray`` = the other value):

- ``fedspray-local-labelled-proxies`` (False): True keeps each labelled node's locally
  trained proxy across rounds instead of resetting it to S[y_i] (code; then the global S
  reaches a client only through its unlabelled nodes).
- ``fedspray-kd-threshold`` (0.0): KD set of Eq. 6 = V_L ∪ {unlabelled i: max_j q_ij >
  threshold}; 0 = all nodes (paper), 0.7 = the code.
- ``fedspray-gq-from-gp`` (False): True starts the local g_q of phase 2 from the global
  g_p, the code's ``classifier2.load_state_dict(classifier.state_dict())`` quirk (the
  teacher still uses the true global g_q).
- ``fedspray-uniform-init`` (False): True draws every GNN parameter from U[0, 1) (code).
- ``fedspray-per-client-init`` (False): True gives each client its own GNN draw (from
  ``seed`` and its partition id), as the code's clients, built one after another from one
  RNG stream, each get; False draws every client's GNN from ``seed`` (below). Under the
  code's U[0, 1) SAGE the result moves by 2-3 points with the draws; on the same draws
  ours and the code agree (docs/results/fedspray.md).
- ``fedspray-gnn``: gcn | sgc (SGConv, K = ``num-layers``) | sage; the code hard-codes sage.
- ``fedspray-zero-proxies`` (False): the S = 0 ablation (Table 3): all proxies are 0 and
  never updated, so the teacher is a feature-only MLP.

Exact reproduction of the official code: local-labelled-proxies=True, kd-threshold=0.7,
gq-from-gp=True, uniform-init=True, per-client-init=True, gnn=sage, lambda1=1, lr=0.003,
weight-decay=0, dropout=0, hidden=64, local-epochs=5 (rounds 500; the paper says 300).
The paper's text says λ1 = 5 but the code passes 1 and the rebuttal numbers match 1
(docs/reading/fedspray.md §11.1).

Seeding: the GNN is built right after ``torch.manual_seed(seed)``, like
:class:`~fedgraph_flwr.algorithms.local.LocalTrainer`, so every client starts from the same
GNN and a GCN backbone starts from exactly Local's weights (with ``per-client-init``,
from ``seed + PER_CLIENT_SEED_STRIDE · (1 + partition id)`` instead); the encoder draws
from its own generator (``seed + ENCODER_SEED_OFFSET``), so the server's initial encoder
equals every client's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from ..config import resolve_metric
from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.fedspray_encoder import FeatureStructureEncoder
from ..nn.personal_gnn import BACKBONES, PersonalGNN
from .base import Aggregator, ClientTrainer
from .fedavg import weighted_average
from .supervised import evaluation_metrics

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig


# `fedspray-reproduce`: the profiles, the default first (docs/methods/fedspray.md).
PUBLISHED = (
    "The paper has no Cora or CiteSeer figures; on the same client files `official` matches the "
    "authors' code and `paper` does not (Expected results above)."
)
PROFILES: dict[str, dict[str, Any]] = {
    "paper": {
        "kd_threshold": 0.0, "local_labelled_proxies": False, "gq_from_gp": False,
        "uniform_init": False, "per_client_init": False,
    },
    "official": {
        "kd_threshold": 0.7, "local_labelled_proxies": True, "gq_from_gp": True,
        "uniform_init": True, "per_client_init": True,
    },
}


@dataclass(frozen=True)
class FedSprayOptions(Options, prefix="fedspray", profiles=PROFILES, published=PUBLISHED):
    """FedSpray's knobs (``fedspray-*``); defaults = the paper, the switches' other value = the code."""

    gnn: str = option("gcn", "personalized GNN backbone: gcn | sgc | sage", choices=BACKBONES)
    lambda1: float = option(1.0, "weight λ1 of KL(p ‖ ŷ) for the GNN (Eq. 7; 0 = Local)", low=0.0)
    lambda2: float = option(1.0, "weight λ2 of KL(ŷ ‖ p) for the encoder and proxies (Eq. 11)",
                            low=0.0)
    proxy_dim: int = option(64, "structure-proxy width d_s (= embedding width of g_e)", low=1)
    encoder_lr: float = option(0.003, "Adam lr of the encoder g_e, g_p, g_q", low=0.0)
    proxy_lr: float = option(0.02, "Adam lr of the node proxies", low=0.0)
    kd_threshold: float = option(0.0, "KD set = labelled ∪ {max_j q_ij > threshold}: 0 = all nodes "
                                 "(paper), 0.7 = code, 1 = labelled only", low=0.0, high=1.0)
    local_labelled_proxies: bool = option(False, "labelled proxies persist locally (code) instead "
                                          "of resetting to S[y] (paper)")
    gq_from_gp: bool = option(False, "local g_q starts from the global g_p (code quirk)")
    uniform_init: bool = option(False, "GNN parameters ~ U[0, 1) (code)")
    per_client_init: bool = option(False, "each client draws its own GNN init (code) instead of "
                                   "all from seed")
    zero_proxies: bool = option(False, "the S = 0 ablation (Table 3)")


ENCODER_PREFIX = "encoder."
PROXIES_KEY = "proxies"
ENCODER_SEED_OFFSET = 7919
PER_CLIENT_SEED_STRIDE = 1_000_003
NODE_PROXY_INIT = 0.1  # official code: every local node proxy starts at 0.1


def initial_global_proxies(num_classes: int, proxy_dim: int) -> torch.Tensor:
    """S_0 [d_c, d_s] with row j = 0.01·j·1 (official code; class 0 starts at 0)."""
    return 0.01 * torch.arange(num_classes, dtype=torch.float32).unsqueeze(1).expand(
        num_classes, proxy_dim).clone()


def build_encoder(num_features: int, num_classes: int, config: ClientConfig) -> FeatureStructureEncoder:
    """The encoder every party draws identically from ``seed + ENCODER_SEED_OFFSET``."""
    generator = torch.Generator().manual_seed(config.seed + ENCODER_SEED_OFFSET)
    return FeatureStructureEncoder(num_features, config.options_of(FedSprayOptions).proxy_dim,
                                   num_classes, generator=generator)


def gnn_seed(config: ClientConfig, opts: FedSprayOptions) -> int:
    """The seed the client's GNN is drawn from: ``seed``, or its own with per-client-init."""
    if not opts.per_client_init:
        return config.seed
    if config.partition_id < 0:
        raise ValueError("fedspray-per-client-init needs the client's partition-id in its config")
    return config.seed + PER_CLIENT_SEED_STRIDE * (1 + config.partition_id)


def build_gnn(num_features: int, num_classes: int, config: ClientConfig) -> PersonalGNN:
    """FedSpray's personalized GNN of the ``fedspray-gnn`` backbone."""
    opts = config.options_of(FedSprayOptions)
    return PersonalGNN(
        num_features, config.hidden, num_classes,
        backbone=opts.gnn,
        num_layers=config.num_layers,
        dropout=config.dropout,
        uniform_init=opts.uniform_init,
    )


def kd_node_mask(train_mask: torch.Tensor, projector_probs: torch.Tensor,
                 threshold: float) -> torch.Tensor:
    """Eq. 6's node set [n] (bool): all nodes if threshold <= 0, else V_L ∪ {max_j q_ij > t}."""
    if threshold <= 0:
        return torch.ones_like(train_mask)
    return train_mask | (projector_probs.max(dim=1).values > threshold)


def class_means(values: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per-class mean of ``values`` [m, d] by ``labels`` [m] -> [num_classes, d] (0 if absent)."""
    sums = values.new_zeros(num_classes, values.size(1)).index_add_(0, labels, values)
    counts = torch.bincount(labels, minlength=num_classes).to(values.dtype)
    return sums / counts.clamp(min=1).unsqueeze(1)


class FedSprayTrainer(ClientTrainer):
    """Personalized GNN + shared encoder + structure proxies, trained in two phases."""

    options_class = FedSprayOptions
    options: FedSprayOptions

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        opts = self.options
        self.lambda1 = opts.lambda1
        self.lambda2 = opts.lambda2
        self.kd_threshold = opts.kd_threshold
        self.local_labelled_proxies = opts.local_labelled_proxies
        self.gq_from_gp = opts.gq_from_gp
        self.zero_proxies = opts.zero_proxies
        proxy_dim = opts.proxy_dim
        num_features = data.num_features

        # GNN first, right after the seed: the same draw as LocalTrainer's GCN.
        torch.manual_seed(gnn_seed(config, opts))
        self.gnn = build_gnn(num_features, num_classes, config).to(device)
        self.encoder = build_encoder(num_features, num_classes, config).to(device)

        self.train_index = self.data.train_mask.nonzero().view(-1)
        self.train_labels = self.data.y[self.train_index]
        self.class_counts = torch.bincount(self.train_labels, minlength=num_classes)
        # Trainable proxies of the labelled nodes [|V_L|, d_s].
        init = 0.0 if self.zero_proxies else NODE_PROXY_INIT
        self.labelled_proxies = nn.Parameter(
            torch.full((self.train_index.numel(), proxy_dim), init, device=device))
        # The global S [d_c, d_s] this round's teacher uses (S_0 until the server sends one).
        self.global_proxies = (torch.zeros(num_classes, proxy_dim) if self.zero_proxies
                               else initial_global_proxies(num_classes, proxy_dim)).to(device)

        self.gnn_optimizer = torch.optim.Adam(
            self.gnn.parameters(), lr=config.lr,
            weight_decay=config.weight_decay)
        self.encoder_optimizer = torch.optim.Adam(
            self.encoder.parameters(), lr=opts.encoder_lr)
        self.proxy_optimizer = torch.optim.Adam([self.labelled_proxies], lr=opts.proxy_lr)
        self.metric = resolve_metric(config.metric, num_classes)

    # --- ClientTrainer: what travels ----------------------------------------------------
    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """The initial shared encoder g_e, g_p, g_q (the GNN stays local)."""
        encoder = build_encoder(num_features, num_classes, config)
        return {ENCODER_PREFIX + k: v.detach().cpu().numpy() for k, v in encoder.state_dict().items()}

    def load_payload(self, arrays: Arrays) -> None:
        """Global ω (``encoder.*``) and, from round 2 on, the global S (``proxies``)."""
        state = self.encoder.state_dict()
        for name, value in arrays.items():
            if name.startswith(ENCODER_PREFIX) and name[len(ENCODER_PREFIX):] in state:
                state[name[len(ENCODER_PREFIX):]].copy_(torch.as_tensor(value))
            elif name == PROXIES_KEY and not self.zero_proxies:
                self.global_proxies = torch.as_tensor(value, dtype=torch.float32).to(self.device).clone()

    def upload(self) -> Arrays:
        """The encoder's parameters (the GNN and the node proxies stay local)."""
        return {ENCODER_PREFIX + k: v.detach().cpu().numpy() for k, v in self.encoder.state_dict().items()}

    def class_proxies(self) -> torch.Tensor:
        """S^(k) [d_c, d_s]: class means of the labelled proxies (0 for an absent class)."""
        return class_means(self.labelled_proxies.detach(), self.train_labels, self.num_classes)

    def class_ratios(self) -> torch.Tensor:
        """a^(k) [d_c]: fraction of this client's labelled nodes in each class."""
        return self.class_counts.float() / max(int(self.train_index.numel()), 1)

    @classmethod
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfig
                         ) -> dict[str, tuple[int, ...]]:
        """The class proxies [C, d_s] and class ratios [C]."""
        proxy_dim = config.options_of(FedSprayOptions).proxy_dim
        return {"class_proxies": (num_classes, proxy_dim), "class_ratios": (num_classes,)}

    def signature(self) -> Arrays:
        """Class proxies and class ratios, which the server aligns and averages."""
        return {
            "class_proxies": self.class_proxies().cpu().numpy().astype(np.float32),
            "class_ratios": self.class_ratios().cpu().numpy().astype(np.float32),
        }

    # --- local training -------------------------------------------------------------------
    @torch.no_grad()
    def build_teacher(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher log-probabilities log p [n, d_c] and the KD node mask [n] (bool).

        Uses the global encoder and S; resets the labelled proxies to S[y] unless
        ``fedspray-local-labelled-proxies``.
        """
        data = self.data
        self.encoder.eval()
        embedding = self.encoder.embed_features(data.x)
        q = F.softmax(self.encoder.project(embedding), dim=1)
        if not self.local_labelled_proxies and not self.zero_proxies:
            self.labelled_proxies.copy_(self.global_proxies[self.train_labels])
        node_proxies = q @ self.global_proxies  # unlabelled nodes: s_i = Σ_j q_ij s_j
        node_proxies[self.train_index] = self.labelled_proxies
        log_p = F.log_softmax(self.encoder.classify(embedding, node_proxies), dim=1)
        return log_p, kd_node_mask(data.train_mask, q, self.kd_threshold)

    def train_gnn(self, epochs: int, teacher_log_p: torch.Tensor, kd_mask: torch.Tensor) -> dict[str, float]:
        """Phase 1: E Adam steps on CE over V_L + λ1·KL(p ‖ ŷ) over the KD set."""
        data = self.data
        self.gnn.train()
        ce_value = loss_value = float("nan")
        kd_value = 0.0  # stays 0 when λ1 = 0 (the term is not computed)
        for _ in range(epochs):
            self.gnn_optimizer.zero_grad()
            logits = self.gnn(data.x, data.edge_index)
            ce = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            loss = ce
            if self.lambda1 != 0:  # skipped, not multiplied by 0: λ1 = 0 is Local bit for bit
                kd = F.kl_div(F.log_softmax(logits[kd_mask], dim=1), teacher_log_p[kd_mask],
                              reduction="batchmean", log_target=True)
                loss = ce + self.lambda1 * kd
                kd_value = float(kd.detach())
            loss.backward()
            self.gnn_optimizer.step()
            ce_value, loss_value = float(ce.detach()), float(loss.detach())
        return {"train_loss": loss_value, "gnn_ce": ce_value, "gnn_kd": kd_value}

    def train_encoder(self, epochs: int) -> dict[str, float]:
        """Phase 2: E steps on CE(y, q) + λ2·KL(ŷ ‖ p) over V_L, updating ω and the proxies."""
        data = self.data
        self.gnn.eval()
        with torch.no_grad():
            student_log_p = F.log_softmax(self.gnn(data.x, data.edge_index)[self.train_index], dim=1)
        if self.gq_from_gp:
            self.encoder.projector.load_state_dict(self.encoder.classifier.state_dict())
        self.encoder.train()
        x_train = data.x[self.train_index]  # every loss term of phase 2 lives on V_L
        ce_value = kd_value = float("nan")
        for _ in range(epochs):
            self.encoder_optimizer.zero_grad()
            self.proxy_optimizer.zero_grad()
            embedding = self.encoder.embed_features(x_train)
            ce = F.cross_entropy(self.encoder.project(embedding), self.train_labels)
            log_p = F.log_softmax(self.encoder.classify(embedding, self.labelled_proxies), dim=1)
            kd = F.kl_div(log_p, student_log_p, reduction="batchmean", log_target=True)
            (ce + self.lambda2 * kd).backward()
            self.encoder_optimizer.step()
            if not self.zero_proxies:
                self.proxy_optimizer.step()
            ce_value, kd_value = float(ce.detach()), float(kd.detach())
        return {"encoder_ce": ce_value, "encoder_kd": kd_value}

    def train(self, epochs: int) -> dict[str, float]:
        """The GNN with KD from the encoder (Eq. 7), then the encoder and proxies (Eq. 11)."""
        teacher_log_p, kd_mask = self.build_teacher()
        metrics = self.train_gnn(epochs, teacher_log_p, kd_mask)
        metrics.update(self.train_encoder(epochs))
        metrics["kd_fraction"] = float(kd_mask.float().mean())
        # How good the teacher this round's KD used was (the mechanism behind FedSpray's
        # minority accuracy: docs/results/fedspray.md).
        teacher = teacher_log_p.argmax(dim=1)
        for split in ("val", "test"):
            mask = getattr(self.data, f"{split}_mask")
            hits = (teacher[mask] == self.data.y[mask]).float()
            metrics[f"teacher_{split}_acc"] = float(hits.mean()) if hits.numel() else float("nan")
        return metrics

    # --- evaluation (the personalized GNN only) -------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Standard keys plus counts for pooled (micro) overall and minority accuracy.

        Minority = test nodes whose label is not the client's majority *training* class.
        """
        self.gnn.eval()
        logits = self.gnn(self.data.x, self.data.edge_index)
        # The same figures as SupervisedTrainer (bit-equal to Local when λ1 = 0) ...
        metrics = evaluation_metrics(logits, self.data, self.metric)
        # ... and the share of test nodes predicted as the client's majority training class.
        test = self.data.test_mask
        majority = int(torch.bincount(self.data.y[self.data.train_mask]).argmax())
        predicted = (logits[test].argmax(dim=1) == majority).float()
        metrics["majority_pred_share"] = float(predicted.mean()) if predicted.numel() else float("nan")
        return metrics

    # --- local state ------------------------------------------------------------------------
    def local_state(self) -> dict[str, Any]:
        """The GNN, the labelled proxies and the optimizers."""
        return {
            "gnn": self.gnn.state_dict(),
            "labelled_proxies": self.labelled_proxies.detach().clone(),
            "gnn_optimizer": self.gnn_optimizer.state_dict(),
            "encoder_optimizer": self.encoder_optimizer.state_dict(),
            "proxy_optimizer": self.proxy_optimizer.state_dict(),
        }

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        self.gnn.load_state_dict(state["gnn"])
        with torch.no_grad():
            self.labelled_proxies.copy_(state["labelled_proxies"])
        self.gnn_optimizer.load_state_dict(state["gnn_optimizer"])
        self.encoder_optimizer.load_state_dict(state["encoder_optimizer"])
        self.proxy_optimizer.load_state_dict(state["proxy_optimizer"])


def align_proxies(class_proxies: np.ndarray, class_ratios: np.ndarray,
                  previous: np.ndarray) -> np.ndarray:
    """Eq. 15: S_j = Σ_k a_j^k S_j^k / Σ_k a_j^k.

    class_proxies [K, d_c, d_s], class_ratios [K, d_c], previous [d_c, d_s] -> [d_c, d_s].
    A client without class j (a_j^k = 0) contributes nothing to S_j; a class no client
    holds keeps its previous global proxy.
    """
    ratios = class_ratios.astype(np.float64)
    total = ratios.sum(axis=0)  # a_j [d_c]
    weighted = np.einsum("kc,kcd->cd", ratios, class_proxies.astype(np.float64))
    present = total > 0
    out = previous.astype(np.float64).copy()
    out[present] = weighted[present] / total[present, None]
    return out.astype(np.float32)


class FedSprayAggregator(Aggregator):
    """FedAvg of the encoder by training-node counts (Eq. 14) + proxy alignment (Eq. 15)."""

    options_class = FedSprayOptions
    options: FedSprayOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        num_classes, proxy_dim = initial[ENCODER_PREFIX + "classifier.weight"].shape
        zero = self.options.zero_proxies
        self.proxies = (np.zeros((num_classes, proxy_dim), np.float32) if zero
                        else initial_global_proxies(num_classes, proxy_dim).numpy())

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """FedAvg of the encoders plus the class proxies aligned across clients, sent to every client."""
        ids = sorted(updates)
        encoder = weighted_average(updates, "train", self.mix_dtype)
        ratios = np.stack([updates[c].signature["class_ratios"] for c in ids])
        self.proxies = align_proxies(
            np.stack([updates[c].signature["class_proxies"] for c in ids]), ratios, self.proxies)
        payload = dict(encoder)
        payload[PROXIES_KEY] = self.proxies.copy()
        # One global model: every client (also one that sat this round out) gets it.
        return AggregateResult(
            payloads={c: payload for c in sorted(set(self.client_ids) | set(ids))},
            metrics={"classes_with_labels": float((ratios.sum(axis=0) > 0).sum()),
                     "proxy_norm_mean": float(np.linalg.norm(self.proxies, axis=1).mean())},
        )

    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the payloads, for checkpoint/resume."""
        return {"proxies": self.proxies}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        if "proxies" in state:
            self.proxies = np.asarray(state["proxies"], dtype=np.float32)


ALGORITHM = Algorithm("fedspray", FedSprayTrainer, FedSprayAggregator, FedSprayOptions)
