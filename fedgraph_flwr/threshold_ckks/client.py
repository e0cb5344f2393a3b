"""A client's side of ``secure-aggregation=ckks-threshold`` (:mod:`fedgraph_flwr.threshold_ckks`).

The client's secret key share, the joint public key and what it keeps between phases
live in its :class:`KeyStore`, a 0700 folder of its own machine, named after the run's
state token; the share never leaves it (the OpenFHE worker is this process's child).
Every value from the server is checked before use; a bad one raises, which fails this
client's reply (the round, not the run).
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from ..config import ClientConfig
from ..core.phases import TRAIN, Arrays, Phase
from ..secure_aggregation import cipher_key, is_encrypted, parse_cipher_key
from . import (
    CHANNEL,
    DECRYPT,
    KEYGEN_JOIN,
    KEYGEN_LEAD,
    KEYGEN_SHARE,
    LEAD,
    PHASE_NAMES,
    PREFIX,
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
from .backend import OpenFHEError, call
from .openfhe_ops import SLOTS

STORE_ENV = "FEDGRAPH_CKKS_THRESHOLD_DIR"


class ThresholdProtocolError(ValueError):
    """A request that breaks the protocol (one line): this client refuses it."""


def handles(phase: Phase) -> bool:
    """Whether ``phase`` is one of the protocol's own (not the algorithm's)."""
    return phase.name in PHASE_NAMES


def chunk_sizes(numel: int) -> list[int]:
    """Values per ciphertext of an array of ``numel`` values."""
    count = max(1, math.ceil(numel / SLOTS))
    return [min(SLOTS, numel - i * SLOTS) for i in range(count)]


def layout(schema: Arrays) -> dict[str, list[int]]:
    """The encrypted arrays of an upload schema and their chunk sizes."""
    return {n: chunk_sizes(a.size) for n, a in sorted(schema.items()) if is_encrypted(a)}


class KeyStore:
    """This client's files for one run: ``<dir>/<token>/<partition>/``; ``<dir>`` is env
    ``FEDGRAPH_CKKS_THRESHOLD_DIR``, else ``client-state-dir``, else the system's temp dir."""

    def __init__(self, config: ClientConfig, partition_id: int) -> None:
        base = os.environ.get(STORE_ENV) or config.client_state_dir or tempfile.gettempdir()
        token = config.client_state_token or "run"
        self.folder = Path(base).expanduser() / "fedgraph-ckks-threshold" / token / str(partition_id)

    def write(self, name: str, blob: bytes) -> None:
        """Write file ``name`` (mode 0600) atomically."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.folder / name
        tmp = path.with_name(f".{name}.tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)

    def read(self, name: str) -> bytes:
        """File ``name``; one line if key setup never wrote it."""
        path = self.folder / name
        if not path.is_file():
            raise ThresholdProtocolError(f"ckks-threshold: this client has no {name} for this "
                                         f"run ({self.folder}): key setup did not reach it")
        return path.read_bytes()



def _blob(arrays: Arrays, key: str) -> bytes:
    value = arrays.get(key)
    if value is None or value.dtype != np.uint8 or value.ndim != 1:
        raise ThresholdProtocolError(f"ckks-threshold: request lacks uint8 bytes {key!r}")
    return value.tobytes()


def _bytes(blob: bytes) -> np.ndarray:
    return np.frombuffer(bytearray(blob), dtype=np.uint8)


def upload_digest(upload: Arrays) -> bytes:
    """SHA-256 over an upload's ciphertext names and bytes (what the decrypt phase checks)."""
    h = hashlib.sha256()
    for key in sorted(upload):
        h.update(key.encode() + b"\0" + upload[key].tobytes())
    return h.digest()


# --- the protocol's phases ------------------------------------------------------------------
def run_phase(config: ClientConfig, phase: Phase, arrays: Arrays, partition_id: int,
              schema: Arrays) -> Arrays:
    """One of the protocol's phases on this client; returns the reply's arrays."""
    store = KeyStore(config, partition_id)
    if phase == KEYGEN_LEAD:
        if LEAD not in arrays or arrays[LEAD].shape != (1,):
            raise ThresholdProtocolError(f"ckks-threshold: keygen request lacks {LEAD!r}")
        if int(arrays[LEAD][0]) != 1:
            return {}
        public, secret = call("lead_keygen")
        return _keep_keys(store, public, secret, lead_public=public)
    if phase == KEYGEN_SHARE:
        if PUBLIC not in arrays:  # the lead: its key is made
            return {}
        lead_public = _blob(arrays, PUBLIC)
        reason = call("check_public", lead_public)
        if reason:
            raise ThresholdProtocolError(f"ckks-threshold: the lead's public key: {reason}")
        public, secret = call("share_keygen", lead_public)
        return _keep_keys(store, public, secret, lead_public=lead_public)
    if phase == KEYGEN_JOIN:
        return _join(store, arrays, partition_id)
    if phase == DECRYPT:
        return _partial_decryptions(store, arrays, partition_id, schema)
    raise ThresholdProtocolError(f"ckks-threshold: no phase {phase.name!r}")


