"""FedStar's feature-structure decoupled GNN (Tan et al., AAAI 2023), per node.

Structure encodings (:func:`structure_encoding`, computed from the topology alone)::

    s_rw[v] = ((M)_vv, (M²)_vv, …, (M^R)_vv),  M = A D⁻¹     random-walk returns
    s_dg[v] = one_hot(min(max(deg v, 1), G) − 1)               degree, G slots
    s = [s_rw ‖ s_dg]                                          [n, R + G]   (``rw_dg``)

Model (official ``GIN_dc`` without its graph pooling; x [n, d], s [n, R+G] -> logits [n, C])::

    h⁰ = pre(x);  s⁰ = structure_embed(s)                      [n, h] each
    for l < L:  h^(l+1) = dropout(relu(conv_l([h^l ‖ s^l])))    feature branch (personal)
                s^(l+1) = tanh(structure_convs_l(s^l))          structure branch (GCN, shared)
    z = post(combine([h^L ‖ s^L]));  logits = readout(dropout(z))

``conv`` is the feature branch's layer type: ``gin`` (the official code: GINConv over
Linear(2h, h) -> ReLU -> Linear(h, h)), ``gcn`` or ``sage`` (FedSpray's node-level
columns). The structure branch is always a GCN, as in the code.

The shared parameters are named explicitly (:data:`STRUCTURE_PREFIXES`), not found by
the code's substring test ``"_s" in name``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, GINConv, SAGEConv

from .sparse import csr_matrix

FEATURE_CONVS = ("gcn", "sage", "gin")
ENCODINGS = ("rw_dg", "rw", "dg")
#: Parameter-name prefixes of the structure branch: what FedStar shares.
STRUCTURE_PREFIXES = ("structure_embed.", "structure_convs.")
#: Columns of the random-walk block propagated at once (memory n × this, floats).
RW_CHUNK = 1024


def random_walk_encoding(edge_index: torch.Tensor, num_nodes: int, steps: int) -> torch.Tensor:
    """s_rw [n, steps]: column k−1 holds diag((A D⁻¹)^k), k = 1..steps.

    A[u, v] = multiplicity of (u, v) in ``edge_index``, D = diag(out-degrees) (a node
    without edges has a zero column, hence zeros). Exact, without forming a matrix power:
    the unit vectors of a block of nodes are walked ``steps`` times and each node's own
    entry is read off, so memory is n × ``RW_CHUNK`` and time O(steps · |E| · n).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    src, dst = edge_index[0], edge_index[1]
    device = edge_index.device
    degree = torch.zeros(num_nodes, dtype=torch.float32, device=device)
    degree.index_add_(0, src, torch.ones(src.numel(), dtype=torch.float32, device=device))
    inverse = torch.where(degree > 0, 1.0 / degree.clamp(min=1.0), torch.zeros_like(degree))
    # M[u, v] = A[u, v] / deg(v)
    walk = csr_matrix(src, dst, inverse[dst], num_nodes)
    out = torch.zeros(num_nodes, steps, dtype=torch.float32, device=device)
    for start in range(0, num_nodes, RW_CHUNK):
        block = torch.arange(start, min(start + RW_CHUNK, num_nodes), device=device)
        cols = torch.arange(block.numel(), device=device)
        probe = torch.zeros(num_nodes, block.numel(), dtype=torch.float32, device=device)
        probe[block, cols] = 1.0  # unit vectors e_v of the block [n, b]
        for k in range(steps):
            probe = torch.sparse.mm(walk, probe)  # M^(k+1) e_v
            out[block, k] = probe[block, cols]
    return out


