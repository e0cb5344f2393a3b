"""The client's side of a round, free of Flower: find the subgraph, train, report.

:mod:`fedgraph_flwr.engine.client_app` wraps this in Flower records; the
in-process loop (:mod:`fedgraph_flwr.engine.loop`) calls it directly, so both
run exactly the same code.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from ..algorithms import get_algorithm
from ..algorithms.base import Arrays, Config
from ..config import data_root

# Subgraphs stay loaded between rounds in a long-lived client process (Ray actor,
# SuperNode): reading and validating the file once is enough.
_DATA_CACHE: dict[tuple, tuple[Data, int]] = {}


class ClientDataError(RuntimeError):
    """The client cannot find or use its subgraph (a one-line reason)."""


@dataclass
class ClientIdentity:
    """Who this client is and where its subgraph comes from."""

    partition_id: int
    source: str  # "cache" | "dir" | "file"
    path: str = ""  # the file for "file"/"dir"


def identify(node_config: dict[str, Any], config: Config) -> ClientIdentity:
    """Resolve the client's logical id and data source from its node config.

    Simulation: ``partition-id``/``num-partitions`` (set by Flower). Deployment:
    ``partition-file=...`` (with ``partition-id`` or a ``client_<i>`` file name),
    or ``partition-id``/``num-partitions`` with ``data-root`` for a demo.
    """
    pfile = str(node_config.get("partition-file", "") or "")
    pid = node_config.get("partition-id")
    if pfile:
        if pid is None:
            stem = Path(pfile).name.split(".")[0]
            if stem.startswith("client_") and stem[len("client_"):].isdigit():
                pid = int(stem[len("client_"):])
            else:
                raise ClientDataError(
                    f"node config has partition-file={pfile} but no partition-id, and the "
                    "file name is not client_<i>: add partition-id=<i> to --node-config"
                )
        return ClientIdentity(int(pid), "file", pfile)
    if pid is None:
        raise ClientDataError(
            "node config has neither partition-file nor partition-id: start the SuperNode "
            "with --node-config \"partition-file=<path>\" (or partition-id/num-partitions)"
        )
    nparts = node_config.get("num-partitions")
    if nparts is not None and int(nparts) != int(config["num-clients"]):
        raise ClientDataError(
            f"this SuperNode has num-partitions={nparts} but the run has "
            f"num-clients={config['num-clients']}"
        )
    if config["partition"] == "files":
        folder = Path(str(config["partition-dir"])).expanduser()
        return ClientIdentity(int(pid), "dir", str(folder))
    return ClientIdentity(int(pid), "cache")


def load_client_data(identity: ClientIdentity, config: Config) -> tuple[Data, int]:
    """The client's subgraph and the label-space size it knows of."""
    from ..data import files, partition  # heavy imports only when a client needs data

    key: tuple
    if identity.source == "cache":
        key = ("cache", str(data_root(config)), config["dataset"], config["partition"],
               int(config["num-clients"]), int(config["split-seed"]),
               int(config["partition-seed"]), identity.partition_id)
    else:
        p = Path(identity.path)
        key = (identity.source, str(p), identity.partition_id,
               p.stat().st_mtime_ns if p.exists() else None)
    if key in _DATA_CACHE:
        return _DATA_CACHE[key]
    try:
        if identity.source == "cache":
            cfg = dict(config)
            cfg["data-root"] = str(data_root(config))
            data = partition.load_client(cfg, identity.partition_id)
        elif identity.source == "dir":
            data = files.load_subgraph_file(client_file_in_dir(identity.path, identity.partition_id))
        else:
            data = files.load_subgraph_file(identity.path)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ClientDataError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from exc
    num_classes = int(getattr(data, "num_classes_total", 0) or int(data.y.max()) + 1)
    _DATA_CACHE[key] = (data, num_classes)
    return data, num_classes


def client_file_in_dir(folder: str | Path, partition_id: int) -> Path:
    """``client_<i>.npz`` or ``client_<i>.pt`` in ``folder``."""
    for suffix in (".npz", ".pt"):
        candidate = Path(folder) / f"client_{partition_id}{suffix}"
        if candidate.is_file():
            return candidate
    raise ClientDataError(f"{folder}: no client_{partition_id}.npz or client_{partition_id}.pt")


def describe(data: Data, num_classes: int, identity: ClientIdentity, device: torch.device) -> dict[str, Any]:
    """Scalar facts about the subgraph for the server's handshake (nothing per node)."""
    return {
        "partition-id": identity.partition_id,
        "num-nodes": int(data.num_nodes),
        "num-edges": int(data.edge_index.size(1)),
        "num-train": int(data.train_mask.sum()),
        "num-val": int(data.val_mask.sum()),
        "num-test": int(data.test_mask.sum()),
        "num-features": int(data.num_features),
        "num-classes": int(num_classes),
        "device": str(device),
    }


def pick_device() -> torch.device:
    """CUDA when the machine has a GPU, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def state_to_bytes(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def state_from_bytes(blob: bytes, device: torch.device) -> dict[str, Any]:
    return torch.load(io.BytesIO(blob), map_location=device, weights_only=True)


@dataclass
class RoundOutput:
    """What one client produced in one round."""

    upload: Arrays
    signature: Arrays
    metrics: dict[str, float]
    state: bytes
    timings: dict[str, float] = field(default_factory=dict)


def train_round(
    data: Data,
    num_classes: int,
    config: Config,
    payload: Arrays,
    state: bytes | None,
    server_round: int,
    partition_id: int,
    device: torch.device | None = None,
) -> RoundOutput:
    """One round on one client: restore, apply the server's payload, train, evaluate."""
    t0 = time.perf_counter()
    device = device or pick_device()
    algo = get_algorithm(str(config["algorithm"]))
    trainer = algo.trainer(data, config, num_classes, device)
    if state is not None:
        trainer.load_local_state(state_from_bytes(state, device))
    trainer.load_payload(payload)
    # A per-(seed, client, round) stream: dropout masks differ across clients and rounds
    # but the whole run is reproducible.
    torch.manual_seed(int(config["seed"]) * 1_000_003 + partition_id * 10_007 + server_round)
    t1 = time.perf_counter()
    metrics = trainer.train(int(config["local-epochs"]))
    t2 = time.perf_counter()
    metrics.update(trainer.evaluate())
    t3 = time.perf_counter()
    upload = trainer.upload()
    signature = trainer.signature()
    new_state = state_to_bytes(trainer.local_state())
    t4 = time.perf_counter()
    metrics["num-train"] = int(data.train_mask.sum())
    return RoundOutput(
        upload={k: np.ascontiguousarray(v) for k, v in upload.items()},
        signature={k: np.ascontiguousarray(v, dtype=np.float32) for k, v in signature.items()},
        metrics={k: float(v) for k, v in metrics.items()},
        state=new_state,
        timings={"time-setup": t1 - t0, "time-train": t2 - t1, "time-eval": t3 - t2,
                 "time-pack": t4 - t3},
    )
