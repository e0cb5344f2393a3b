"""FedDEP's generator ``LocalDGen``: missing-neighbour counts and embeddings, and the inner
classifier that reads them (``zkzhangke/FedDEP`` ``gfl/model/feddep.py``).

Shapes: n nodes, d features, e = embedding width (also the hidden width), g = latent width,
P = ``num_pred`` slots::

    z      = encoder(x, edge_index)               [n, g]    SAGE(d -> e) -> ReLU -> dropout -> SAGE(e -> g)
    n̂      = relu(Linear(g -> 1)(z))              [n]       missing-neighbour count (``reg_model``)
    ĝ      = gen(z + ε), ε ~ N(0, I)              [n, P, e] FedSage+'s fGen with e outputs per slot
    z̄      = mean_p(ĝ_p · 1[p < clip(round(n̂), 0, P)])   [n, e]  (``MendGraph``: masked slots count as 0)
    logits = classifier(x, z̄, edge_index)        [n, C]    :class:`DepClassifier`

The noise ε is drawn on every forward, training and evaluation (both codes' ``Sampling``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .feddep_classifier import DepClassifier
from .neighgen import FeatureGenerator, TwoLayerGNN


def mended_mean(generated: torch.Tensor, degree: torch.Tensor) -> torch.Tensor:
    """z̄ [n, e]: the mean over all P slots of ĝ [n, P, e], slots p >= round(n̂) zeroed."""
    num_pred = generated.size(1)
    counts = torch.round(degree.detach()).clamp(0, num_pred)
    used = torch.arange(num_pred, device=generated.device).view(1, -1) < counts.view(-1, 1)
    return (generated * used.unsqueeze(-1)).mean(dim=1)


class DepGenerator(nn.Module):
    """Encoder + count regressor + embedding generator + inner classifier.

    Parameter names: ``encoder.*``, ``reg.*``, ``gen.*``, ``classifier.*``.
    """

    def __init__(self, num_features: int, num_classes: int, emb_dim: int = 128,
                 latent_dim: int = 128, num_pred: int = 5, dropout: float = 0.5,
                 branch: str = "chained") -> None:
        super().__init__()
        if min(num_features, num_classes, emb_dim, latent_dim, num_pred) < 1:
            raise ValueError("num_features, num_classes, emb_dim, latent_dim and num_pred must be >= 1")
        self.num_pred = num_pred
        self.encoder = TwoLayerGNN(num_features, emb_dim, latent_dim, "sage", dropout)
        self.reg = nn.Linear(latent_dim, 1)
        self.gen = FeatureGenerator(latent_dim, num_pred, emb_dim, dropout)
        self.classifier = DepClassifier(num_features, emb_dim, emb_dim, num_classes, 2, dropout,
                                        branch)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for module in (self.encoder, self.reg, self.gen, self.classifier):
            module.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [n, d], edge_index [2, m] -> (n̂ [n] >= 0, ĝ [n, P, e], logits [n, C])."""
        z = self.encoder(x, edge_index)
        degree = F.relu(self.reg(z)).view(-1)
        generated = self.gen(z)
        logits = self.classifier(x, mended_mean(generated, degree), edge_index)
        return degree, generated, logits
