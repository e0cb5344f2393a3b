"""Reply validation: every client reply is checked before the aggregator sees it.

Every schema a reply is held to is the server's own, never a reply's: the train
upload's names, shapes and dtypes are the initial model's; the signature's names and
shapes are what the algorithm declares (``ClientTrainer.signature_shapes``); a non-train
phase's arrays are what the trainer declares for the request the server sent
(``ClientTrainer.phase_reply_specs``: names, shapes up to the node counts the server
cannot know, dtypes and integer ranges); every
count a reply carries is bounded by what that client declared at the handshake
(``num-train`` by its ``num-train``, ``test_count`` by its ``num-test``, ...); every
number is finite and in its range; every array is bounded (``max-array-bytes``). A
rejected reply becomes the client's failure for the round, with a one-line reason,
never part of an aggregate and never the end of the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..core.phases import Arrays, ClientUpdate, Phase, ReplySpec
from . import protocols
from .transport import ClientReply

#: Most metric entries a reply may carry: far above any algorithm's (about 40), far below
#: what would cost the server memory.
MAX_METRICS = 1024

#: Train-reply metrics that are scores in [0, 1] (NaN allowed: a client without such nodes).
SCORES = ("val_metric", "test_metric", "minority_metric")
#: Train-reply counts and the handshake fact that bounds each.
HANDSHAKE_BOUNDS = {"num-train": "num-train", "val_count": "num-val", "test_count": "num-test",
                    "minority_count": "num-test"}
#: Train-reply counts bounded by another count of the same reply.
REPLY_BOUNDS = {"test_correct": "test_count", "minority_correct": "minority_count"}


def wrong_names(what: str, got: Mapping[str, Any], expected: Mapping[str, Any]) -> str | None:
    """One line when ``got``'s names are not exactly ``expected``'s (``what``: array or
    signature), naming up to three missing and three unexpected."""
    if set(got) == set(expected):
        return None
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    return f"wrong {what} names (missing {missing[:3]}, unexpected {extra[:3]})"


class ReplyValidator:
    """The checks of one run.

    ``initial``: the server's initial model (the train upload's schema); ``signature_shapes``:
    the algorithm's declared signature; ``facts``: each client's handshake facts (the
    bounds of its counts); ``ciphertexts``: under ``secure-aggregation=ckks`` the mixer's
    check of a train upload (engine/ckks_mixing.py), in place of the plaintext schema.
    """

    def __init__(self, initial: Arrays, signature_shapes: Mapping[str, tuple[int, ...]],
                 facts: Mapping[int, Mapping[str, Any]], max_array_bytes: int,
                 log: Callable[[str], None] = print,
                 ciphertexts: Callable[[Arrays], str | None] | None = None,
                 withheld: frozenset[str] = frozenset()) -> None:
        self.schema = {k: (v.shape, v.dtype) for k, v in initial.items()}
        self.signature_shapes = {k: tuple(int(s) for s in v) for k, v in signature_shapes.items()}
        self.facts = facts
        self.ciphertexts = ciphertexts
        self.max_array_bytes = max_array_bytes
        self.log = log
        # dp=client (issue #76): the counts no client sends (privacy/counts.py). The contract
        # does not ask for them, one a client sends anyway is dropped, and every client
        # weighs 1 where the aggregator weighs by training nodes.
        self.withheld = withheld

    def check(self, cid: int, reply: ClientReply, phase: str = "train",
              spec: ReplySpec | None = None) -> str | None:
        """Why client ``cid``'s reply must be rejected, or None. ``spec``: a non-train
        phase's declared reply (None: an engine phase whose own step checks more, as
        ckks-threshold's; then size, dtype kind and finiteness only)."""
        train = phase == "train"
        if train and self.ciphertexts is not None:
            reason = self._check_ciphertexts(reply.upload)
        elif spec is not None and not train:
            reason = (self._check_phase_arrays(reply.upload, spec)
                      or self._check_phase_metrics(cid, reply.metrics, spec))
            if reason is None and reply.signature:
                reason = f"a signature in phase {phase!r}, which carries none"
        else:
            reason = self._check_arrays(reply.upload, train)
        return (reason or self._check_signature(reply.signature, train)
                or self._check_metrics(cid, reply.metrics, train))

    def _check_arrays(self, upload: Arrays, train: bool) -> str | None:
        """The plaintext schema (train), size and finiteness of every array."""
        if train and (reason := wrong_names("array", upload, self.schema)):
            return reason
        for name, arr in upload.items():
            if reason := self._unbounded(name, arr):
                return reason
            if train:
                shape, dtype = self.schema[name]
                if arr.shape != shape:
                    return f"array {name!r} has shape {arr.shape}, expected {shape}"
                if arr.dtype != dtype:
                    return f"array {name!r} has dtype {arr.dtype}, expected {dtype}"
            elif arr.dtype.hasobject or arr.dtype.kind not in "biufc":
                return f"array {name!r} has dtype {arr.dtype}, not a number type"
            if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                return f"array {name!r} holds NaN or Inf"
        return None

    def _unbounded(self, name: str, arr: object) -> str | None:
        """Why one uploaded array cannot even be looked at: not an array, or over
        ``max-array-bytes``."""
        if not isinstance(arr, np.ndarray):
            return f"array {name!r} is a {type(arr).__name__}, not an array"
        if arr.nbytes > self.max_array_bytes:
            return (f"array {name!r} is {arr.nbytes} bytes, over "
                    f"max-array-bytes={self.max_array_bytes}")
        return None

    def _check_phase_arrays(self, upload: Arrays, spec: ReplySpec) -> str | None:
        """A non-train reply: exactly the declared arrays, each of its declared dtype and
        shape (a named length the same across the reply's arrays), integers in range,
        floats finite."""
        specs = spec.arrays
        if reason := wrong_names("array", upload, specs):
            return reason
        lengths: dict[str, int] = {}
        for name, arr in sorted(upload.items()):
            if reason := self._unbounded(name, arr):
                return reason
            declared = specs[name]
            if arr.dtype != np.dtype(declared.dtype):
                return f"array {name!r} has dtype {arr.dtype}, expected {declared.dtype}"
            expected = tuple(lengths.get(d, d) if isinstance(d, str) else d for d in declared.shape)
            fits = arr.ndim == len(declared.shape) and all(
                isinstance(want, str) or got == want for got, want in zip(arr.shape, expected))
            if not fits:
                return f"array {name!r} has shape {arr.shape}, expected {expected}"
            for got, want in zip(arr.shape, declared.shape):
                if isinstance(want, str):
                    lengths.setdefault(want, got)
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                return f"array {name!r} holds NaN or Inf"
            if arr.size and declared.low is not None and int(arr.min()) < declared.low:
                return f"array {name!r} holds {int(arr.min())}, below {declared.low}"
            if arr.size and declared.high is not None and int(arr.max()) > declared.high:
                return f"array {name!r} holds {int(arr.max())}, above {declared.high}"
        return None

    def _check_phase_metrics(self, cid: int, metrics: Mapping[str, float], spec: ReplySpec
                             ) -> str | None:
        """A non-train reply's declared numbers: present, in range, NaN only where allowed,
        within the client's handshake fact where one bounds them."""
        for key, want in spec.metrics.items():
            value = metrics.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                return f"metric {key!r} missing (phase replies carry it)"
            if math.isnan(value):
                if want.nan:
                    continue
                return f"metric {key!r} is NaN"
            high = min(want.high, self.facts.get(cid, {}).get(want.fact, math.inf)
                       if want.fact else math.inf)
            if not want.low <= value <= high:
                return f"metric {key!r} is {value:g}, outside [{want.low:g}, {high:g}]"
        return None

    def _check_ciphertexts(self, upload: Arrays) -> str | None:
        """ckks: each chunk bounded, then the mixer's check (names, sizes, that they load)."""
        for name, arr in upload.items():
            if arr.nbytes > self.max_array_bytes:
                return (f"array {name!r} is {arr.nbytes} bytes, over "
                        f"max-array-bytes={self.max_array_bytes}")
        return self.ciphertexts(upload) if self.ciphertexts else None

    def _check_signature(self, signature: Arrays, train: bool) -> str | None:
        """A train signature is exactly the declared names and shapes; any is finite."""
        if train and (reason := wrong_names("signature", signature, self.signature_shapes)):
            return reason
        for name, arr in signature.items():
            if train and arr.shape != self.signature_shapes[name]:
                return (f"signature {name!r} has shape {arr.shape}, expected "
                        f"{self.signature_shapes[name]}")
            if arr.nbytes > self.max_array_bytes:
                return (f"signature {name!r} is {arr.nbytes} bytes, over "
                        f"max-array-bytes={self.max_array_bytes}")
            if arr.dtype.kind != "f":
                return f"signature {name!r} has dtype {arr.dtype}, not a float type"
            if not np.isfinite(arr).all():
                return f"signature {name!r} holds NaN or Inf"
        return None

    def _check_metrics(self, cid: int, metrics: Mapping[str, float], train: bool) -> str | None:
        """Every number finite (NaN only where a score or loss may be undefined); a train
        reply's contract complete, its scores in [0, 1], its counts whole and within what
        the client declared at the handshake."""
        if len(metrics) > MAX_METRICS:
            return f"{len(metrics)} metrics, over {MAX_METRICS}"
        for key, value in metrics.items():
            if not isinstance(value, (int, float)) or math.isinf(value):
                return f"metric {key!r} is {value!r}, not a finite number"
        loss = metrics.get("train_loss", 0.0)
        if math.isnan(loss):
            return "train loss is NaN or Inf"
        if not train:
            return None
        missing = [k for k in protocols.missing_metrics(dict(metrics)) if k not in self.withheld]
        if missing:
            return (f"metrics {missing[:4]} missing (every train reply carries the "
                    f"engine's metric contract, engine/protocols.py)")
        for key in SCORES:
            value = metrics.get(key, math.nan)
            if not math.isnan(value) and not 0.0 <= value <= 1.0:
                return f"metric {key!r} is {value!r}, outside [0, 1]"
        facts = self.facts.get(cid, {})
        bounds = [(key, bound, facts.get(bound), "the handshake")
                  for key, bound in HANDSHAKE_BOUNDS.items()]
        bounds += [(key, bound, metrics.get(bound), "this reply")
                   for key, bound in REPLY_BOUNDS.items()]
        for key, bound_key, bound, where in bounds:
            count = metrics.get(key)
            if count is None or (math.isnan(count) and key != "num-train"):
                continue  # a count of a phase that evaluated nothing (NaN, as its scores)
            value = float(count)
            if math.isnan(value) or value != int(value) or value < 0:
                return f"{key} is {value!r}, not a count"
            if bound is not None and value > bound:
                return f"{key} is {value:g}, above {bound_key}={bound:g} of {where}"
        if metrics.get("num-train", 1) < 1:
            return "num-train is 0: a client without training nodes cannot train"
        return None

    def valid_updates(self, phase: Phase, server_round: int, replies: dict[int, ClientReply],
                      failures: dict[int, str],
                      specs: Callable[[int], ReplySpec] | None = None
                      ) -> dict[int, ClientUpdate]:
        """The replies that pass :meth:`check` (``specs``: a non-train phase's declared
        reply for each client); the others go into ``failures``."""
        updates: dict[int, ClientUpdate] = {}
        for cid, reply in sorted(replies.items()):
            reason = self.check(cid, reply, phase.name, specs(cid) if specs else None)
            if reason is not None:
                failures[cid] = f"rejected: {reason}" + ("" if phase.name == "train"
                                                         else f" (phase {phase.name})")
                self.log(f"round {server_round}: client {cid} reply rejected: {reason}")
                continue
            metrics = {k: v for k, v in reply.metrics.items() if k not in self.withheld}
            num_train = 1 if "num-train" in self.withheld else int(metrics.get("num-train", 0))
            updates[cid] = ClientUpdate(reply.upload, reply.signature, num_train, metrics)
        return updates
