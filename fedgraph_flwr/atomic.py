"""Files written whole or not at all: a reader (another process, a resumed run) never
sees half of one. The engine's records and the HTML reports both write through it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """Write through a temp file in the same folder, then rename: never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
