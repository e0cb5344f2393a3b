"""The client's side of a round, free of Flower: find the subgraph, train, report.

:mod:`fedgraph_flwr.engine.client_app` wraps this in Flower records; the
in-process loop (:mod:`fedgraph_flwr.engine.loop`) calls it directly, so both
run exactly the same code.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import secure_aggregation as secure
from ..config import ClientConfig, ClientSettings, ConfigError
from ..core.bases import state_follows
from ..core.phases import TRAIN, Arrays, Phase
from ..core.registry import ALGORITHMS, get_algorithm
from ..privacy import counts as privacy_counts
from ..privacy import scope as privacy_scope
from ..privacy.mechanism import NOISE_KEY_ENV, Mechanism, noise_key_words
from . import state_codec
from .contract import TRAIN_POSITION, data_root_reason, peak_rss_mib, state_position

if TYPE_CHECKING:  # loaded with the client's data, not with this module
    from torch_geometric.data import Data

# Subgraphs stay loaded between rounds in a long-lived client process (Ray actor,
# SuperNode): reading and validating the file once is enough.
_DATA_CACHE: dict[tuple, tuple[Data, int]] = {}


#: A client's serialised state as it arrives: a file's bytearray, a record's memoryview.
StateBlob = bytes | bytearray | memoryview


class ClientDataError(RuntimeError):
    """The client cannot find or use its subgraph (a one-line reason)."""


class DataRootError(ClientDataError):
    """The dataset's raw files are not under the data root this client resolved: a
    setting of the run or of the client's environment, the same on every client."""


class MemoryGuardError(RuntimeError):
    """This machine's memory is fuller than ``memory-limit``: the client refuses the phase
    before Ray's (or the kernel's) out-of-memory killer ends it without a word."""


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def memory_use(cgroup: Path = Path("/sys/fs/cgroup"),
               meminfo: Path = Path("/proc/meminfo")) -> tuple[float, str] | None:
    """(used fraction, what it is of) for this process's memory bound: its cgroup v2
    limit where one is set (a container), else the machine's; None where neither can be
    read (not Linux). Used = total - available, and for a cgroup its usage less the page
    cache it can drop (``inactive_file``), as Ray's memory monitor counts it."""
    limit = _read_int(cgroup / "memory.max")
    current = _read_int(cgroup / "memory.current")
    if limit and current is not None:
        inactive = 0
        try:
            for line in (cgroup / "memory.stat").read_text().splitlines():
                if line.startswith("inactive_file "):
                    inactive = int(line.split()[1])
        except (OSError, ValueError):
            pass
        return max(current - inactive, 0) / limit, f"the container's {limit / 2**30:.1f} GiB"
    try:
        info = dict(line.split(":", 1) for line in meminfo.read_text().splitlines())
        total = int(info["MemTotal"].split()[0])
        available = int(info["MemAvailable"].split()[0])
    except (OSError, KeyError, ValueError):
        return None
    return (total - available) / total, f"this machine's {total / 2**20:.1f} GiB"


def check_memory(config: ClientSettings) -> None:
    """Raise :class:`MemoryGuardError` (one line) when memory is fuller than ``memory-limit``."""
    limit = config.memory_limit
    use = memory_use() if limit > 0 else None
    if use is None or use[0] < limit:
        return
    raise MemoryGuardError(
        f"{100 * use[0]:.0f}% of {use[1]} memory is in use, over memory-limit={limit:g}, "
        f"so this client stopped before an out-of-memory kill: run fewer clients at once "
        f"(a larger client-resources-num-cpus), use client-state=\"file\", give it more memory, "
        f"or set memory-limit=0 to turn this check off")


@dataclass
class ClientIdentity:
    """Who this client is and where its subgraph comes from."""

    partition_id: int
    source: str  # "cache" | "dir" | "file"
    path: str = ""  # the file for "file"/"dir"


def identify(node_config: dict[str, Any], config: ClientSettings) -> ClientIdentity:
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
    if nparts is not None and int(nparts) != config.num_clients:
        raise ClientDataError(
            f"this SuperNode has num-partitions={nparts} but the run has "
            f"num-clients={config.num_clients}"
        )
    if config.partition == "files":
        folder = Path(config.partition_dir).expanduser()
        return ClientIdentity(int(pid), "dir", str(folder))
    return ClientIdentity(int(pid), "cache")


