"""Every file in configs/ resolves as it did before the reproduction profiles (issue #77).

``tests/golden/configs_resolved.json`` holds, for each run config (``configs/<...>.yaml``,
resolved as its ``config-file``) and each cell of each grid (``name``/``grid`` files, their
cells expanded at seed 0, ``<path>#<i>``), a hash of ``RunConfig.to_config()`` as main
resolved it at 048cbd6, before ``<prefix>-reproduce`` existed. The profile keys are left out
of today's config before hashing; every other key must resolve to the same value.
Written by::

    python tests/test_config_replay.py --write   # only where a change is meant to change a config
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import yaml

import fedgraph_flwr.config as config_module
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.experiments import expand

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "configs_resolved.json"


def config_hash(config: dict) -> str:
    kept = {key: value for key, value in config.items() if not key.endswith("-reproduce")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolved_hashes() -> dict[str, str]:
    """``{file or file#cell: hash}`` of every file in configs/, paths from the repo root."""
    out = {}
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        name = str(path.relative_to(ROOT))
        spec = yaml.safe_load(path.read_text()) or {}
        if "grid" in spec:
            spec.setdefault("base", {})
            for i, cell in enumerate(expand(spec, seeds=[0])):
                out[f"{name}#{i}"] = config_hash(resolve_config(None, cell).to_config())
        else:
            out[name] = config_hash(resolve_config(None, {"config-file": name}).to_config())
    return out


def test_every_file_in_configs_resolves_as_before(monkeypatch):
    monkeypatch.chdir(ROOT)  # grids name config-files from the repo root
    # Reference client files (../shared or built by hand) need not be here: their folders
    # are checked when a run starts, not what this test replays.
    monkeypatch.setattr(config_module, "_check_partition_dir", lambda folder, num_clients: None)
    golden = json.loads(GOLDEN.read_text())
    now = resolved_hashes()
    assert sorted(now) == sorted(golden), "a file in configs/ was added or removed: --write"
    changed = sorted(key for key in golden if now[key] != golden[key])
    assert not changed, f"{len(changed)} resolve differently, e.g. {changed[:5]}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import os

    os.chdir(ROOT)
    config_module._check_partition_dir = lambda folder, num_clients: None  # type: ignore[assignment]
    GOLDEN.write_text(json.dumps(resolved_hashes(), indent=0, sort_keys=True) + "\n")
