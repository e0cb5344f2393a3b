"""Checkpoints: everything a run needs to continue after its last completed round,
written atomically after every round, and read back by ``resume=true``."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_write
from ..config import ConfigError, RunConfig
from . import state_codec

# Config keys that may change between a run and its resume (limits, paths, logging);
# every other key must match the checkpoint's, or resuming would mix two experiments.
RESUMABLE_CHANGES = frozenset({
    "rounds", "resume", "fail-fast", "round-timeout", "handshake-timeout", "min-clients",
    "verbose", "output-dir", "data-root", "partition-dir", "config-file", "client-state",
    "client-state-dir", "max-array-bytes", "memory-limit", "ckks-secret-context",
    "ckks-public-context", "device", "trackers", "tracker-dir", "tracker-group",
})


def to_numpy(obj: Any) -> Any:
    """Tensors (as the codec stores numpy arrays) back to numpy, in nested containers."""
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_numpy(v) for v in obj)
    return obj


class Checkpointer:
    """``<out_dir>/checkpoint.pt``, in the engine's own codec (no pickle)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / "checkpoint.pt"
        self._writer: threading.Thread | None = None
        self._write_error: BaseException | None = None

    def save(self, config: RunConfig, state: dict[str, Any], *, background: bool = False) -> None:
        """Encode ``state`` now (a snapshot: the caller may change it right after), then
        write it, in a thread when ``background``: the next round's clients start while
        the file is written. :meth:`wait` (and the next ``save``) joins that write."""
        blob = state_codec.encode({**state, "config_json": json.dumps(config.all_keys(), default=str)})
        self.wait()
        if not background:
            atomic_write(self.path, lambda fh: fh.write(blob))
            return

        def write() -> None:
            try:
                atomic_write(self.path, lambda fh: fh.write(blob))
            except BaseException as exc:  # noqa: BLE001 - raised by wait(), in the caller
                self._write_error = exc

        # Not a daemon: an interpreter that exits (a run that raised) still finishes it.
        self._writer = threading.Thread(target=write, name="checkpoint-writer")
        self._writer.start()

    def wait(self) -> None:
        """Until the last ``save`` is on disk; re-raises its error (a full disk)."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._write_error is not None:
            error, self._write_error = self._write_error, None
            raise error

    def load(self, config: RunConfig) -> dict[str, Any]:
        """The saved state; a one-line ConfigError if it is missing, unreadable or of
        another run (a key outside :data:`RESUMABLE_CHANGES` differs)."""
        self.wait()
        if not self.path.is_file():
            raise ConfigError(f"resume=true but there is no checkpoint at {self.path}")
        try:
            state = state_codec.decode(self.path.read_bytes())
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file
            raise ConfigError(f"resume=true but {self.path} is unreadable: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                              ) from None
        if "config_json" in state:
            saved = json.loads(state["config_json"])
            now = config.all_keys()
            changed = [k for k in sorted(set(saved) | set(now))
                       if k not in RESUMABLE_CHANGES and saved.get(k) != now.get(k)]
            if changed:
                detail = ", ".join(f"{k}={saved.get(k)!r} -> {now.get(k)!r}"
                                   for k in changed[:4])
                raise ConfigError(f"resume=true but the checkpoint at {self.path} is "
                                  f"of a different run ({detail}); use the same settings or "
                                  f"another run-name")
        return to_numpy({k: v for k, v in state.items() if k != "diagnostics"}) | {
            "diagnostics": {n: [t.numpy() for t in v] for n, v in state["diagnostics"].items()}}
