"""METIS k-way partitioning through a METIS shared library (ctypes), as the reference code does.

Why this exists: the FED-PUB / FedAux / FedIIH generators partition with the
``metis`` Python wrapper (imported there as ``metispy``), which calls the system's
``libmetis``: METIS 5.1.0 built with 32-bit ``idx_t`` on Debian/Ubuntu. pymetis bundles
the same METIS 5.1.0 but builds it with 64-bit ``idx_t``, and METIS draws its random
numbers at ``idx_t`` width (a 64-bit draw is two ``rand()`` calls), so the same graph
and seed give a different k-way partition. A 32-bit METIS library called with the
default options on the same CSR graph gives the reference's partition node for node
(checked against the shipped Cora-10 files: ``tests/test_partition.py``); a 64-bit one
gives pymetis' partition.

The library is ``$METIS_DLL`` when set, else the system's ``libmetis`` found by
:func:`ctypes.util.find_library` (Debian/Ubuntu: ``apt install libmetis5``). Both 32- and
64-bit ``idx_t`` builds load (the width is read off ``METIS_SetDefaultOptions``); only a
32-bit one reproduces the reference code's partitions, and :func:`idx_bits` says which
was loaded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import lru_cache

import numpy as np

METIS_NOPTIONS = 40
METIS_OK = 1
INSTALL_HINT = ("install METIS 5.1 (Debian/Ubuntu: apt install libmetis5) or set "
                "METIS_DLL=/path/to/libmetis.so")


class LibMetisNotFound(RuntimeError):
    """No METIS shared library could be loaded."""


def library_path() -> str:
    """The library to load: ``$METIS_DLL``, else the system's libmetis; raises when none."""
    path = os.environ.get("METIS_DLL", "") or ctypes.util.find_library("metis") or ""
    if not path:
        raise LibMetisNotFound(f"metis-library=system: no METIS shared library found; {INSTALL_HINT}")
    return path


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[ctypes.CDLL, type]:
    """The loaded library and its idx_t numpy dtype (int32 or int64)."""
    try:
        lib = ctypes.CDLL(path)
        lib.METIS_SetDefaultOptions, lib.METIS_PartGraphKway  # noqa: B018 - symbols exist
    except (OSError, AttributeError) as exc:
        raise LibMetisNotFound(f"metis-library=system: cannot load METIS from {path!r} ({exc}); "
                               f"{INSTALL_HINT}") from None
    # METIS_SetDefaultOptions writes METIS_NOPTIONS idx_t values of -1: count the int32 words.
    probe = np.zeros(2 * METIS_NOPTIONS, dtype=np.int32)
    lib.METIS_SetDefaultOptions(probe.ctypes.data_as(ctypes.c_void_p))
    written = int((probe == -1).sum())
    if written == METIS_NOPTIONS:
        return lib, np.int32
    if written == 2 * METIS_NOPTIONS:
        return lib, np.int64
    raise LibMetisNotFound(f"metis-library=system: {path!r} does not behave like METIS 5 "
                           f"(METIS_SetDefaultOptions wrote {written} words)")


def idx_bits() -> int:
    """The ``idx_t`` width (32 or 64) of the library :func:`library_path` names."""
    return 8 * np.dtype(_load(library_path())[1]).itemsize


def part_graph_kway(xadj: np.ndarray, adjncy: np.ndarray, nparts: int,
                    seed: int | None = None) -> np.ndarray:
    """METIS_PartGraphKway with default options on CSR (xadj [n+1], adjncy [2m]); part id per node.

    ``seed=None`` keeps METIS' default seed, as the reference wrapper does.
    """
    path = library_path()
    lib, idx = _load(path)
    n = int(len(xadj) - 1)
    xadj_c = np.ascontiguousarray(xadj, dtype=idx)
    adjncy_c = np.ascontiguousarray(adjncy, dtype=idx)
    options = np.zeros(METIS_NOPTIONS, dtype=idx)
    lib.METIS_SetDefaultOptions(options.ctypes.data_as(ctypes.c_void_p))
    if seed is not None:
        options[8] = int(seed)  # METIS_OPTION_SEED
    scalars = np.array([n, 1, int(nparts), 0], dtype=idx)  # nvtxs, ncon, nparts, objval
    part = np.zeros(n, dtype=idx)

    def ptr(a: np.ndarray, i: int = 0) -> ctypes.c_void_p:
        return ctypes.c_void_p(a.ctypes.data + i * a.itemsize)

    null = ctypes.c_void_p(None)
    status = lib.METIS_PartGraphKway(
        ptr(scalars, 0), ptr(scalars, 1), ptr(xadj_c), ptr(adjncy_c),
        null, null, null,  # vwgt, vsize, adjwgt: unit weights
        ptr(scalars, 2), null, null,  # tpwgts, ubvec: METIS defaults
        ptr(options), ptr(scalars, 3), ptr(part))
    if status != METIS_OK:
        raise RuntimeError(f"METIS_PartGraphKway ({path}) failed with status {status}")
    return part.astype(np.int64)
