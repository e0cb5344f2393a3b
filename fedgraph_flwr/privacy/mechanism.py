"""The client's Gaussian mechanism: clip what ``dp`` covers in a reply, add noise.

One phase reply is one release. What its scope covers (:mod:`.scope`) is clipped to L2
norm ``dp-clip`` (C) as a whole, then every covered coordinate gets N(0, (σ·C)²) noise,
σ = ``dp-noise-multiplier`` (the noise std in clip norms, as in Flower's ``LocalDpMod``
and Opacus). Noise is added before anything leaves the client, so the guarantee holds
against the server and against the other clients, who receive mixtures; against them
the neighbouring relation is replace-one (a client's whole data replaced by any other),
under which two clipped replies differ by up to 2C: the accountant
(:mod:`.accountant`) counts each release as a Gaussian mechanism of sensitivity 2C.

Weights are clipped as an update: the change from what the server sent this phase
(an array the request did not carry is clipped as it is). When a reply has both an
update part and a part sent as it is (e.g. FedAux's APV signature), each is clipped to
C/√2, so that the whole stays within C and neither drowns the other.

The noise stream is seeded by the run's seed, the client, the round and the phase, so
a run is reproducible; a data owner who sets ``FEDGRAPH_DP_NOISE_KEY`` (a secret the
server never sees) mixes it into the seed, so that nobody who knows the run's seed can
reproduce and subtract the noise. Without the key the guarantee holds only against a
server that does not know the seed: research runs; the run's record says which.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass

import numpy as np

Arrays = dict[str, np.ndarray]

NOISE_KEY_ENV = "FEDGRAPH_DP_NOISE_KEY"


class DpError(ValueError):
    """A reply the mechanism cannot protect (an array that cannot carry noise)."""


@dataclass(frozen=True)
class Mechanism:
    """The Gaussian mechanism of one run: clip norm C and noise multiplier σ."""

    clip: float
    noise_multiplier: float

    def __post_init__(self) -> None:
        if not self.clip > 0 or not self.noise_multiplier > 0:
            raise DpError(f"the Gaussian mechanism needs dp-clip > 0 and dp-noise-multiplier "
                          f"> 0, got {self.clip} and {self.noise_multiplier}")

    def privatize(self, upload: Arrays, signature: Arrays, request: Arrays, *,
                  cover_upload: bool, seed_words: tuple[int, ...]) -> tuple[Arrays, Arrays]:
        """The reply with what it covers clipped and noised: the signature always, the
        upload when ``cover_upload``; the rest as it was. ``request``: what the server
        sent this phase (the reference of the weights' update)."""
        covered = ([("upload", n) for n in sorted(upload)] if cover_upload else []) + \
                  [("signature", n) for n in sorted(signature)]
        if not covered:
            return upload, signature
        parts = {"upload": upload, "signature": signature}
        values: dict[tuple[str, str], np.ndarray] = {}
        updates: set[tuple[str, str]] = set()
        for where, name in covered:
            array = parts[where][name]
            if not np.issubdtype(array.dtype, np.floating):
                raise DpError(f"dp cannot noise {where} array {name!r} ({array.dtype}): only "
                              f"floating arrays carry noise")
            sent = request.get(name) if where == "upload" else None
            if sent is not None and sent.shape == array.shape:
                values[(where, name)] = array.astype(np.float64) - sent.astype(np.float64)
                updates.add((where, name))
            else:
                values[(where, name)] = array.astype(np.float64)
        groups = [g for g in (updates, set(values) - updates) if g]
        bound = self.clip / math.sqrt(len(groups))
        for group in groups:
            norm = math.sqrt(sum(float(np.vdot(values[k], values[k])) for k in group))
            scale = min(1.0, bound / norm) if norm > 0 else 1.0
            for k in group:
                values[k] *= scale
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(seed_words))))
        std = self.noise_multiplier * self.clip
        out = {"upload": dict(upload), "signature": dict(signature)}
        for key in covered:  # a fixed order: sorted names, upload first
            where, name = key
            noisy = values[key] + rng.normal(0.0, std, size=values[key].shape)
            if key in updates:
                noisy += request[name].astype(np.float64)
            out[where][name] = noisy.astype(parts[where][name].dtype)
        return out["upload"], out["signature"]


def noise_key_words() -> tuple[int, ...]:
    """The data owner's secret (``FEDGRAPH_DP_NOISE_KEY``) as seed words; () without one."""
    key = os.environ.get(NOISE_KEY_ENV, "")
    if not key:
        return ()
    digest = hashlib.sha256(key.encode()).digest()
    return tuple(int.from_bytes(digest[i:i + 4], "little") for i in range(0, 32, 4))
