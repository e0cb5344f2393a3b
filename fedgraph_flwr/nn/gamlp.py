"""GAMLP with the "JK" hop attention, as FedGTA's official code runs it (Zhang et al., KDD 2022).

Precomputed once per graph (:func:`propagate_hops`), with the r-normalised adjacency of
:func:`normalized_adjacency`::

    X^(k) = Â^k X,  k = 0..K                                  hops [K+1, n, d]

Learned (``forward``), for each node i and hop k::

    score_ik = gate([X^(0)_i ‖ … ‖ X^(K)_i ‖ X^(k)_i])        gate: Linear((K+2)·d -> 1)
    a_i      = softmax_k(sigmoid(score_i·))                   [n, K+1]
    z_i      = Σ_k a_ik X^(k)_i                               [n, d]
    logits   = MLP(z)                                         [n, C]

The MLP has ``num_layers`` linear layers (d -> h -> … -> h -> C) with one PReLU shared by
every hidden layer and dropout after it (none on the input), Xavier-uniform weights
(ReLU gain) and zero biases; the gate keeps ``nn.Linear``'s initialisation. All of this is
the official code's ``SimGAMLP`` (``SimLearnableWeightedMessageOp(..., "jk")`` +
``SimMultiLayerPerceptron``).

``gate_layout``: how the [(K+1)·n] gate scores become the [n, K+1] attention matrix.
``"node"`` (default; GAMLP's definition) gives node i the scores of its own hops. ``"code"``
reproduces the official code, which stacks the scores hop-major and then reshapes them
row-major (``view(-1, K+1)``), so node i's K+1 weights are the scores of the entries
i·(K+1) … i·(K+1)+K of that hop-major list: other nodes' scores. Under ``"code"`` the
result depends on which rows are fed in, which is why :meth:`GAMLP.forward` takes the
rows (the code feeds the training rows while training and all rows at evaluation).
The gate's linear map is evaluated as one product with the concatenated hops plus one per
hop (the same sum as the code's [(K+1)·n, (K+2)·d] stacked input, without building it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .sparse import csr_matrix

GATE_LAYOUTS = ("node", "code")


def normalized_adjacency(edge_index: torch.Tensor, num_nodes: int, r: float = 0.5,
                         self_loops: bool = True,
                         edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Â = D̃^(r−1) Ãᵀ D̃^(−r) as a sparse CSR [n, n] float32 tensor (official code's
    ``adj_to_symmetric_norm``): Ã = A + I (``self_loops``), D̃ its row sums; a zero degree
    gets a zero factor. A[u, v] = multiplicity of (u, v) in ``edge_index`` (or the sum of
    their ``edge_weight`` [m], e.g. AdaFGL's rewired graph); for an undirected graph and
    r = 0.5 this is D̃^(−1/2) Ã D̃^(−1/2). ``y = Â x`` sends x_u along each edge u -> v
    with weight d̃_v^(r−1) d̃_u^(−r).
    """
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"r must be in [0, 1], got {r}")
    src, dst = edge_index[0], edge_index[1]
    if self_loops:
        loop = torch.arange(num_nodes, device=edge_index.device)
        src, dst = torch.cat([src, loop]), torch.cat([dst, loop])
    weight = torch.ones(src.numel(), dtype=torch.float32, device=edge_index.device)
    if edge_weight is not None:
        if edge_weight.shape != (edge_index.size(1),):
            raise ValueError(f"edge_weight has shape {tuple(edge_weight.shape)}, expected "
                             f"[{edge_index.size(1)}]")
        weight[: edge_weight.numel()] = edge_weight.to(torch.float32)
    degree = torch.zeros(num_nodes, dtype=torch.float32, device=edge_index.device)
    degree.index_add_(0, src, weight)  # row sums of Ã
    safe = torch.where(degree > 0, degree, torch.ones_like(degree))  # weights may be < 1
    left = torch.where(degree > 0, safe.pow(r - 1.0), torch.zeros_like(degree))
    right = torch.where(degree > 0, safe.pow(-r), torch.zeros_like(degree))
    values = left[dst] * weight * right[src]
    # Row dst, column src: Ãᵀ, so that (Â x)_v sums over the edges u -> v.
    return csr_matrix(dst, src, values, num_nodes)


