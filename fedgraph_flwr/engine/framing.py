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
    """One byte string: magic, header length, header, buffers at their :func:`offsets`."""
    where, size = offsets(len(b) for b in buffers)
    start = aligned(len(magic) + _LEN.size + len(header))
    out = bytearray(start + size)
    out[:len(magic)] = magic
    out[len(magic):len(magic) + _LEN.size] = _LEN.pack(len(header))
    out[len(magic) + _LEN.size:len(magic) + _LEN.size + len(header)] = header
    for off, buf in zip(where, buffers):
        out[start + off:start + off + len(buf)] = buf
    return bytes(out)


def read(blob: bytes | bytearray | memoryview, magic: bytes) -> tuple[memoryview, bytearray] | None:
    """(header, a private writable copy of the data section), or None without ``magic``."""
    view = memoryview(blob)
    if bytes(view[:len(magic)]) != magic:
        return None
    (n,) = _LEN.unpack_from(view, len(magic))
    begin = len(magic) + _LEN.size
    return view[begin:begin + n], bytearray(view[aligned(begin + n):])
