"""The server's side of ``secure-aggregation=ckks-threshold`` (:mod:`fedgraph_flwr.threshold_ckks`).

:class:`ThresholdAggregator` wraps the algorithm's aggregator: it answers the protocol's
own phases (:data:`~fedgraph_flwr.threshold_ckks.PHASES`, which the federation puts
before the algorithm's) and replaces ``aggregate`` by the algorithm's mixing plan kept for
the next round's decrypt phase; everything else is the algorithm's. It holds public
material only: public key shares, channel keys, ciphertexts, and partial decryptions
sealed for their receivers, which it relays and cannot read. Every value a client sends
is checked (names, byte sizes, that OpenFHE loads it where the server can); a bad one
makes that client fail the round (:meth:`check_phase`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.bases import Aggregator
from ..core.options import ConfigError
from ..core.phases import AggregateResult, Arrays, ClientUpdate, Phase
from ..secure_aggregation import cipher_key
from . import (
    CHANNEL,
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
    channel,
    from_key,
    key_key,
    mixture_key,
    part_key,
    row_key,
)
from .backend import call
from .client import layout
from .openfhe_ops import FRESH

#: bytes a serialized partial decryption may differ from the server's own one by (OpenFHE's
#: metadata, e.g. key tags), far below one modulus of one coefficient block
METADATA_SLACK = 1024
STATE = "ckks-threshold"  # the protocol's part of the aggregator's checkpoint state


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
        self.channels: dict[int, bytes] = {}
        self.sealed_size = 0  # bytes of a sealed partial decryption (known at key setup)
        self.pending: dict[str, Any] | None = None  # last round's uploads and weights
        self.partials: dict[int, Arrays] = {}

    def __getattr__(self, name: str) -> Any:  # the algorithm's, for all the rest
        return getattr(self.inner, name)

    # --- checkpoint / resume -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The algorithm's state and the protocol's: every party's public share and channel
        key, and last round's plan with its uploads or mixture (public material only)."""
        return {**self.inner.state_dict(), STATE: {
            "shares": dict(self.shares), "channels": dict(self.channels),
            "sealed_size": self.sealed_size, "pending": self.pending}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (``resume``: the key setup is not run again, the
        clients keep their shares in their key stores)."""
        if STATE not in state:
            raise ConfigError("resume=true but the checkpoint holds no ckks-threshold keys: "
                              "it is not of a ckks-threshold run")
        own = state[STATE]
        self.inner.load_state_dict({k: v for k, v in state.items() if k != STATE})
        self.shares = {int(c): bytes(b) for c, b in own["shares"].items()}
        self.channels = {int(c): bytes(b) for c, b in own["channels"].items()}
        self.sealed_size = int(own["sealed_size"])
        self.pending = own["pending"]

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
            keys = {f"{SHARE}{c}": _bytes(b) for c, b in sorted(self.shares.items())}
            keys.update({f"{CHANNEL}{c}": _bytes(b) for c, b in sorted(self.channels.items())})
            return {c: keys for c in clients}
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
            if set(arrays) != {PUBLIC, CHANNEL} or any(a.dtype != np.uint8 for a in arrays.values()):
                return f"expected uint8 arrays {PUBLIC!r} and {CHANNEL!r}, got {sorted(arrays)[:3]}"
            return (channel.check_public(arrays[CHANNEL].tobytes())
                    or call("check_public", arrays[PUBLIC].tobytes()))
        if phase == KEYGEN_JOIN:
            return None if not arrays else "unexpected arrays"
        assert self.pending is not None
        expected = {row_key(k, r): self.sealed_size for r in self.pending["rows_for"][cid]
                    for k in self.chunks}
        expected.update({key_key(i): 32 + channel.OVERHEAD for i in self.pending["senders"]
                         if i != cid})
        if set(arrays) != set(expected):
            missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
            return f"wrong partial decryptions (missing {missing[:2]}, unexpected {extra[:2]})"
        for key, size in expected.items():  # sealed: their size is all the server can check
            slack = METADATA_SLACK if "@row" in key else 0
            if arrays[key].dtype != np.uint8 or arrays[key].ndim != 1 \
                    or abs(arrays[key].size - size) > slack:
                return (f"{key!r} is not the {size} bytes of a sealed "
                        f"{'partial decryption' if slack else 'key'}")
        return None

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
            self.channels.update({c: updates[c].arrays[CHANNEL].tobytes() for c in makers})
            if not self.sealed_size:  # OpenFHE's, with a throwaway key of the server's own
                self.sealed_size = call("partial_size") + channel.OVERHEAD
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
        """Each receiver's train request: every other party's sealed partial decryption of
        its mixture and the key sealed for it; where one is missing (that party failed) the
        mixture stays closed."""
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
            parts.update({key_key(p): updates[p].arrays[key_key(cid)] for p in others})
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
        return call("check_ciphertexts", [upload[k].tobytes() for k in self.chunks], FRESH)

    def aggregate(self, server_round: int, updates: dict[int, ClientUpdate]) -> AggregateResult:
        """The algorithm's mixing plan, kept for the next decrypt phase with the uploads
        (several rows: each client recomputes the mixtures) or with the one mixture the
        server computes (one row); until then every contributor's request holds no mixture."""
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
        uploads = [[updates[s].arrays[k] for k in self.chunks] for s in senders]
        if len(rows) == 1:  # every receiver gets this one mixture: no upload need go out
            (mixture,) = call("mix", [[a.tobytes() for a in u] for u in uploads], rows.tolist())
            request.update({mixture_key(k): _bytes(b) for k, b in zip(self.chunks, mixture)})
        else:
            request.update({from_key(k, s): a for s, u in zip(senders, uploads)
                            for k, a in zip(self.chunks, u)})
        rows_for = {p: [r for r in range(len(rows))
                        if any(row_of[i] == r and s != p for i, s in enumerate(senders))]
                    for p in self.client_ids}
        self.pending = {"senders": senders, "row_of": [int(r) for r in row_of],
                        "request": request, "rows_for": rows_for, "clear": plan.clear}
        closed = {c: {**plan.clear.get(c, {}), UNOPENED: np.ones(1, dtype=np.int64)} for c in senders}
        return AggregateResult(closed, plan.diagnostics, plan.metrics)


def _bytes(blob: bytes) -> np.ndarray:
    return np.frombuffer(bytearray(blob), dtype=np.uint8)
