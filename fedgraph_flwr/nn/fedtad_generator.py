"""FedTAD's class-conditional generator of pseudo-node features, and its pseudo graph."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: The official generator's hidden widths (after the noise ⊕ class embedding input).
HIDDEN_DIMS = (64, 128, 256)


class ConditionalGenerator(nn.Module):
    """x = MLP([embed(c), z]): a class embedding [C, C] concatenated with noise z, three
    Linear → Tanh → Dropout layers (64, 128, 256), then a linear map to ``out_channels``.

    z [n, noise_dim], c [n] (class ids) -> features [n, out_channels].
    """

    def __init__(self, noise_dim: int, num_classes: int, out_channels: int, dropout: float = 0.0) -> None:
        super().__init__()
        if noise_dim < 1 or num_classes < 1 or out_channels < 1:
            raise ValueError("noise_dim, num_classes and out_channels must be >= 1")
        self.noise_dim = noise_dim
        self.class_embedding = nn.Embedding(num_classes, num_classes)
        layers: list[nn.Module] = []
        dims = (noise_dim + num_classes, *HIDDEN_DIMS)
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(d_in, d_out), nn.Tanh(), nn.Dropout(dropout)]
        self.hidden = nn.Sequential(*layers)
        self.out = nn.Linear(HIDDEN_DIMS[-1], out_channels)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        self.class_embedding.reset_parameters()
        for module in self.hidden:
            if isinstance(module, nn.Linear):
                module.reset_parameters()
        self.out.reset_parameters()

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Features [n, out_channels] of pseudo nodes of classes ``c``."""
        return self.out(self.hidden(torch.cat((self.class_embedding(c), z), dim=-1)))


def knn_pseudo_graph(features: torch.Tensor, k: int) -> torch.Tensor:
    """edge_index [2, m] of the pseudo graph over ``features`` [n, d]: each node linked to
    its ``k`` most cosine-similar nodes (itself included, as the official top-k over the
    full similarity matrix), made symmetric, plus one self-loop per node (the official
    code adds a second, which GCNConv's normalisation folds into one).

    n is the generator's batch (``fedtad-num-gen``, 100), never a client's graph, so the
    [n, n] similarity is the official construction at its own small size."""
    n = features.size(0)
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    unit = F.normalize(features.detach(), p=2, dim=1)
    top = torch.topk(unit @ unit.t(), k=k, dim=1).indices  # [n, k]
    rows = torch.arange(n, device=features.device).repeat_interleave(k)
    cols = top.reshape(-1)
    keys = torch.cat((rows * n + cols, cols * n + rows, torch.arange(n, device=features.device) * (n + 1)))
    keys = keys.unique()  # sorted: row-major, each edge once
    return torch.stack((keys // n, keys % n))
