"""End-to-end sealed partial decryptions between two clients, relayed by the server.

Why: a partial decryption the server could read would let it decrypt. Client ``p``'s
*main* partial decryption of a ciphertext ``M = (c0, c1)`` is ``c1·s_p + e_p``; the
server holds ``M``, so with every party's partial of the same ``M`` it has
``c0 + Σ_p c1·s_p``, the plaintext. That happens whenever two clients receive the same
mixture (FedAvg: every client): each party's partial of it must reach the other
receivers, and all of them pass through the server. So every partial decryption goes
to its receiver sealed with a key only the two clients share.

With the ``cryptography`` package (a Flower dependency), nothing of ours: X25519 key
agreement on each client's channel key pair (made at key setup beside its OpenFHE
share; the public half goes out with the public share), HKDF-SHA256 to a 256-bit key per
pair of clients, AES-256-GCM with a random 96-bit nonce per message. The associated
data binds a message to its sender, its receiver and the SHA-256 of the mixture chunk
it partially decrypts, so the server can neither redirect nor replay one.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

NONCE = 12
TAG = 16
#: bytes a sealed message adds to its plaintext
OVERHEAD = NONCE + TAG
PUBLIC_SIZE = 32


class ChannelError(ValueError):
    """A sealed message that does not open (one line)."""


def new_key_pair() -> tuple[bytes, bytes]:
    """A client's channel key pair: (public 32 bytes, private 32 bytes)."""
    private = X25519PrivateKey.generate()
    return private.public_key().public_bytes_raw(), private.private_bytes_raw()


def check_public(blob: bytes) -> str | None:
    """Why ``blob`` is not a channel public key, or None."""
    if len(blob) != PUBLIC_SIZE:
        return f"a channel key has {len(blob)} bytes, not {PUBLIC_SIZE}"
    return None


def pair_key(private: bytes, me: int, peer_public: bytes, peer: int) -> AESGCM:
    """The AEAD both ``me`` and ``peer`` derive for their pair (the same either way)."""
    shared = X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(peer_public))
    low, high = sorted((me, peer))
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
               info=f"fedgraph ckks-threshold partial decryptions {low}-{high}".encode()
               ).derive(shared)
    return AESGCM(key)


def _associated(sender: int, receiver: int, about: bytes) -> bytes:
    return f"{sender}>{receiver}:".encode() + about


def seal(aead: AESGCM, sender: int, receiver: int, about: bytes, message: bytes) -> bytes:
    """``message`` from ``sender`` to ``receiver``, bound to ``about`` (a digest)."""
    nonce = os.urandom(NONCE)
    return nonce + aead.encrypt(nonce, message, _associated(sender, receiver, about))


def open_sealed(aead: AESGCM, sender: int, receiver: int, about: bytes, sealed: bytes) -> bytes:
    """The message of :func:`seal`; :class:`ChannelError` where it was altered, is not
    from ``sender`` to ``receiver``, or is about something else."""
    try:
        return aead.decrypt(sealed[:NONCE], sealed[NONCE:], _associated(sender, receiver, about))
    except (InvalidTag, ValueError):
        raise ChannelError(f"ckks-threshold: client {sender}'s partial decryption does not "
                           f"open (altered, misdirected or about another mixture)") from None