def propagate_hops(x: torch.Tensor, adjacency: torch.Tensor, num_hops: int) -> torch.Tensor:
    """[X, ÂX, …, Â^K X] stacked: x [n, d], Â sparse [n, n] (CSR or COO) -> [K+1, n, d]."""
    if num_hops < 0:
        raise ValueError(f"num_hops must be >= 0, got {num_hops}")
    hops = [x]
    for _ in range(num_hops):
        hops.append(torch.sparse.mm(adjacency, hops[-1]))
    return torch.stack(hops)


class GAMLP(nn.Module):
    """hops [K+1, n, d] (rows ``index`` of them, or all) -> logits [len(index) or n, C].

    Parameters: ``gate.{weight [1, (K+2)·d], bias [1]}``, ``mlp.{0..L-1}.{weight, bias}``,
    ``prelu.weight`` [1].
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_hops: int = 3, num_layers: int = 3, dropout: float = 0.5,
                 gate_layout: str = "node") -> None:
        super().__init__()
        if num_hops < 0:
            raise ValueError(f"num_hops must be >= 0, got {num_hops}")
        if num_layers < 2:
            raise ValueError(f"num_layers must be >= 2 (the code's MLP), got {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if gate_layout not in GATE_LAYOUTS:
            raise ValueError(f"gate_layout {gate_layout!r}; valid: {', '.join(GATE_LAYOUTS)}")
        self.in_channels = in_channels
        self.num_hops = num_hops
        self.dropout = dropout
        self.gate_layout = gate_layout
        self.gate = nn.Linear((num_hops + 2) * in_channels, 1)
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.prelu = nn.PReLU()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        self.gate.reset_parameters()
        gain = nn.init.calculate_gain("relu")
        for layer in self.mlp:
            nn.init.xavier_uniform_(layer.weight, gain=gain)
            nn.init.zeros_(layer.bias)
        self.prelu.reset_parameters()

    def hop_attention(self, hops: torch.Tensor) -> torch.Tensor:
        """Attention over hops [m, K+1] (rows sum to 1) for hops [K+1, m, d]."""
        num_hops, m, d = hops.shape
        if num_hops != self.num_hops + 1 or d != self.in_channels:
            raise ValueError(f"hops has shape {tuple(hops.shape)}, expected "
                             f"[{self.num_hops + 1}, n, {self.in_channels}]")
        w = self.gate.weight.view(-1)
        w_all, w_hop = w[: num_hops * d], w[num_hops * d:]
        # Score of the [all hops ‖ hop k] row = w_all·concat_i + w_hop·X^(k)_i + b.
        reference = hops.permute(1, 0, 2).reshape(m, num_hops * d) @ w_all  # [m]
        per_hop = hops @ w_hop  # [K+1, m]
        scores = per_hop + reference + self.gate.bias  # [K+1, m], hop-major
        if self.gate_layout == "node":
            scores = scores.t()
        else:  # the official code's reshape of the hop-major list
            scores = scores.reshape(m, num_hops)
        return F.softmax(torch.sigmoid(scores), dim=1)

    def forward(self, hops: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [n, C] from the hop features (``index``: only those rows)."""
        if index is not None:
            hops = hops[:, index]
        attention = self.hop_attention(hops)  # [m, K+1]
        z = torch.einsum("kmd,mk->md", hops, attention)  # [m, d]
        for layer in self.mlp[:-1]:
            z = F.dropout(self.prelu(layer(z)), p=self.dropout, training=self.training)
        return self.mlp[-1](z)
