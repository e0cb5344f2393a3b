"""FED-PUB (Baek et al., ICML 2023): personalized subgraph FL via functional embeddings.

Client: FED-PUB's MaskedGCN (every weight matrix ``W`` carries an elementwise
learnable mask ``M`` initialised to ones, effective weight ``W ⊙ M``; at eval
``|M| < 1e-3`` is pruned). The masks are personal: they are uploaded (as the
FED-PUB code does, so the server can run the client's real model) but never
overwritten on download. The local loss is::

    CE + l1 · Σ ||M||_1 + loc_l2 · Σ ||θ - θ_received||_2     (norm, not squared)

the last sum over the non-mask parameters, skipped in round 1 (FED-PUB code).

Server: a random proxy graph ``G_proxy`` (``fedpub-proxy-graphs`` disconnected
random blocks of ``fedpub-proxy-nodes`` nodes, edge probability
``fedpub-proxy-p`` within a block, features ~ N(0, 1) with the client feature
width), generated once from the run seed. Each client's functional embedding
is the mean over proxy nodes of its model's last GCN layer output (before the
ReLU/classifier), computed in eval mode. Then::

    S_kl = cos(e_k, e_l),   W_kl = exp(τ S_kl) / Σ_r exp(τ S_kr),   θ_k ← Σ_l W_kl θ_l

FED-PUB code defaults: τ (``norm_scale``) = 10 in parser.py (its run script
passes 3), 5 proxy graphs × 100 nodes with p_in = 0.1, l1 = loc_l2 = 1e-3,
masks initialised to ones (``--laye-mask-one --clsf-mask-one`` in the script).

Code quirk: FED-PUB adds its L1 and proximal terms over ``model.state_dict()``,
whose tensors are detached, so in the original code both terms change the
reported loss but carry no gradient. ``fedpub-reg-grad=true`` (default)
applies them as the paper describes; ``false`` reproduces the code (no-op).

The code's ``MaskedLinear`` classifier draws its bias Xavier-uniform as a [1, C]
matrix; ``fedpub-classifier-init=xavier`` does the same, the default ``glorot`` draws
the same weight and a zero bias (on Cora-10 the two are within noise, docs/results/baselines.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.utils import stochastic_blockmodel_graph

from ..core.mixing import MixingPlan, cosine_similarity, mix, row_softmax
from ..core.options import ConfigError, Options, option
from ..core.phases import AggregateResult, Arrays, ClientUpdate
from ..core.registry import Algorithm
from ..nn.masked import MaskedGCNConv, MaskedLinear, fedpub_xavier_
from .base import Aggregator
from .supervised import SupervisedTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig, RunConfig

MASK_KEY = "mask"
# secure-aggregation=ckks: the functional embedding the client computes and sends as its
# signature (as FED-PUB's own client does, ``transfer_to_server``), since the server
# cannot run an encrypted model.
EMBEDDING_KEY = "functional-embedding"
CLASSIFIER_INITS = ("glorot", "xavier")


# `fedpub-reproduce`: the profiles, the default first (docs/methods/fedpub.md).
PUBLISHED = (
    "`official` (τ 3, the L1 and proximal terms without gradient) reproduces the published "
    "FED-PUB figure (81.45, FedAux Table 1a); the default, `paper`, does not (Paper versus code, "
    "above)."
)
PROFILES: dict[str, dict[str, Any]] = {
    "paper": {"reg_grad": True},
    "official": {"reg_grad": False, "tau": 3.0},
}


@dataclass(frozen=True)
class FedPubOptions(Options, prefix="fedpub", profiles=PROFILES, published=PUBLISHED):
    """FED-PUB's knobs (``fedpub-*``); defaults = the FED-PUB code's."""

    tau: float = option(10.0, "softmax scale τ of the server's similarity weights (0 = uniform)",
                        low=0.0)
    proxy_nodes: int = option(100, "nodes per random proxy graph", low=1)
    proxy_graphs: int = option(5, "number of random proxy graphs", low=1)
    proxy_p: float = option(0.1, "edge probability within a proxy graph", low=0.0, high=1.0)
    l1: float = option(1e-3, "L1 weight on the masks", low=0.0)
    loc_l2: float = option(1e-3, "weight of the proximal ||θ - θ_received||_2 term", low=0.0)
    reg_grad: bool = option(True, "the L1 and proximal terms carry gradient (paper); false = the "
                            "code's no-op")
    classifier_init: str = option("glorot", "glorot weight, zero bias | xavier: weight and [1, C] "
                                  "bias as FED-PUB's MaskedLinear", choices=CLASSIFIER_INITS)

    def check_run(self, config: RunConfig) -> None:
        """dp=signature protects the functional embedding only where the client sends it
        (under ckks); otherwise the server computes it from weights in the clear."""
        if config.dp == "signature" and config.secure_aggregation != "ckks":
            raise ConfigError("dp=signature for algorithm=fedpub needs secure-aggregation=ckks: "
                              "without it the server computes the functional embeddings from "
                              "the weights in the clear; use dp=client")


class MaskedGCN(nn.Module):
    """FED-PUB's backbone: ``num_layers`` MaskedGCNConv of width ``hidden``, then MaskedLinear.

    x [n, in_channels], edge_index [2, m] -> logits [n, out_channels], or with
    ``embed=True`` the last convolution's output [n, hidden] (no ReLU), which
    is what FED-PUB mean-pools on the proxy graph.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, dropout: float = 0.5, cached: bool = True,
                 classifier_init: str = "glorot") -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        dims = [in_channels] + [hidden_channels] * num_layers
        self.convs = nn.ModuleList(
            MaskedGCNConv(a, b, cached=cached) for a, b in zip(dims[:-1], dims[1:])
        )
        if classifier_init not in CLASSIFIER_INITS:
            raise ValueError(f"unknown fedpub-classifier-init {classifier_init!r}; "
                             f"valid: {', '.join(CLASSIFIER_INITS)}")
        self.classifier = MaskedLinear(hidden_channels, out_channels, weight_init="glorot")
        self.classifier_init = classifier_init
        if classifier_init == "xavier":
            fedpub_xavier_(self.classifier)
        self.dropout = dropout

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for conv in cast(Iterable[MaskedGCNConv], self.convs):  # ModuleList yields nn.Module
            conv.reset_parameters()
        self.classifier.reset_parameters()
        if self.classifier_init == "xavier":
            fedpub_xavier_(self.classifier)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, embed: bool = False) -> torch.Tensor:
        """Logits [n, C], or with ``embed`` the last convolution's output [n, hidden]."""
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if embed and i == len(self.convs) - 1:
                return x
            x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return self.classifier(x)


