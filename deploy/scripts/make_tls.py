#!/usr/bin/env python3
"""Make TLS material for a Flower deployment: a CA and server certificates it signs.

    python deploy/scripts/make_tls.py --out "$FEDGRAPH_DEPLOY_DIR/tls" --name superlink \
        --host superlink.example.org

writes (PEM, private keys mode 0600; ``--out`` defaults to ``$FEDGRAPH_DEPLOY_DIR/tls``,
else ``~/fedgraph-deploy/tls``: outside the checkout)::

    tls/ca.crt  tls/ca.key                 # the CA (reused if it already exists)
    tls/superlink.pem  tls/superlink.key   # server certificate + key for --ssl-certfile/--ssl-keyfile

The certificate's subjectAltName holds every ``--host`` (DNS name or IP address)
plus ``localhost``, ``127.0.0.1`` and ``::1``: Flower's own SuperExec reaches the
Runtime API on the loopback address, so the certificate must be valid there too.
Run it again with another ``--name`` to issue more certificates from the same CA
(e.g. one per SuperNode for its Runtime API). Only ``ca.crt`` is ever copied to
other machines; ``ca.key`` stays with whoever runs the CA.

Needs only the ``cryptography`` package (a dependency of flwr).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = ("localhost", "127.0.0.1", "::1")


def _write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def load_or_make_ca(out: Path, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA in ``out`` (ca.crt + ca.key), created on first use."""
    crt, key = out / "ca.crt", out / "ca.key"
    if crt.is_file() and key.is_file():
        ca_key = serialization.load_pem_private_key(key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise SystemExit(f"{key}: not an EC private key")
        return x509.load_pem_x509_certificate(crt.read_bytes()), ca_key
    if crt.exists() or key.exists():
        raise SystemExit(f"{out}: found only one of ca.crt/ca.key; remove it or restore the other")
    ca_key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedgraph-flwr deployment CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    _write_private_key(key, ca_key)
    _write_cert(crt, cert)
    return cert, ca_key


def make_server_cert(out: Path, name: str, hosts: list[str], days: int) -> Path:
    """Issue ``out/<name>.pem`` + ``out/<name>.key`` for ``hosts`` (+ loopback)."""
    ca_cert, ca_key = load_or_make_ca(out, days)
    sans: list[str] = []
    for host in [*hosts, *LOOPBACK]:
        if host and host not in sans:
            sans.append(host)
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sans[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in sans]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    _write_private_key(out / f"{name}.key", key)
    _write_cert(out / f"{name}.pem", cert)
    return out / f"{name}.pem"


def default_out(sub: str) -> Path:
    """Secrets go outside the checkout: ``$FEDGRAPH_DEPLOY_DIR/<sub>`` (deploy/layout.py)."""
    root = os.environ.get("FEDGRAPH_DEPLOY_DIR") or "~/fedgraph-deploy"
    return Path(root).expanduser() / sub


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_out("tls"),
                        help="folder for ca.* and <name>.* (default: $FEDGRAPH_DEPLOY_DIR/tls, else "
                             "~/fedgraph-deploy/tls: outside the checkout)")
    parser.add_argument("--name", default="superlink", help="file stem of the server certificate")
    parser.add_argument("--host", action="append", default=[],
                        help="DNS name or IP address the server is reached at (repeatable)")
    parser.add_argument("--days", type=int, default=365, help="validity in days")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pem = make_server_cert(args.out, args.name, args.host, args.days)
    print(f"wrote {args.out / 'ca.crt'} and {pem} (+ .key) for "
          f"{', '.join([*args.host, *LOOPBACK])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
