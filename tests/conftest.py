"""Shared fixtures: a private copy of the raw datasets (never write where they come from).

The raw datasets come from ../shared/datasets beside the checkout (as in CI), else from
``$FEDGRAPH_DATA_ROOT`` when it holds Cora's raw files (the data root a user filled).
Without either, the tests that need the real datasets skip (``data_root``,
``requires_datasets``), as do those of the reference partitions without ../shared
(``shared_dir``, ``reference_partitions``); the synthetic ones (SBM, CSBM:
``synthetic_root``) always run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _datasets_dir() -> Path:
    shared = SHARED / "datasets"
    env = os.environ.get("FEDGRAPH_DATA_ROOT", "")
    if not shared.is_dir() and env and (Path(env).expanduser() / "Cora" / "raw").is_dir():
        return Path(env).expanduser()
    return shared


#: Where the tests' raw datasets are read from (copied, never written).
DATASETS = _datasets_dir()
NO_DATASETS = ("no raw datasets: neither ../shared/datasets nor a FEDGRAPH_DATA_ROOT holding "
               "Cora/raw: dataset tests skipped")

#: For tests that read ../shared directly instead of through a fixture.
requires_datasets = pytest.mark.skipif(not DATASETS.is_dir(), reason=NO_DATASETS)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not DATASETS.is_dir():
        pytest.skip(NO_DATASETS)
    return SHARED


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """A writable data root holding copies of the raw datasets (their raw/ folders)."""
    if not DATASETS.is_dir():
        pytest.skip(NO_DATASETS)
    root = tmp_path_factory.mktemp("data")
    for name in ("Cora", "CiteSeer", "minesweeper", "tolokers"):
        src = DATASETS / name / "raw"
        if src.is_dir():
            shutil.copytree(src, root / name / "raw")
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
