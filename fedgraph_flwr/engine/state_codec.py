"""A client's between-rounds state (and the server's checkpoint) as one flat byte string.

The state (model and optimizer state dicts, a few extra tensors) travels with every
message under ``client-state=context`` and is written every round under
``client-state=file``. ``torch.save``/``torch.load`` take ~7 ms each for FedAux's
10.5 MB; this codec is a copy of the tensors' bytes into one buffer and back.

Layout (:mod:`.framing`): ``MAGIC``, then as header the pickled *skeleton* (the state
with every tensor replaced by a :class:`TensorRef`; numpy arrays are stored as
tensors), then each tensor's raw bytes. The skeleton holds
only dicts, lists, tuples, numbers, strings, bytes, None and TensorRefs (anything else
is refused when encoding), and :func:`decode` unpickles it with an
unpickler that refuses every other class. Blobs without ``MAGIC`` (written by
``torch.save`` before this codec) are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import framing

MAGIC = b"FGSTATE1"


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor's bytes are in the blob."""

    offset: int
    nbytes: int
    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]
    requires_grad: bool = False


class _SkeletonUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "TensorRef":
            return TensorRef
        raise pickle.UnpicklingError(f"client state: {module}.{name} is not allowed")


def _tensor_bytes(t: torch.Tensor) -> memoryview | bytes:
    """A contiguous CPU tensor's bytes, any dtype (bfloat16 too)."""
    return t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else b""


def encode(state: Any) -> bytes:
    """``state`` (nested dicts/lists/tuples of tensors and plain values) as bytes."""
    tensors: list[torch.Tensor] = []
    offset = 0

    def strip(obj: Any) -> Any:
        nonlocal offset
        if isinstance(obj, torch.Tensor):
            t = obj.detach().to("cpu").contiguous()
            ref = TensorRef(offset, t.numel() * t.element_size(), str(t.dtype).removeprefix("torch."),
                            tuple(t.shape), bool(obj.requires_grad))
            tensors.append(t)
            offset += framing.aligned(ref.nbytes)
            return ref
        if isinstance(obj, np.ndarray):
            return strip(torch.from_numpy(obj.copy(order="C") if not obj.flags.c_contiguous else obj))
        if isinstance(obj, np.generic):
            return obj.item()
        if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
            return obj
        raise TypeError(f"client state: cannot store a {type(obj).__name__} "
                        f"(tensors, arrays, dicts, lists, tuples and plain values only)")

    skeleton = pickle.dumps(_map_leaves(state, strip), protocol=5)
    return framing.write(MAGIC, skeleton, [_tensor_bytes(t) for t in tensors])


def decode(blob: bytes | bytearray | memoryview, device: torch.device | str = "cpu",
           take: bool = False) -> Any:
    """The state :func:`encode` wrote (or an older ``torch.save`` blob), on ``device``.

    Tensors on CPU share one private, writable copy of the blob's tensor bytes: the
    optimizer and model load_state_dict may keep them as their own storage and update
    them in place, so they must not alias the caller's bytes. With ``take`` a writable
    ``blob`` (a bytearray read from a state file) is handed over and used as that storage
    instead of copied.
    """
    framed = framing.read(blob, MAGIC, take=take)
    if framed is None:
        return torch.load(io.BytesIO(blob), map_location=device, weights_only=True)
    header, data = framed
    skeleton = _SkeletonUnpickler(io.BytesIO(header)).load()
    raw = torch.frombuffer(data, dtype=torch.uint8) if data else None

    def build(obj: Any) -> Any:
        if isinstance(obj, TensorRef):
            dtype = getattr(torch, obj.dtype)
            if obj.nbytes == 0:
                t = torch.empty(obj.shape, dtype=dtype)
            else:
                assert raw is not None  # a tensor with bytes implies a non-empty data section
                t = raw[obj.offset:obj.offset + obj.nbytes].view(dtype).view(obj.shape)
            t = t.to(device)
            return t.requires_grad_(True) if obj.requires_grad else t
        return obj

    return _map_leaves(skeleton, build)


def _map_leaves(obj: Any, leaf: Any) -> Any:
    """``obj`` with the same dicts, lists and tuples, and ``leaf(x)`` for everything else."""
    if isinstance(obj, dict):
        return {k: _map_leaves(v, leaf) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_leaves(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_map_leaves(v, leaf) for v in obj)
    return leaf(obj)
