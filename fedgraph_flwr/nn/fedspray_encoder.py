"""FedSpray's global feature-structure encoder g(ω) = {g_e, g_p, g_q} (Fu et al., KDD 2024).

- ``embed`` (g_e):      e_i = ReLU(x_i W_e + b_e),          x [n, d_x] -> e [n, d_s]
- ``classifier`` (g_p): p_i = softmax((e_i + s_i) W_p + b_p), Combine = addition, so the
  embedding width must equal the proxy width d_s
- ``projector`` (g_q):  q_i = softmax(e_i W_q + b_q),       same shape as g_p, no proxy

Every layer's weight and bias are drawn from U(-1/√d_out, 1/√d_out), where d_out is the
layer's output width (official code). The modules return logits; callers apply
(log-)softmax where the losses need it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class FeatureStructureEncoder(nn.Module):
    """The shared encoder: one linear layer each for g_e, g_p and g_q.

    Parameter names (what FedSpray uploads): ``embed.{weight,bias}`` [d_s, d_x] / [d_s],
    ``classifier.{weight,bias}`` [d_c, d_s] / [d_c], ``projector.{weight,bias}``
    [d_c, d_s] / [d_c].
    """

    def __init__(self, in_channels: int, proxy_dim: int, num_classes: int,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.embed = nn.Linear(in_channels, proxy_dim)
        self.classifier = nn.Linear(proxy_dim, num_classes)
        self.projector = nn.Linear(proxy_dim, num_classes)
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """U(±1/√d_out) for every weight and bias (official FedSpray code)."""
        for layer in (self.embed, self.classifier, self.projector):
            bound = 1.0 / math.sqrt(layer.out_features)
            with torch.no_grad():
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)

    def embed_features(self, x: torch.Tensor) -> torch.Tensor:
        """g_e: x [n, d_x] -> e [n, d_s]."""
        return F.relu(self.embed(x))

    def classify(self, embedding: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
        """g_p(Combine(e, s)) logits [n, d_c] from e [n, d_s] and node proxies s [n, d_s]."""
        return self.classifier(embedding + proxies)

    def project(self, embedding: torch.Tensor) -> torch.Tensor:
        """g_q(e) logits [n, d_c] from e [n, d_s]."""
        return self.projector(embedding)

    def forward(self, x: torch.Tensor, proxies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g_p logits, g_q logits), both [n, d_c], for x [n, d_x] and proxies [n, d_s]."""
        embedding = self.embed_features(x)
        return self.classify(embedding, proxies), self.project(embedding)
