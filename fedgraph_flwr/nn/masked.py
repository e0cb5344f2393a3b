"""FED-PUB's masked layers: a learnable elementwise mask on every weight matrix.

The effective weight is ``W ⊙ M`` with ``M`` initialised to ones. At eval time
mask entries with ``|M| < prune_threshold`` (1e-3) are zeroed, i.e. those
weights are pruned. Biases are not masked. In FedAux/FED-PUB the masks never
leave the client (parameter names end in ``mask``; the trainer lists ``"mask"``
in its ``local_keys``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn.inits import glorot

from .csr_gcn_conv import CSRGCNConv

PRUNE_THRESHOLD = 1e-3


class MaskedLinear(nn.Module):
    """``y = x (W ⊙ M)ᵀ + b``; x [..., in_features] -> [..., out_features].

    ``weight`` and ``mask`` are [out_features, in_features]. ``weight_init`` is
    ``"glorot"`` (as PyG's GCNConv) or ``"kaiming_uniform"`` (as ``nn.Linear``).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        weight_init: str = "kaiming_uniform",
        prune_threshold: float = PRUNE_THRESHOLD,
    ) -> None:
        super().__init__()
        if weight_init not in ("glorot", "kaiming_uniform"):
            raise ValueError(f"unknown weight_init {weight_init!r}")
        self.in_features = in_features
        self.out_features = out_features
        self.weight_init = weight_init
        self.prune_threshold = prune_threshold
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.mask = nn.Parameter(torch.empty(out_features, in_features))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        if self.weight_init == "glorot":
            glorot(self.weight)
        else:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.ones_(self.mask)
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
            if self.weight_init == "glorot":
                nn.init.zeros_(self.bias)
            else:
                nn.init.uniform_(self.bias, -bound, bound)

    def effective_weight(self) -> torch.Tensor:
        """``W ⊙ M`` [out, in]; at eval, entries whose ``|M|`` is below the threshold are 0."""
        mask = self.mask
        if not self.training:
            mask = mask * (mask.abs() >= self.prune_threshold)
        return self.weight * mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x Wᵀ + b with W masked."""
        return F.linear(x, self.effective_weight(), self.bias)

    def extra_repr(self) -> str:
        """The hyper-parameters shown in the module's repr."""
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class MaskedGCNConv(CSRGCNConv):
    """GCNConv (symmetric normalisation with self-loops) whose weight is masked.

    x [n, in_channels], edge_index [2, m] or a CSR adj_t -> [n, out_channels]. Reuses
    PyG's ``GCNConv.forward`` (``gcn_norm``, caching, ``propagate``; the CSR backward of
    :class:`CSRGCNConv`) unchanged: only
    its bias-free ``lin`` is swapped for a :class:`MaskedLinear`, so the
    parameters are ``lin.weight``, ``lin.mask`` and the (unmasked) ``bias``.
    """

    def __init__(self, in_channels: int, out_channels: int, cached: bool = False,
                 prune_threshold: float = PRUNE_THRESHOLD) -> None:
        super().__init__(in_channels, out_channels, cached=cached)
        self.lin = MaskedLinear(in_channels, out_channels, bias=False, weight_init="glorot",
                                prune_threshold=prune_threshold)
        self.reset_parameters()


def fedpub_xavier_(layer: nn.Module) -> None:
    """Initialise a linear layer as FED-PUB's ``MaskedLinear``: Xavier-uniform weight, and
    Xavier-uniform bias drawn as a [1, out] matrix (bound sqrt(6 / (1 + out)), up to ±0.87
    for 7 classes), where ``nn.Linear`` keeps biases within ±1/sqrt(in)."""
    with torch.no_grad():
        nn.init.xavier_uniform_(layer.weight)
        if layer.bias is not None:
            nn.init.xavier_uniform_(layer.bias.view(1, -1))