def build_masked_gcn(num_features: int, num_classes: int, config: ClientConfig,
                     cached: bool = True) -> MaskedGCN:
    """FED-PUB's MaskedGCN with the run's width, depth, dropout and classifier init."""
    return MaskedGCN(num_features, config.hidden, num_classes,
                     num_layers=config.num_layers, dropout=config.dropout,
                     cached=cached, classifier_init=config.options_of(FedPubOptions).classifier_init)


class FedPubTrainer(SupervisedTrainer):
    """MaskedGCN with personal masks, mask L1 and a proximal pull to the received model."""

    options_class = FedPubOptions
    options: FedPubOptions
    received: dict[str, torch.Tensor] | None = None
    _proxy: tuple[MaskedGCN, Data] | None = None

    @classmethod
    def signature_shapes(cls, num_features: int, num_classes: int, config: ClientConfig
                         ) -> dict[str, tuple[int, ...]]:
        """The functional embedding [hidden] under ckks; nothing otherwise."""
        return {EMBEDDING_KEY: (config.hidden,)} if config.secure_aggregation == "ckks" else {}

    def signature(self) -> Arrays:
        """Under ``secure-aggregation=ckks`` the functional embedding [hidden] on the run's
        proxy graph (FED-PUB's client computes it too); otherwise nothing (the server
        computes it from the uploaded weights)."""
        if self.config.secure_aggregation != "ckks":
            return {}
        if self._proxy is None:  # its own uncached model: the proxy graph is not the client's
            num_features = int(self.data.num_features)
            with torch.random.fork_rng(devices=[]):
                model = build_masked_gcn(num_features, self.num_classes, self.config, cached=True)
            self._proxy = model, proxy_graph(num_features, self.options, self.config.seed)
        model, proxy = self._proxy
        model.load_state_dict(self.model.state_dict())
        return {EMBEDDING_KEY: functional_embedding(model, proxy).astype(np.float32)}

    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> MaskedGCN:
        """FED-PUB's MaskedGCN."""
        return build_masked_gcn(num_features, num_classes, config)

    def load_payload(self, arrays: Arrays) -> None:
        """The server's weights (masks stay local), also kept for the proximal term."""
        # Everything but the masks is applied (FED-PUB: skip_mask=True); the proximal anchor
        # is the received non-mask parameters.
        state = self.model.state_dict()
        self.received = {}
        for name, value in arrays.items():
            if name in state and MASK_KEY not in name:
                state[name].copy_(torch.as_tensor(value))
                self.received[name] = state[name].detach().clone()

    def extra_loss(self) -> torch.Tensor | float:
        """L1 on the masks plus the proximal ||θ - θ_received||_2 term."""
        l1, loc_l2, with_grad = self.options.l1, self.options.loc_l2, self.options.reg_grad
        # FED-PUB skips the proximal term in the first round (curr_rnd == 0).
        first_round = self.config.server_round == 1  # (0: no round given, as in unit tests)
        loss = torch.zeros((), device=self.device)
        for name, param in self.model.named_parameters():
            p = param if with_grad else param.detach()
            if MASK_KEY in name:
                loss = loss + l1 * p.abs().sum()
            elif not first_round and self.received is not None and name in self.received:
                loss = loss + loc_l2 * torch.linalg.vector_norm(p - self.received[name])
        return loss

    def train(self, epochs: int) -> dict[str, float]:
        """Local training (:meth:`extra_loss` included); also reports the masks' sparsity."""
        out = super().train(epochs)
        out["mask_sparsity"] = self.mask_sparsity()
        return out

    @torch.no_grad()
    def mask_sparsity(self) -> float:
        """Fraction of mask entries below the prune threshold (what eval zeroes)."""
        pruned = total = 0
        for name, param in self.model.named_parameters():
            if MASK_KEY in name:
                pruned += int((param.abs() < 1e-3).sum())
                total += param.numel()
        return pruned / max(total, 1)


