"""FedLit's multi-channel GCN (Xie, Xiong and Yang, WWW 2023), one channel per latent link type.

The official code's ``multichannel_GCN`` (``src/models/models.py``, DGL), in PyG::

    h      = feature1(x)                                          [n, h]   shared projection
    for each link type k = 0..K-1, on the subgraph induced by the edges of type k
    (its nodes V_k = the endpoints of those edges, relabelled 0..|V_k|-1):
        z_k = channels.k.lin(h[V_k])                              [|V_k|, h]
        z_k = dropout(relu(conv_l(z_k, E_k))),  l = 1..L           [|V_k|, h]
    out[v] = Σ_{k : v ∈ V_k} z_k[v]                               [n, h]   0 for isolated v
    logits = classifier(out)                                      [n, C]   shared classifier

``conv_l`` is, by default (``conv="gcn"``, the paper and code), a GCN layer without
self-loops, D^{-1/2} A_k D^{-1/2} (DGL ``GraphConv``, norm "both", weight and bias,
Glorot weights and zero biases as DGL initialises them).
PyG's ``gcn_norm`` takes both degrees from the in-degree; DGL's "both" uses the source's
out-degree and the target's in-degree: the same on the undirected graphs used here, where
both directions of an edge always share a type. No activation after ``feature1`` nor
after a channel's ``lin``, ReLU and dropout after every conv (also the last), no dropout
on the input: all as in the code.

``conv`` also takes FedSpray's other two backbones (its Table 2 runs FedLit with GCN, SGC
and SAGE; neither paper nor code says how a channel changes, so this is our reading):
``sage``: each conv a SAGEConv (mean aggregation, root weight), ReLU and dropout after
each, as for GCN; ``sgc``: one SGConv with K = L (L-hop propagation with the same
normalisation, no self-loops, then one linear layer), with no ReLU or dropout: SGC is linear.

Parameter names: ``feature1.{weight [h, d], bias}``, ``channels.{k}.lin.{weight [h, h], bias}``,
``channels.{k}.convs.{l}.{lin.weight [h, h], bias [h]}``, ``classifier.{weight [C, h], bias}``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, SAGEConv, SGConv

#: Parameter-name prefixes of the layers every client shares one copy of.
SHARED_PREFIXES = ("feature1.", "classifier.")
#: Prefix of channel k's parameters: ``channels.{k}.``.
CHANNEL_PREFIX = "channels."
#: A channel's message-passing layers (FedSpray's three backbones).
CHANNEL_CONVS = ("gcn", "sgc", "sage")


class LinkTypeChannel(nn.Module):
    """One link type's channel: Linear(h, h) then its message passing (``conv``).

    gcn / sage: ``num_layers`` convs, each followed by ReLU and dropout; sgc: one SGConv
    with K = ``num_layers``, linear. x [|V_k|, h], edge_index [2, |E_k|] (relabelled to
    0..|V_k|-1) -> [|V_k|, h].
    """

    def __init__(self, hidden_channels: int, num_layers: int, dropout: float,
                 conv: str = "gcn") -> None:
        super().__init__()
        if conv not in CHANNEL_CONVS:
            raise ValueError(f"conv {conv!r}; valid: {', '.join(CHANNEL_CONVS)}")
        self.dropout = dropout
        self.linear = conv == "sgc"
        self.lin = nn.Linear(hidden_channels, hidden_channels)
        # Not cached: the edges of a type change every round.
        h = hidden_channels
        if conv == "sgc":
            convs = [SGConv(h, h, K=num_layers, add_self_loops=False)]
        elif conv == "sage":
            convs = [SAGEConv(h, h) for _ in range(num_layers)]
        else:
            convs = [GCNConv(h, h, add_self_loops=False) for _ in range(num_layers)]
        self.convs = nn.ModuleList(convs)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        self.lin.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """This channel's representation of the nodes over its edges."""
        x = self.lin(x)
        for conv in self.convs:
            x = conv(x, edge_index)
            if not self.linear:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x


class MultiChannelGCN(nn.Module):
    """x [n, d], edge_index [2, m], edge_type [m] in 0..K-1 -> logits [n, C].

    :meth:`project` (h = feature1(x)), :meth:`propagate` (the summed channels) and
    :meth:`classify` are exposed so that a trainer can cluster the edges on h before the
    channels run, with one projection per step.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_link_types: int = 4, num_layers: int = 2, dropout: float = 0.5,
                 conv: str = "gcn") -> None:
        super().__init__()
        if num_link_types < 1:
            raise ValueError(f"num_link_types must be >= 1, got {num_link_types}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.hidden_channels = hidden_channels
        self.num_link_types = num_link_types
        self.feature1 = nn.Linear(in_channels, hidden_channels)
        self.channels = nn.ModuleList(LinkTypeChannel(hidden_channels, num_layers, dropout, conv)
                                      for _ in range(num_link_types))
        self.classifier = nn.Linear(hidden_channels, out_channels)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        self.feature1.reset_parameters()
        for channel in self.channels:
            channel.reset_parameters()
        self.classifier.reset_parameters()

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """h = feature1(x): [n, d] -> [n, h] (what the edges are clustered on)."""
        return self.feature1(x)

    def propagate(self, h: torch.Tensor, edge_index: torch.Tensor,
                  edge_type: torch.Tensor) -> torch.Tensor:
        """Σ_k channel_k on the type-k edge subgraph: h [n, h] -> [n, h]."""
        if edge_type.shape != (edge_index.size(1),):
            raise ValueError(f"edge_type has shape {tuple(edge_type.shape)}, expected "
                             f"[{edge_index.size(1)}]")
        num_nodes = h.size(0)
        out = h.new_zeros(num_nodes, self.hidden_channels)
        local = torch.full((num_nodes,), -1, dtype=torch.long, device=h.device)
        for k, channel in enumerate(self.channels):
            edges = edge_index[:, edge_type == k]  # [2, |E_k|]
            if edges.size(1) == 0:
                continue  # an empty subgraph: the channel adds nothing
            nodes = torch.unique(edges)  # V_k, sorted
            local[nodes] = torch.arange(nodes.numel(), device=h.device)
            z = channel(h[nodes], local[edges])  # [|V_k|, h]
            local[nodes] = -1
            out = out.index_add(0, nodes, z)
        return out

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """[n, h] -> logits [n, C]."""
        return self.classifier(z)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                edge_type: torch.Tensor) -> torch.Tensor:
        """Logits [n, C] with each edge routed to the channel of its type."""
        return self.classify(self.propagate(self.project(x), edge_index, edge_type))
