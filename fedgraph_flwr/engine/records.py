"""Conversions between plain arrays/dicts and Flower records.

A message's arrays travel packed: one byte string in :mod:`.framing`'s layout,
``PACK_MAGIC``, a JSON list of ``[name, dtype, shape, offset]`` as header, and the
arrays' bytes (no pickle: it comes from the network). Where it goes depends on its size.

Up to :data:`INLINE_MAX_BYTES` (every model of the papers' settings), inline, as one
``bytes`` entry of the message's only record::

    train message (server -> client):  RecordDict({"config": ConfigRecord(run config
        + server-round + handshake facts + {INLINE: <packed arrays>})})
    reply (client -> server):          RecordDict({"metrics": ConfigRecord(train/val/test
        metrics, timings, num-train, partition-id, the signature as "sig.<name>" (flat
        floats) + "sigshape.<name>", and {INLINE: <packed arrays>})})

Larger, as one uint8 ``Array`` of an ArrayRecord beside the scalars (Flower cuts an
Array into 5 MB chunks, so no single request grows with the model)::

    RecordDict({"arrays": ArrayRecord({"packed": <packed arrays>}),
                "config": ConfigRecord(...)})       # train message
    RecordDict({"arrays": ArrayRecord({"packed": <packed arrays>}),
                "metrics": MetricRecord(...)})      # reply

Why: a deployed SuperLink stores, and SuperNodes push and pull, every record, Array and
chunk as its own object, one authenticated request and SQLite transaction each, and
that per-request cost, not the bytes, is most of a deployed round (docs/performance.md,
"Where a deployed round's time goes"). A FedAux model as 7 Arrays is 18 objects per
message; packed into one Array, 6 (message, record dict, array record, array, chunk,
scalars); inline, 3. :func:`content_arrays` reads every layout, including a record of
one Array per name.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from ..core.phases import Arrays
from . import framing

SIG, SIGSHAPE = "sig.", "sigshape."


PACKED = "packed"
#: The ``bytes`` entry that carries the packed arrays inline in a message's record.
INLINE = "packed-arrays"
#: Largest packed payload sent inline: below Flower's 5 MB array chunk, so an inline
#: record is never a larger request than Flower's own chunking sends.
INLINE_MAX_BYTES = 4 * 2**20
PACK_MAGIC = b"FGARRS1\0"
#: The serialization type Flower gives an Array made from a numpy array.
NUMPY_STYPE = Array(np.zeros(0, np.uint8)).stype


def pack_arrays(arrays: Arrays) -> bytes:
    """Named numpy arrays as one byte string (see the module docstring)."""
    values = [np.asarray(v) for v in arrays.values()]
    values = [v if v.flags.c_contiguous else v.copy(order="C") for v in values]  # keeps 0-d
    for name, v in zip(arrays, values):
        if v.dtype.hasobject:
            raise TypeError(f"array {name!r} has dtype object")
    where, _ = framing.offsets(v.nbytes for v in values)
    layout = [[str(name), v.dtype.str, list(v.shape), off]
              for name, v, off in zip(arrays, values, where)]
    return framing.write(PACK_MAGIC, json.dumps(layout).encode(),
                         [v.reshape(-1).view(np.uint8).data for v in values])


def unpack_arrays(blob: bytes | memoryview) -> Arrays:
    """The arrays :func:`pack_arrays` wrote, writable and independent of ``blob``."""
    framed = framing.read(blob, PACK_MAGIC)
    if framed is None:
        raise ValueError("not a packed array record")
    header, data = framed  # one copy; the arrays are views of it
    out: Arrays = {}
    for name, dtype, shape, offset in json.loads(bytes(header)):
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise ValueError(f"array {name!r}: dtype {dtype} not allowed")
        count = int(np.prod(shape, dtype=np.int64))
        out[name] = np.frombuffer(data, dtype=dt, count=count, offset=int(offset)).reshape(tuple(shape))
    return out


def packed_array_record(packed: bytes) -> ArrayRecord:
    """Packed arrays (:func:`pack_arrays`) as a record of one Array: the large layout."""
    return ArrayRecord({PACKED: bytes_to_array(packed)})


def from_array_record(record: ArrayRecord) -> Arrays:
    """The arrays of a packed record, or of a record of one Array per name."""
    if list(record.keys()) == [PACKED]:
        return unpack_arrays(array_to_bytes(record[PACKED]))
    return {k: v.numpy() for k, v in record.items()}


def bytes_to_array(blob: bytes) -> Array:
    """``blob`` as a 1-D uint8 Array (numpy's .npy layout, as ``Array(ndarray)`` makes),
    built with one copy instead of ``np.save``'s three: the client state is ~10 MB."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": (len(blob),)})
    return Array(dtype="uint8", shape=(len(blob),), stype=NUMPY_STYPE,
                 data=header.getvalue() + blob)


def array_to_bytes(array: Array) -> memoryview:
    """The bytes :func:`bytes_to_array` wrapped (any 1-D uint8 .npy Array), without copying."""
    data = memoryview(array.data)
    if array.dtype != "uint8" or len(array.shape) != 1 or bytes(data[:6]) != b"\x93NUMPY":
        raise ValueError(f"not a 1-D uint8 .npy array: dtype={array.dtype} shape={array.shape}")
    major = data[6]
    (header_len,) = struct.unpack_from("<H" if major == 1 else "<I", data, 8)
    start = 10 + header_len if major == 1 else 12 + header_len
    return data[start:start + int(array.shape[0])]


def to_config_record(config: dict[str, Any]) -> ConfigRecord:
    """The scalar and string entries of ``config`` as a ConfigRecord."""
    return ConfigRecord({k: v for k, v in config.items() if isinstance(v, (bool, int, float, str))})


def to_metric_record(metrics: dict[str, float], signature: Arrays) -> MetricRecord:
    """Scalar metrics plus the signature arrays flattened to float lists."""
    out: dict[str, Any] = {k: float(v) for k, v in metrics.items()}
    for name, arr in signature.items():
        out[SIG + name] = [float(x) for x in np.asarray(arr, dtype=np.float32).ravel()]
        out[SIGSHAPE + name] = [int(s) for s in arr.shape]
    return MetricRecord(out)


def from_metric_record(record: Mapping[str, Any]) -> tuple[dict[str, float], Arrays]:
    """Metrics and signature arrays from a reply's metrics (inverse of to_metric_record)."""
    metrics: dict[str, float] = {}
    signature: Arrays = {}
    for key, value in record.items():
        if key.startswith(SIG):
            name = key[len(SIG):]
            values = cast(list[float], value)  # to_metric_record writes signatures as lists
            shape = tuple(int(s) for s in cast(list[int], record.get(SIGSHAPE + name, [len(values)])))
            signature[name] = np.asarray(values, dtype=np.float32).reshape(shape)
        elif not key.startswith(SIGSHAPE):
            metrics[key] = float(cast(float, value))  # and metrics as scalars
    return metrics, signature


def request_content(arrays: Arrays, config: ConfigRecord) -> RecordDict:
    """A train message's content: ``config`` and the packed ``arrays`` (module docstring)."""
    return _with_arrays(arrays, "config", config)


def reply_content(arrays: Arrays, metrics: dict[str, float], signature: Arrays) -> RecordDict:
    """A reply's content: metrics, signature and the packed ``arrays`` (module docstring)."""
    return _with_arrays(arrays, "metrics", to_metric_record(metrics, signature))


def _with_arrays(arrays: Arrays, key: str, scalars: ConfigRecord | MetricRecord) -> RecordDict:
    """``scalars`` as record ``key``, with the packed ``arrays`` inline in it when small,
    else beside it as the ``arrays`` record."""
    packed = pack_arrays(arrays)
    if len(packed) <= INLINE_MAX_BYTES:
        return RecordDict({key: ConfigRecord({**scalars, INLINE: packed})})
    return RecordDict({"arrays": packed_array_record(packed), key: scalars})


def content_arrays(content: RecordDict) -> Arrays:
    """The arrays of a message's content, in whichever layout it came."""
    if "arrays" in content:
        return from_array_record(cast(ArrayRecord, content["arrays"]))
    for record in content.config_records.values():
        if INLINE in record:
            return unpack_arrays(cast(bytes, record[INLINE]))
    raise ValueError(f"the message carries no arrays (no 'arrays' record and no "
                     f"{INLINE!r} entry; records: {sorted(content)})")


def content_scalars(content: RecordDict, key: str) -> dict[str, Any]:
    """Record ``key`` of a message's content (its config or metrics), without the arrays."""
    return {k: v for k, v in content[key].items() if k != INLINE}


def signature_floats(signature: Arrays) -> int:
    """Number of floats in ``signature``."""
    return int(sum(a.size for a in signature.values()))
