"""The engine: one round driver over a transport (Flower or in process), the server's
bookkeeping, and the Flower apps; the only part of the library that touches Flower."""

from .. import pyg_warnings  # noqa: F401  (before any PyG import)
