"""OpenFHE's threshold CKKS, as byte-in byte-out operations (``secure-aggregation=ckks-threshold``).

This file imports nothing of the package and runs under any Python that has the
``openfhe`` wheel: PyPI's wheels hold a CPython 3.10 (Ubuntu 22.04 builds) or 3.12
(24.04) extension and none for 3.11, so on the project's Python 3.11 it runs as a
worker process (``python3.10 openfhe_ops.py --serve``: :mod:`.backend`); where
``import openfhe`` works it is imported directly. Keep it Python 3.10 compatible.

Scheme (OpenFHE's own multiparty API, nothing of ours): one *lead* party makes a key
pair (``KeyGen``); every other party a key share on the lead's public key in OpenFHE's
star topology (``MultipartyKeyGen(lead, fresh=True)``); the joint public key is the sum
of the public shares (``MultiAddPubKeys``), whose secret is the sum of every party's
secret share, which no one holds. A ciphertext under it opens only with a partial
decryption by every party (``MultipartyDecryptLead`` by one, ``MultipartyDecryptMain``
by each other one) put together by ``MultipartyDecryptFusion``.

Parameters: CKKS, multiplicative depth 1 (the mixture's plaintext-scalar products),
scaling modulus 40 bits, first modulus 60 bits, 128-bit classical security, scaling
FIXEDMANUAL: a ciphertext has two moduli (q0 · q1, 100 bits). A mixture's products are
left at scale 2^80, not rescaled: the noise each party's partial decryption adds (OpenFHE's
fixed 20-bit flooding) is then ~2^-50 of a value, where at scale 2^40 (rescaled) it would
be ~1e-4. Decrypted mixtures are within ~1e-8 of the plaintext ones. (OpenFHE's default
FLEXIBLEAUTO adds a third modulus to every fresh ciphertext and rescales each term of a
mixture: 50% more bytes per upload, several times the mixing time, for the same result.)
OpenFHE picks ring dimension 16384: with its default HYBRID key switching it counts the
key-switching modulus P into the 128-bit bound, which 8192 does not meet (BV key
switching, no P, would allow 8192; we never key-switch), but 8192 would save nothing per
value: a ciphertext would hold half the values in half the bytes. So :data:`SLOTS` =
8192 values a ciphertext, 525 KB (a fresh one or a mixture), 263 KB a partial decryption.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
import sys
from collections import OrderedDict
from functools import lru_cache

import numpy as np

SLOTS = 8192
MULTIPLICATIVE_DEPTH = 1
SCALING_MOD_SIZE = 40
FIRST_MOD_SIZE = 60
#: a decrypted value beyond this is not a model weight but a failed decryption (a wrong
#: partial decryption fuses to values of the order of the ciphertext modulus / scale)
SANE_MAGNITUDE = 1e6


def _openfhe():
    import openfhe

    return openfhe


@lru_cache(maxsize=1)
def context():
    """The run's crypto context: fixed parameters, the same in every party's process."""
    o = _openfhe()
    params = o.CCParamsCKKSRNS()
    params.SetMultiplicativeDepth(MULTIPLICATIVE_DEPTH)
    params.SetScalingModSize(SCALING_MOD_SIZE)
    params.SetFirstModSize(FIRST_MOD_SIZE)
    params.SetBatchSize(SLOTS)
    params.SetSecurityLevel(o.SecurityLevel.HEStd_128_classic)
    params.SetScalingTechnique(o.ScalingTechnique.FIXEDMANUAL)
    cc = o.GenCryptoContext(params)
    for feature in (o.PKESchemeFeature.PKE, o.PKESchemeFeature.KEYSWITCH,
                    o.PKESchemeFeature.LEVELEDSHE, o.PKESchemeFeature.MULTIPARTY):
        cc.Enable(feature)
    if cc.GetRingDimension() // 2 != SLOTS:
        raise RuntimeError(f"OpenFHE chose ring dimension {cc.GetRingDimension()}, "
                           f"expected {2 * SLOTS}")
    return cc


#: the scale degree (OpenFHE's noise scale degree) of a fresh encryption and of a mixture
FRESH, MIXED = 1, 2
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 4096


def _load(kind: str, blob: bytes, cache: bool = True):
    """An OpenFHE object from its bytes (cached by digest: the same upload is read by
    every party an in-process run stands for; ``cache=False`` for what is read once,
    the partial decryptions)."""
    if not cache:
        o = _openfhe()
        context()
        return o.DeserializeCiphertextString(blob, o.BINARY)
    key = (kind, hashlib.sha256(blob).digest())
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    o = _openfhe()
    context()  # the parameters' context first: deserialized objects attach to it
    reader = {"ct": o.DeserializeCiphertextString, "pk": o.DeserializePublicKeyString,
              "sk": o.DeserializePrivateKeyString}[kind]
    obj = reader(blob, o.BINARY)
    _CACHE[key] = obj
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return obj


def _dump(obj) -> bytes:
    o = _openfhe()
    return bytes(o.Serialize(obj, o.BINARY))


# --- keys -------------------------------------------------------------------------------
def lead_keygen():
    """The lead party's key pair: (public bytes, secret bytes)."""
    pair = context().KeyGen()
    return _dump(pair.publicKey), _dump(pair.secretKey)