def load_client_data(identity: ClientIdentity, config: ClientSettings) -> tuple[Data, int]:
    """The client's subgraph and the label-space size it knows of."""
    from ..data import partition  # heavy imports only when a client needs data

    key: tuple
    p: Path | None = None
    if identity.source == "cache":
        # everything that names the partition build (split draw, METIS build, features, ...)
        key = ("cache", str(config.data_root_path),
               partition.cache_name(partition.cache_key(config)), identity.partition_id)
    else:
        p = Path(identity.path)
        if identity.source == "dir":
            p = client_file_in_dir(p, identity.partition_id)
        # The file itself, not its folder: a client file rewritten or replaced in place
        # (same name, same mtime from cp -p / rsync -t) is read again.
        st = p.stat() if p.exists() else None
        key = ("file", str(p), identity.partition_id,
               (st.st_mtime_ns, st.st_size, st.st_ino) if st else None)
    if key not in _DATA_CACHE:
        _DATA_CACHE[key] = _read_client_data(identity, config, p)
    data, num_classes = _DATA_CACHE[key]
    if "halo_global_id" in data and not _reads_halo(config.algorithm):
        # the halo (global ids of other clients' nodes) only for the method that reads it
        data = copy.copy(data)
        del data.halo_global_id, data.halo_edge_index
    return data, num_classes


def _reads_halo(algorithm: str) -> bool:
    algo = ALGORITHMS.get(algorithm)
    return algo is not None and algo.trainer.reads_halo


def _read_client_data(identity: ClientIdentity, config: ClientSettings, p: Path | None
                      ) -> tuple[Data, int]:
    from ..data import files, partition
    from ..data.datasets import DatasetNotAvailable

    try:
        if identity.source == "cache":
            resolved = dataclasses.replace(config, data_root=str(config.data_root_path))
            data = partition.load_client(resolved, identity.partition_id)
        else:
            assert p is not None
            data = files.load_subgraph_file(p)
    except DatasetNotAvailable as exc:
        raise DataRootError(data_root_reason(str(exc) or repr(exc), config)) from exc
    except (OSError, ValueError, RuntimeError) as exc:
        raise ClientDataError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from exc
    return data, int(getattr(data, "num_classes_total", 0) or int(data.y.max()) + 1)


def client_file_in_dir(folder: str | Path, partition_id: int) -> Path:
    """``client_<i>.npz`` or ``client_<i>.pt`` in ``folder``."""
    for suffix in (".npz", ".pt"):
        candidate = Path(folder) / f"client_{partition_id}{suffix}"
        if candidate.is_file():
            return candidate
    raise ClientDataError(f"{folder}: no client_{partition_id}.npz or client_{partition_id}.pt")


def check_client_keys(config: ClientSettings, identity: ClientIdentity | None = None) -> None:
    """At the handshake, so that a missing key stops the run before any client trains, in
    one line: under secure-aggregation=ckks this client's secret context loads; under dp, a
    data owner serving its own file (``partition-file``: a deployment) has its noise key,
    without which the noise is seeded by the run's seed, which the server knows."""
    if config.secure_aggregation == "ckks":
        secure.load_secret_context(config)
    if config.secure_aggregation == "ckks-threshold":
        from ..threshold_ckks.backend import openfhe

        openfhe()  # one line if this machine has no OpenFHE
    if config.dp != "off" and identity is not None and identity.source == "file" \
            and not noise_key_words():
        raise ConfigError(
            f"dp={config.dp} on a data owner's own file needs {NOISE_KEY_ENV} (a secret the "
            f"server never sees) in this ClientApp's environment: without it the noise is "
            f"seeded by the run's seed, which the server knows and could subtract "
            f"(docs/privacy.md, 'Whose noise')")


