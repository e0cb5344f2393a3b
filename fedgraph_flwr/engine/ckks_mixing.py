"""The server's half of ``secure-aggregation=ckks``: check ciphertext uploads, mix them.

The server holds the public CKKS context only (:func:`~fedgraph_flwr.secure_aggregation.
load_public_context` refuses one with a secret key). Each client's train upload is the
ciphertext chunks of its float arrays (wire form: :mod:`fedgraph_flwr.secure_aggregation`);
the aggregator's :class:`~fedgraph_flwr.core.mixing.MixingPlan`, computed from
signatures and sample counts in the clear, says with which weights; client ``i``'s
payload is then, chunk by chunk, ``Σ_j w_ij · Enc(θ_j)`` (a plaintext-scalar, or for a
per-element group a plaintext-vector, multiplication and additions), which only a
client can decrypt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.mixing import MixingPlan
from ..core.phases import Arrays, ClientUpdate
from ..secure_aggregation import chunk_sizes, cipher_key, is_encrypted

if TYPE_CHECKING:
    import tenseal as ts


class CiphertextMixer:
    """The expected ciphertext schema of a run's train uploads, and the mixing of them.

    ``initial``: the initial model (its float arrays' sizes fix every upload's chunks).
    """

    def __init__(self, context: ts.Context, initial: Arrays) -> None:
        if context.is_private():  # never: load_public_context refuses it first
            raise ValueError("the server's CKKS context must not hold a secret key")
        self.context = context
        self.layout = {name: chunk_sizes(arr.size) for name, arr in sorted(initial.items())
                       if is_encrypted(arr)}
        self.expected = {cipher_key(n, i) for n, sizes in self.layout.items()
                         for i in range(len(sizes))}

    def check(self, upload: Arrays) -> str | None:
        """Why a train upload is not this run's ciphertexts, or None: the chunk names,
        uint8 byte strings, each a CKKS vector under the public context of the right size."""
        import tenseal as ts

        if set(upload) != self.expected:
            missing = sorted(self.expected - set(upload))
            extra = sorted(set(upload) - self.expected)
            return f"wrong ciphertext names (missing {missing[:3]}, unexpected {extra[:3]})"
        for name, sizes in self.layout.items():
            for i, size in enumerate(sizes):
                key = cipher_key(name, i)
                blob = upload[key]
                if blob.dtype != np.uint8 or blob.ndim != 1:
                    return f"ciphertext {key!r} is {blob.dtype} {blob.shape}, not uint8 bytes"
                try:
                    vector = ts.ckks_vector_from(self.context, blob.tobytes())
                except Exception as exc:  # noqa: BLE001 - any TenSEAL error: not ours
                    return (f"ciphertext {key!r} does not load under the run's public "
                            f"context ({type(exc).__name__})")
                if vector.size() != size:
                    return f"ciphertext {key!r} holds {vector.size()} values, expected {size}"
        return None

    def mix(self, plan: MixingPlan, updates: dict[int, ClientUpdate]) -> dict[int, Arrays]:
        """Each client's payload: its ciphertext mixture (per :meth:`MixingPlan.group_of`)
        plus ``plan.clear``. Receivers with identical weights (FedAvg: all) share one."""
        import tenseal as ts

        ids = plan.client_ids
        if sorted(updates) != ids:
            raise RuntimeError(f"mixing plan for {ids}, updates from {sorted(updates)}")
        # Receivers whose weights agree in every matrix get the same mixture: computed once.
        rows = plan.matrices.transpose(1, 0, 2).reshape(len(ids), -1)  # [K, G*K]
        first_of: dict[bytes, int] = {}
        same_as = [first_of.setdefault(row.tobytes(), i) for i, row in enumerate(rows)]
        mixtures: dict[int, Arrays] = {i: {} for i in sorted(set(same_as))}
        for name, sizes in self.layout.items():
            group = plan.group_of(name)
            flat_group = None if np.ndim(group) == 0 else np.asarray(group).reshape(-1)
            start = 0
            for chunk, size in enumerate(sizes):
                key = cipher_key(name, chunk)
                senders = [ts.ckks_vector_from(self.context, updates[c].arrays[key].tobytes())
                           for c in ids]
                segment = None if flat_group is None else flat_group[start:start + size]
                for i in mixtures:
                    total = None
                    for j, vector in enumerate(senders):
                        term = _weighted(vector, plan.matrices, group, segment, i, j)
                        if term is not None:
                            total = term if total is None else total + term
                    if total is None:  # every weight 0: an encryption of zeros under the
                        total = senders[0] * 0.0  # same key, so the client still decrypts
                    mixtures[i][key] = np.frombuffer(bytearray(total.serialize()), dtype=np.uint8)
                start += size
        return {c: {**mixtures[same_as[i]], **plan.clear.get(c, {})} for i, c in enumerate(ids)}


def _weighted(vector: ts.CKKSVector, matrices: np.ndarray, group: int | np.ndarray,
              segment: np.ndarray | None, i: int, j: int) -> ts.CKKSVector | None:
    """w_ij · vector: a plaintext scalar (one matrix for the chunk), or a plaintext
    vector of per-element weights; None where the weight is 0 everywhere."""
    if segment is None:
        weight = float(matrices[int(group), i, j])
        return None if weight == 0.0 else vector * weight
    weights = matrices[segment, i, j]
    if not weights.any():
        return None
    if (weights == weights[0]).all():  # one factor in this chunk: the cheaper scalar product
        return vector * float(weights[0])
    return vector * weights.tolist()
