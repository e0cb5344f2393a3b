"""FedIIH (Yu et al., AAAI 2025): disentangled factors + hierarchical variational posteriors.

Client (:class:`FedIIHTrainer`), one round (docs/reading/fediih.md §5):

- Step A, ``local-epochs`` full-batch Adam steps on the classification loss
  (cross-entropy; BCE-with-logits and a single output for binary tasks) over all
  model parameters: DisenGCN projection ``pca`` → routing trunk → ``clf``.
- Step B, ``local-epochs`` steps on the HVGAE loss (docs/reading/fediih.md §3.7): μ/σ routing
  branches on the trunk, reparameterised sample, inner-product decoder, KL terms
  against the local factor means α̂ [K, d_k] (never uploaded) and the server's
  global factor means α̃ [K, d_k] (payload key ``"prior.alpha"``).
  ``fediih-mode="code"`` (default, the released code, docs/reading/fediih.md §9.1): this step
  moves α̂ only, so the encoder is trained by classification alone.
  ``fediih-mode="paper"``: the ELBO also trains the encoder (``pca``), with a
  separate Adam so the two objectives do not share moment estimates.
- upload: ``pca.weight`` [K·d_k, F], ``pca.bias`` [K·d_k], ``clf.weight`` [C, K·d_k],
  ``clf.bias`` [C]; signature: ``"mu"`` and ``"logvar"`` [K, d_k], node-means of the
  μ^k / ℓ^k matrices from the last Step-B forward pass. Nothing per node.

Server (:class:`FedIIHAggregator`), docs/reading/fediih.md §3.6 and §4: α̃^k = Σ_m μ̄_m^k / (M + 0.25);
per factor k, S^k = 1 − JS/ln 2 between the clients' diagonal Gaussians
(moment-matched midpoint), β^k = row-softmax(τ·S^k), and client m receives
Σ_j β^k_mj × (factor block k of pca.weight, pca.bias, clf.weight of client j).
``clf.bias`` is a uniform mean (K ≥ 2), or β-weighted too when K = 1 (docs/reading/fediih.md §9.12).

Ablations (paper Table 5 and appendix Table 6 name them but never define them;
docs/reading/fediih.md §9.18's interpretations): "w/o Dis" is ``fediih-factors=1``; "w/o HM" is
``fediih-prior="standard"`` (Step B's KL is to N(0, I), no α̂ or α̃, nothing of α̃
sent); "w/o VI" is ``fediih-inference="deterministic"`` (Step B is a plain graph
autoencoder on the μ-branch: no σ-branch, no sample, no prior; the signature is the
node-mean μ alone and S^k is the cosine of the clients' μ̄^k). In the default code
mode Step B trains no model parameter, so "w/o HM" leaves the model, the signature
and every metric bit-identical (same RNG draws): only paper mode can tell it apart.

Config: ``hidden`` is the per-factor width d_k (docs/reading/fediih.md §9.3), so the projection has
K·hidden units; ``num-layers`` is unused (``fediih-routing-layers`` sets depth).
``fediih-recon`` picks how the n² reconstruction term is computed (see
:func:`fedgraph_flwr.nn.hvgae.reconstruction_loss`); ``"auto"`` is the dense form up
to ``fediih-recon-dense-max-nodes``, above it blockwise (exact) in paper mode and
sampled in code mode, where the term trains nothing and is only logged.
``fediih-routing-kernel`` picks how routing runs: ``"auto"`` takes the fused CPU
kernel (:mod:`fedgraph_flwr.nn.fused_routing`, with ``torch.rand`` dropout masks) on
clients of at least 4,097 nodes and the sparse kernels below, where every published
figure was made; the two agree to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from ..core.mixing import MixingPlan, average, cosine_similarity, mix, row_softmax
from ..core.options import Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.disengcn import ROUTING_KERNELS, DisenGCN, routing_layer_split
from ..nn.hvgae import (
    RECON_METHODS,
    SIGMA2_ALPHA,
    SIGMA2_H,
    VariationalRoutingBranches,
    graph_autoencoder_loss,
    hvgae_loss,
    resolve_recon_method,
    standard_prior_loss,
)
from .base import Aggregator
from .supervised import SupervisedTrainer, evaluation_metrics

if TYPE_CHECKING:
    from ..config import ClientConfig

MODES = ("code", "paper")
PRIORS = ("hierarchical", "standard")
INFERENCES = ("variational", "deterministic")


# `fediih-reproduce`: the profiles, the default first (docs/methods/fediih.md).
PUBLISHED = (
    "The comparison with the paper on this page ran the default, `official` (every file in "
    "configs/ that names fediih-mode sets code)."
)
PROFILES: dict[str, dict[str, Any]] = {
    "official": {"mode": "code"},
    "paper": {"mode": "paper"},
}


@dataclass(frozen=True)
class FedIIHOptions(Options, prefix="fediih", profiles=PROFILES, published=PUBLISHED):
    """FedIIH's knobs (``fediih-*``); ``hidden`` is the per-factor width d_k."""

    mode: str = option("code", "code: the ELBO moves α̂ only (released code) | paper: it also "
                       "trains the encoder", choices=MODES)
    factors: int = option(2, "number of latent factors K", low=1)
    routing_layers: int = option(4, "routing layers L: trunk max(1, L-2), μ/σ branches 1 (L <= 2) "
                                 "or 2", low=1)
    routing_iters: int = option(6, "neighbourhood routing iterations T", low=1)
    routing_tau: float = option(1.0, "routing temperature τ_p", low=0.0, low_inclusive=False)
    tau: float = option(10.0, "softmax scale τ of the server's similarity weights (0 = uniform)",
                        low=0.0)
    prior: str = option("hierarchical", "Step B's prior: hierarchical (N(α̂, s²), α̂ tied to the "
                        "server's α̃) | standard (N(0, I); the 'w/o HM' ablation)", choices=PRIORS)
    inference: str = option("variational", "variational (μ/σ branches, sampled latent, JS similarity) "
                            "| deterministic (μ-branch autoencoder, cosine of node-mean μ; the "
                            "'w/o VI' ablation)", choices=INFERENCES)
    routing_kernel: str = option("auto", "routing kernel: auto (fused on CPU clients of at least "
                                 "4,097 nodes, else sparse) | sparse | fused (CPU only; equal to "
                                 "rounding, 4-5x faster; torch.rand dropout masks)",
                                 choices=ROUTING_KERNELS)
    recon: str = option("auto", "n² reconstruction term: auto | dense | blockwise | sampled",
                        choices=("auto", *RECON_METHODS))
    recon_dense_max_nodes: int = option(4096, "recon=auto: dense up to this many nodes; above, "
                                        "blockwise (paper mode) or sampled (code mode)", low=0)
    recon_columns: int = option(256, "recon=sampled: random columns per step (exact when >= n)",
                                low=1)
    recon_block_rows: int = option(0, "recon=blockwise: rows per block (0 = ~16M logits per "
                                   "block)", low=0)

    @property
    def hierarchical(self) -> bool:
        """Whether α̂ and the server's α̃ exist (not under either ablation)."""
        return self.prior == "hierarchical" and self.inference == "variational"
