"""Where OpenFHE runs: in this process where ``import openfhe`` works, else in a worker.

PyPI's ``openfhe`` wheels carry a CPython 3.10 or 3.12 extension and none for 3.11 (the
project's Python): ``pip install openfhe`` succeeds there but ``import openfhe`` fails
(``No module named 'openfhe.openfhe'``), and its sdist is a 3 kB stub that does not
build. So under 3.11 the operations of :mod:`.openfhe_ops` run in a worker process of an
interpreter that has the wheel (``scripts/install-openfhe-worker.sh`` makes one):
env ``FEDGRAPH_OPENFHE_PYTHON``, else ``<repo>/.venv-openfhe/bin/python``. The worker
is this party's own child process on its own machine (a client's secret share goes to
it over a pipe, never off the machine); one per process, started on first use. It runs
OpenFHE's OpenMP loops on env ``FEDGRAPH_OPENFHE_THREADS`` threads (default 1): with
more threads than idle cores they spin and wait, and on this project's busy 2-core
machine every operation took ~10× longer (encryption 125 ms a ciphertext against 13 ms).
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..core.options import ConfigError

PYTHON_ENV = "FEDGRAPH_OPENFHE_PYTHON"
THREADS_ENV = "FEDGRAPH_OPENFHE_THREADS"
OPS_FILE = Path(__file__).with_name("openfhe_ops.py")
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-openfhe" / "bin" / "python"


class OpenFHEUnavailable(ConfigError):
    """No interpreter with OpenFHE (one line: how to make one)."""


class OpenFHEError(RuntimeError):
    """An OpenFHE operation failed (one line, from the worker)."""


def worker_python() -> Path | None:
    """The interpreter the worker runs under, or None where there is none."""
    value = os.environ.get(PYTHON_ENV, "")
    path = Path(value).expanduser() if value else DEFAULT_VENV
    return path if path.is_file() else None


class _Worker:
    """``python openfhe_ops.py --serve`` and a lock around its request/answer pipe."""

    def __init__(self, python: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get(THREADS_ENV, "1")}
        self.process = subprocess.Popen([str(python), str(OPS_FILE), "--serve"], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lock = threading.Lock()
        status, value = self._answer()
        if status != "ok":
            raise OpenFHEUnavailable(f"secure-aggregation=ckks-threshold: the OpenFHE worker "
                                     f"({python}) did not start: {value}")
        atexit.register(self.close)

    def _answer(self) -> tuple[str, Any]:
        assert self.process.stdout is not None
        head = self.process.stdout.read(8)
        if len(head) < 8:
            raise OpenFHEError(f"the OpenFHE worker exited (code {self.process.poll()})")
        (size,) = struct.unpack("<Q", head)
        return pickle.loads(self.process.stdout.read(size))  # noqa: S301 - our own child

    def call(self, name: str, *args: Any) -> Any:
        blob = pickle.dumps((name, args), protocol=4)
        with self.lock:
            assert self.process.stdin is not None
            self.process.stdin.write(struct.pack("<Q", len(blob)) + blob)
            self.process.stdin.flush()
            status, value = self._answer()
        if status != "ok":
            raise OpenFHEError(f"OpenFHE {name}: {value}")
        return value

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


class _InProcess:
    """The same operations, called directly (an interpreter with the wheel)."""

    def __init__(self) -> None:
        from . import openfhe_ops

        self.ops = openfhe_ops

    def call(self, name: str, *args: Any) -> Any:
        try:
            return self.ops.OPERATIONS[name](*args)
        except RuntimeError as exc:  # OpenFHE's own errors
            raise OpenFHEError(f"OpenFHE {name}: {str(exc).splitlines()[0]}") from None


def _importable() -> bool:
    try:
        import openfhe  # noqa: F401
    except ImportError:
        return False
    return True


@lru_cache(maxsize=1)
def openfhe() -> _Worker | _InProcess:
    """This process's OpenFHE: in process where it imports, else the worker."""
    if _importable():
        return _InProcess()
    python = worker_python()
    if python is None:
        raise OpenFHEUnavailable(
            "secure-aggregation=ckks-threshold needs OpenFHE: `pip install openfhe` has no "
            "build for this Python; run scripts/install-openfhe-worker.sh (a Python 3.10 "
            f"venv with openfhe in .venv-openfhe) or set {PYTHON_ENV} to such an interpreter")
    return _Worker(python)


def available() -> str | None:
    """Why OpenFHE cannot run here, or None (tests skip on it and say why)."""
    try:
        openfhe()
    except (OpenFHEUnavailable, OpenFHEError) as exc:
        return str(exc)
    return None


def call(name: str, *args: Any) -> Any:
    """Run :mod:`.openfhe_ops`'s operation ``name``."""
    return openfhe().call(name, *args)
