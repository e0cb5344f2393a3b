"""``secure-aggregation=ckks``: train uploads encrypted under a CKKS key the server lacks.

Who holds what:

- every client (data owner) holds the *secret* context (TenSEAL, CKKS: secret key
  included); it encrypts the float arrays of its train upload after training and
  decrypts its personalized payload before ``trainer.load_payload``;
- the server holds the *public* context only (``serialize(save_secret_key=False)``):
  enough to deserialize ciphertexts, multiply them by plaintext weights and add them
  (:mod:`fedgraph_flwr.engine.ckks_mixing`), not to decrypt. :func:`load_public_context`
  refuses a file that holds a secret key.

The mixing weights (an aggregator's :class:`~fedgraph_flwr.core.mixing.MixingPlan`)
come from the signatures and sample counts, which stay in the clear.

Keys: ``python -m fedgraph_flwr.secure_aggregation keygen --out DIR`` writes
``DIR/secret.ckks`` (to every SuperNode, out of band: env ``FEDGRAPH_CKKS_SECRET_CONTEXT``
or run-config ``ckks-secret-context``) and ``DIR/public.ckks`` (to the server:
``ckks-public-context``). The in-process transport and the simulation launchers make a
pair per run in ``<output-dir>/<run-name>/ckks/`` (:func:`ensure_run_keys`), kept across
``resume`` (the checkpoint's payloads are ciphertexts under it).

Wire form: float array ``name`` flattened (C order) and cut into chunks of
:data:`SLOTS` values; chunk ``i`` travels as ``"<name>@ckks<i>"``, a uint8 array holding
the serialized ``CKKSVector``. Non-float arrays are never mixed (mixing.py): under ckks
they are not uploaded at all, and each client keeps its own.

Parameters (docs/secure-aggregation.md): poly modulus degree 8192 (4096 slots; 128-bit
security for a 200-bit modulus), coefficient moduli [60, 40, 40, 60] bits, scale 2^40.
The mixture needs one plaintext multiplication (one rescale), so one 40-bit level is
used and one spare; the 60-bit first prime leaves 20 bits above the scale for the
integer part. Decrypted mixtures are within ~1e-7 of the plaintext ones.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .core.options import ConfigError

if TYPE_CHECKING:
    import tenseal as ts

    from .config import ClientSettings, RunConfig

Arrays = dict[str, np.ndarray]

POLY_MODULUS_DEGREE = 8192
COEFF_MOD_BIT_SIZES = (60, 40, 40, 60)
GLOBAL_SCALE = 2.0**40
SLOTS = POLY_MODULUS_DEGREE // 2  # values per ciphertext

SECRET_ENV = "FEDGRAPH_CKKS_SECRET_CONTEXT"
SECRET_FILE = "secret.ckks"
PUBLIC_FILE = "public.ckks"
CIPHER_MARK = "@ckks"


class SecureAggregationError(ConfigError):
    """A key is missing or wrong (one line); which methods and settings it works with,
    ``RunConfig`` checks (config.py)."""


# --- keys ---------------------------------------------------------------------------------
def new_context() -> ts.Context:
    """A fresh CKKS context (secret key included) with this module's parameters."""
    import tenseal as ts

    context = ts.context(ts.SCHEME_TYPE.CKKS, POLY_MODULUS_DEGREE,
                         coeff_mod_bit_sizes=list(COEFF_MOD_BIT_SIZES))
    context.global_scale = GLOBAL_SCALE
    return context


def generate_keys(folder: str | Path) -> tuple[Path, Path]:
    """Write ``folder/secret.ckks`` (mode 0600) and ``folder/public.ckks``; return both."""
    folder = Path(folder).expanduser()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    context = new_context()
    secret, public = folder / SECRET_FILE, folder / PUBLIC_FILE
    for path, blob in ((secret, context.serialize(save_secret_key=True)),
                       (public, context.serialize(save_secret_key=False))):
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    return secret, public


def run_key_folder(config: RunConfig) -> Path:
    """``<output-dir>/<run-name>/ckks``: where a run's own keys live."""
    return Path(config.output_dir).expanduser() / config.resolved_run_name / "ckks"


def ensure_run_keys(config: RunConfig) -> RunConfig:
    """For launchers that stand for every data owner at once (the in-process transport, a
    simulation): under ckks with no ``ckks-public-context`` given, the run's own key pair
    (made once, kept for ``resume``), with the config pointing the clients at its secret
    and the server at its public half. Otherwise ``config`` unchanged."""
    if config.secure_aggregation != "ckks" or config.ckks_public_context:
        return config
    folder = run_key_folder(config)
    if not (folder / SECRET_FILE).is_file() or not (folder / PUBLIC_FILE).is_file():
        generate_keys(folder)
    return config.replace(ckks_secret_context=str(folder / SECRET_FILE),
                          ckks_public_context=str(folder / PUBLIC_FILE))


def public_context_path(config: RunConfig) -> Path:
    """``ckks-public-context``, else the run's own ``ckks/public.ckks``."""
    return Path(config.ckks_public_context or run_key_folder(config) / PUBLIC_FILE).expanduser()


