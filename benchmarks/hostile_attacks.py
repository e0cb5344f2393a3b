"""The hostile clients of issue #76: what each attack does to a reply, and the transport
that lets the chosen clients do it (:class:`HostileTransport`). Read by
``benchmarks/hostile_clients.py``; not part of the product.

Every attack but ``label-flip`` acts on the train-phase reply the attacker's own ClientApp
code produced (it trains honestly, on its own data, every round) before the server sees
it. ``sent`` is what the server sent that client this round, so the client's honest
update is ``upload - sent``. Float arrays only are touched (every upload of the four
methods is float32); the mutated arrays keep the upload's dtype unless the attack is about
the dtype. Each attack is deterministic given the run's seed, the client and the round.

The signature: the attacks that change the model (``scale-*``, ``sign-flip``, ``noise``)
leave the reply's signature as the client computed it from its honest model, so a
signature-reading server (FedAux's APV, FedIIH's μ/logvar) sees an honest-looking client
whose model is poisoned. ``forge`` goes further (module constant :data:`FORGE_SCALE`): the
×10 update under a *copy of an honest client's signature* (the victim: the honest client
with the largest training set, its reply of the same round, the worst case of an attacker
that learns it), so the server takes the attacker for that client; upload arrays that
repeat a signature array (FedAux uploads its APV too, and mixes by the uploaded one) carry
the victim's copy as well. FedAvg and FED-PUB (plaintext: its server computes the
functional embedding from the uploaded model) have no signature: there ``forge`` is
``scale-10``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedgraph_flwr.config import RunConfig
from fedgraph_flwr.core.phases import Arrays, Phase
from fedgraph_flwr.engine.loop import InProcessTransport
from fedgraph_flwr.engine.recorder import nbytes
from fedgraph_flwr.engine.records import signature_floats
from fedgraph_flwr.engine.transport import ClientReply, ClientRequest, Exchange

#: The poisoned update's factor in ``forge``.
FORGE_SCALE = 10.0
#: ``num-train`` claimed by the ``num-train`` attack (the handshake said tens).
INFLATED_NUM_TRAIN = 1e9
#: Bytes of the ``oversized-*`` attacks' arrays (16 MiB).
OVERSIZED_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class AttackContext:
    """What an attacker knows when it forges one reply."""

    cid: int
    server_round: int
    seed: int
    sent: Arrays  # what the server sent this client for the train phase
    victim: ClientReply | None  # the victim's (honest) reply of this round, if any


Mutation = Callable[[ClientReply, AttackContext], ClientReply]


@dataclass(frozen=True)
class Attack:
    """One attack: its name, what it does (one line, for the results page), how it changes
    a train reply (None: the reply is left alone) and whether it flips the attacker's labels."""

    name: str
    doc: str
    mutate: Mutation | None = None
    flips_labels: bool = False


# --- helpers ---------------------------------------------------------------------------------
def is_float(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)


def reply_with(reply: ClientReply, *, upload: Arrays | None = None, signature: Arrays | None = None,
               metrics: dict[str, float] | None = None) -> ClientReply:
    """``reply`` with some parts replaced; ``bytes_received`` recounted as the transport counts."""
    upload = reply.upload if upload is None else upload
    signature = reply.signature if signature is None else signature
    metrics = reply.metrics if metrics is None else metrics
    return ClientReply(upload, signature, metrics, nbytes(upload) + 4 * signature_floats(signature))


def base_of(name: str, arr: np.ndarray, sent: Arrays) -> np.ndarray:
    """What the client's update to ``name`` is measured from: what it was sent (zeros where
    it was sent nothing of that shape)."""
    s = sent.get(name)
    if s is None or np.shape(s) != arr.shape:
        return np.zeros(arr.shape, dtype=np.float64)
    return np.asarray(s, dtype=np.float64)


def scaled_upload(upload: Arrays, sent: Arrays, factor: float) -> Arrays:
    """``sent + factor · (upload − sent)`` for every float array (in float64, then the
    upload's dtype); other arrays as they are."""
    out = {}
    for name, arr in upload.items():
        if is_float(arr):
            base = base_of(name, arr, sent)
            out[name] = (base + factor * (arr.astype(np.float64) - base)).astype(arr.dtype)
        else:
            out[name] = arr
    return out


def rng_for(ctx: AttackContext, tag: int) -> np.random.Generator:
    """The attack's generator for this client and round: the seed decides everything."""
    return np.random.default_rng([ctx.seed, ctx.cid, ctx.server_round, tag])


def first_float(upload: Arrays) -> str:
    """The name of the upload's first float array (sorted names): the one malformed attacks touch."""
    return next(k for k in sorted(upload) if is_float(upload[k]))