def share_keygen(lead_public: bytes):
    """Another party's key share on the lead's public key (star topology): (public share
    bytes, secret share bytes)."""
    pair = context().MultipartyKeyGen(_load("pk", lead_public), False, True)
    return _dump(pair.publicKey), _dump(pair.secretKey)


def join_public(shares):
    """The joint public key: the sum of the public shares (lead's first)."""
    cc = context()
    joint = _load("pk", shares[0])
    for share in shares[1:]:
        joint = cc.MultiAddPubKeys(joint, _load("pk", share))
    return _dump(joint)


def check_public(blob: bytes):
    """Why ``blob`` is not a public key of this context, or None."""
    try:
        _load("pk", blob)
    except Exception as exc:  # noqa: BLE001 - OpenFHE raises RuntimeError and others
        return f"not an OpenFHE public key ({type(exc).__name__})"
    return None


# --- ciphertexts ---------------------------------------------------------------------------
def encrypt(public: bytes, values: bytes):
    """float64 ``values`` (raw bytes) encrypted under ``public``, :data:`SLOTS` a ciphertext."""
    cc = context()
    key = _load("pk", public)
    flat = np.frombuffer(values, dtype=np.float64)
    out = []
    for start in range(0, max(1, flat.size), SLOTS):
        chunk = flat[start:start + SLOTS].tolist()
        out.append(_dump(cc.Encrypt(key, cc.MakeCKKSPackedPlaintext(chunk))))
    return out


def _shape_reason(ct, i: int, degree: int):
    if ct.GetCryptoContext().GetRingDimension() != 2 * SLOTS:
        return f"ciphertext {i} has ring dimension {ct.GetCryptoContext().GetRingDimension()}"
    shape = (ct.GetLevel(), ct.GetNoiseScaleDeg(), ct.NumberCiphertextElements())
    if shape != (0, degree, 2):
        return (f"ciphertext {i} has (level, scale degree, elements) {shape}, "
                f"expected {(0, degree, 2)}")
    return None


def check_ciphertexts(blobs, degree: int):
    """Why ``blobs`` are not ciphertexts of this context at level 0 and scale degree
    ``degree`` (:data:`FRESH` as a party encrypts them, :data:`MIXED` a mixture), or None."""
    for i, blob in enumerate(blobs):
        try:
            ct = _load("ct", blob)
        except Exception as exc:  # noqa: BLE001
            return f"ciphertext {i} does not load ({type(exc).__name__})"
        reason = _shape_reason(ct, i, degree)
        if reason:
            return reason
    return None


_MIXTURES: OrderedDict = OrderedDict()


def mix(uploads, rows):
    """Per row of weights, chunk by chunk, ``Σ_j w_j · uploads[j]`` (plaintext-scalar
    products and sums, terms of weight 0 left out, an all-zero row gives
    ``0·uploads[0]``), at scale degree :data:`MIXED` (not rescaled). Deterministic: the
    same inputs give the same bytes, so a worker that serves several parties (an in-process run)
    computes a mixture once and hands out its bytes."""
    digest = hashlib.sha256(repr(rows).encode())
    for chunks in uploads:
        for blob in chunks:
            digest.update(hashlib.sha256(blob).digest())
    key = digest.digest()
    if key not in _MIXTURES:
        _MIXTURES[key] = _mix(uploads, rows)
        if len(_MIXTURES) > 2:
            _MIXTURES.popitem(last=False)
    return _MIXTURES[key]


def _mix(uploads, rows):
    cc = context()
    out = []
    for row in rows:
        mixture = []
        for c in range(len(uploads[0])):
            total = None
            for j, weight in enumerate(row):
                if weight == 0.0 and total is not None:
                    continue
                term = cc.EvalMult(_load("ct", uploads[j][c]), float(weight))
                total = term if total is None else cc.EvalAdd(total, term)
            mixture.append(_dump(total))
        out.append(mixture)
    return out


def partial_size():
    """The bytes of one serialized partial decryption of a mixture, up to OpenFHE's
    metadata (key tags: a few dozen bytes); the server checks replies it cannot read
    against it."""
    cc = context()
    pair = cc.KeyGen()  # a throwaway key, public operations only
    (mixture,) = _mix([encrypt(_dump(pair.publicKey), np.zeros(SLOTS).tobytes())], [[1.0]])
    return len(_dump(cc.MultipartyDecryptMain([_load("ct", mixture[0], cache=False)],
                                              pair.secretKey)[0]))


