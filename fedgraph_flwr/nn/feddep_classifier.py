"""FedDEP's classifier ``Classifier_F``: GraphSAGE layers plus a linear embedding branch.

Shapes: n nodes, d features, e = embedding width, h hidden, C classes, L layers::

    x_0 = x                                  [n, d]
    e_0 = z̄                                  [n, e]   mean of the generated embeddings (over all P slots)
    e_k = Lin_k(e_{k-1})    (chained)        [n, h]   or Lin_k(z̄) (direct)
    x_k = relu(dropout(SAGE_k(x_{k-1}) + e_k))        for k < L
    out = SAGE_L(x_{L-1}) + e_L              [n, C]

Both codes (``zkzhangke/FedDEP`` ``gfl/model/sage.py`` ``Classifier_F``; OpenFGL's
``flcore/feddep/localdep.py``) chain the branch: layer k's linear reads layer k−1's linear
output, with no activation between. They build every linear as Linear(e, ·), so chaining
needs h = e; here Lin_k reads what e_{k−1} is (e for k = 1, h after), the same layers when
h = e. ``branch="direct"`` feeds z̄ to every layer, as the appendix's σ(W[x̄^{k−1} ‖ z̄]).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import SAGEConv

BRANCHES = ("chained", "direct")


class DepClassifier(nn.Module):
    """SAGEConv layers whose pre-activations each add a linear map of the node's embedding."""

    def __init__(self, in_channels: int, emb_channels: int, hidden_channels: int,
                 out_channels: int, num_layers: int = 2, dropout: float = 0.5,
                 branch: str = "chained") -> None:
        super().__init__()
        if min(in_channels, emb_channels, hidden_channels, out_channels) < 1 or num_layers < 1:
            raise ValueError("channels and num_layers must be >= 1")
        if branch not in BRANCHES:
            raise ValueError(f"branch {branch!r}; valid: {', '.join(BRANCHES)}")
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        emb_in = [emb_channels] + ([hidden_channels] * (num_layers - 1) if branch == "chained"
                                   else [emb_channels] * (num_layers - 1))
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(emb_in, dims[1:]))
        self.emb_channels, self.branch, self.dropout = emb_channels, branch, dropout

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for conv, lin in zip(self.convs, self.lins):
            conv.reset_parameters()
            lin.reset_parameters()

    def forward(self, x: torch.Tensor, emb: torch.Tensor,
                edge_index: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """x [n, d], emb [n, e] (z̄), edge_index [2, m] or one per layer (sampled) -> [n, C]."""
        layers = len(self.convs)
        edges = [edge_index] * layers if isinstance(edge_index, torch.Tensor) else list(edge_index)
        if len(edges) != layers:
            raise ValueError(f"{len(edges)} edge sets for {layers} layers")
        e = emb
        for k, (conv, lin) in enumerate(zip(self.convs, self.lins)):
            e = lin(e if self.branch == "chained" else emb)
            x = conv(x, edges[k]) + e
            if k < layers - 1:
                x = F.relu(F.dropout(x, p=self.dropout, training=self.training))
        return x
