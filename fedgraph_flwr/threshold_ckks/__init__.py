"""``secure-aggregation=ckks-threshold``: CKKS whose decryption key no single party holds.

OpenFHE's threshold CKKS (:mod:`.openfhe_ops`), K-of-K: every client holds one secret
key share, made on its own machine and never sent; the server holds public material
only (the public shares, the joint public key, ciphertexts, partial decryptions of
mixtures). Phases the engine runs around the algorithm's own (:mod:`.server`):

- before round 1, ``ckks_keygen_lead`` (the lowest client id makes the lead key pair),
  ``ckks_keygen_share`` (every other client a share on the lead's public key) and
  ``ckks_keygen_join`` (every client gets every public share, checks its own is among
  them, and sums them to the joint public key it encrypts under);
- each round from round 2, ``ckks_decrypt``: every client gets last round's uploads
  (ciphertexts under the joint key) and the mixing weights, checks its own upload is
  among them unchanged and the weights form a distribution, recomputes each mixture
  itself and returns its partial decryption of every mixture another client receives
  (its own it partially decrypts for itself, as the lead of its own mixture); the train
  request then brings client ``i`` the other parties' partial decryptions of mixture
  ``i``, and only ``i`` can put them together with its own.

Wire form: float array ``name`` in chunks of :data:`.openfhe_ops.SLOTS` values,
``"<name>@ckks<c>"`` as under ``ckks``; in a decrypt request ``"<name>@ckks<c>@from<j>"``
(client j's upload), in its reply ``"<name>@ckks<c>@row<r>"``, in a train request
``"<name>@ckks<c>@part<p>"`` (party p's partial decryption). docs/secure-aggregation.md
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
SHARE = PREFIX + "share"  # keygen_join request: f"{SHARE}{cid}", every party's public share
WEIGHTS = PREFIX + "weights"  # [R, S] float64: the distinct rows of mixing weights
ROW_OF = PREFIX + "row-of"  # [S] int64: receiver s's row
SENDERS = PREFIX + "senders"  # [S] int64: the client ids, in the weights' column order
UNOPENED = PREFIX + "unopened"  # train request: no mixture this round (a party failed)


def from_key(cipher: str, sender: int) -> str:
    """Client ``sender``'s upload chunk ``cipher`` in a decrypt request."""
    return f"{cipher}@from{sender}"


def row_key(cipher: str, row: int) -> str:
    """A party's partial decryption of chunk ``cipher`` of mixture row ``row``."""
    return f"{cipher}@row{row}"


def part_key(cipher: str, party: int) -> str:
    """Party ``party``'s partial decryption of chunk ``cipher`` of the receiver's mixture."""
    return f"{cipher}@part{party}"