def secret_context_path(config: ClientSettings) -> Path:
    """env ``FEDGRAPH_CKKS_SECRET_CONTEXT`` (the data owner's own setting), else
    ``ckks-secret-context``; one line if neither names a file."""
    source, value = SECRET_ENV, os.environ.get(SECRET_ENV, "")
    if not value:
        source, value = "ckks-secret-context", config.ckks_secret_context
    if not value:
        raise SecureAggregationError(
            f"secure-aggregation=ckks: this client has no secret CKKS context: set env "
            f"{SECRET_ENV} (or run-config ckks-secret-context) to the secret.ckks file of "
            f"`python -m fedgraph_flwr.secure_aggregation keygen`")
    path = Path(value).expanduser()
    if not path.is_file():
        raise SecureAggregationError(f"secure-aggregation=ckks: {source}={path} is not a file")
    return path


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int) -> ts.Context:
    import tenseal as ts

    try:
        return ts.context_from(Path(path).read_bytes())
    except Exception as exc:  # noqa: BLE001 - TenSEAL raises several kinds; one line
        raise SecureAggregationError(f"secure-aggregation=ckks: {path} is not a TenSEAL "
                                     f"context ({type(exc).__name__})") from None


def load_public_context(path: str | Path) -> ts.Context:
    """The server's context: refuses a missing file and one that holds a secret key."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise SecureAggregationError(
            f"secure-aggregation=ckks: no public CKKS context at {path}: set "
            f"ckks-public-context to the public.ckks file of `python -m "
            f"fedgraph_flwr.secure_aggregation keygen`")
    context = _load(str(path), path.stat().st_mtime_ns)
    if context.is_private():
        raise SecureAggregationError(f"secure-aggregation=ckks: {path} holds a secret key; "
                                     f"the server must be given the public context only")
    return context


def load_secret_context(config: ClientSettings) -> ts.Context:
    """The client's context (secret key included), from :func:`secret_context_path`."""
    path = secret_context_path(config)
    context = _load(str(path), path.stat().st_mtime_ns)
    if not context.is_private():
        raise SecureAggregationError(f"secure-aggregation=ckks: {path} holds no secret key")
    return context


# --- the wire form ------------------------------------------------------------------------
def cipher_key(name: str, chunk: int) -> str:
    """The upload key of chunk ``chunk`` of array ``name``."""
    return f"{name}{CIPHER_MARK}{chunk}"


def parse_cipher_key(key: str) -> tuple[str, int] | None:
    """(array name, chunk) of a ciphertext key, or None for a key in the clear."""
    name, mark, chunk = key.rpartition(CIPHER_MARK)
    return (name, int(chunk)) if mark and chunk.isdigit() else None


def chunk_sizes(numel: int) -> list[int]:
    """How many values each ciphertext of an array of ``numel`` values holds."""
    count = max(1, math.ceil(numel / SLOTS))
    return [min(SLOTS, numel - i * SLOTS) for i in range(count)]


def is_encrypted(array: np.ndarray) -> bool:
    """Whether ``array`` is mixed (and so encrypted): the floating ones."""
    return bool(np.issubdtype(array.dtype, np.floating))


def encrypt_arrays(arrays: Arrays, context: ts.Context) -> Arrays:
    """The float arrays of ``arrays`` as ciphertext chunks (uint8); the others left out."""
    import tenseal as ts

    out: Arrays = {}
    for name in sorted(arrays):
        array = arrays[name]
        if not is_encrypted(array):
            continue
        flat = np.asarray(array, dtype=np.float64).reshape(-1)
        start = 0
        for i, size in enumerate(chunk_sizes(flat.size)):
            vector = ts.ckks_vector(context, flat[start:start + size].tolist())
            out[cipher_key(name, i)] = np.frombuffer(bytearray(vector.serialize()), dtype=np.uint8)
            start += size
    return out


def decrypt_arrays(arrays: Arrays, context: ts.Context, schema: Arrays) -> Arrays:
    """``arrays`` with every array of ``schema`` that arrived as ciphertext chunks
    decrypted to its shape and dtype; keys in the clear pass as they are."""
    import tenseal as ts

    chunks: dict[str, dict[int, np.ndarray]] = {}
    out: Arrays = {}
    for key, value in arrays.items():
        parsed = parse_cipher_key(key)
        if parsed is None:
            out[key] = value
        else:
            chunks.setdefault(parsed[0], {})[parsed[1]] = value
    for name, parts in chunks.items():
        like = schema[name]
        values = [ts.ckks_vector_from(context, parts[i].tobytes()).decrypt()
                  for i in range(len(parts))]
        flat = np.concatenate([np.asarray(v, dtype=np.float64) for v in values])
        out[name] = flat[:like.size].reshape(like.shape).astype(like.dtype)
    return out


def main(argv: list[str] | None = None) -> int:
    """``keygen --out DIR``: a key pair for a deployment's data owners and server."""
    parser = argparse.ArgumentParser(prog="python -m fedgraph_flwr.secure_aggregation",
                                     description="CKKS keys for secure-aggregation=ckks.")
    sub = parser.add_subparsers(dest="command", required=True)
    keygen = sub.add_parser("keygen", help="write DIR/secret.ckks (clients) and "
                            "DIR/public.ckks (server)")
    keygen.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    secret, public = generate_keys(args.out)
    print(f"{secret}: give to every SuperNode (env {SECRET_ENV}); never to the server\n"
          f"{public}: give to the server (run-config ckks-public-context)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
