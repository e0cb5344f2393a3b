"""Packing a message's arrays into one Flower Array (fedgraph_flwr.engine.records)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedgraph_flwr.engine import records
from fedgraph_flwr.engine.records import (
    INLINE,
    PACKED,
    array_to_bytes,
    bytes_to_array,
    content_arrays,
    content_scalars,
    from_array_record,
    from_metric_record,
    pack_arrays,
    packed_array_record,
    reply_content,
    request_content,
    unpack_arrays,
)


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "conv1.weight": rng.standard_normal((37, 16)).astype(np.float32),
        "strided": rng.standard_normal((6, 8))[:, ::2],  # not contiguous
        "empty": np.zeros((0, 3), np.float32),
        "scalar": np.array(2.5, np.float64),  # 0-d stays 0-d
        "ids": np.arange(7, dtype=np.int64),
        "half": np.ones((2, 3), np.float16),
        "flags": np.array([True, False]),
    }


def test_one_packed_array_round_trips_every_dtype_and_shape():
    arrays = _arrays()
    record = packed_array_record(pack_arrays(arrays))
    assert list(record.keys()) == [PACKED]
    packed = record[PACKED].numpy()  # a valid .npy, as Flower's own Array(ndarray) makes
    assert packed.dtype == np.uint8 and packed.ndim == 1
    back = from_array_record(record)
    assert list(back) == list(arrays)
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        assert np.array_equal(back[name], value), name
    back["conv1.weight"] += 1  # writable, and not a view of the record
    assert np.array_equal(from_array_record(record)["conv1.weight"], arrays["conv1.weight"])


def test_reads_a_record_of_one_array_per_name_too():
    arrays = {"a": np.arange(4, dtype=np.float32), "b": np.ones((2, 2))}
    legacy = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    back = from_array_record(legacy)
    assert all(np.array_equal(back[k], arrays[k]) for k in arrays)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="not a packed array record"):
        unpack_arrays(b"\x00" * 64)
    with pytest.raises(TypeError, match="dtype object"):
        pack_arrays({"o": np.array([object()])})
    with pytest.raises(ValueError, match="1-D uint8"):
        array_to_bytes(Array(np.ones(3, np.float32)))


def test_bytes_to_array_is_numpys_own_npy_layout():
    blob = bytes(range(256)) * 3
    ours = bytes_to_array(blob)
    numpys = Array(np.frombuffer(blob, dtype=np.uint8))
    assert ours.data == numpys.data
    assert bytes(array_to_bytes(ours)) == blob


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def test_a_model_travels_inline_in_the_one_record_of_its_message():
    """Up to INLINE_MAX_BYTES the packed arrays are a bytes entry of the message's only
    record: a deployed SuperLink then stores 3 objects per message, not 6."""
    arrays = _arrays()
    content = request_content(arrays, ConfigRecord({"server-round": 3, "lr": 0.01}))
    assert list(content) == ["config"] and not content.array_records
    assert isinstance(content["config"][INLINE], bytes)
    assert content_scalars(content, "config") == {"server-round": 3, "lr": 0.01}
    assert _same(content_arrays(content), arrays)

    signature = {"apv": np.arange(6, dtype=np.float32).reshape(2, 3)}
    reply = reply_content(arrays, {"train-loss": 0.5, "num-train": 12.0}, signature)
    assert list(reply) == ["metrics"] and not reply.array_records
    metrics, sig = from_metric_record(content_scalars(reply, "metrics"))
    assert metrics == {"train-loss": 0.5, "num-train": 12.0}
    assert _same(sig, signature) and _same(content_arrays(reply), arrays)


def test_a_model_over_the_inline_limit_travels_as_one_chunked_array(monkeypatch):
    """Above the limit the packed arrays become one Flower Array beside the scalars,
    which Flower cuts into 5 MB chunks: no request grows with the model."""
    arrays = _arrays()
    monkeypatch.setattr(records, "INLINE_MAX_BYTES", len(pack_arrays(arrays)) - 1)
    content = request_content(arrays, ConfigRecord({"server-round": 3}))
    assert sorted(content) == ["arrays", "config"] and INLINE not in content["config"]
    assert list(content["arrays"]) == [PACKED]
    assert content_scalars(content, "config") == {"server-round": 3}
    assert _same(content_arrays(content), arrays)
    reply = reply_content(arrays, {"num-train": 1.0}, {})
    assert sorted(reply) == ["arrays", "metrics"]
    assert from_metric_record(content_scalars(reply, "metrics")) == ({"num-train": 1.0}, {})
    assert _same(content_arrays(reply), arrays)


def test_a_message_without_arrays_is_refused_in_one_line():
    content = RecordDict({"config": ConfigRecord({"server-round": 1})})
    with pytest.raises(ValueError, match="carries no arrays"):
        content_arrays(content)
