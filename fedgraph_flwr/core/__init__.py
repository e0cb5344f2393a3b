"""The contract between the engine and the methods, below both.

- :mod:`.phases`: a round as phases, and what crosses between a client and the server
  (:class:`~.phases.Phase`, :class:`~.phases.ClientUpdate`, :class:`~.phases.AggregateResult`).
- :mod:`.bases`: the :class:`~.bases.ClientTrainer` and :class:`~.bases.Aggregator` a
  method subclasses (``fedgraph_flwr.algorithms.base`` binds them to the typed config).
- :mod:`.mixing`: :class:`~.mixing.MixingPlan` (a round's mixing as weights only) and the
  server's mixing maths.
- :mod:`.options`: typed options, the machinery of every run-config key.
- :mod:`.registry`: the methods by name, each imported the first time it is asked for.

Nothing here imports ``fedgraph_flwr.config``, ``algorithms``, ``engine``, ``nn``, torch or
PyG (tests/test_import_graph.py): the engine and the configuration load this package
without loading any model code. This ``__init__`` imports nothing, so that importing one
module of the package loads that module alone.
"""