def _keep_keys(store: KeyStore, public: bytes, secret: bytes, lead_public: bytes) -> Arrays:
    """Keep this client's OpenFHE key share and a new channel key pair; send their
    public halves."""
    channel_public, channel_private = channel.new_key_pair()
    store.write("secret-share", secret)
    store.write("public-share", public)
    store.write("lead-public", lead_public)
    store.write("channel-private", channel_private)
    store.write("channel-public", channel_public)
    return {PUBLIC: _bytes(public), CHANNEL: _bytes(channel_public)}


def _join(store: KeyStore, arrays: Arrays, me: int) -> Arrays:
    """The joint public key from every party's public share, this client's own among them
    unchanged and the lead's the one this client's share was made on; every party's
    channel key, this client's own at its place."""
    shares = {int(k[len(SHARE):]): _blob(arrays, k) for k in arrays if k.startswith(SHARE)}
    channels = {int(k[len(CHANNEL):]): _blob(arrays, k) for k in arrays if k.startswith(CHANNEL)}
    own, lead = store.read("public-share"), store.read("lead-public")
    if shares.get(me) != own or channels.get(me) != store.read("channel-public"):
        raise ThresholdProtocolError("ckks-threshold: this client's public share or channel "
                                     "key is not among the keys the server would join")
    if sorted(channels) != sorted(shares):
        raise ThresholdProtocolError("ckks-threshold: the channel keys are not those of the "
                                     "parties that hold shares")
    ordered = [shares[c] for c in sorted(shares)]
    if ordered[0] != lead:
        raise ThresholdProtocolError("ckks-threshold: the first share is not the lead key "
                                     "this client's share was made on")
    for blob in ordered:
        reason = call("check_public", blob)
        if reason:
            raise ThresholdProtocolError(f"ckks-threshold: a public share: {reason}")
    for blob in channels.values():
        reason = channel.check_public(blob)
        if reason:
            raise ThresholdProtocolError(f"ckks-threshold: {reason}")
    store.write("joint-public", call("join_public", ordered))
    store.write("parties", ",".join(str(c) for c in sorted(shares)).encode())
    store.write("channel-keys", b"".join(channels[c] for c in sorted(shares)))
    return {}


def _peers(store: KeyStore) -> dict[int, bytes]:
    """Every party's channel public key, by client id."""
    parties = [int(p) for p in store.read("parties").decode().split(",")]
    keys = store.read("channel-keys")
    size = channel.PUBLIC_SIZE
    return {p: keys[i * size:(i + 1) * size] for i, p in enumerate(parties)}


def _digest(chunks: list[bytes]) -> bytes:
    """What a sealed partial decryption is bound to: the SHA-256 of its mixture's chunks."""
    h = hashlib.sha256()
    for blob in chunks:
        h.update(hashlib.sha256(blob).digest())
    return h.digest()


def _partial_decryptions(store: KeyStore, arrays: Arrays, me: int, schema: Arrays) -> Arrays:
    """This client's partial decryption of every mixture: the one the server sent (one
    row), else each one it recomputed from the uploads (checked); kept for its own
    mixture, sealed for the other receivers of each."""
    senders, weights, row_of = _mixing(arrays)
    chunks = [cipher_key(n, c) for n, sizes in layout(schema).items() for c in range(len(sizes))]
    if weights.shape[0] == 1:  # one mixture for every receiver: the server's (checked
        mixtures = [[_blob(arrays, mixture_key(k)) for k in chunks]]  # as it is decrypted)
    else:
        uploads = [[_blob(arrays, from_key(k, s)) for k in chunks] for s in senders]
        if me in senders:  # its own upload, byte for byte, at its place
            own = {k: np.frombuffer(b, dtype=np.uint8)
                   for k, b in zip(chunks, uploads[senders.index(me)])}
            if upload_digest(own) != store.read("last-upload"):
                raise ThresholdProtocolError("ckks-threshold: the decrypt request does not hold "
                                             "this client's own upload unchanged")
        mixtures = call("mix", uploads, weights.tolist())
    peers = _peers(store)
    if sorted(set(senders) - set(peers)):
        raise ThresholdProtocolError("ckks-threshold: a receiver that holds no key share")
    secret, private = store.read("secret-share"), store.read("channel-private")
    lead = me == min(peers)  # OpenFHE's lead partial decryption: the lowest client id's
    reply: Arrays = {}
    for r, mixture in enumerate(mixtures):
        receivers = [s for s, row in zip(senders, row_of) if row == r]
        try:
            parts = call("partial_decrypt", mixture, secret, lead)
        except OpenFHEError as exc:  # not a mixture (a bad request)
            raise ThresholdProtocolError(f"ckks-threshold: mixture {r}: {exc}") from None
        about = _digest(mixture)
        if me in receivers:  # its own mixture's: kept
            store.write("own-parts", b"".join(len(b).to_bytes(8, "little") + b for b in parts))
            store.write("own-mixture", about)
        others = [i for i in receivers if i != me]
        if not others:
            continue
        content = os.urandom(32)  # one key for this row's chunks, sealed for each receiver
        aead = channel.AESGCM(content)
        for key, blob in zip(chunks, parts):
            reply[row_key(key, r)] = _bytes(channel.seal(aead, me, -1, about + key.encode(), blob))
        for i in others:
            pair = channel.pair_key(private, me, peers[i], i)
            reply[key_key(i)] = _bytes(channel.seal(pair, me, i, about, content))
    return reply


