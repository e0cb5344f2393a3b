"""DisenGCN (Ma et al. 2019) as FedIIH uses it: factor projection + neighbourhood routing.

The input projection ``pca`` is one linear layer whose output ``[n, K·d_k]`` is
read as K factor blocks of width ``d_k`` (block k = rows ``k·d_k:(k+1)·d_k`` of
``pca.weight``). Neighbourhood routing (:class:`NeighbourhoodRouting`) has no
parameters: each node's factor-k embedding is its own plus the neighbours'
factor-k embeddings, weighted by how much each neighbour "belongs" to factor k
(a softmax over factors of cosine agreement), re-normalised, T times.

Layer stack as in the released FedIIH code (docs/reading/fediih.md §2.3, §9.11): projection →
LeakyReLU → dropout, then ``L_c`` routing layers (each → LeakyReLU → dropout),
then a linear classifier ``clf`` on the trunk output. The μ/σ branches of the
HVGAE sit on top of the same trunk (see :mod:`fedgraph_flwr.nn.hvgae`).

Routing kernels (``kernel``): ``"sparse"`` (:mod:`fedgraph_flwr.nn.factor_graph`,
every published figure), ``"fused"`` (:mod:`fedgraph_flwr.nn.fused_routing`: one
CPU pass per iteration, 4-5x faster on a 16k-node client, equal to rounding) and
``"auto"``: fused on CPU graphs of at least :data:`FUSED_ROUTING_MIN_NODES` nodes. A
pass that routes with the fused kernel also draws its dropout masks with
``torch.rand`` (:mod:`fedgraph_flwr.nn.fast_dropout`), as FedAux's large-client path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .factor_graph import EdgeAggregate, EdgeDots, factor_graph
from .fast_dropout import uniform_mask_dropout

LEAKY_SLOPE = 0.01  # the released code's LeakyReLU slope
ROUTING_KERNELS = ("auto", "sparse", "fused")
#: ``kernel="auto"`` routes graphs of at least this many nodes with the fused kernel: the
#: threshold of FedAux's large-client path (``supervised.SPARSE_ADJACENCY_MIN_NODES``),
#: above every client behind a published FedIIH figure (Cora, CiteSeer, Minesweeper).
FUSED_ROUTING_MIN_NODES = 4097


def uses_fused_routing(kernel: str, x: torch.Tensor) -> bool:
    """Whether a pass over node features x [n, ·] routes with the fused kernel."""
    if kernel not in ROUTING_KERNELS:
        raise ValueError(f"unknown routing kernel {kernel!r}; valid: {', '.join(ROUTING_KERNELS)}")
    if kernel == "auto":
        return x.device.type == "cpu" and x.size(0) >= FUSED_ROUTING_MIN_NODES
    return kernel == "fused"


def activation(x: torch.Tensor, dropout: float, training: bool, fused: bool) -> torch.Tensor:
    """LeakyReLU → dropout (masks from ``torch.rand`` on the fused path)."""
    x = F.leaky_relu(x, LEAKY_SLOPE)
    if fused:
        return uniform_mask_dropout(x, dropout, training)
    return F.dropout(x, p=dropout, training=training)


def routing_layer_split(num_routing_layers: int) -> tuple[int, int]:
    """Map the "# routing layers" hyperparameter L to (trunk layers, layers per μ/σ branch).

    L ≤ 2 → (1, 1); L > 2 → (L − 2, 2)  (docs/reading/fediih.md §9.11).
    """
    if num_routing_layers < 1:
        raise ValueError(f"routing layers must be >= 1, got {num_routing_layers}")
    if num_routing_layers <= 2:
        return 1, 1
    return num_routing_layers - 2, 2


class NeighbourhoodRouting(nn.Module):
    """One parameter-free routing layer (the released code's ``DisenConv``).

    x [n, K·d_k], edge_index [2, m] (src → trg, symmetric, no self-loops needed)
    -> [n, K·d_k] whose K blocks are unit-norm. Per iteration, for every edge
    (v → u): p_vk = softmax_k(<z_v^k, c_u^k> / τ_p), then
    c_u^k = normalise(z_u^k + Σ_v p_vk z_v^k). Both edge sums are sparse CSR
    kernels over all edges and factors (:mod:`fedgraph_flwr.nn.factor_graph`); the
    only Python loop is over the T iterations. ``kernel``: see the module docstring.
    """

    def __init__(self, num_factors: int, iterations: int, tau: float = 1.0,
                 kernel: str = "auto") -> None:
        super().__init__()
        if num_factors < 1 or iterations < 1:
            raise ValueError("num_factors and iterations must be >= 1")
        if kernel not in ROUTING_KERNELS:
            raise ValueError(f"unknown routing kernel {kernel!r}; valid: {', '.join(ROUTING_KERNELS)}")
        self.num_factors = num_factors
        self.iterations = iterations
        self.tau = tau
        self.kernel = kernel

    def reset_parameters(self) -> None:
        """Nothing to reset: routing has no parameters."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Factor representations [n, K·d] after the routing iterations."""
        n, width = x.shape
        k = self.num_factors
        if width % k:
            raise ValueError(f"width {width} is not divisible by {k} factors")
        # Row u·K+k of z/c is node u's factor-k embedding (see nn.factor_graph).
        z = F.normalize(x.view(n, k, width // k), dim=-1).view(n * k, -1)  # [n·K, d_k]
        if edge_index.numel() == 0:
            return z.view(n, width)
        if uses_fused_routing(self.kernel, x):
            from .fused_routing import fused_routing  # numba: imported only when used

            return fused_routing(x, edge_index, k, self.iterations, self.tau)
        graph = factor_graph(edge_index, n, k)
        multiplicity = graph.count.to(z.dtype)[:, None]  # [m', 1]: duplicate edges count twice
        c = z
        for _ in range(self.iterations):
            # Which factor does neighbour v share with centre u? softmax over factors.
            p = torch.softmax(EdgeDots.apply(c, z, graph) / self.tau, dim=1)  # [m', K]
            c = F.normalize(EdgeAggregate.apply(p * multiplicity, z, graph) + z, dim=-1)
        return c.view(n, width)

    def extra_repr(self) -> str:
        """The hyper-parameters shown in the module's repr."""
        return (f"factors={self.num_factors}, iterations={self.iterations}, tau={self.tau}, "
                f"kernel={self.kernel}")


class DisenGCN(nn.Module):
    """Projection ``pca`` → routing trunk → classifier ``clf``.

    x [n, in_channels], edge_index [2, m] -> logits [n, out_channels].
    ``pca``: in_channels → K·d_k (factor block k = output units k·d_k:(k+1)·d_k),
    ``clf``: K·d_k → out_channels (factor block k = its input columns k·d_k:(k+1)·d_k).
    These four tensors (``pca.weight``, ``pca.bias``, ``clf.weight``, ``clf.bias``)
    are the only learnable parameters.
    """

    def __init__(
        self,
        in_channels: int,
        factor_channels: int,
        out_channels: int,
        num_factors: int,
        trunk_layers: int,
        iterations: int,
        dropout: float = 0.0,
        routing_tau: float = 1.0,
        routing_kernel: str = "auto",
    ) -> None:
        super().__init__()
        self.num_factors = num_factors
        self.factor_channels = factor_channels
        self.dropout = dropout
        self.routing_kernel = routing_kernel
        width = num_factors * factor_channels
        self.pca = nn.Linear(in_channels, width)
        self.routing = nn.ModuleList(
            NeighbourhoodRouting(num_factors, iterations, routing_tau, routing_kernel)
            for _ in range(trunk_layers)
        )
        self.clf = nn.Linear(width, out_channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as at construction."""
        # Released code: W, b ~ U(-1/sqrt(K d_k), 1/sqrt(K d_k)) for the projection;
        # nn.Linear's default for the classifier.
        bound = 1.0 / math.sqrt(self.pca.out_features)
        nn.init.uniform_(self.pca.weight, -bound, bound)
        nn.init.uniform_(self.pca.bias, -bound, bound)
        self.clf.reset_parameters()

    def embed(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Trunk output [n, K·d_k] (input of the classifier and of the μ/σ branches)."""
        fused = uses_fused_routing(self.routing_kernel, x)
        h = activation(self.pca(x), self.dropout, self.training, fused)
        for layer in self.routing:
            h = activation(layer(h, edge_index), self.dropout, self.training, fused)
        return h

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Logits [n, C] of the classifier on :meth:`embed`."""
        return self.clf(self.embed(x, edge_index))
