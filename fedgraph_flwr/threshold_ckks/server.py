"""The server's side of ``secure-aggregation=ckks-threshold`` (:mod:`fedgraph_flwr.threshold_ckks`).

:class:`ThresholdAggregator` wraps the algorithm's aggregator: it answers the protocol's
own phases (:data:`~fedgraph_flwr.threshold_ckks.PHASES`, which the federation puts
before the algorithm's) and replaces ``aggregate`` by the algorithm's mixing plan kept for
the next round's decrypt phase; everything else is the algorithm's. It holds public
material only: public key shares, ciphertexts, partial decryptions. Every value a client
sends is checked (names, byte sizes, that OpenFHE loads it); a bad one makes that client
fail the round (:meth:`check_phase`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.bases import Aggregator
from ..core.options import ConfigError
from ..core.phases import AggregateResult, Arrays, ClientUpdate, Phase
from ..secure_aggregation import cipher_key
from . import (
    DECRYPT,
    KEYGEN_JOIN,
    KEYGEN_LEAD,
    KEYGEN_SHARE,
    LEAD,
    PHASES,
    PUBLIC,
    ROW_OF,
    SENDERS,
    SHARE,
    UNOPENED,
    WEIGHTS,
    from_key,
    part_key,
    row_key,
)
from .backend import call
from .client import layout


class ThresholdSetupError(ConfigError):
    """Key setup failed (one line): without every party's share there is no joint key."""