def _mixing(arrays: Arrays) -> tuple[list[int], np.ndarray, list[int]]:
    """(senders, weight rows, row of each receiver), checked: every row a distribution
    over the senders (non-negative, summing to 1), every receiver's row one of them."""
    for key in (SENDERS, WEIGHTS, ROW_OF):
        if key not in arrays:
            raise ThresholdProtocolError(f"ckks-threshold: decrypt request lacks {key!r}")
    senders = [int(s) for s in arrays[SENDERS].reshape(-1)]
    weights = np.asarray(arrays[WEIGHTS], dtype=np.float64)
    row_of = [int(r) for r in arrays[ROW_OF].reshape(-1)]
    if (len(set(senders)) != len(senders) or weights.ndim != 2
            or weights.shape[1] != len(senders) or len(row_of) != len(senders)):
        raise ThresholdProtocolError(f"ckks-threshold: weights {weights.shape} for "
                                     f"{len(senders)} senders")
    if not np.isfinite(weights).all() or (weights < 0).any() \
            or not np.allclose(weights.sum(axis=1), 1.0, atol=1e-9):
        raise ThresholdProtocolError("ckks-threshold: a row of mixing weights is not a "
                                     "distribution (non-negative, summing to 1)")
    if any(r < 0 or r >= weights.shape[0] for r in row_of):
        raise ThresholdProtocolError("ckks-threshold: a receiver's row is out of range")
    return senders, weights, row_of


# --- the train phase ------------------------------------------------------------------------
def open_payload(config: ClientConfig, arrays: Arrays, partition_id: int,
                 schema: Arrays) -> Arrays:
    """The train request's arrays in the clear: this client's mixture fused from its own
    lead partial decryption and every other party's; none (keep training its own model)
    where the round's mixtures stayed closed; keys in the clear pass as they are."""
    clear = {k: v for k, v in arrays.items()
             if parse_cipher_key(k.rsplit("@part", 1)[0]) is None and not k.startswith(PREFIX)}
    if UNOPENED in arrays or not any("@part" in k for k in arrays):
        return clear
    store = KeyStore(config, partition_id)
    peers = _peers(store)
    others = [p for p in peers if p != partition_id]
    own = _unpack(store.read("own-parts"))
    about = store.read("own-mixture")
    private = store.read("channel-private")
    contents = {}
    for p in others:  # each party's row key, sealed for this client
        pair = channel.pair_key(private, partition_id, peers[p], p)
        try:
            contents[p] = channel.AESGCM(channel.open_sealed(pair, p, partition_id, about,
                                                             _blob(arrays, key_key(p))))
        except channel.ChannelError as exc:
            raise ThresholdProtocolError(str(exc)) from None
    out = dict(clear)
    start = 0
    for name, sizes in layout(schema).items():
        keys = [cipher_key(name, c) for c in range(len(sizes))]
        parts = [own[start:start + len(keys)]]
        try:
            parts += [[channel.open_sealed(contents[p], p, -1, about + k.encode(),
                                           _blob(arrays, part_key(k, p))) for k in keys]
                      for p in others]
        except channel.ChannelError as exc:
            raise ThresholdProtocolError(str(exc)) from None
        start += len(keys)
        like = schema[name]
        try:
            flat = np.frombuffer(call("fuse", parts, like.size), dtype=np.float64)
        except Exception as exc:  # noqa: BLE001 - a wrong partial: refuse the payload
            raise ThresholdProtocolError(f"ckks-threshold: mixture of {name!r}: {exc}") from None
        out[name] = flat.reshape(like.shape).astype(like.dtype)
    return out


def _unpack(blob: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(blob):
        size = int.from_bytes(blob[at:at + 8], "little")
        out.append(blob[at + 8:at + 8 + size])
        at += 8 + size
    return out


def seal_upload(config: ClientConfig, upload: Arrays, partition_id: int) -> Arrays:
    """The float arrays of a train upload encrypted under the joint public key (the
    others are not uploaded, as under ``ckks``); remembers what it sent."""
    store = KeyStore(config, partition_id)
    joint = store.read("joint-public")
    out: Arrays = {}
    for name in sorted(upload):
        array = upload[name]
        if not is_encrypted(array):
            continue
        flat = np.ascontiguousarray(array, dtype=np.float64).reshape(-1)
        for c, blob in enumerate(call("encrypt", joint, flat.tobytes())):
            out[cipher_key(name, c)] = _bytes(blob)
    store.write("last-upload", upload_digest(out))
    return out


__all__ = ["handles", "run_phase", "open_payload", "seal_upload", "KeyStore", "TRAIN"]
