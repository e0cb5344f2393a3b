"""Silence the one warning that importing PyG raises on torch >= 2.10 and that no user can
act on: PyG's own modules call ``torch.jit.script`` at import (``nn/pool/select``,
``nn/pool/connect``), and torch warns each time ("`torch.jit.script` is deprecated"), so
a clean run printed it three times (issue #59). Imported first by every package of ours
that imports PyG (``algorithms``, ``data``, ``engine``, ``nn``); this project itself never
calls ``torch.jit.script``.
"""

import warnings

warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated",
                        category=DeprecationWarning, module=r"torch\.jit\._script")
