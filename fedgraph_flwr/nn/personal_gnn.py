"""FedSpray's personalized GNN f(θ^(k)): GCN, SGC or GraphSAGE; it never leaves its client.

- ``gcn``:  GCNConv(d_x, h) -> ReLU -> dropout -> GCNConv(h, d_c) (``num_layers`` convs).
  Built in the same order as :class:`fedgraph_flwr.nn.gcn.GCN`, so under the same seed both
  start from the same weights (this is what makes FedSpray with λ1 = 0 equal Local).
- ``sage``: the same stack with SAGEConv (mean aggregation, root weight; full batch).
- ``sgc``:  one SGConv(d_x, d_c, K=num_layers): K-hop propagation then one linear layer;
  "two layers, hidden 64" in the paper means K = 2 with no hidden layer.

``uniform_init=True`` redraws every parameter (weights and biases) from U[0, 1), as the
official code does (``param.data.uniform_()``); the default keeps PyG's initialisation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, SAGEConv, SGConv

BACKBONES = ("gcn", "sgc", "sage")


class PersonalGNN(nn.Module):
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
        super().__init__()
        if backbone not in BACKBONES:
            raise ValueError(f"unknown backbone {backbone!r}; valid: {', '.join(BACKBONES)}")
        if num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        self.backbone = backbone
        self.dropout = dropout
        self.uniform_init = uniform_init
        if backbone == "sgc":
            # The graph is fixed for a trainer's lifetime: cache Â^K X.
            self.convs = nn.ModuleList([SGConv(in_channels, out_channels, K=num_layers, cached=True)])
        else:
            dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
            if backbone == "gcn":
                convs = [GCNConv(a, b, cached=True) for a, b in zip(dims[:-1], dims[1:])]
            else:
                convs = [SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:])]
            self.convs = nn.ModuleList(convs)
        # The convs initialised themselves on construction; only redraw for U[0,1)
        # (a second PyG reset would consume RNG and break parity with nn.gcn.GCN).
        if uniform_init:
            self._uniform_()

    def _uniform_(self) -> None:
        with torch.no_grad():
            for param in self.parameters():
                param.uniform_()

    def reset_parameters(self) -> None:
        for conv in self.convs:
            conv.reset_parameters()
        if self.uniform_init:
            self._uniform_()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for conv in self.convs[:-1]:
            x = F.relu(conv(x, edge_index))
            x = F.dropout(x, p=self.dropout, training=self.training)
        return self.convs[-1](x, edge_index)