def largest_float(upload: Arrays) -> str:
    return max(sorted(upload), key=lambda k: upload[k].size if is_float(upload[k]) else -1)


def odd(ctx: AttackContext) -> bool:
    return ctx.server_round % 2 == 1


# --- the attacks -----------------------------------------------------------------------------
def scale(factor: float) -> Mutation:
    def mutate(reply: ClientReply, ctx: AttackContext) -> ClientReply:
        return reply_with(reply, upload=scaled_upload(reply.upload, ctx.sent, factor))
    return mutate


def noise(reply: ClientReply, ctx: AttackContext) -> ClientReply:
    """The update replaced by Gaussian noise of its own scale: per array, N(0, σ²) with σ
    the RMS of the honest update of that array (so the norm is about the honest one's)."""
    rng = rng_for(ctx, 1)
    out = {}
    for name, arr in sorted(reply.upload.items()):
        if not is_float(arr):
            out[name] = arr
            continue
        base = base_of(name, arr, ctx.sent)
        sigma = float(np.sqrt(np.mean((arr.astype(np.float64) - base) ** 2))) if arr.size else 0.0
        out[name] = (base + rng.normal(0.0, sigma, arr.shape)).astype(arr.dtype)
    return reply_with(reply, upload=out)


def inflate_num_train(reply: ClientReply, ctx: AttackContext) -> ClientReply:
    return reply_with(reply, metrics={**reply.metrics, "num-train": INFLATED_NUM_TRAIN})


def forge(reply: ClientReply, ctx: AttackContext) -> ClientReply:
    """The ×FORGE_SCALE update under the victim's signature (module docstring)."""
    upload = scaled_upload(reply.upload, ctx.sent, FORGE_SCALE)
    if ctx.victim is None:
        return reply_with(reply, upload=upload)
    signature = {k: v.copy() for k, v in ctx.victim.signature.items()}
    for name, arr in signature.items():
        if name in upload and upload[name].shape == arr.shape:
            upload[name] = arr.astype(upload[name].dtype)
    return reply_with(reply, upload=upload, signature=signature)


def non_finite_array(reply: ClientReply, ctx: AttackContext) -> ClientReply:
    """One element of the first float array NaN (odd rounds) or +Inf (even rounds)."""
    name = first_float(reply.upload)
    arr = reply.upload[name].copy()
    arr.flat[0] = math.nan if odd(ctx) else math.inf
    return reply_with(reply, upload={**reply.upload, name: arr})


def non_finite_num_train(reply: ClientReply, ctx: AttackContext) -> ClientReply:
    """``num-train`` NaN (odd rounds) or +Inf (even rounds)."""
    value = math.nan if odd(ctx) else math.inf
    return reply_with(reply, metrics={**reply.metrics, "num-train": value})


