"""The methods, one module each (its ``ALGORITHM``), found by name through the registry.

Importing this package imports no method: ``fedgraph_flwr.core.registry`` imports
``algorithms.<name>`` the first time ``<name>`` is asked for. The names below are the
registry's and the options machinery's, kept here for the code and tests that import
them from this package.
"""

from .. import pyg_warnings  # noqa: F401  (before any method's PyG import)
from ..core.options import ConfigError, Options, option
from ..core.registry import ALGORITHMS, Algorithm, declare, get_algorithm, register, unregister

__all__ = ["ALGORITHMS", "Algorithm", "ConfigError", "Options", "declare", "get_algorithm", "option",
           "register", "unregister"]
