"""The byte layout shared by the engine's two binary formats: a client's state
(:mod:`.state_codec`) and a message's packed arrays (:mod:`.records`).

``magic`` (8 bytes), a little-endian uint64 ``n``, ``n`` header bytes, then the data
buffers, each starting at a multiple of ``ALIGN`` bytes counted from the first aligned
position after the header. The header says where each buffer is (:func:`offsets`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

ALIGN = 64
_LEN = struct.Struct("<Q")


def aligned(n: int) -> int:
    """``n`` rounded up to a multiple of ``ALIGN``."""
    return -(-n // ALIGN) * ALIGN


def offsets(sizes: Iterable[int]) -> tuple[list[int], int]:
    """Each buffer's offset in the data section, and the section's size."""
    out, total = [], 0
    for size in sizes:
        out.append(total)
        total += aligned(size)
    return out, total


def write(magic: bytes, header: bytes, buffers: Sequence[memoryview | bytes]) -> bytes:
    """One byte string: magic, header length, header, buffers at their :func:`offsets`.

    Built by one ``join`` (each byte copied once): a client state is ~10 MB and is
    written every round.
    """
    head = len(magic) + _LEN.size + len(header)
    parts: list[bytes | memoryview] = [magic, _LEN.pack(len(header)), header, bytes(aligned(head) - head)]
    for buf in buffers:
        parts.append(buf)
        if pad := aligned(len(buf)) - len(buf):
            parts.append(bytes(pad))
    return b"".join(parts)


def read(blob: bytes | bytearray | memoryview, magic: bytes, take: bool = False
         ) -> tuple[memoryview, bytearray | memoryview] | None:
    """(header, the data section), or None without ``magic``. The data section is a
    private writable copy, unless ``take`` and ``blob`` is writable: then it is ``blob``'s
    own bytes, which the caller hands over (no copy)."""
    view = memoryview(blob)
    if bytes(view[:len(magic)]) != magic:
        return None
    (n,) = _LEN.unpack_from(view, len(magic))
    begin = len(magic) + _LEN.size
    data = view[aligned(begin + n):]
    return view[begin:begin + n], (data if take and not view.readonly else bytearray(data))
