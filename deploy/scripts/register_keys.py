#!/usr/bin/env python3
"""Register SuperNode public keys with a SuperLink; keys already registered are fine.

    python deploy/scripts/register_keys.py --connection fedgraph keys/*.pub

First lists the SuperNodes the SuperLink knows (the Control API's ``ListNodes``, as
``flwr supernode list`` does; its replies carry each node's public key) and skips the
keys already registered, so the SuperLink logs no ERROR for them (``flwr supernode
register`` on a known key makes it log one). Then runs ``flwr supernode register <key>
<connection> --format json`` for each new key (the connection is a
``[superlink.<name>]`` block of ``$FLWR_HOME/config.toml``, see deploy/README.md step 4)
and retries while the SuperLink is still starting. Exit status 1 names the first key
that could not be registered. Used by the compose file's ``register`` service.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import time

ALREADY = "Public key already in use"


def register(key: str, connection: str) -> tuple[bool, str]:
    out = subprocess.run(["flwr", "supernode", "register", key, connection, "--format", "json"],
                         capture_output=True, text=True)
    try:
        reply = json.loads(out.stdout)
    except json.JSONDecodeError:
        return False, (out.stdout + out.stderr).strip()
    if reply.get("success"):
        return True, f"registered as node {reply.get('node-id')}"
    message = str(reply.get("error-message", ""))
    if ALREADY in message:
        return True, "already registered"
    return False, message.strip()


GONE = {"unregistered", "deleted"}  # statuses whose key may be registered again


def public_key_bytes(path: str) -> bytes:
    """The key as the SuperLink stores it (flwr's own encoding of the OpenSSH key)."""
    from cryptography.hazmat.primitives import serialization
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    with open(path, "rb") as f:
        return public_key_to_bytes(serialization.load_ssh_public_key(f.read()))


def registered_keys(connection: str) -> dict[bytes, int] | None:
    """public key -> node id of every SuperNode registered (not unregistered) with the
    SuperLink, None when it cannot be asked (not up yet), {} on a flwr release without
    the same client modules."""
    try:
        from flwr.cli.flower_config import read_superlink_connection
        from flwr.cli.utils import init_http_client_from_connection
        from flwr.proto.control_pb2 import ListNodesRequest  # pylint: disable=E0611
    except ImportError:  # another flwr release: register every key (known ones are fine)
        return {}
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # "Using SuperLink: ..." per try
            connection_config = read_superlink_connection(connection)
        client = init_http_client_from_connection(connection_config)
        try:
            reply = client.ListNodes(ListNodesRequest())
        finally:
            client.close()
    except (Exception, SystemExit):  # noqa: BLE001 - fall back to registering every key
        return None
    return {bytes(n.public_key): n.node_id for n in reply.nodes_info
            if n.public_key and n.status not in GONE}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connection", required=True, help="SuperLink connection name")
    parser.add_argument("--wait", type=float, default=120.0,
                        help="seconds to keep retrying while the SuperLink is unreachable")
    parser.add_argument("keys", nargs="+", help="public key files (OpenSSH format, NIST EC curve)")
    args = parser.parse_args(argv)
    deadline = time.time() + args.wait
    known = registered_keys(args.connection)
    while known is None and time.time() < deadline:  # the SuperLink is still starting
        time.sleep(2.0)
        known = registered_keys(args.connection)
    for key in args.keys:
        try:
            node = (known or {}).get(public_key_bytes(key))
        except (OSError, ValueError) as err:
            print(f"{key}: not a readable OpenSSH public key ({err})", flush=True)
            return 1
        if node is not None:
            print(f"{key}: already registered as node {node}", flush=True)
            continue
        deadline = time.time() + args.wait
        while True:
            ok, message = register(key, args.connection)
            if ok or time.time() > deadline:
                break
            time.sleep(2.0)
        print(f"{key}: {message}", flush=True)
        if not ok:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