def partial_decrypt(blobs, secret: bytes, lead: bool, degree: int = MIXED):
    """This party's partial decryption of each ciphertext (the lead's or a main one);
    ValueError where one is not a ciphertext at scale degree ``degree`` (a mixture)."""
    cc = context()
    key = _load("sk", secret)
    cts = []
    for i, blob in enumerate(blobs):
        try:
            cts.append(_load("ct", blob, cache=False))
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"ciphertext {i} does not load ({type(exc).__name__})") from None
        reason = _shape_reason(cts[-1], i, degree)
        if reason:
            raise ValueError(reason)
    parts = (cc.MultipartyDecryptLead if lead else cc.MultipartyDecryptMain)(cts, key)
    return [_dump(p) for p in parts]


def fuse(parts_per_party, count: int):
    """The plaintext of each ciphertext from every party's partial decryption of it
    (``parts_per_party[p][c]``: party p's of chunk c), float64 bytes of ``count`` values.
    Raises ValueError where the result is no model (a wrong partial decryption)."""
    cc = context()
    values = []
    for c in range(len(parts_per_party[0])):
        try:
            plain = cc.MultipartyDecryptFusion([_load("ct", party[c], cache=False)
                                                for party in parts_per_party])
        except RuntimeError:  # OpenFHE: "the approximation error is too high"
            raise ValueError("the partial decryptions do not fuse (one of them is wrong)") from None
        plain.SetLength(SLOTS)
        values.append(np.asarray(plain.GetRealPackedValue(), dtype=np.float64))
    flat = np.concatenate(values)[:count]
    if flat.size != count or not np.isfinite(flat).all() or np.abs(flat).max() > SANE_MAGNITUDE:
        raise ValueError("the partial decryptions do not fuse to a model (one of them is wrong)")
    return flat.tobytes()


def decrypt_with_one_share(blobs, secret: bytes, count: int):
    """What one party's secret share alone makes of ciphertexts (the key-isolation test):
    its lead partial decryption fused alone. Returns float64 bytes, or None where OpenFHE
    refuses to decode the result (its approximation error is too high)."""
    cc = context()
    part = cc.MultipartyDecryptLead([_load("ct", b) for b in blobs], _load("sk", secret))
    values = []
    for p in part:
        try:
            plain = cc.MultipartyDecryptFusion([p])
        except RuntimeError:  # "The decryption failed because the approximation error ..."
            return None
        plain.SetLength(SLOTS)
        values.append(np.asarray(plain.GetRealPackedValue(), dtype=np.float64))
    return np.concatenate(values)[:count].tobytes()


def decrypt_with_every_main_partial(blobs, mains_per_party, count: int):
    """What a server makes of ciphertexts when it holds every party's *main* partial
    decryption of them (``mains_per_party[p][c]``; the attack that sealing the partial
    decryptions stops, :mod:`.channel`): with a throwaway key pair of its own, public
    operations only, its lead partial of ``ct`` plus its main partial of ``-ct`` cancel
    its key and leave ``c0``, which with every main partial fuses to the plaintext.
    float64 bytes, or None where OpenFHE refuses to decode."""
    cc = context()
    own = cc.KeyGen().secretKey
    values = []
    for c, blob in enumerate(blobs):
        ct = _load("ct", blob)
        c0 = [cc.MultipartyDecryptLead([ct], own)[0],
              cc.MultipartyDecryptMain([cc.EvalNegate(ct)], own)[0]]
        try:
            plain = cc.MultipartyDecryptFusion(
                c0 + [_load("ct", party[c], cache=False) for party in mains_per_party])
        except RuntimeError:
            return None
        plain.SetLength(SLOTS)
        values.append(np.asarray(plain.GetRealPackedValue(), dtype=np.float64))
    return np.concatenate(values)[:count].tobytes()


OPERATIONS = {f.__name__: f for f in (lead_keygen, share_keygen, join_public, check_public,
                                      encrypt, check_ciphertexts, mix, partial_size,
                                      partial_decrypt, fuse, decrypt_with_one_share,
                                      decrypt_with_every_main_partial)}


# --- the worker: length-prefixed pickles of builtins on stdin/stdout -------------------------
def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def _write(stream, obj) -> None:
    blob = pickle.dumps(obj, protocol=4)
    stream.write(struct.pack("<Q", len(blob)) + blob)
    stream.flush()


def serve() -> None:
    """Answer ``(operation, args)`` requests with ``("ok", result)`` or ``("error", line)``."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers on the pipe
    try:
        context()
        _write(stdout, ("ok", "ready"))
    except Exception as exc:  # noqa: BLE001
        _write(stdout, ("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        request = _read(stdin)
        if request is None:
            return
        name, args = request
        try:
            _write(stdout, ("ok", OPERATIONS[name](*args)))
        except Exception as exc:  # noqa: BLE001 - the caller raises it, one line
            _write(stdout, ("error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))


if __name__ == "__main__":
    if sys.argv[1:] != ["--serve"]:
        sys.exit("usage: python openfhe_ops.py --serve")
    serve()