def describe(data: Data, num_classes: int, identity: ClientIdentity, device: torch.device,
             dp: str = "off") -> dict[str, Any]:
    """Scalar facts about the subgraph for the server's handshake (nothing per node; no
    count under ``dp=client``: privacy/counts.py)."""
    return privacy_counts.handshake_facts({
        "partition-id": identity.partition_id,
        "num-nodes": int(data.num_nodes),
        "num-edges": int(data.edge_index.size(1)),
        "num-train": int(data.train_mask.sum()),
        "num-val": int(data.val_mask.sum()),
        "num-test": int(data.test_mask.sum()),
        "num-features": int(data.num_features),
        "num-classes": int(num_classes),
        "device": str(device),
    }, dp)


def in_ray_worker() -> bool:
    """True inside a Ray worker (a simulated ClientApp); ray is never imported here."""
    ray = sys.modules.get("ray")
    try:
        return ray is not None and ray.is_initialized()
    except Exception:  # noqa: BLE001 - a half-imported or odd ray: not a simulation
        return False


def ray_resources() -> dict[str, Any]:
    """What Ray gave this simulated ClientApp: ``ray-cpus`` (its CPUs), ``ray-cpus-total``
    (the simulation's), ``ray-actor`` (its actor's id) and ``ray-node`` (the id of the
    Ray node it runs on: several on a cluster); empty outside Ray.

    Flower runs each ClientApp in an actor reserving ``client-resources-num-cpus``
    (default 2) and keeps ``total // that`` actors: the server reads from these how
    many clients run at once (:func:`.flower_transport.serialised_note`).
    """
    if not in_ray_worker():
        return {}
    ray = sys.modules["ray"]
    out: dict[str, Any] = {}
    try:
        ctx = ray.get_runtime_context()
        out["ray-actor"] = str(ctx.get_actor_id() or "")
        out["ray-node"] = str(ctx.get_node_id() or "")
        cpus = ctx.get_assigned_resources().get("CPU")
        if cpus:
            out["ray-cpus"] = float(cpus)
        total = ray.cluster_resources().get("CPU")
        if total:
            out["ray-cpus-total"] = float(total)
    except Exception:  # noqa: BLE001 - a diagnostic only: never fail the handshake for it
        pass
    return out


class DeviceError(ConfigError):
    """``device`` names a GPU this client's machine does not have."""


