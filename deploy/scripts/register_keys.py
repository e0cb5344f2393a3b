#!/usr/bin/env python3
"""Register SuperNode public keys with a SuperLink; keys already registered are fine.

    python deploy/scripts/register_keys.py --connection fedgraph keys/*.pub

Runs ``flwr supernode register <key> <connection> --format json`` per key (the
connection is a ``[superlink.<name>]`` block of ``$FLWR_HOME/config.toml``) and
retries while the SuperLink is still starting. Exit status 1 names the first key
that could not be registered. Used by the compose file's ``register`` service.
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connection", required=True, help="SuperLink connection name")
    parser.add_argument("--wait", type=float, default=120.0,
                        help="seconds to keep retrying while the SuperLink is unreachable")
    parser.add_argument("keys", nargs="+", help="public key files (OpenSSH format, NIST EC curve)")
    args = parser.parse_args(argv)
    for key in args.keys:
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
