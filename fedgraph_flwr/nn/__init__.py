"""GNN layers and models (plain torch / PyG)."""

from .. import pyg_warnings  # noqa: F401  (before any PyG import)


def fork_server_warm_up() -> list[str]:
    """PyG generates and imports a ``propagate`` for each MessagePassing class the first
    time one is built (jinja + ``ast``, and a new file under the temp folder each time).
    Built in every forked ClientApp, that was ~40 ms of CPU and one leaked temp file per
    layer class per message; built once in ``fedgraph-superexec``'s fork server (1x1
    layers: parameter init on single numbers, no thread pool, no CUDA), every child
    inherits the compiled classes. Called there by name
    (``engine.accelerate.superexec.WARM_UP_HOOK``); returns the classes' names."""
    from torch_geometric.nn import GCNConv, SAGEConv, SGConv

    from .masked import MaskedGCNConv

    layers = (GCNConv(1, 1), MaskedGCNConv(1, 1), SGConv(1, 1), SAGEConv(1, 1))
    return [type(layer).__name__ for layer in layers]
