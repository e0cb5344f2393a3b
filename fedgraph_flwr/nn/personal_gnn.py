"""FedSpray's personalized GNN f(θ^(k)): GCN, SGC or GraphSAGE; it never leaves its client.

- ``gcn``:  GCNConv(d_x, h) -> ReLU -> dropout -> GCNConv(h, d_c) (``num_layers`` convs):
  exactly :class:`fedgraph_flwr.nn.gcn.GCN`, so under the same seed both start from the
  same weights (this is what makes FedSpray with λ1 = 0 equal Local).
- ``sage``: the same stack with SAGEConv (mean aggregation, root weight; full batch).
- ``sgc``:  one SGConv(d_x, d_c, K=num_layers): K-hop propagation then one linear layer;
  "two layers, hidden 64" in the paper means K = 2 with no hidden layer.

``uniform_init=True`` redraws every parameter (weights and biases) from U[0, 1), as the
official code does (``param.data.uniform_()``); the default keeps PyG's initialisation.
"""

from __future__ import annotations

import torch
from torch_geometric.nn import SAGEConv, SGConv

from ..config import BACKBONES  # the gnn key's choices: each is built here
from .gcn import GCN, cached_gcn_conv


class PersonalGNN(GCN):
    """x [n, in_channels], edge_index [2, m] -> logits [n, out_channels]."""

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        backbone: str = "gcn",
        num_layers: int = 2,
        dropout: float = 0.0,
        uniform_init: bool = False,
    ) -> None:
        if backbone not in BACKBONES:
            raise ValueError(f"unknown backbone {backbone!r}; valid: {', '.join(BACKBONES)}")
        if num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        if backbone == "sgc":
            # One layer: GCN's forward is then just convs[0]. The graph is fixed for a
            # trainer's lifetime, so Â^K X is cached.
            super().__init__(in_channels, out_channels, out_channels, num_layers=1, dropout=dropout,
                             conv=lambda a, b: SGConv(a, b, K=num_layers, cached=True))
        else:
            super().__init__(in_channels, hidden_channels, out_channels, num_layers=num_layers,
                             dropout=dropout, conv=cached_gcn_conv if backbone == "gcn" else SAGEConv)
        self.backbone = backbone
        self.uniform_init = uniform_init
        # The convs initialised themselves on construction; only redraw for U[0,1)
        # (a second PyG reset would consume RNG and break parity with GCN).
        if uniform_init:
            self._uniform_()

    def _uniform_(self) -> None:
        with torch.no_grad():
            for param in self.parameters():
                param.uniform_()

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        super().reset_parameters()
        if self.uniform_init:
            self._uniform_()
