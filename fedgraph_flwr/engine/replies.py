"""Reply validation: every client reply is checked before the aggregator sees it.

A train reply must match the initial model's schema (names, shapes) and carry the
engine's metric contract (:mod:`~.protocols`); every phase's reply is bounded
(``max-array-bytes``) and finite, and a signature keeps the shape it first had. A
rejected reply becomes the client's failure for the round, never part of an aggregate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..algorithms.base import Arrays, ClientUpdate, Phase
from . import protocols
from .transport import ClientReply


class ReplyValidator:
    """The checks of one run: the initial model's schema and the signatures' shapes."""

    def __init__(self, initial: Arrays, max_array_bytes: int,
                 log: Callable[[str], None] = print,
                 ciphertexts: Callable[[Arrays], str | None] | None = None,
                 withheld: frozenset[str] = frozenset()) -> None:
        self.schema = {k: (v.shape, v.dtype) for k, v in initial.items()}
        # secure-aggregation=ckks: a train upload is checked as ciphertexts instead
        # (engine/ckks_mixing.py, CiphertextMixer.check).
        self.ciphertexts = ciphertexts
        self.signature_schema: dict[str, tuple[int, ...]] = {}
        self.max_array_bytes = max_array_bytes
        self.log = log
        # dp=client (issue #76): the counts no client sends (privacy/counts.py). The contract
        # does not ask for them, one a client sends anyway is dropped, and every client
        # weighs 1 where the aggregator weighs by training nodes.
        self.withheld = withheld

    def check(self, reply: ClientReply, phase: str = "train") -> str | None:
        """Why a reply must be rejected, or None. Guards the aggregate against poison."""
        upload = reply.upload
        if phase == "train" and self.ciphertexts is not None:
            reason = self._check_ciphertexts(upload)
        else:
            reason = self._check_arrays(upload, phase)
        if reason is not None:
            return reason
        for name, arr in reply.signature.items():
            if not np.isfinite(arr).all():
                return f"signature {name!r} holds NaN or Inf"
            expected = self.signature_schema.get(name)
            if phase == "train" and expected is not None and arr.shape != expected:
                return f"signature {name!r} has shape {arr.shape}, expected {expected}"
        if "train_loss" in reply.metrics and not math.isfinite(reply.metrics["train_loss"]):
            return "train loss is NaN or Inf"
        if phase == "train":
            missing = [k for k in protocols.missing_metrics(reply.metrics)
                       if k not in self.withheld]
            if missing:
                return (f"metrics {missing[:4]} missing (every train reply carries the "
                        f"engine's metric contract, engine/protocols.py)")
        return None

    def _check_arrays(self, upload: Arrays, phase: str) -> str | None:
        """The plaintext schema (train), size and finiteness of every array."""
        limit = self.max_array_bytes
        if phase == "train" and set(upload) != set(self.schema):
            missing = sorted(set(self.schema) - set(upload))
            extra = sorted(set(upload) - set(self.schema))
            return f"wrong array names (missing {missing[:3]}, unexpected {extra[:3]})"
        for name, arr in upload.items():
            if phase == "train" and arr.shape != self.schema[name][0]:
                return f"array {name!r} has shape {arr.shape}, expected {self.schema[name][0]}"
            if arr.nbytes > limit:
                return f"array {name!r} is {arr.nbytes} bytes, over max-array-bytes={limit}"
            if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
                return f"array {name!r} holds NaN or Inf"
        return None

    def _check_ciphertexts(self, upload: Arrays) -> str | None:
        """ckks: each chunk bounded, then the mixer's check (names, sizes, that they load)."""
        for name, arr in upload.items():
            if arr.nbytes > self.max_array_bytes:
                return (f"array {name!r} is {arr.nbytes} bytes, over "
                        f"max-array-bytes={self.max_array_bytes}")
        return self.ciphertexts(upload) if self.ciphertexts else None

    def valid_updates(self, phase: Phase, server_round: int, replies: dict[int, ClientReply],
                      failures: dict[int, str]) -> dict[int, ClientUpdate]:
        """The replies that pass :meth:`check`; the others go into ``failures``. The first
        valid train replies fix the signatures' shapes for the rest of the run."""
        updates: dict[int, ClientUpdate] = {}
        for cid, reply in sorted(replies.items()):
            reason = self.check(reply, phase.name)
            if reason is not None:
                failures[cid] = f"rejected: {reason}" + ("" if phase.name == "train"
                                                         else f" (phase {phase.name})")
                self.log(f"round {server_round}: client {cid} reply rejected: {reason}")
                continue
            metrics = {k: v for k, v in reply.metrics.items() if k not in self.withheld}
            num_train = 1 if "num-train" in self.withheld else int(metrics.get("num-train", 0))
            updates[cid] = ClientUpdate(reply.upload, reply.signature, num_train, metrics)
        if phase.name == "train":  # after the round's checks: its replies are held to the last's
            for update in updates.values():
                for name, arr in update.signature.items():
                    self.signature_schema.setdefault(name, arr.shape)
        return updates

    def state_dict(self) -> dict[str, Any]:
        """The validator's part of a checkpoint (the signatures' shapes)."""
        return {"signature_schema": {k: list(v) for k, v in self.signature_schema.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.signature_schema = {k: tuple(v) for k, v in state["signature_schema"].items()}
