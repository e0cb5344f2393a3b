"""Shared fixtures: a private copy of ../shared/datasets (never write into shared/)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"../shared not found at {SHARED}")
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
def reference_partitions(shared_dir) -> Path:
    return shared_dir / "reference-partitions" / "fedaux-cora-disjoint-10"