class ThresholdAggregator:
    """The algorithm's ``inner`` aggregator with the protocol's phases; ``payloads``: the
    federation's dict of each client's next train request (filled by the decrypt phase)."""

    phases: tuple[Phase, ...] = PHASES

    def __init__(self, inner: Aggregator, client_ids: list[int], initial: Arrays,
                 payloads: dict[int, Arrays]) -> None:
        self.inner = inner
        self.client_ids = sorted(client_ids)
        self.lead = self.client_ids[0]
        self.layout = layout(initial)
        self.chunks = [cipher_key(n, c) for n, sizes in self.layout.items()
                       for c in range(len(sizes))]
        self.payloads = payloads
        self.shares: dict[int, bytes] = {}
        self.pending: dict[str, Any] | None = None  # last round's uploads and weights
        self.partials: dict[int, Arrays] = {}

    def __getattr__(self, name: str) -> Any:  # the algorithm's, for all the rest
        return getattr(self.inner, name)

    # --- which phases, what they send ---------------------------------------------------
    def runs_phase(self, phase: Phase, server_round: int) -> bool:
        """The decrypt phase runs when last round left mixtures; the rest as the algorithm says."""
        if phase == DECRYPT:
            return self.pending is not None
        return self.inner.runs_phase(phase, server_round)

    def configure(self, phase: Phase, server_round: int, clients: list[int]) -> dict[int, Arrays]:
        """The protocol's requests (every client gets the same decrypt request)."""
        if phase == KEYGEN_LEAD:
            return {c: {LEAD: np.array([int(c == self.lead)], dtype=np.int64)} for c in clients}
        if phase == KEYGEN_SHARE:
            lead = _bytes(self.shares[self.lead])
            return {c: ({} if c == self.lead else {PUBLIC: lead}) for c in clients}
        if phase == KEYGEN_JOIN:
            shares = {f"{SHARE}{c}": _bytes(b) for c, b in sorted(self.shares.items())}
            return {c: shares for c in clients}
        if phase == DECRYPT:
            assert self.pending is not None
            return {c: self.pending["request"] for c in clients}
        return self.inner.configure(phase, server_round, clients)

    # --- what comes back ---------------------------------------------------------------
    def check_phase(self, phase: Phase, updates: dict[int, ClientUpdate],
                    failures: dict[int, str]) -> dict[int, ClientUpdate]:
        """The protocol's checks of a phase's replies; the failing ones go to ``failures``."""
        if phase not in PHASES:
            return updates
        valid = {}
        for cid, update in updates.items():
            reason = self._reason(phase, cid, update.arrays)
            if reason is None:
                valid[cid] = update
            else:
                failures[cid] = f"rejected: {reason} (phase {phase.name})"
        return valid

    def _reason(self, phase: Phase, cid: int, arrays: Arrays) -> str | None:
        if phase in (KEYGEN_LEAD, KEYGEN_SHARE):
            makes_key = (phase == KEYGEN_LEAD) == (cid == self.lead)
            if not makes_key:
                return None if not arrays else "a key share from a party that makes none here"
            if set(arrays) != {PUBLIC} or arrays[PUBLIC].dtype != np.uint8:
                return f"expected one uint8 array {PUBLIC!r}, got {sorted(arrays)[:3]}"
            return call("check_public", arrays[PUBLIC].tobytes())
        if phase == KEYGEN_JOIN:
            return None if not arrays else "unexpected arrays"
        assert self.pending is not None
        expected = {row_key(k, r) for r in self.pending["rows_for"][cid] for k in self.chunks}
        if set(arrays) != expected:
            missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
            return f"wrong partial decryptions (missing {missing[:2]}, unexpected {extra[:2]})"
        if any(a.dtype != np.uint8 or a.ndim != 1 for a in arrays.values()):
            return "a partial decryption is not uint8 bytes"
        return call("check_ciphertexts", [arrays[k].tobytes() for k in sorted(arrays)], False)

    def step(self, phase: Phase, server_round: int, updates: dict[int, ClientUpdate]
             ) -> AggregateResult | None:
        """Keep the key shares; open the mixtures; the algorithm's own phases as it says."""
        if phase in (KEYGEN_LEAD, KEYGEN_SHARE):
            makers = [self.lead] if phase == KEYGEN_LEAD else self.client_ids[1:]
            missing = [c for c in makers if c not in updates]
            if missing:
                raise ThresholdSetupError(f"secure-aggregation=ckks-threshold: key setup needs "
                                          f"every client's share; client(s) {missing} gave none "
                                          f"(phase {phase.name})")
            self.shares.update({c: updates[c].arrays[PUBLIC].tobytes() for c in makers})
            return None
        if phase == KEYGEN_JOIN:
            missing = [c for c in self.client_ids if c not in updates]
            if missing:
                raise ThresholdSetupError(f"secure-aggregation=ckks-threshold: client(s) "
                                          f"{missing} did not take the joint key")
            return AggregateResult({}, metrics={"ckks-threshold-parties": len(self.client_ids)})
        if phase == DECRYPT:
            return self._open(updates)
        return self.inner.step(phase, server_round, updates)

    def _open(self, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """Each receiver's train request: every other party's partial decryption of its
        mixture; where one is missing (that party failed) the mixture stays closed."""
        assert self.pending is not None
        pending, self.pending = self.pending, None
        closed = 0
        for cid, row in zip(pending["senders"], pending["row_of"]):
            clear = pending["clear"].get(cid, {})
            others = [p for p in self.client_ids if p != cid]
            if any(p not in updates for p in others):
                self.payloads[cid] = {**clear, UNOPENED: np.ones(1, dtype=np.int64)}
                closed += 1
                continue
            parts = {part_key(k, p): updates[p].arrays[row_key(k, row)]
                     for p in others for k in self.chunks}
            self.payloads[cid] = {**clear, **parts}
        return AggregateResult({}, metrics={"ckks-threshold-closed": float(closed)})

    # --- the train phase -----------------------------------------------------------------
    def check_upload(self, upload: Arrays) -> str | None:
        """Why a train upload is not this run's ciphertexts, or None."""
        if set(upload) != set(self.chunks):
            missing, extra = sorted(set(self.chunks) - set(upload)), sorted(set(upload) - set(self.chunks))
            return f"wrong ciphertext names (missing {missing[:3]}, unexpected {extra[:3]})"
        if any(upload[k].dtype != np.uint8 or upload[k].ndim != 1 for k in self.chunks):
            return "a ciphertext is not uint8 bytes"
        return call("check_ciphertexts", [upload[k].tobytes() for k in self.chunks], True)

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """The algorithm's mixing plan, kept with the uploads for the next decrypt phase;
        until then every contributor's request holds no mixture."""
        plan = self.inner.mixing_plan(server_round, updates)
        if plan.matrices.shape[0] != 1 or any(np.ndim(g) or g for g in plan.groups.values()):
            raise ConfigError("secure-aggregation=ckks-threshold mixes with one weight matrix; "
                              f"{type(self.inner).__name__} uses per-array groups")
        senders = list(plan.client_ids)
        matrix = np.asarray(plan.matrices[0], dtype=np.float64)
        rows, row_of = np.unique(matrix, axis=0, return_inverse=True)
        row_of = np.asarray(row_of).reshape(-1)
        request: Arrays = {SENDERS: np.asarray(senders, dtype=np.int64), WEIGHTS: rows,
                           ROW_OF: row_of.astype(np.int64)}
        for s in senders:
            for k in self.chunks:
                request[from_key(k, s)] = updates[s].arrays[k]
        rows_for = {p: [r for r in range(len(rows))
                        if any(row_of[i] == r and s != p for i, s in enumerate(senders))]
                    for p in self.client_ids}
        self.pending = {"senders": senders, "row_of": [int(r) for r in row_of],
                        "request": request, "rows_for": rows_for, "clear": plan.clear}
        closed = {c: {**plan.clear.get(c, {}), UNOPENED: np.ones(1, dtype=np.int64)} for c in senders}
        return AggregateResult(closed, plan.diagnostics, plan.metrics)


def _bytes(blob: bytes) -> np.ndarray:
    return np.frombuffer(bytearray(blob), dtype=np.uint8)
