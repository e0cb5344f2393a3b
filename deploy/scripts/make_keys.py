#!/usr/bin/env python3
"""Make one SuperNode authentication key pair (EC P-384, OpenSSH format) per name.

    python deploy/scripts/make_keys.py --out "$FEDGRAPH_DEPLOY_DIR/keys" supernode-0 supernode-1

writes (``--out`` defaults to ``$FEDGRAPH_DEPLOY_DIR/keys``, else
``~/fedgraph-deploy/keys``: outside the checkout) ``keys/<name>`` (private key, mode
0600: stays on that SuperNode's machine,
``flower-supernode --auth-supernode-private-key``) and ``keys/<name>.pub`` (public
key: sent to the SuperLink operator, ``flwr supernode register``). Equivalent to
``ssh-keygen -t ecdsa -b 384 -N "" -f keys/<name>``. Existing keys are kept.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


def make_key_pair(out: Path, name: str) -> tuple[Path, Path]:
    """``out/<name>`` + ``out/<name>.pub``; an existing pair is left alone."""
    private, public = out / name, out / f"{name}.pub"
    if private.is_file() and public.is_file():
        return private, public
    key = ec.generate_private_key(ec.SECP384R1())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                   serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + f" {name}\n".encode())
    return private, public


def default_out(sub: str) -> Path:
    """Secrets go outside the checkout: ``$FEDGRAPH_DEPLOY_DIR/<sub>`` (deploy/layout.py)."""
    root = os.environ.get("FEDGRAPH_DEPLOY_DIR") or "~/fedgraph-deploy"
    return Path(root).expanduser() / sub


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_out("keys"),
                        help="folder for the key files (default: $FEDGRAPH_DEPLOY_DIR/keys, else "
                             "~/fedgraph-deploy/keys: outside the checkout)")
    parser.add_argument("names", nargs="+", help="one name per SuperNode, e.g. supernode-0")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        private, public = make_key_pair(args.out, name)
        print(f"{name}: private {private}, public {public}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