def degree_encoding(edge_index: torch.Tensor, num_nodes: int, slots: int) -> torch.Tensor:
    """s_dg [n, slots]: one-hot of min(max(out-degree, 1), slots) − 1."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    degree = torch.bincount(edge_index[0], minlength=num_nodes)
    return F.one_hot(degree.clamp(1, slots) - 1, slots).to(torch.float32)


def structure_encoding(edge_index: torch.Tensor, num_nodes: int, rw_steps: int = 16,
                       degree_slots: int = 16, kind: str = "rw_dg") -> torch.Tensor:
    """FedStar's structure encoding [n, width] (``kind``: rw_dg = [s_rw ‖ s_dg], rw, dg)."""
    if kind not in ENCODINGS:
        raise ValueError(f"kind {kind!r}; valid: {', '.join(ENCODINGS)}")
    parts = []
    if kind in ("rw_dg", "rw"):
        parts.append(random_walk_encoding(edge_index, num_nodes, rw_steps))
    if kind in ("rw_dg", "dg"):
        parts.append(degree_encoding(edge_index, num_nodes, degree_slots).to(edge_index.device))
    return torch.cat(parts, dim=1)


def encoding_width(rw_steps: int, degree_slots: int, kind: str) -> int:
    """Columns of :func:`structure_encoding` for these settings."""
    return {"rw_dg": rw_steps + degree_slots, "rw": rw_steps, "dg": degree_slots}[kind]


def _feature_conv(kind: str, in_channels: int, out_channels: int) -> nn.Module:
    if kind == "gin":
        return GINConv(nn.Sequential(nn.Linear(in_channels, out_channels), nn.ReLU(),
                                     nn.Linear(out_channels, out_channels)))
    if kind == "sage":
        return SAGEConv(in_channels, out_channels)
    # cached: a trainer only ever sees its own fixed subgraph.
    return GCNConv(in_channels, out_channels, cached=True)


class FedStarNet(nn.Module):
    """Decoupled GNN: personal feature branch, shareable structure branch.

    Parameter names: ``pre.*`` [h, d], ``convs.{l}.*`` (feature branch), ``combine.*``
    [h, 2h], ``post.*`` [h, h], ``readout.*`` [C, h] (personal); ``structure_embed.*``
    [h, R+G], ``structure_convs.{l}.*`` [h, h] (shared).
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 structure_channels: int, num_layers: int = 3, dropout: float = 0.5,
                 conv: str = "gcn") -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if structure_channels < 1:
            raise ValueError(f"structure_channels must be >= 1, got {structure_channels}")
        if conv not in FEATURE_CONVS:
            raise ValueError(f"conv {conv!r}; valid: {', '.join(FEATURE_CONVS)}")
        h = hidden_channels
        self.dropout = dropout
        self.pre = nn.Linear(in_channels, h)
        self.structure_embed = nn.Linear(structure_channels, h)
        self.convs = nn.ModuleList(_feature_conv(conv, 2 * h, h) for _ in range(num_layers))
        self.structure_convs = nn.ModuleList(GCNConv(h, h, cached=True) for _ in range(num_layers))
        self.combine = nn.Linear(2 * h, h)
        self.post = nn.Linear(h, h)
        self.readout = nn.Linear(h, out_channels)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        for module in (self.pre, self.structure_embed, *self.convs, *self.structure_convs,
                       self.combine, self.post, self.readout):
            module.reset_parameters()

    def forward(self, x: torch.Tensor, structure: torch.Tensor,
                edge_index: torch.Tensor) -> torch.Tensor:
        """x [n, d], structure [n, R+G], edge_index [2, m] -> logits [n, C]."""
        h = self.pre(x)  # [n, h]
        s = self.structure_embed(structure)  # [n, h]
        for conv, structure_conv in zip(self.convs, self.structure_convs):
            h = F.dropout(F.relu(conv(torch.cat([h, s], dim=-1), edge_index)),
                          p=self.dropout, training=self.training)
            s = torch.tanh(structure_conv(s, edge_index))
        z = F.relu(self.post(self.combine(torch.cat([h, s], dim=-1))))
        return self.readout(F.dropout(z, p=self.dropout, training=self.training))