def oversized_array(reply: ClientReply, ctx: AttackContext) -> ClientReply:
    """The largest float array grown to OVERSIZED_BYTES (its values tiled along axis 0):
    an array far larger than the schema."""
    name = largest_float(reply.upload)
    arr = reply.upload[name]
    reps = -(-OVERSIZED_BYTES // max(arr.nbytes, 1))
    big = np.tile(arr, (reps,) + (1,) * (arr.ndim - 1)) if arr.ndim else np.full(reps, arr)
    return reply_with(reply, upload={**reply.upload, name: big})


def oversized_signature(reply: ClientReply, ctx: AttackContext) -> ClientReply:
    """Every signature array a OVERSIZED_BYTES float32 vector (its values tiled); a client
    whose method sends no signature sends one such array, named ``oversized``."""
    n = OVERSIZED_BYTES // 4
    sig = reply.signature or {"oversized": np.zeros(1, dtype=np.float32)}
    big = {k: np.resize(np.asarray(v, dtype=np.float32).ravel(), n) for k, v in sig.items()}
    return reply_with(reply, signature=big)


def malformed(reply: ClientReply, ctx: AttackContext) -> ClientReply:
    """By round (round mod 3): 1 a wrong name (the first float array renamed), 2 a wrong dtype
    (every float array as int32), 0 a wrong shape (the first float array flattened, its
    last element dropped so that no reshape mends it)."""
    upload = dict(reply.upload)
    name = first_float(upload)
    kind = ctx.server_round % 3
    if kind == 1:
        upload[name + ".renamed"] = upload.pop(name)
    elif kind == 2:
        upload = {k: v.astype(np.int32) if is_float(v) else v for k, v in upload.items()}
    else:
        upload[name] = upload[name].ravel()[:-1].copy()
    return reply_with(reply, upload=upload)


ATTACKS: dict[str, Attack] = {a.name: a for a in (
    Attack("scale-10", "update ×10: sent + 10·(upload − sent)", scale(10.0)),
    Attack("scale-100", "update ×100", scale(100.0)),
    Attack("sign-flip", "update ×(−1): sent − (upload − sent)", scale(-1.0)),
    Attack("sign-flip-4", "update ×(−4)", scale(-4.0)),
    Attack("noise", "update replaced by N(0, σ²), σ per array = the RMS of the honest update",
           noise),
    Attack("label-flip", "trains honestly on its training labels y → (y + 1) mod C",
           flips_labels=True),
    Attack("num-train", f"claims num-train = {INFLATED_NUM_TRAIN:.0e}", inflate_num_train),
    Attack("forge", f"update ×{FORGE_SCALE:g} under the victim's signature (a copy of an "
           "honest client's)", forge),
    Attack("nan-array", "one element of an array NaN (odd rounds) or Inf (even)", non_finite_array),
    Attack("nan-num-train", "num-train NaN (odd rounds) or Inf (even)", non_finite_num_train),
    Attack("oversized-array", "the largest array tiled to 16 MiB (wrong shape)", oversized_array),
    Attack("oversized-signature", "every signature array (or one, if none) a 16 MiB vector",
           oversized_signature),
    Attack("malformed", "round mod 3 = 1: an array renamed; 2: float arrays as int32; "
           "0: an array flattened and cut by one", malformed),
)}


# --- who is hostile --------------------------------------------------------------------------
def hostile_ids(roster: dict[int, dict[str, Any]], count: int) -> list[int]:
    """The ``count`` clients with the largest training sets (the lower id on ties): the ones
    that weigh most in FedAvg. Sorted."""
    ranked = sorted(roster, key=lambda c: (-int(roster[c]["num-train"]), c))
    return sorted(ranked[:count])


def victim_id(roster: dict[int, dict[str, Any]], hostile: list[int]) -> int:
    """The honest client ``forge`` impersonates: the largest honest training set."""
    honest = {c: f for c, f in roster.items() if c not in hostile}
    return hostile_ids(honest, 1)[0]


def flip_labels(data: Any, num_classes: int) -> Any:
    """A copy of ``data`` whose training labels are y → (y + 1) mod C (the cached original,
    shared with every other run in this process, is left alone)."""
    out = copy.copy(data)
    y = data.y.clone()
    train = data.train_mask
    y[train] = (y[train] + 1) % num_classes
    out.y = y
    return out


class HostileTransport(InProcessTransport):
    """The in-process transport with ``count`` hostile clients (:func:`hostile_ids`) that
    run ``attack``: every client's ClientApp code runs as usual, then each hostile client's
    train reply is replaced by the attack's before the server sees it. ``attack=None``: the
    clean run (the hostile ids are still named, for the honest clients' figures)."""

    def __init__(self, attack: Attack | None, count: int) -> None:
        super().__init__()
        self.attack = attack
        self.count = count
        self.hostile: list[int] = []
        self.victim: int | None = None
        self.seed = 0
        self.mutated = 0  # replies replaced so far

    def connect(self, config: RunConfig) -> dict[int, dict[str, Any]]:
        roster = super().connect(config)
        self.seed = config.seed
        if self.count:
            self.hostile = hostile_ids(roster, self.count)
            self.victim = victim_id(roster, self.hostile)
        if self.attack is not None and self.attack.flips_labels:
            classes = max(int(f["num-classes"]) for f in roster.values())
            for cid in self.hostile:
                self.data[cid] = flip_labels(self.data[cid], classes)
        return roster

    def exchange(self, phase: Phase, requests: dict[int, ClientRequest], timeout: float
                 ) -> Exchange:
        out = super().exchange(phase, requests, timeout)
        if phase.name != "train" or self.attack is None or self.attack.mutate is None:
            return out
        victim = out.replies.get(self.victim) if self.victim is not None else None
        for cid in self.hostile:
            if cid not in out.replies:
                continue
            ctx = AttackContext(cid, requests[cid].config.server_round, self.seed,
                                requests[cid].arrays, victim)
            out.replies[cid] = self.attack.mutate(out.replies[cid], ctx)
            self.mutated += 1
        return out


def honest_update(reply: ClientReply, sent: Arrays) -> dict[str, np.ndarray]:
    """``upload − sent`` per float array, in float64 (what the tests compare)."""
    return {k: v.astype(np.float64) - base_of(k, v, sent) for k, v in reply.upload.items()
            if is_float(v)}

