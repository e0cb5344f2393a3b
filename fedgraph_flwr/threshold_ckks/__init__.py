"""``secure-aggregation=ckks-threshold``: CKKS whose decryption key no single party holds.

OpenFHE's threshold CKKS (:mod:`.openfhe_ops`), K-of-K: every client holds one secret
key share, made on its own machine and never sent; the server holds public material
only (the public shares, the joint public key, ciphertexts, partial decryptions of
mixtures). Phases the engine runs around the algorithm's own (:mod:`.server`):

- before round 1, ``ckks_keygen_lead`` (the lowest client id makes the lead key pair),
  ``ckks_keygen_share`` (every other client a share on the lead's public key) and
  ``ckks_keygen_join`` (every client gets every public share, checks its own is among
  them, and sums them to the joint public key it encrypts under);
- each round from round 2, ``ckks_decrypt``: every client gets last round's mixing
  weights and either the one mixture (a method whose receivers all get the same one,
  e.g. FedAvg: the server mixes, and the client cannot check the mixture) or every
  upload (ciphertexts under the joint key; the client checks its own is among them
  unchanged and the weights form a distribution, and recomputes each mixture itself);
  it partially decrypts every mixture (the lowest client id as OpenFHE's lead, the
  others' main ones) and seals its partial decryption of each mixture for that
  mixture's receivers (:mod:`.channel`: the server relays it and cannot read it);
  the train request then brings client ``i`` every other party's sealed partial of
  mixture ``i``, which it opens and fuses with its own.

Wire form: float array ``name`` in chunks of :data:`.openfhe_ops.SLOTS` values,
``"<name>@ckks<c>"`` as under ``ckks``; in a decrypt request ``"<name>@ckks<c>@from<j>"``
(client j's upload) or ``"<name>@ckks<c>@mixture"`` (the one mixture); in its reply
``"<name>@ckks<c>@row<r>"`` (the sealed partial of row r's mixture) and
``"ckksthr:key<i>"`` (that row's content key, sealed for receiver i); in a train request
``"<name>@ckks<c>@part<p>"`` and ``"ckksthr:key<p>"`` (party p's). docs/secure-aggregation.md
says what colluding parties learn.
"""

from __future__ import annotations

from ..core.phases import Phase

KEYGEN_LEAD = Phase("ckks_keygen_lead", "before-first-round")
KEYGEN_SHARE = Phase("ckks_keygen_share", "before-first-round")
KEYGEN_JOIN = Phase("ckks_keygen_join", "before-first-round")
DECRYPT = Phase("ckks_decrypt")
PHASES = (KEYGEN_LEAD, KEYGEN_SHARE, KEYGEN_JOIN, DECRYPT)
PHASE_NAMES = frozenset(p.name for p in PHASES)

MODE = "ckks-threshold"
PREFIX = "ckksthr:"  # names of the protocol's own arrays
LEAD = PREFIX + "lead"  # keygen_lead request: [1] for the lead, [0] for the others
PUBLIC = PREFIX + "public"  # a party's public key (share), uint8
CHANNEL = PREFIX + "channel"  # a party's X25519 channel key (keygen replies; in the
# keygen_join request f"{CHANNEL}{cid}", every party's), uint8
SHARE = PREFIX + "share"  # keygen_join request: f"{SHARE}{cid}", every party's public share
KEY = PREFIX + "key"  # f"{KEY}{party}": a row's content key, sealed for one receiver
WEIGHTS = PREFIX + "weights"  # [R, S] float64: the distinct rows of mixing weights
ROW_OF = PREFIX + "row-of"  # [S] int64: receiver s's row
SENDERS = PREFIX + "senders"  # [S] int64: the client ids, in the weights' column order
UNOPENED = PREFIX + "unopened"  # train request: no mixture this round (a party failed)


def from_key(cipher: str, sender: int) -> str:
    """Client ``sender``'s upload chunk ``cipher`` in a decrypt request."""
    return f"{cipher}@from{sender}"


def mixture_key(cipher: str) -> str:
    """Chunk ``cipher`` of the one mixture in a decrypt request."""
    return f"{cipher}@mixture"


def row_key(cipher: str, row: int) -> str:
    """A party's sealed partial decryption of chunk ``cipher`` of mixture row ``row``."""
    return f"{cipher}@row{row}"


def key_key(party: int) -> str:
    """A content key sealed for (in a decrypt reply) or from (in a train request) ``party``."""
    return f"{KEY}{party}"


def part_key(cipher: str, party: int) -> str:
    """Party ``party``'s sealed partial decryption of chunk ``cipher`` of the receiver's mixture."""
    return f"{cipher}@part{party}"