PRIOR_KEY = "prior.alpha"
MODEL_KEYS = ("pca.weight", "pca.bias", "clf.weight", "clf.bias")


def output_width(num_classes: int) -> int:
    """Binary tasks use one logit and BCE, as the released code (docs/reading/fediih.md §2.3)."""
    return 1 if num_classes == 2 else num_classes


# --------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------
class FedIIHTrainer(SupervisedTrainer):
    """DisenGCN + HVGAE client; see the module docstring for the round."""

    options_class = FedIIHOptions
    options: FedIIHOptions
    model: DisenGCN

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)  # seeds, builds model + optimizer
        opts = self.options
        self.mode = opts.mode
        self.hierarchical = opts.hierarchical
        self.deterministic = opts.inference == "deterministic"
        # In code mode no parameter receives the reconstruction's gradient (α̂ is not in
        # it), so for large clients "auto" only estimates the logged value.
        self.recon_method = resolve_recon_method(
            opts.recon, int(data.num_nodes), opts.recon_dense_max_nodes,
            needs_gradient=self.mode == "paper")
        self.recon_columns = opts.recon_columns
        self.recon_block_rows = opts.recon_block_rows
        num_factors = opts.factors
        factor_channels = config.hidden
        _, branch_layers = routing_layer_split(opts.routing_layers)
        self.branches = VariationalRoutingBranches(
            num_factors, branch_layers, opts.routing_iters,
            dropout=config.dropout, routing_tau=opts.routing_tau,
            routing_kernel=opts.routing_kernel,
        ).to(device)
        # α̂ ~ N(0, 1), local and persistent; α̃ ~ N(0, I) until the server sends one
        # (docs/reading/fediih.md §9.6).
        self.alpha_local = nn.Parameter(torch.randn(num_factors, factor_channels, device=device))
        self.alpha_global = torch.randn(num_factors, factor_channels, device=device)
        lr, wd = config.lr, config.weight_decay
        self.vae_optimizer = torch.optim.Adam([self.alpha_local], lr=lr, weight_decay=wd)
        self.encoder_optimizer = (
            torch.optim.Adam(self.model.pca.parameters(), lr=lr, weight_decay=wd)
            if self.mode == "paper" else None
        )
        self.posterior_mean: torch.Tensor | None = None  # [K, d_k]
        self.posterior_logvar: torch.Tensor | None = None  # [K, d_k]

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> DisenGCN:
        """The DisenGCN encoder and classifier."""
        opts = config.options_of(FedIIHOptions)
        trunk_layers, _ = routing_layer_split(opts.routing_layers)
        return DisenGCN(
            num_features, config.hidden, output_width(num_classes),
            num_factors=opts.factors, trunk_layers=trunk_layers,
            iterations=opts.routing_iters, dropout=config.dropout,
            routing_tau=opts.routing_tau, routing_kernel=opts.routing_kernel,
        )

    # --- losses ---------------------------------------------------------------------
    def classification_loss(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """CE over the masked nodes, or BCE-with-logits when the model has one output."""
        y = self.data.y[mask]
        if logits.size(1) == 1:
            return F.binary_cross_entropy_with_logits(logits[mask, 0], y.to(logits.dtype))
        return F.cross_entropy(logits[mask], y)

    def encode(self) -> tuple[torch.Tensor, torch.Tensor]:
        """μ, ℓ [n, K, d_k] from the trunk and the μ/σ branches (current train/eval mode)."""
        h = self.model.embed(self.data.x, self.data.edge_index)
        return self.branches(h, self.data.edge_index)

    def encode_mean(self) -> torch.Tensor:
        """μ [n, K, d_k] alone, from the μ-branch (the deterministic encoder)."""
        h = self.model.embed(self.data.x, self.data.edge_index)
        return self.branches.mean(h, self.data.edge_index)

    def step_b_loss(self, train_encoder: bool
                    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor | None]:
        """Step B's terms and the (μ, ℓ) they came from (ℓ is None when deterministic).

        Without ``train_encoder`` the encoder's graph is skipped (code mode: it gets no
        ELBO gradient); α̂'s part of the loss is still differentiated.
        """
        recon = (self.data.edge_index, self.recon_method, self.recon_columns, self.recon_block_rows)
        if self.deterministic:
            with torch.set_grad_enabled(train_encoder):
                mu = self.encode_mean()
            return graph_autoencoder_loss(mu, *recon), mu, None
        with torch.set_grad_enabled(train_encoder):
            mu, logvar = self.encode()
        if self.hierarchical:
            return hvgae_loss(mu, logvar, self.alpha_local, self.alpha_global, *recon), mu, logvar
        return standard_prior_loss(mu, logvar, *recon), mu, logvar

    # --- ClientTrainer --------------------------------------------------------------
    def load_payload(self, arrays: Arrays) -> None:
        """The shared model and, if sent, the server's prior α̃."""
        super().load_payload(arrays)
        if PRIOR_KEY in arrays:
            self.alpha_global = torch.as_tensor(
                np.asarray(arrays[PRIOR_KEY]), dtype=torch.float32, device=self.device).clone()

    def train(self, epochs: int) -> dict[str, float]:
        """Cross-entropy on the classifier and the HVGAE ELBO on α̂ (and in paper mode the encoder)."""
        self.model.train()
        self.branches.train()
        data = self.data
        cls_loss = float("nan")
        for _ in range(epochs):  # Step A: classification, all model parameters
            self.optimizer.zero_grad()
            loss = self.classification_loss(self.model(data.x, data.edge_index), data.train_mask)
            loss.backward()
            self.optimizer.step()
            cls_loss = float(loss.detach())
        terms: dict[str, torch.Tensor] = {}
        train_encoder = self.encoder_optimizer is not None
        for _ in range(epochs):  # Step B: HVGAE
            self.vae_optimizer.zero_grad()
            if self.encoder_optimizer is not None:
                self.encoder_optimizer.zero_grad()
            terms, mu, logvar = self.step_b_loss(train_encoder)
            # Without α̂ (either ablation) code mode leaves nothing for the loss to train.
            if terms["loss"].requires_grad:
                terms["loss"].backward()
                self.vae_optimizer.step()
                if self.encoder_optimizer is not None:
                    self.encoder_optimizer.step()
            self.posterior_mean = mu.detach().mean(0)
            self.posterior_logvar = None if logvar is None else logvar.detach().mean(0)
        out = {"train_loss": cls_loss}
        out.update({f"hvgae_{k}": float(v.detach()) for k, v in terms.items()})
        return out

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Scores of the current model (BCE when the classifier has one output)."""
        self.model.eval()
        data = self.data
        logits = self.model(data.x, data.edge_index)
        val_loss = (float(self.classification_loss(logits, data.val_mask))
                    if int(data.val_mask.sum()) else float("nan"))
        if logits.size(1) == 1:  # two columns so that argmax and the margin both work
            logits = torch.cat([torch.zeros_like(logits), logits], dim=1)
        return evaluation_metrics(logits, data, self.metric, val_loss=val_loss)

    @classmethod
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfig
                         ) -> dict[str, tuple[int, ...]]:
        """μ [K, d_k], and ℓ [K, d_k] unless the encoder is deterministic."""
        opts = config.options_of(FedIIHOptions)
        shape = (opts.factors, config.hidden)
        return {"mu": shape} if opts.inference == "deterministic" else {"mu": shape, "logvar": shape}

    def signature(self) -> Arrays:
        """Per-factor node-means of μ and ℓ, each [K, d_k] float32 (nothing per node);
        μ's alone under the deterministic encoder."""
        if self.posterior_mean is None:
            # Not trained this round (not in the engine's flow): one training-mode pass.
            self.model.train()
            self.branches.train()
            with torch.no_grad():
                _, mu, logvar = self.step_b_loss(train_encoder=False)
            self.posterior_mean = mu.mean(0)
            self.posterior_logvar = None if logvar is None else logvar.mean(0)
        signature = {"mu": self.posterior_mean.cpu().numpy().astype(np.float32)}
        if self.posterior_logvar is not None:
            signature["logvar"] = self.posterior_logvar.cpu().numpy().astype(np.float32)
        return signature

    def local_state(self) -> dict[str, Any]:
        """The base state plus α̂, α̃ and the ELBO's optimizers."""
        state = super().local_state()
        state.update({
            "alpha_local": self.alpha_local.detach().clone(),
            "alpha_global": self.alpha_global.detach().clone(),
            "vae_optimizer": self.vae_optimizer.state_dict(),
        })
        if self.encoder_optimizer is not None:
            state["encoder_optimizer"] = self.encoder_optimizer.state_dict()
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        super().load_local_state(state)
        with torch.no_grad():
            self.alpha_local.copy_(state["alpha_local"])
        self.alpha_global = state["alpha_global"].to(self.device).clone()
        self.vae_optimizer.load_state_dict(state["vae_optimizer"])
        if self.encoder_optimizer is not None and "encoder_optimizer" in state:
            self.encoder_optimizer.load_state_dict(state["encoder_optimizer"])


# --------------------------------------------------------------------------------------
# Server math (pure numpy, float64)
# --------------------------------------------------------------------------------------
def global_factor_means(mu: np.ndarray) -> np.ndarray:
    """α̃ = Σ_m μ̄_m / (M + σ²_H/σ²_α); mu [M, K, d_k] -> [K, d_k] (Eq. 12, docs/reading/fediih.md §3.6)."""
    mu = np.asarray(mu, dtype=np.float64)
    return mu.sum(0) / (mu.shape[0] + SIGMA2_H / SIGMA2_ALPHA)


def gaussian_js(mu_a: np.ndarray, logvar_a: np.ndarray,
                mu_b: np.ndarray, logvar_b: np.ndarray) -> np.ndarray:
    """JS between diagonal Gaussians via the moment-matched midpoint (docs/reading/fediih.md §4.1).

    JS = ½[KL(A‖M̄) + KL(B‖M̄)], M̄ = N((μ_A+μ_B)/2, (σ²_A+σ²_B)/2), each KL summed
    over the last axis. Inputs broadcast; output drops the last axis. Not bounded by ln 2.

    Evaluated in the equivalent closed form
    JS = ¼ Σ [2 log((σ²_A+σ²_B)/2) − ℓ_A − ℓ_B + (μ_A−μ_B)²/(σ²_A+σ²_B)]
    (the two KLs' trace terms sum to a constant 2 that cancels the −1s), one log and
    one division per element instead of two of each: the server's pairwise cost.
    """
    mu_a, mu_b = np.asarray(mu_a, np.float64), np.asarray(mu_b, np.float64)
    logvar_a, logvar_b = np.asarray(logvar_a, np.float64), np.asarray(logvar_b, np.float64)
    var_sum = np.exp(logvar_a) + np.exp(logvar_b)
    diff = mu_a - mu_b
    np.square(diff, out=diff)
    mahalanobis = (diff / var_sum).sum(-1)
    np.log(var_sum, out=var_sum)
    d = var_sum.shape[-1]
    return 0.25 * (2.0 * var_sum.sum(-1) - 2.0 * d * math.log(2.0)
                   - logvar_a.sum(-1) - logvar_b.sum(-1) + mahalanobis)


# Pairwise JS works on [rows, M, d_k] temporaries; rows are chosen so that one holds
# about this many float64s (64 MB), keeping server memory linear in M·d_k, not M²·d_k.
JS_BLOCK_ELEMENTS = 8 * 1024 * 1024


def factor_similarity(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    """S^k_mj = 1 − JS(q_m^k, q_j^k)/ln 2; mu, logvar [M, K, d_k] -> S [K, M, M].

    Computed in blocks of client rows (each entry exactly as the unblocked formula).
    """
    mu = np.asarray(mu, np.float64).transpose(1, 0, 2)  # [K, M, d_k]
    logvar = np.asarray(logvar, np.float64).transpose(1, 0, 2)
    num_factors, num_clients, d_k = mu.shape
    rows = max(1, JS_BLOCK_ELEMENTS // max(1, num_clients * d_k))
    js = np.empty((num_factors, num_clients, num_clients))
    for k in range(num_factors):
        for start in range(0, num_clients, rows):
            block = slice(start, start + rows)
            js[k, block] = gaussian_js(mu[k, block, None], logvar[k, block, None],
                                       mu[k, None], logvar[k, None])
    return 1.0 - js / math.log(2.0)


# The float32 path's row blocks are cache-sized: its ~5 elementwise passes then stay in
# L2/L3 instead of streaming 64 MB temporaries through memory (0.38 s -> 0.22 s at M=1000).
JS_BLOCK_ELEMENTS_FLOAT32 = 1024 * 1024


def factor_similarity_float32(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    """:func:`factor_similarity` in float32 with torch (``server-mix-dtype=float32``).

    JS is symmetric, so only row block × (columns from the block on) is evaluated and
    the upper triangle mirrored: half the pairs. Per element only the pairwise part,
    2·log(σ²_a+σ²_b) + (μ_a−μ_b)²/(σ²_a+σ²_b), is summed; Σℓ_a, Σℓ_b and the constant
    are added per pair afterwards. torch runs the logs vectorised on every core
    (numpy's ufuncs use one). Agrees with the float64 form to ~1e-5 in S
    (tests/test_fediih.py). Returns S [K, M, M] float64, S(m, m) = 1 exactly.
    """
    mu_t = torch.as_tensor(np.asarray(mu, np.float32)).transpose(0, 1).contiguous()  # [K, M, d_k]
    logvar_t = torch.as_tensor(np.asarray(logvar, np.float32)).transpose(0, 1).contiguous()
    num_factors, num_clients, d_k = mu_t.shape
    var_t = logvar_t.exp()
    logvar_sum = logvar_t.double().sum(-1)  # [K, M]
    rows = max(1, JS_BLOCK_ELEMENTS_FLOAT32 // max(1, num_clients * d_k))
    pairwise = torch.zeros(num_factors, num_clients, num_clients, dtype=torch.float64)
    with torch.no_grad():
        for k in range(num_factors):
            for start in range(0, num_clients, rows):
                stop = min(start + rows, num_clients)
                var_sum = var_t[k, start:stop, None] + var_t[k, None, start:]  # [r, M-start, d_k]
                term = (mu_t[k, start:stop, None] - mu_t[k, None, start:]).square_().div_(var_sum)
                term.add_(var_sum.log_(), alpha=2.0)
                pairwise[k, start:stop, start:] = term.sum(-1)
    js = 0.25 * (pairwise - logvar_sum[:, :, None] - logvar_sum[:, None, :]
                 + 2.0 * d_k * math.log(0.5))
    js = torch.triu(js, 1)
    js = js + js.transpose(1, 2)  # mirror the upper triangle; JS(q, q) = 0 exactly
    return (1.0 - js / math.log(2.0)).numpy()


def factor_block(arrays: Arrays, factor: int, d_k: int) -> Arrays:
    """Factor ``factor``'s block of a client's model: rows k·d_k:(k+1)·d_k of
    ``pca.weight`` and ``pca.bias``, the same columns of ``clf.weight`` (views)."""
    rows = slice(factor * d_k, (factor + 1) * d_k)
    return {"pca.weight": arrays["pca.weight"][rows], "pca.bias": arrays["pca.bias"][rows],
            "clf.weight": arrays["clf.weight"][:, rows]}


class FedIIHAggregator(Aggregator):
    """Per-factor JS similarity → personalised block-wise mixing, plus α̃ for every client."""

    options_class = FedIIHOptions
    options: FedIIHOptions

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Per-factor personalized mixing by the similarity of the clients' latent (μ, log σ²)."""
        ids, similarity, beta, alpha = self._factor_weights(updates)
        num_clients, num_factors = len(ids), beta.shape[0]
        d_k = updates[ids[0]].signature["mu"].shape[-1]
        prior = {} if alpha is None else {PRIOR_KEY: alpha}

        uploads = [updates[c].arrays for c in ids]
        # Client m's factor-k block: Σ_j β^k_mj × client j's factor-k block.
        blocks = [mix(beta[k], [factor_block(a, k, d_k) for a in uploads], self.mix_dtype)
                  for k in range(num_factors)]
        biases = [{"clf.bias": a["clf.bias"]} for a in uploads]
        if num_factors == 1:  # K = 1: the whole model is similarity-weighted
            clf_bias = [m["clf.bias"] for m in mix(beta[0], biases, self.mix_dtype)]
        else:  # shared by the factors: a plain mean
            clf_bias = [average(None, biases, self.mix_dtype)["clf.bias"]] * num_clients
        others = average(None, [{n: v for n, v in a.items() if n not in MODEL_KEYS} for a in uploads],
                         self.mix_dtype)

        payloads: dict[int, Arrays] = {}
        for m, c in enumerate(ids):
            payloads[c] = {
                "pca.weight": np.concatenate([b[m]["pca.weight"] for b in blocks]),
                "pca.bias": np.concatenate([b[m]["pca.bias"] for b in blocks]),
                "clf.weight": np.concatenate([b[m]["clf.weight"] for b in blocks], axis=1),
                "clf.bias": clf_bias[m],
                **others,
                **prior,
            }
        return AggregateResult(payloads=payloads, diagnostics=self._diagnostics(similarity),
                               metrics=self._metrics(similarity, beta, alpha))

    def mixing_plan(self, server_round: int, updates: dict[int, ClientUpdate]) -> MixingPlan:
        """Matrices β^0..β^{F-1} and a uniform one; each element of pca.weight, pca.bias
        and clf.weight picks its factor's β, clf.bias (F ≥ 2) and any other array the
        uniform mean; α̃ travels in the clear (it is computed from the signatures)."""
        ids, similarity, beta, alpha = self._factor_weights(updates)
        num_clients, num_factors = len(ids), beta.shape[0]
        d_k = updates[ids[0]].signature["mu"].shape[-1]
        uniform = np.full((1, num_clients, num_clients), 1.0 / num_clients)
        factor_of = np.arange(num_factors * d_k) // d_k  # the factor of each pca row
        pca_shape = self.initial["pca.weight"].shape
        clf_shape = self.initial["clf.weight"].shape
        groups: dict[str, int | np.ndarray] = {
            "pca.weight": np.broadcast_to(factor_of[:, None], pca_shape).copy(),
            "pca.bias": factor_of.copy(),
            "clf.weight": np.broadcast_to(factor_of[None, :], clf_shape).copy(),
            "clf.bias": 0 if num_factors == 1 else num_factors,
        }
        groups.update({n: num_factors for n in self.initial if n not in MODEL_KEYS})
        return MixingPlan(ids, np.concatenate([beta, uniform]), groups,
                          clear={} if alpha is None else {c: {PRIOR_KEY: alpha} for c in ids},
                          diagnostics=self._diagnostics(similarity),
                          metrics=self._metrics(similarity, beta, alpha))

    def _factor_weights(self, updates: dict[int, ClientUpdate]
                        ) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray | None]:
        """ids, per-factor similarity S [F, M, M], β = row-softmax(τ S), α̃ (float32; None
        under either ablation, which has no hierarchical prior)."""
        ids = sorted(updates)
        mu = np.stack([updates[c].signature["mu"] for c in ids]).astype(np.float64)  # [M, K, d_k]
        tau = self.options.tau
        if self.options.inference == "deterministic":
            similarity = np.stack([cosine_similarity(mu[:, k]) for k in range(mu.shape[1])])
            return ids, similarity, row_softmax(similarity, tau), None
        logvar = np.stack([updates[c].signature["logvar"] for c in ids]).astype(np.float64)
        if self.mix_dtype == np.float32:
            # float32 mode: the pairwise JS in float32 too (its cost dominates), the
            # softmax (still float64) with torch on every core.
            similarity = factor_similarity_float32(mu, logvar)  # [K, M, M]
            beta = torch.softmax(tau * torch.from_numpy(similarity), dim=-1).numpy()
        else:
            similarity = factor_similarity(mu, logvar)
            beta = row_softmax(similarity, tau)
        alpha = global_factor_means(mu).astype(np.float32) if self.options.hierarchical else None
        return ids, similarity, beta, alpha

    @staticmethod
    def _diagnostics(similarity: np.ndarray) -> dict[str, np.ndarray]:
        return {f"similarity.{k}": similarity[k] for k in range(similarity.shape[0])}

    @staticmethod
    def _metrics(similarity: np.ndarray, beta: np.ndarray, alpha: np.ndarray | None
                 ) -> dict[str, float]:
        num_factors, num_clients = beta.shape[0], beta.shape[1]
        off_diag = ~np.eye(num_clients, dtype=bool)
        metrics = {} if alpha is None else {"alpha-norm": float(np.linalg.norm(alpha))}
        for k in range(num_factors):
            metrics[f"similarity-offdiag-mean.{k}"] = (
                float(similarity[k][off_diag].mean()) if num_clients > 1 else 1.0)
            metrics[f"beta-self-mean.{k}"] = float(np.diag(beta[k]).mean())
        return metrics


ALGORITHM = Algorithm("fediih", FedIIHTrainer, FedIIHAggregator, FedIIHOptions)
