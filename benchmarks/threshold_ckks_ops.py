"""secure-aggregation=ckks-threshold: OpenFHE's operations, one by one, with this project's parameters.

Runs under the OpenFHE worker's interpreter (it imports ``openfhe_ops.py`` by path, as the
worker does), K parties in one process:

    OMP_NUM_THREADS=1 .venv-openfhe/bin/python benchmarks/threshold_ckks_ops.py
    OMP_NUM_THREADS=2 .venv-openfhe/bin/python benchmarks/threshold_ckks_ops.py   # OpenMP

Prints one JSON line: per-ciphertext milliseconds of encrypt, load (deserialize), a K-term
mix, a partial decryption and a K-party fusion; the bytes of a fresh ciphertext, a mixture
and a partial decryption; the largest error of a fused mixture against its plaintext, and
of a fused fresh ciphertext (scale 2^40: what a rescaled mixture would give); and whether
OpenFHE accepts ring dimension 8192 at 128-bit security with HYBRID and with BV key
switching (``--ring-check``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fedgraph_flwr" / "threshold_ckks"))
import openfhe_ops as ops  # noqa: E402 - the worker's own module, by path


def per_chunk(fn, chunks: int) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) / chunks * 1e3, out


def ring_check() -> dict:
    """Whether OpenFHE makes a context of ring dimension 8192 with our moduli at 128-bit."""
    o = ops._openfhe()
    out = {}
    for name, technique in (("HYBRID", o.KeySwitchTechnique.HYBRID), ("BV", o.KeySwitchTechnique.BV)):
        params = o.CCParamsCKKSRNS()
        params.SetMultiplicativeDepth(ops.MULTIPLICATIVE_DEPTH)
        params.SetScalingModSize(ops.SCALING_MOD_SIZE)
        params.SetFirstModSize(ops.FIRST_MOD_SIZE)
        params.SetScalingTechnique(o.ScalingTechnique.FIXEDMANUAL)
        params.SetSecurityLevel(o.SecurityLevel.HEStd_128_classic)
        params.SetKeySwitchTechnique(technique)
        params.SetRingDim(8192)
        try:
            cc = o.GenCryptoContext(params)
            out[name] = f"accepted (log2 Q = {np.log2(cc.GetModulus()):.0f})"
        except RuntimeError as exc:
            out[name] = "refused: " + str(exc).splitlines()[0].split("():", 1)[-1].strip()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parties", type=int, default=10)
    parser.add_argument("--chunks", type=int, default=8, help="ciphertexts per party")
    parser.add_argument("--ring-check", action="store_true")
    args = parser.parse_args()
    k, chunks = args.parties, args.chunks
    lead_public, lead_secret = ops.lead_keygen()
    shares = [ops.share_keygen(lead_public) for _ in range(k - 1)]
    joint = ops.join_public([lead_public] + [p for p, _ in shares])
    secrets = [lead_secret] + [s for _, s in shares]
    rng = np.random.default_rng(0)
    models = [rng.normal(0, 0.1, ops.SLOTS * chunks) for _ in range(k)]
    weights = rng.dirichlet(np.ones(k)).tolist()
    row = {"parties": k, "chunks": chunks}
    row["encrypt_ms"], uploads = per_chunk(lambda: [ops.encrypt(joint, m.tobytes()) for m in models],
                                           k * chunks)
    ops._CACHE.clear()
    row["load_ms"], _ = per_chunk(lambda: [ops._load("ct", b) for u in uploads for b in u], k * chunks)
    row["mix_ms"], mixed = per_chunk(lambda: ops._mix(uploads, [weights]), chunks)
    (mixture,) = mixed
    row["partial_decrypt_ms"], lead = per_chunk(
        lambda: ops.partial_decrypt(mixture, secrets[0], True), chunks)
    parts = [lead] + [ops.partial_decrypt(mixture, s, False) for s in secrets[1:]]
    row["fuse_ms"], fused = per_chunk(lambda: ops.fuse(parts, ops.SLOTS * chunks), chunks)
    expected = sum(w * m for w, m in zip(weights, models))
    row["mixture_max_error"] = float(np.abs(np.frombuffer(fused) - expected).max())
    one = uploads[0][:1]
    fresh = [ops.partial_decrypt(one, s, i == 0, ops.FRESH) for i, s in enumerate(secrets)]
    row["fresh_max_error"] = float(np.abs(np.frombuffer(ops.fuse(fresh, ops.SLOTS))
                                          - models[0][:ops.SLOTS]).max())
    row["bytes"] = {"fresh": len(uploads[0][0]), "mixture": len(mixture[0]),
                    "partial": len(parts[1][0])}
    if args.ring_check:
        row["ring_8192"] = ring_check()
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
