"""Datasets, splits, partitions and client subgraph files.

Modules (imported on demand; they pull in PyG):

- :mod:`.datasets`: ``DATASETS`` registry and ``load_dataset`` (PyG loaders + the
  papers' preprocessing; synthetic SBM/CSBM/arxiv-shaped graphs).
- :mod:`.synthetic`: seeded, vectorised SBM / contextual SBM / arxiv-shaped generators.
- :mod:`.splits`: the global random split (FedAux/FedIIH) and the per-client split (FedSpray).
- :mod:`.partition`: METIS / overlapping METIS / Louvain / block partitions, the on-disk
  partition cache (``ensure_partitions``) and ``load_client``.
- :mod:`.files`: reading, validating and writing client subgraph files (``.npz``/``.pt``).
"""

from .. import pyg_warnings  # noqa: F401  (before any PyG import)
