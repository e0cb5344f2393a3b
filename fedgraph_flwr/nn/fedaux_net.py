"""The FedAux client model: (masked) L-layer GCN, APV soft-sorting branch, classifier head.

Forward (docs/reading/fedaux.md §2.3), x [N, d], edge_index [2, m] -> logits [N, C]::

    h = dropout(relu(convL(... dropout(relu(conv1(x))))))  h [N, d']   (L = 2 by default)
    s = score(h, apv)                                        s [N]
    z = Σ_j κ(s_i, s_j) h_j / Σ_j κ(s_i, s_j)               z [N, d']  (variant "soft")
      | unsort(Conv1D(sort(s ⊙ h)))                                    (variant "hard")
    logits = classifier([h ‖ z])                             [N, C]

The classifier is one linear layer 2d' -> C (``head="linear"``, the reference code) or
the paper's "simple MLP" (``head="mlp"``: 2d' -> d', ReLU, dropout, d' -> C, the
two-layer head left commented out in the reference code). ``classifier_init="xavier"``
(default) initialises the head as FED-PUB's ``MaskedLinear`` does in the reference code
(Xavier-uniform weight *and* bias, the bias as a [1, C] matrix); ``"torch"`` keeps
``nn.Linear``'s default (weights 2.4× smaller for d' = 256, biases within ±1/sqrt(2d')).
On the reference partitions the Xavier head scores 0.9 / 0.7 / 2.2 points higher on
Cora-5 / 10 / 20 (docs/results/fedaux.md, ``configs/paper/fedaux-cora-init.yaml``); the
paper is silent on it.

Parameter names: ``conv1.*`` ... ``conv{L}.*`` (conv1: d -> d', the others d' -> d';
the paper sweeps L in {1, 2, 3}, Fig. 6), ``apv`` [d'], ``classifier.*`` (``classifier.0.*``
and ``classifier.3.*`` for the MLP head), ``hard_conv.*`` (hard variant only); in the
masked variant every mask is called ``*.mask``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .apv_kernel import KERNEL_IMPLS, SCORE_MODES, HardSortConv1d, apv_scores, kernel_smooth
from .csr_gcn_conv import CSRGCNConv
from .fast_dropout import uniform_mask_dropout
from .masked import MaskedGCNConv, MaskedLinear, fedpub_xavier_

VARIANTS = ("soft", "hard")
APV_INITS = ("normal", "uniform")
HEADS = ("linear", "mlp")
CLASSIFIER_INITS = ("torch", "xavier")


class FedAuxNet(nn.Module):
    """GCN backbone of width ``hidden`` (= APV dimension d') plus the APV branch."""

    #: ``forward``/``embed`` take a CSR ``adj_t`` as well as ``edge_index`` (GCNConv does).
    accepts_sparse_adjacency = True

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        num_classes: int,
        dropout: float = 0.5,
        masked: bool = True,
        variant: str = "soft",
        score_mode: str = "cosine",
        sigma: float = 1.0,
        kernel_impl: str = "auto",
        dense_max_nodes: int = 4096,
        apv_init: str = "normal",
        hard_kernel_size: int = 3,
        head: str = "linear",
        classifier_init: str = "xavier",
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown fedaux-variant {variant!r}; valid: {', '.join(VARIANTS)}")
        if score_mode not in SCORE_MODES:
            raise ValueError(f"unknown fedaux-score {score_mode!r}; valid: {', '.join(SCORE_MODES)}")
        if kernel_impl not in KERNEL_IMPLS:
            raise ValueError(f"unknown fedaux-kernel {kernel_impl!r}; valid: {', '.join(KERNEL_IMPLS)}")
        if apv_init not in APV_INITS:
            raise ValueError(f"unknown fedaux-apv-init {apv_init!r}; valid: {', '.join(APV_INITS)}")
        if head not in HEADS:
            raise ValueError(f"unknown fedaux-head {head!r}; valid: {', '.join(HEADS)}")
        if classifier_init not in CLASSIFIER_INITS:
            raise ValueError(f"unknown fedaux-classifier-init {classifier_init!r}; "
                             f"valid: {', '.join(CLASSIFIER_INITS)}")
        if sigma <= 0:
            raise ValueError("fedaux-sigma must be > 0")
        if num_layers < 1:
            raise ValueError("num-layers must be >= 1")
        self.dropout = dropout
        self.variant = variant
        self.score_mode = score_mode
        self.sigma = sigma
        self.kernel_impl = kernel_impl
        self.dense_max_nodes = dense_max_nodes
        self.apv_init = apv_init
        self.classifier_init = classifier_init
        self.num_layers = num_layers
        # cached=True: a trainer only ever sees its own fixed subgraph. Named conv1..convL
        # (not a ModuleList) so the default L = 2 keeps the reference code's names.
        conv = MaskedGCNConv if masked else CSRGCNConv
        for i in range(1, num_layers + 1):
            setattr(self, f"conv{i}", conv(in_channels if i == 1 else hidden_channels,
                                           hidden_channels, cached=True))
        self.apv = nn.Parameter(torch.empty(hidden_channels))
        self.hard_conv = HardSortConv1d(hidden_channels, hard_kernel_size) if variant == "hard" else None
        linear = MaskedLinear if masked else nn.Linear
        if head == "linear":
            self.classifier = linear(2 * hidden_channels, num_classes)
        else:
            self.classifier = nn.Sequential(
                linear(2 * hidden_channels, hidden_channels), nn.ReLU(), nn.Dropout(dropout),
                linear(hidden_channels, num_classes))
        self.reset_apv()
        if classifier_init != "torch":  # the layers' own init already is torch's default
            self.reset_classifier()

    def reset_apv(self) -> None:
        """a ~ N(0, I) (paper) or U(0, 1) (reference code's MaskedGCN variants)."""
        with torch.no_grad():
            if self.apv_init == "normal":
                self.apv.normal_()
            else:
                self.apv.uniform_()

    def reset_classifier(self) -> None:
        """``nn.Linear``'s default, or Xavier-uniform weight and [1, C]-shaped bias (FED-PUB)."""
        for layer in self.classifier.modules():
            if not isinstance(layer, (MaskedLinear, nn.Linear)):
                continue
            layer.reset_parameters()
            if self.classifier_init == "xavier":
                fedpub_xavier_(layer)

    def convs(self) -> list[nn.Module]:
        """The convolution layers in order."""
        return [getattr(self, f"conv{i}") for i in range(1, self.num_layers + 1)]

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for conv in self.convs():
            conv.reset_parameters()
        self.reset_apv()
        if self.hard_conv is not None:
            self.hard_conv.reset_parameters()
        self.reset_classifier()

    def embed(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Post-ReLU, post-dropout node embeddings h [N, d']. A CSR ``adj_t`` (a large
        client's) draws the dropout masks with ``torch.rand`` (``fast_dropout``)."""
        large = edge_index.layout == torch.sparse_csr
        h = x
        for conv in self.convs():
            h = F.relu(conv(h, edge_index))
            if large:
                h = uniform_mask_dropout(h, self.dropout, self.training)
            else:
                h = F.dropout(h, p=self.dropout, training=self.training)
        return h

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        """Node coordinates on the APV axis, s [N]."""
        return apv_scores(h, self.apv, self.score_mode)

    def aggregate(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The APV branch's output z [N, d'] (soft sorting or the hard ablation)."""
        if self.hard_conv is not None:
            return self.hard_conv(h, s)
        return kernel_smooth(s, h, self.sigma, self.kernel_impl, self.dense_max_nodes)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [N, C] from embeddings h [N, d']: classifier on [h ‖ z]."""
        z = self.aggregate(h, self.scores(h))
        return self.classifier(torch.cat([h, z], dim=1))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Logits [n, C] of the head on :meth:`embed`."""
        return self.head(self.embed(x, edge_index))