def pick_device(setting: str = "auto") -> torch.device:
    """The device a client trains on, from its ``device`` setting and this machine: ``auto``
    is CUDA when torch sees a GPU (its first visible one), else CPU. A GPU that is not here
    is a one-line :class:`DeviceError`, never a silent fall back to the CPU."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type != "cuda":
        return device
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "CUDA_VISIBLE_DEVICES unset"
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise DeviceError(f"device={setting} but torch {torch.__version__} ({build}) sees no GPU "
                          f"on this machine ({seen}); set device=auto or device=cpu")
    count = torch.cuda.device_count()
    if (device.index or 0) >= count:
        raise DeviceError(f"device={setting} but this machine shows {count} GPU(s) (cuda:0.."
                          f"cuda:{count - 1}, {seen})")
    return device


def state_to_bytes(state: dict[str, Any]) -> bytes:
    """A trainer's local state as bytes (the engine's codec, no pickle)."""
    return state_codec.encode(state)


def state_from_bytes(blob: bytes | bytearray | memoryview, device: torch.device) -> dict[str, Any]:
    """A bytearray (a state file's bytes) is handed over to the tensors, not copied."""
    return state_codec.decode(blob, device, take=isinstance(blob, bytearray))


# --- client state kept in files (client-state=file) ---------------------------------------
# One file per client and phase it ran, in the client's own folder ``client_<id>/`` of
# the state dir, named ``client_<id>.<token>.r<round>.pt`` after
# the train phase and ``client_<id>.<token>.r<round>p<index>.pt`` after the round's other
# phases (``index`` = the phase's place in the algorithm's round; round 0 = the phases
# before round 1), where ``token`` identifies the run (set by the server, kept across
# resume). A client loads the newest state from *before* the current (round, phase) and
# keeps only that one plus the one it just wrote. So if the server dies after
# checkpointing round r while clients have already saved round r+1, the resumed round
# r+1 starts again from round r's state, and files of other runs in the same folder are
# never read. The token is ``ClientConfig.client_state_token``; per client, the server
# also says where it knows this client's last state to be (``client_state_expected``,
# "<round>:<place>", see :func:`.contract.state_position_tag`): a client whose newest state is
# older (another machine without the shared folder, a folder wiped mid-run) refuses it.
_POSITION = re.compile(r"r(\d+)(?:p(\d+))?")


class StaleClientStateError(RuntimeError):
    """A client's newest state file is older than the server knows it saved."""


def state_dir(config: ClientSettings, partition_id: int | None = None) -> Path:
    """``client-state-dir``, else ``<data-root>/client-state/<run-name>``; with
    ``partition_id``, that client's own folder in it, ``client_<id>/``.

    Each client has its own folder, so SuperNodes sharing a host (and a data root, or
    one ``client-state-dir``) never share one: none lists, reads or prunes another's
    files, and each folder is created private to its owner (mode 0700).
    """
    folder = Path(config.client_state_dir or (
        config.data_root_path / "client-state" / config.run_name)).expanduser()
    return folder if partition_id is None else folder / f"client_{int(partition_id)}"


def _state_files(config: ClientConfig, partition_id: int, any_token: bool = False
                 ) -> dict[Path, tuple[str, tuple[int, int]]]:
    """This client's state files: path -> (token, position)."""
    token = config.client_state_token or "run"
    out: dict[Path, tuple[str, tuple[int, int]]] = {}
    for path in state_dir(config, partition_id).glob(f"client_{partition_id}.*.r*.pt"):
        parts = path.name[:-len(".pt")].split(".")
        match = _POSITION.fullmatch(parts[2]) if len(parts) == 3 else None
        if match is None:
            continue
        place = TRAIN_POSITION if match[2] is None else int(match[2])
        if any_token or parts[1] == token:
            out[path] = (parts[1], (int(match[1]), place))
    return out


def state_file(config: ClientConfig, partition_id: int, server_round: int,
               phase: Phase | None = None) -> Path:
    """The file this client's state after ``phase`` of ``server_round`` is saved to."""
    token = config.client_state_token or "run"
    rnd, place = state_position(config, server_round, phase)
    suffix = "" if place == TRAIN_POSITION else f"p{place}"
    return state_dir(config, partition_id) / f"client_{partition_id}.{token}.r{rnd:06d}{suffix}.pt"


def load_state_file(config: ClientConfig, partition_id: int, server_round: int,
                    phase: Phase | None = None) -> bytearray | None:
    """The client's state from the last phase it ran before this one (``phase``: the
    train phase when None), as a bytearray the trainer's tensors may keep."""
    here = state_position(config, server_round, phase)
    older = [(pos, p) for p, (_, pos) in _state_files(config, partition_id).items() if pos < here]
    expected = config.client_state_expected
    if expected:
        want = tuple(int(v) for v in expected.split(":"))
        found = max(older)[0] if older else None
        if found is None or found < want:
            have = "none" if found is None else f"round {found[0]}'s"
            raise StaleClientStateError(
                f"client {partition_id}: its state from round {want[0]} is not in "
                f"{state_dir(config, partition_id)} on this machine (newest: {have}); "
                f"client-state=file needs a client-state-dir every node shares, or use "
                f"client-state=context")
    if not older:
        return None
    with open(max(older)[1], "rb") as f:
        blob = bytearray(os.fstat(f.fileno()).st_size)
        if f.readinto(blob) != len(blob):
            raise OSError(f"{f.name}: short read")
        return blob


def save_state_file(config: ClientConfig, partition_id: int, server_round: int, blob: bytes,
                    phase: Phase | None = None) -> Path:
    """Write this phase's state atomically; keep only it and the newest older one."""
    path = state_file(config, partition_id, server_round, phase)
    here = state_position(config, server_round, phase)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    mine = _state_files(config, partition_id)
    older = [(pos, p) for p, (_, pos) in mine.items() if pos < here]
    keep = {path} | ({max(older)[1]} if older else set())
    for other in _state_files(config, partition_id, any_token=True):
        if other not in keep:
            other.unlink(missing_ok=True)
    return path


@dataclass
class RoundOutput:
    """What one client produced in one round."""

    upload: Arrays
    signature: Arrays
    metrics: dict[str, float]
    state: bytes
    timings: dict[str, float] = field(default_factory=dict)


def restore_trainer(data: Data, num_classes: int, config: ClientConfig, state: StateBlob | None,
                    device: torch.device, partition_id: int | None = None):
    """The client's trainer as it was after its last round (``state``), or fresh. Its
    config carries ``partition_id`` when given (a per-client initial draw needs it)."""
    if partition_id is not None:
        config = config.with_round(partition_id=partition_id)
    if device.type == "cpu":
        # Multi-threaded CPU scatter-add sums in varying order (FedIIH's routing): the
        # deterministic kernels make the same config and seed give the same numbers.
        torch.use_deterministic_algorithms(True, warn_only=True)
    build = get_algorithm(config.algorithm).trainer
    if state is None:
        return build(data, config, num_classes, device)
    with state_follows():
        trainer = build(data, config, num_classes, device)
    trainer.load_local_state(state_from_bytes(state, device))
    return trainer


def phase_round(
    data: Data,
    num_classes: int,
    config: ClientConfig,
    phase: Phase,
    arrays: Arrays,
    state: StateBlob | None,
    server_round: int,
    partition_id: int,
    device: torch.device | None = None,
) -> RoundOutput:
    """One phase on one client, as a ClientApp runs it: restore the trainer from
    ``state``, handle the phase, serialise the state again."""
    t0 = time.perf_counter()
    trainer = restore_trainer(data, num_classes, config, state, device or pick_device(),
                              partition_id)
    restore = time.perf_counter() - t0
    out = run_phase(trainer, config, phase, arrays, server_round, partition_id)
    t1 = time.perf_counter()
    out.state = state_to_bytes(trainer.local_state())
    # The upload and signature may share memory with the model (``Tensor.numpy``), which
    # ``release`` hands to the next trainer restored in this process: the reply copies.
    out.upload = {k: v.copy() for k, v in out.upload.items()}
    out.signature = {k: v.copy() for k, v in out.signature.items()}
    trainer.release()
    out.timings["time-setup"] = out.timings.get("time-setup", 0.0) + restore
    out.timings["time-pack"] = out.timings.get("time-pack", 0.0) + time.perf_counter() - t1
    return out


class StateStore(ABC):
    """Where a client keeps its trainer between phases, and how a phase runs on it."""

    #: Whether the state travels as bytes (a reply then says how many: ``state-bytes``).
    keeps_bytes = True

    @abstractmethod
    def run(self, data: Data, num_classes: int, config: ClientConfig, phase: Phase,
            arrays: Arrays, partition_id: int, device: torch.device) -> RoundOutput:
        """Restore this client's trainer, run ``phase`` on it, keep its state again."""


class SerialisedStateStore(StateStore):
    """The state as bytes between phases (a ClientApp's context, a file): the trainer is
    rebuilt from them every phase (:func:`phase_round`)."""

    @abstractmethod
    def load(self, config: ClientConfig, partition_id: int, phase: Phase) -> StateBlob | None:
        """The client's state from before ``phase``, or None before its first."""

    @abstractmethod
    def save(self, config: ClientConfig, partition_id: int, blob: bytes, phase: Phase) -> None:
        """Keep ``blob``, the client's state after ``phase``."""

    def run(self, data: Data, num_classes: int, config: ClientConfig, phase: Phase,
            arrays: Arrays, partition_id: int, device: torch.device) -> RoundOutput:
        """Rebuild the trainer from its saved state, run ``phase``, save the state again."""
        state = self.load(config, partition_id, phase)
        out = phase_round(data, num_classes, config, phase, arrays, state, config.server_round,
                          partition_id, device)
        self.save(config, partition_id, out.state, phase)
        return out


class FileStateStore(SerialisedStateStore):
    """``client-state=file``: a per-client file on this machine (:func:`save_state_file`)."""

    def load(self, config: ClientConfig, partition_id: int, phase: Phase) -> StateBlob | None:
        """The newest state file from before ``phase`` (refusing one older than the server knows of)."""
        return load_state_file(config, partition_id, config.server_round, phase)

    def save(self, config: ClientConfig, partition_id: int, blob: bytes, phase: Phase) -> None:
        """Write the state file atomically, keeping the previous one."""
        save_state_file(config, partition_id, config.server_round, blob, phase)


class LiveTrainers(StateStore):
    """The in-process transport's ``client-state=context``: each client's trainer stays
    alive between phases (what a ClientApp restores from its context: the same numbers,
    tests/test_engine.py)."""

    keeps_bytes = False

    def __init__(self) -> None:
        self.trainers: dict[int, Any] = {}

    def run(self, data: Data, num_classes: int, config: ClientConfig, phase: Phase,
            arrays: Arrays, partition_id: int, device: torch.device) -> RoundOutput:
        """Run ``phase`` on the client's live trainer (built on its first phase)."""
        if partition_id not in self.trainers:
            self.trainers[partition_id] = restore_trainer(data, num_classes, config, None, device,
                                                          partition_id)
        return run_phase(self.trainers[partition_id], config, phase, arrays, config.server_round,
                         partition_id)


def handle_phase(config: ClientConfig, phase: Phase, arrays: Arrays, data: Data,
                 num_classes: int, partition_id: int, store: StateStore,
                 device: torch.device) -> tuple[RoundOutput, dict[str, float]]:
    """One phase on one client, whoever delivered the request: the ClientApp's handler
    (Flower) and the in-process transport both call this. Checks the memory guard before
    and after (what the phase left: the next one would start from it); returns the
    phase's output and the reply's metrics."""
    check_memory(config)
    # --- secure-aggregation=ckks-threshold (fedgraph_flwr/threshold_ckks/client.py) ---
    if config.secure_aggregation == "ckks-threshold":
        from ..threshold_ckks import client as threshold

        schema = upload_schema(config, data, num_classes)
        t0 = time.perf_counter()
        if threshold.handles(phase):
            upload = threshold.run_phase(config, phase, arrays, partition_id, schema)
            return RoundOutput(upload, {}, {}, b""), {
                "time-ckks-threshold": time.perf_counter() - t0, "partition-id": partition_id}
        if phase.name == TRAIN:
            arrays = threshold.open_payload(config, arrays, partition_id, schema)
            out = store.run(data, num_classes, config, phase, arrays, partition_id, device)
            opened = time.perf_counter()
            out.upload = threshold.seal_upload(config, out.upload, partition_id)
            out.timings.update({"time-decrypt": opened - t0 - out.timings.get("time-train", 0.0),
                                "time-encrypt": time.perf_counter() - opened})
            check_memory(config)
            return out, {**out.metrics, **out.timings, "partition-id": partition_id,
                         "mem-peak-rss-mib": peak_rss_mib()}
    # --- end ckks-threshold ---
    secret = None
    if config.secure_aggregation == "ckks" and phase.name == TRAIN:
        t0 = time.perf_counter()
        secret = secure.load_secret_context(config)
        arrays = secure.decrypt_arrays(arrays, secret, upload_schema(config, data, num_classes))
        decrypt = time.perf_counter() - t0
    out = store.run(data, num_classes, config, phase, arrays, partition_id, device)
    keyed = None
    if config.dp != "off":  # noise first: what gets encrypted is already private
        keyed = privatize_reply(out, config, phase, arrays, partition_id)
    if secret is not None:  # ckks: only ciphertexts of the trained weights leave the client
        t0 = time.perf_counter()
        out.upload = secure.encrypt_arrays(out.upload, secret)
        out.timings.update({"time-decrypt": decrypt, "time-encrypt": time.perf_counter() - t0})
    check_memory(config)
    metrics = {**out.metrics, **out.timings, "partition-id": partition_id}
    if keyed is not None:
        metrics["dp-noise-keyed"] = float(keyed)
    if store.keeps_bytes:
        metrics["state-bytes"] = len(out.state)
    metrics["mem-peak-rss-mib"] = peak_rss_mib()
    return out, privacy_counts.reply_metrics(metrics, config.dp)  # dp=client: no count


def privatize_reply(out: RoundOutput, config: ClientConfig, phase: Phase, request: Arrays,
                    partition_id: int) -> bool:
    """``dp``: clip and noise what the scope covers in ``out`` before it leaves (in place);
    returns whether the noise is keyed by the owner's secret (privacy/mechanism.py)."""
    trainer = get_algorithm(config.algorithm).trainer
    key = noise_key_words()
    if not privacy_scope.releases(trainer, config.dp, phase):
        return bool(key)
    place = [p.name for p in trainer.phases].index(phase.name)
    mechanism = Mechanism(config.dp_clip, config.dp_noise_multiplier)
    out.upload, out.signature = mechanism.privatize(
        out.upload, out.signature, request,
        cover_upload=privacy_scope.covers_upload(config.dp, phase),
        seed_words=(config.seed, partition_id, config.server_round, place, *key))
    return bool(key)


_SCHEMA_CACHE: dict[tuple, Arrays] = {}


def upload_schema(config: ClientConfig, data: Data, num_classes: int) -> Arrays:
    """The arrays a train upload holds (the algorithm's initial model: names, shapes,
    dtypes), to shape a decrypted payload; built once per config, off the run's RNG."""
    key = (config.without_round_facts(), int(data.num_features), int(num_classes))
    if key not in _SCHEMA_CACHE:
        with torch.random.fork_rng(devices=[]):
            _SCHEMA_CACHE[key] = get_algorithm(config.algorithm).trainer.initial_arrays(
                int(data.num_features), int(num_classes), config)
    return _SCHEMA_CACHE[key]


def run_phase(trainer, config: ClientConfig, phase: Phase, arrays: Arrays, server_round: int,
              partition_id: int) -> RoundOutput:
    """Handle one phase on a restored trainer (``state`` left empty: the caller
    serialises it when it must keep it)."""
    if phase.name == TRAIN:
        return run_round(trainer, config, arrays, server_round, partition_id)
    t0 = time.perf_counter()
    trainer.config = config
    # Its own stream per phase, so adding a phase never shifts the train phase's draws.
    torch.manual_seed(config.seed * 1_000_003 + partition_id * 10_007 + server_round
                      + 7_919 * (1 + [p.name for p in trainer.phases].index(phase.name)))
    reply = trainer.run_phase(phase, arrays)
    t1 = time.perf_counter()
    return RoundOutput(
        upload={k: np.ascontiguousarray(v) for k, v in reply.arrays.items()},
        signature={k: np.ascontiguousarray(v, dtype=np.float32) for k, v in reply.signature.items()},
        metrics={k: float(v) for k, v in reply.metrics.items()},
        state=b"",
        timings={"time-phase": t1 - t0},
    )


def run_round(trainer, config: ClientConfig, payload: Arrays, server_round: int,
              partition_id: int) -> RoundOutput:
    """Apply the server's payload to a restored trainer, train, evaluate, pack the reply
    (``state`` left empty: the caller serialises it when it must keep it)."""
    t0 = time.perf_counter()
    data = trainer.data
    trainer.config = config  # this round's server-round etc.; a live trainer keeps its own
    trainer.load_payload(payload)
    # A per-(seed, client, round) stream: dropout masks differ across clients and rounds
    # but the whole run is reproducible.
    torch.manual_seed(config.seed * 1_000_003 + partition_id * 10_007 + server_round)
    t1 = time.perf_counter()
    metrics = trainer.train(config.local_epochs)
    t2 = time.perf_counter()
    metrics.update(trainer.evaluate())
    t3 = time.perf_counter()
    upload = trainer.upload()
    signature = trainer.signature()
    t4 = time.perf_counter()
    metrics["num-train"] = int(data.train_mask.sum())
    return RoundOutput(
        upload={k: np.ascontiguousarray(v) for k, v in upload.items()},
        signature={k: np.ascontiguousarray(v, dtype=np.float32) for k, v in signature.items()},
        metrics={k: float(v) for k, v in metrics.items()},
        state=b"",
        timings={"time-setup": t1 - t0, "time-train": t2 - t1, "time-eval": t3 - t2,
                 "time-pack": t4 - t3},
    )
