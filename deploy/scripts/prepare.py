#!/usr/bin/env python3
"""Make everything deploy/docker-compose.yml mounts, under deploy/generated/.

    python deploy/scripts/prepare.py                          # partitions via fedgraph-partition
    python deploy/scripts/prepare.py --from-dir DIR           # or copy DIR/client_<i>.npz

Writes (idempotent: existing TLS material and keys are kept)::

    generated/partitions/client_<i>.npz    one file per SuperNode (partition CLI --export)
    generated/tls/{ca.crt,ca.key,superlink.pem,superlink.key}   SAN: superlink, localhost, --host
    generated/node-tls/{ca.crt,runtime.pem,runtime.key}         the SuperNodes' Runtime API
    generated/keys/supernode-<i>{,.pub}     SuperNode auth keys (EC P-384, OpenSSH)
    generated/flwr-home/config.toml         host-side `flwr` connection "fedgraph" -> 127.0.0.1
    generated/flwr-home-compose/config.toml the `register` service's connection -> superlink
    generated/state/  generated/outputs/    SuperLink database, run outputs
    .env                                    COMPOSE_PROJECT_NAME, COMPOSE_PROFILES=cpu,
                                            FEDGRAPH_UID/GID, FEDGRAPH_PUBLISH=127.0.0.1,
                                            FEDGRAPH_FEATURES/CLASSES (the files' signature)

The number of clients is the compose file's (``layout.NUM_SUPERNODES``) unless
``--clients`` says otherwise (then render the compose file with the same number:
``make_compose.py --supernodes N --write``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DEPLOY))
sys.path.insert(0, str(DEPLOY / "scripts"))
import layout as L  # noqa: E402
from make_keys import make_key_pair  # noqa: E402
from make_tls import make_server_cert  # noqa: E402


def make_partitions(out: Path, clients: int, args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if args.from_dir:
        for i in range(clients):
            src = Path(args.from_dir) / L.partition_file_name(i)
            if not src.is_file():
                raise SystemExit(f"{src} does not exist (--from-dir needs client_0..{clients - 1}.npz)")
            shutil.copy(src, out / src.name)
        return
    cmd = [sys.executable, "-m", "fedgraph_flwr.partition", "--dataset", args.dataset,
           "--num-clients", str(clients), "--partition", args.partition,
           "--export", str(out), "--format", "npz"]
    if args.data_root:
        cmd += ["--data-root", args.data_root]
    print("+", L.shell(cmd), flush=True)
    subprocess.run(cmd, check=True)


def write_connection(home: Path, address: str, ca: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{L.CONNECTION}"\n\n' + L.connection_toml(address, ca))


def dataset_signature(folder: Path, clients: int) -> tuple[int, int]:
    """The feature width and class count of the prepared files, as a federation of them
    has it (``load_partition_dir``: one width, the largest declared or seen label space):
    what each SuperNode's ``preflight-<i>`` service checks its file against
    (FEDGRAPH_FEATURES/_CLASSES in .env)."""
    from fedgraph_flwr.data.files import SubgraphFileError, load_partition_dir

    try:
        data = load_partition_dir(folder, clients)
    except SubgraphFileError as exc:
        sys.exit(f"prepare.py: {exc}")
    return int(data[0].num_features), int(data[0].num_classes_total)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=L.NUM_SUPERNODES)
    parser.add_argument("--from-dir", help="copy client_<i>.npz from here instead of partitioning")
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--partition", default="metis")
    parser.add_argument("--data-root", default="", help="folder holding <root>/<Dataset>/raw")
    parser.add_argument("--host", action="append", default=[],
                        help="extra DNS name/IP for the SuperLink certificate (repeatable)")
    parser.add_argument("--out", type=Path, default=DEPLOY / L.GENERATED)
    args = parser.parse_args(argv)
    gen = args.out
    gen.mkdir(parents=True, exist_ok=True)
    make_partitions(gen / "partitions", args.clients, args)

    tls, node_tls, keys = gen / "tls", gen / Path(L.GEN_NODE_TLS).name, gen / "keys"
    for folder in (tls, node_tls, keys, gen / "state", gen / "outputs"):
        folder.mkdir(parents=True, exist_ok=True)
    if not (tls / f"{L.TLS_CERT_NAME}.pem").is_file():
        make_server_cert(tls, L.TLS_CERT_NAME, ["superlink", *args.host], days=365)
    if not (node_tls / f"{L.RUNTIME_CERT_NAME}.pem").is_file():
        make_server_cert(node_tls, L.RUNTIME_CERT_NAME, [], days=365)
    for i in range(args.clients):
        make_key_pair(keys, L.supernode_name(i))

    write_connection(gen / Path(L.GEN_FLWR_HOME).name, f"127.0.0.1:{L.SUPERLINK_PORT}",
                     str((tls / "ca.crt").resolve()))
    write_connection(gen / Path(L.GEN_FLWR_HOME_COMPOSE).name, f"superlink:{L.SUPERLINK_PORT}",
                     str(L.CONTAINER_TLS / "ca.crt"))
    env_file = DEPLOY / ".env" if args.out == DEPLOY / L.GENERATED else gen / ".env"
    # COMPOSE_PROJECT_NAME instead of the file's top-level `name:` (docker-compose 1.29
    # rejects that); FEDGRAPH_PUBLISH: the address port 8000 is published on.
    # Values already in .env (say FEDGRAPH_PUBLISH=0.0.0.0) are kept.
    # FEDGRAPH_CLIENTAPP_THREADS: the owners' ClientApps share this host's cores (the
    # loopback deployment splits them the same way); on its own machine an owner uses all.
    env = {"COMPOSE_PROJECT_NAME": "fedgraph-flwr", "COMPOSE_PROFILES": "cpu",
           "FEDGRAPH_PUBLISH": "127.0.0.1",
           "FEDGRAPH_CLIENTAPP_THREADS": str(max(1, (os.cpu_count() or 1) // args.clients))}
    if env_file.is_file():
        env.update(line.split("=", 1) for line in env_file.read_text().splitlines()
                   if "=" in line and not line.lstrip().startswith("#"))
    env.update(FEDGRAPH_UID=str(os.getuid()), FEDGRAPH_GID=str(os.getgid()))
    features, classes = dataset_signature(gen / "partitions", args.clients)
    env.update(FEDGRAPH_FEATURES=str(features), FEDGRAPH_CLASSES=str(classes))
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    print(f"prepared {args.clients} clients under {gen} (and {env_file})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
