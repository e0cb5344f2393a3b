"""Conversions between plain arrays/dicts and Flower records.

Record layout of a train message (server -> client)::

    RecordDict({"arrays": ArrayRecord(personalized payload),
                "config": ConfigRecord(run config + server-round + handshake facts)})

and of its reply (client -> server)::

    RecordDict({"arrays": ArrayRecord(uploaded parameters),
                "metrics": MetricRecord(train/val/test metrics, timings, num-train,
                                        partition-id, and the signature as
                                        "sig.<name>" (flat floats) + "sigshape.<name>")})
"""

from __future__ import annotations

import io
import struct
from collections import OrderedDict
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.common.constant import SType

from ..algorithms.base import Arrays

SIG, SIGSHAPE = "sig.", "sigshape."


def to_array_record(arrays: Arrays) -> ArrayRecord:
    return ArrayRecord(OrderedDict((k, Array(np.ascontiguousarray(v))) for k, v in arrays.items()))


def from_array_record(record: ArrayRecord) -> Arrays:
    return {k: v.numpy() for k, v in record.items()}


def bytes_to_array(blob: bytes) -> Array:
    """``blob`` as a 1-D uint8 Array (numpy's .npy layout, as ``Array(ndarray)`` makes),
    built with one copy instead of ``np.save``'s three: the client state is ~10 MB."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": (len(blob),)})
    return Array(dtype="uint8", shape=(len(blob),), stype=SType.NUMPY,
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
    return ConfigRecord({k: v for k, v in config.items() if isinstance(v, (bool, int, float, str))})


def to_metric_record(metrics: dict[str, float], signature: Arrays) -> MetricRecord:
    """Scalar metrics plus the signature arrays flattened to float lists."""
    out: dict[str, Any] = {k: float(v) for k, v in metrics.items()}
    for name, arr in signature.items():
        out[SIG + name] = [float(x) for x in np.asarray(arr, dtype=np.float32).ravel()]
        out[SIGSHAPE + name] = [int(s) for s in arr.shape]
    return MetricRecord(out)


def from_metric_record(record: MetricRecord) -> tuple[dict[str, float], Arrays]:
    metrics: dict[str, float] = {}
    signature: Arrays = {}
    for key, value in record.items():
        if key.startswith(SIG):
            name = key[len(SIG):]
            shape = tuple(int(s) for s in record.get(SIGSHAPE + name, [len(value)]))
            signature[name] = np.asarray(value, dtype=np.float32).reshape(shape)
        elif not key.startswith(SIGSHAPE):
            metrics[key] = float(value)
    return metrics, signature


def signature_floats(signature: Arrays) -> int:
    return int(sum(a.size for a in signature.values()))