@torch.no_grad()
def functional_embedding(model: MaskedGCN, proxy: Data) -> np.ndarray:
    """Mean over proxy nodes of ``model``'s last-conv output [hidden] (eval mode), float64."""
    model.eval()
    h = model(proxy.x, proxy.edge_index, embed=True)
    return h.mean(dim=0).double().cpu().numpy()


def proxy_graph(num_features: int, options: FedPubOptions, seed: int) -> Data:
    """FED-PUB's random proxy graph, a pure function of (seed, sizes, feature width).

    ``fedpub-proxy-graphs`` blocks × ``fedpub-proxy-nodes`` nodes, undirected edges with
    probability ``fedpub-proxy-p`` inside a block and none across; x ~ N(0, 1) [N, d].
    """
    n_graphs, n_nodes, p_in = options.proxy_graphs, options.proxy_nodes, options.proxy_p
    with torch.random.fork_rng(devices=[]):  # seeded, without disturbing the caller's RNG
        torch.manual_seed(seed)
        probs = torch.eye(n_graphs) * p_in
        edge_index = stochastic_blockmodel_graph([n_nodes] * n_graphs, probs, directed=False)
        x = torch.randn(n_nodes * n_graphs, num_features)
    return Data(x=x, edge_index=edge_index)


class FedPubAggregator(Aggregator):
    """Functional-embedding similarity on a proxy graph -> personalized weighted averages."""

    options_class = FedPubOptions
    options: FedPubOptions

    def __init__(self, config: RunConfig, client_ids: list[int], initial: Arrays) -> None:
        super().__init__(config, client_ids, initial)
        # The server rebuilds the clients' model class from config + the arrays' shapes.
        num_features = int(initial["convs.0.lin.weight"].shape[1])
        num_classes = int(initial["classifier.weight"].shape[0])
        with torch.random.fork_rng(devices=[]):
            self.model = build_masked_gcn(num_features, num_classes, config.client_config(),
                                          cached=True)
        self.model.eval()
        self.proxy = proxy_graph(num_features, self.options, config.seed)

    @torch.no_grad()
    def functional_embedding(self, arrays: Arrays) -> np.ndarray:
        """Mean over proxy nodes of the client model's last-conv output [hidden] (eval mode);
        zero where it overflows (a hostile model's, scaled round after round): similar to
        no client, instead of a NaN that would spread to every row of the softmax."""
        self.model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()})
        embedding = functional_embedding(self.model, self.proxy)
        return embedding if np.isfinite(embedding).all() else np.zeros_like(embedding)

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Personalized models mixed by the softmax of functional-embedding similarities."""
        ids = sorted(updates)
        plan = self.clear_mixing_plan(server_round, updates)
        mixed = mix(plan.matrices[0], [updates[c].arrays for c in ids], self.mix_dtype,
                    rowwise=True)
        return AggregateResult(payloads=dict(zip(ids, mixed)), diagnostics=plan.diagnostics,
                               metrics=plan.metrics)

    def mixing_plan(self, server_round: int, updates: dict[int, ClientUpdate]) -> MixingPlan:
        """The same weights from the embeddings the clients computed on the same proxy
        graph and sent as signatures (float32 there: the weights agree to ~1e-7)."""
        ids = sorted(updates)
        return self._plan(ids, np.stack([np.asarray(updates[c].signature[EMBEDDING_KEY],
                                                    dtype=np.float64) for c in ids]))

    def clear_mixing_plan(self, server_round: int, updates: dict[int, ClientUpdate]) -> MixingPlan:
        """:meth:`aggregate`'s weights: from the embeddings of the uploaded models."""
        ids = sorted(updates)
        return self._plan(ids, np.stack([self.functional_embedding(updates[c].arrays)
                                         for c in ids]))

    def _plan(self, ids: list[int], emb: np.ndarray) -> MixingPlan:
        # Unclipped, one product per client: FED-PUB's order before mixing.py, same bits.
        sim = cosine_similarity(emb, clip=False)
        weights = row_softmax(sim, self.options.tau)
        off_diag = sim[~np.eye(len(ids), dtype=bool)]
        return MixingPlan(
            ids, weights[None],
            diagnostics={"similarity": sim, "mixing": weights},
            metrics={"mean-similarity": float(off_diag.mean()) if off_diag.size else 1.0,
                     "mean-self-weight": float(np.diag(weights).mean())},
        )


ALGORITHM = Algorithm("fedpub", FedPubTrainer, FedPubAggregator, FedPubOptions)
