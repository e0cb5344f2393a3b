"""Shared fixtures: a private copy of ../shared/datasets (never write into shared/).

From a clean clone without ../shared the tests that need the real datasets or the
reference partitions skip (``data_root``, ``shared_dir``, ``reference_partitions``,
``requires_datasets``); the synthetic ones (SBM, CSBM: ``synthetic_root``) always run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATASETS = SHARED / "datasets"
NO_DATASETS = "../shared/datasets not found: dataset tests skipped"

#: For tests that read ../shared directly instead of through a fixture.
requires_datasets = pytest.mark.skipif(not DATASETS.is_dir(), reason=NO_DATASETS)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not DATASETS.is_dir():
        pytest.skip(NO_DATASETS)
    return SHARED


@pytest.fixture(scope="session")
def data_root(tmp_path_factory, shared_dir) -> Path:
    """A writable data root holding copies of the shared raw datasets."""
    root = tmp_path_factory.mktemp("data")
    for name in ("Cora", "CiteSeer", "minesweeper", "tolokers"):
        src = shared_dir / "datasets" / name
        if src.is_dir():
            shutil.copytree(src, root / name)
    return root


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory) -> Path:
    """An empty data root: the synthetic datasets (SBM, CSBM) need no files, so tests
    on them run from a clean clone too (a real dataset here fails, not skips)."""
    return tmp_path_factory.mktemp("synthetic-data")


@pytest.fixture(scope="session")
def reference_partitions(shared_dir) -> Path:
    folder = shared_dir / "reference-partitions" / "fedaux-cora-disjoint-10"
    if not folder.is_dir():
        pytest.skip(f"{folder} not found: reference-partition tests skipped")
    return folder


@pytest.fixture
def one_torch_thread():
    """One torch thread, as each simulated ClientApp has: the same sums, the same bits
    (and on tiny graphs thread start-up would dominate)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
