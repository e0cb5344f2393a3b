"""``fedgraph-preflight``: a data owner's check of its client file and link before its SuperNode starts.

    fedgraph-preflight /srv/fedgraph/client_0.npz [--partition-id 0]
        [--features 1433] [--classes 7] [--run-config 'dp="client" ...']
        [--superlink HOST:PORT --root-certificates ca.crt
         [--auth-supernode-private-key keys/supernode-0]]

Reads the file exactly as the ClientApp's handshake will (the same code, so the same
one-line errors): readable, the required arrays with their shapes and dtypes, no NaN or
infinite feature, edge ids inside the node range, labels in range, a training node. With
``--features``/``--classes`` (the run's dataset signature, which the operator announces,
e.g. 1433 and 7 for Cora) it checks the feature width and that every label is below the
class count: a mismatch the server would otherwise find only at the handshake, after
every owner's SuperNode is up. With ``--run-config`` (the run's settings, as
``fedgraph-run`` takes them) it also checks what the handshake checks of this owner's
keys: under ``secure-aggregation="ckks"`` the secret context loads, under ``dp`` the
noise key (``FEDGRAPH_DP_NOISE_KEY``) is in this environment.

With ``--superlink`` (the SuperNode's own flags, same values) it also checks, against
the running SuperLink: TLS to its Fleet API address with the CA certificate (reachable,
its certificate signed by that CA and issued for that name), and with
``--auth-supernode-private-key`` that this SuperNode's public key is registered there
(without activating a node). The file may then be left out, to check only the link.
These are what a SuperNode otherwise reports only in its own terminal while the run
waits for it (:mod:`fedgraph_flwr.engine.fleet_check`).

Prints one line per check and exits 0, or the passed checks' lines and one error line
and exits 1. Without ``--superlink`` nothing leaves the machine. deploy/systemd runs it
as the SuperNode's ``ExecStartPre``; the compose file as the one-shot ``preflight-<i>``
service its SuperNode waits for.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

PROG = "fedgraph-preflight"


class PreflightError(ValueError):
    """The file does not fit the run (one line)."""


def check(path: str, partition_id: int | None = None, features: int | None = None,
          classes: int | None = None, run_config: dict[str, Any] | None = None) -> str:
    """The summary line for a file the handshake will accept; raises with the handshake's
    own one-line message (or a :class:`PreflightError`) otherwise."""
    from .config import resolve_config
    from .engine import client_runtime as rt

    config = resolve_config(None, run_config or {}).client_config()
    node_config: dict[str, Any] = {"partition-file": path}
    if partition_id is not None:
        node_config["partition-id"] = partition_id
    try:
        identity = rt.identify(node_config, config)
    except rt.ClientDataError as exc:  # the SuperNode's flag, said as this command's
        raise PreflightError(f"{path} is not named client_<i>: pass --partition-id <i> here "
                             f"and partition-id=<i> in the SuperNode's --node-config") from exc
    data, num_classes = rt.load_client_data(identity, config)
    rt.check_client_keys(config, identity)
    width = int(data.num_features)
    if features is not None and width != features:
        raise PreflightError(f"{path}: feature width {width}, but the run's dataset has {features}")
    top = int(data.y.max())
    if classes is not None and top >= classes:
        raise PreflightError(f"{path}: label {top} is outside the run's {classes} classes "
                             f"(0..{classes - 1})")
    if classes is not None and num_classes > classes:
        raise PreflightError(f"{path}: declares num_classes={num_classes}, but the run's "
                             f"dataset has {classes}")
    facts = rt.describe(data, num_classes, identity, rt.pick_device())
    labels = f"labels 0..{top}" + (f" of the run's {classes} classes" if classes else "")
    return (f"{path}: client {identity.partition_id}: {facts['num-nodes']} nodes, "
            f"{facts['num-edges']} directed edges, {width} features, {labels}, "
            f"train/val/test {facts['num-train']}/{facts['num-val']}/{facts['num-test']}: ready")


def _run_config(text: str) -> dict[str, Any]:
    from .run import CONFIG_PAIR, run_config_values

    values = run_config_values({"--run-config": [text]})
    if values is None or (text.strip() and not CONFIG_PAIR.findall(text)):
        raise PreflightError(f"--run-config {text!r} is not 'key=value ...' as flwr run takes it")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", help="the client file (client_<i>.npz or .pt)")
    parser.add_argument("--partition-id", type=int, default=None,
                        help="the client id, where the file is not named client_<i>")
    parser.add_argument("--features", type=int, default=None,
                        help="the run's feature width (e.g. 1433 for Cora)")
    parser.add_argument("--classes", type=int, default=None,
                        help="the run's number of classes (e.g. 7 for Cora)")
    parser.add_argument("--run-config", default="",
                        help="the run's settings, as flwr run takes them (checks dp/ckks keys)")
    parser.add_argument("--superlink", default=None, metavar="HOST:PORT",
                        help="the SuperLink's Fleet API address, as the SuperNode's --superlink")
    parser.add_argument("--root-certificates", default=None, metavar="CA",
                        help="the operator's CA certificate, as the SuperNode's flag")
    parser.add_argument("--auth-supernode-private-key", default=None, metavar="KEY",
                        help="this SuperNode's private key: check its public key is registered")
    args = parser.parse_args(argv)
    if args.file is None and args.superlink is None:
        parser.error("give the client file, --superlink HOST:PORT, or both")
    if (args.superlink is None) != (args.root_certificates is None):
        parser.error("--superlink and --root-certificates go together (TLS is always on)")
    if args.auth_supernode_private_key and args.superlink is None:
        parser.error("--auth-supernode-private-key needs --superlink and --root-certificates")
    checks = []
    if args.file is not None:
        checks.append(lambda: check(args.file, args.partition_id, args.features, args.classes,
                                    _run_config(args.run_config)))
    if args.superlink is not None:
        from .engine import fleet_check

        checks.append(lambda: fleet_check.check_tls(args.superlink, args.root_certificates))
        if args.auth_supernode_private_key:
            checks.append(lambda: fleet_check.check_registration(
                args.superlink, args.root_certificates, args.auth_supernode_private_key))
    for run_check in checks:
        try:
            line = run_check()
        except Exception as exc:  # noqa: BLE001 - every problem is one line, as at the handshake
            reason = str(exc).splitlines()[0] if str(exc) else ""
            print(f"{PROG}: error: {type(exc).__name__}: {reason}", file=sys.stderr)
            return 1
        print(f"{PROG}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
