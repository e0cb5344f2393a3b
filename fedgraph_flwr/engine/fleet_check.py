"""A data owner's checks against the SuperLink's Fleet API before its SuperNode starts
(``fedgraph-preflight --superlink``): TLS with the operator's CA, and whether this
SuperNode's public key is registered. Each answer is one line.

Flower 1.42 serves the Fleet API as protobuf over HTTPS. The registration check sends
the SuperNode's own signed ``ActivateNode`` request (Flower's client and auth
interceptor) with a heartbeat interval of 0, which the SuperLink refuses *after* it
looked the key up: "No SuperNode found with the given public key" for an unregistered
key (``FLEET_NODE_ACTIVATION_FAILED``), an out-of-bounds heartbeat interval for a
registered one (``FLEET_INVALID_HEARTBEAT_INTERVAL``), each as its API error code. So the node is never
activated (no session the ServerApp could take for a SuperNode); should a later Flower
accept the request, the node is deactivated again at once.
"""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
from pathlib import Path
from typing import cast

CONNECT_TIMEOUT_S = 10.0


class FleetCheckError(RuntimeError):
    """The check failed; the message is one line with what to fix."""


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise FleetCheckError(f"--superlink {address!r} is not HOST:PORT (the SuperNode's "
                              f"--superlink, e.g. superlink.example.org:8000)")
    return host.strip("[]"), int(port)


def check_tls(address: str, ca_file: str, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """One line: the SuperLink at ``address`` presented a certificate for its name that
    the CA in ``ca_file`` signed. Raises :class:`FleetCheckError` otherwise."""
    from cryptography import x509

    host, port = _host_port(address)
    path = Path(ca_file).expanduser()
    try:
        ca = x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as exc:
        raise FleetCheckError(f"CA certificate {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise FleetCheckError(f"CA certificate {path} is not a PEM certificate (the "
                              f"operator's ca.crt, as passed to --root-certificates)") from None
    context = ssl.create_default_context(cafile=str(path))
    context.set_alpn_protocols(["h2", "http/1.1"])
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock, \
                context.wrap_socket(sock, server_hostname=host) as tls:
            cert = tls.getpeercert() or {}
    except ssl.SSLCertVerificationError as exc:
        raise FleetCheckError(
            f"TLS to {address}: the SuperLink's certificate is not accepted with {path}: "
            f"{exc.verify_message} (another CA's ca.crt, or a certificate without "
            f"{host!r} among its names)") from None
    except ssl.SSLError as exc:
        raise FleetCheckError(f"TLS to {address} failed: {exc.reason or exc} (is it the "
                              f"SuperLink's Fleet API port, with TLS on?)") from None
    except OSError as exc:  # refused, unreachable, timed out
        reason = "timed out" if isinstance(exc, TimeoutError) else (
            exc.strerror or type(exc).__name__)
        raise FleetCheckError(f"cannot reach the SuperLink at {address}: {reason} (is it "
                              f"running, is the address right, does a firewall let "
                              f"port {port} through?)") from None
    alt_names = cast(tuple[tuple[str, str], ...], cert.get("subjectAltName", ()))
    names = [v for kind, v in alt_names if kind in ("DNS", "IP Address")]
    issuer = ca.subject.rfc4514_string()
    return (f"TLS to {address}: the SuperLink's certificate (for {', '.join(names) or host}, "
            f"valid until {cert.get('notAfter', '?')}) is signed by the CA in {path} "
            f"({issuer})")


def _load_private_key(key_file: str):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(key_file).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FleetCheckError(f"private key {path}: {exc.strerror or exc}") from None
    for load in (serialization.load_ssh_private_key, serialization.load_pem_private_key):
        try:
            key = load(data, password=None)
        except (ValueError, TypeError):
            continue
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return key
        raise FleetCheckError(f"private key {path} is not an elliptic-curve key "
                              f"(make one with deploy/scripts/make_keys.py)")
    raise FleetCheckError(f"private key {path} is not an OpenSSH or PEM private key (the "
                          f"file passed to --auth-supernode-private-key, not its .pub)")


def check_registration(address: str, ca_file: str, key_file: str) -> str:
    """One line: this SuperNode's public key (from its private key ``key_file``) is
    registered with the SuperLink at ``address``. Raises :class:`FleetCheckError`
    otherwise (not registered: the operator's ``flwr supernode register`` is missing)."""
    import httpx
    from flwr.proto.fleet_pb2 import ActivateNodeRequest, DeactivateNodeRequest
    from flwr.supercore.error import ApiErrorCode
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes
    from flwr.supernode.fleet_http_client import FleetHttpClient
    from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

    private = _load_private_key(key_file)
    public = private.public_key()
    public_bytes = public_key_to_bytes(public)
    try:
        ca = Path(ca_file).expanduser().read_bytes()  # bytes: Flower builds the SSL context
    except OSError as exc:
        raise FleetCheckError(f"CA certificate {ca_file}: {exc.strerror or exc}") from None
    client = FleetHttpClient.from_server_address(
        address, False, ca,
        interceptors=[NodeAuthHttpInterceptor(private, public)])
    try:
        with client:
            try:
                reply = client.ActivateNode(ActivateNodeRequest(public_key=public_bytes,
                                                                heartbeat_interval=0.0))
            except httpx.HTTPStatusError as exc:
                text = exc.response.text
                try:
                    code = int(json.loads(text).get("code", -1))
                except (ValueError, AttributeError):
                    code = -1
            else:  # a Flower that takes the interval: registered; leave no session behind
                client.DeactivateNode(DeactivateNodeRequest(node_id=reply.node_id))
                text, code = "", int(ApiErrorCode.FLEET_INVALID_HEARTBEAT_INTERVAL)
    except httpx.TransportError as exc:
        raise FleetCheckError(f"cannot reach the SuperLink's Fleet API at {address}: "
                              f"{type(exc).__name__}: {exc}") from None
    fingerprint = "sha256:" + hashlib.sha256(public_bytes).hexdigest()[:16]
    if code == ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED:
        raise FleetCheckError(
            f"the SuperLink at {address} does not know this SuperNode's public key "
            f"({fingerprint}, from {key_file}): send its .pub to the operator, who runs "
            f"`flwr supernode register <file>.pub <connection>`")
    if code != ApiErrorCode.FLEET_INVALID_HEARTBEAT_INTERVAL:
        raise FleetCheckError(f"the SuperLink at {address} answered the key check with "
                              f"{text.strip().splitlines()[0][:200] if text.strip() else 'nothing'}")
    return (f"SuperNode key {fingerprint} ({key_file}) is registered with the SuperLink at "
            f"{address} (checked without activating a node)")
