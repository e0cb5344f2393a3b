"""Text blocks generated from the code (pyproject's run-config block, README's method
table): replaced between their marker lines, and written or checked by one command."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def replace_block(text: str, begin: str, end: str, block: str) -> str | None:
    """``text`` with what lies from ``begin`` through ``end`` replaced by ``block``
    (which holds both markers); None when the markers are missing or out of order."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        return None
    return text[:start] + block + text[stop + len(end):]


def write_or_check(path: Path, render: Callable[[str], str], *, check: bool,
                   stale: str) -> int:
    """Rewrite ``path`` with ``render(text)`` (``check``: only report a stale file with
    the one line ``stale``); the exit status: 0 current or written, 1 stale, 2 unreadable
    (``render`` raised ValueError)."""
    text = path.read_text()
    try:
        new = render(text)
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    if check:
        if new != text:
            print(stale, file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new)
        print(f"wrote {path}")
    return 0
