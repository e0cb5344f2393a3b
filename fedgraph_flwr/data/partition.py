"""Graph partitioning into client subgraphs, and the on-disk partition cache.

Modes (``partition_graph``):

- ``metis``: K disjoint METIS parts (k-way, METIS default options as in the FED-PUB
  reference, whose ``metispy.part_graph`` also defaults to k-way; METIS' default seed
  is fixed, so the result is deterministic). Client i = part i. ``metis-library``
  picks the METIS build: ``pymetis`` (the default; METIS 5.1 built with 64-bit
  ``idx_t``) or ``system`` (the system's METIS shared library, :mod:`.libmetis`); a
  32-bit build there, as Debian's ``libmetis5``, reproduces the reference code's
  partitions node for node.
- ``metis-overlapping`` (FedIIH): K/5 METIS parts; 5 clients per part, each a uniform
  random half (⌊n/2⌋ nodes) of the part, drawn with ``numpy.random.default_rng(seed)``;
  client id = part·5 + j.
- ``louvain`` (FedSpray): networkx ``louvain_communities(resolution=1, seed=seed)``;
  the K largest communities (ties: smallest node id first) become clients 0..K-1,
  largest first; all other nodes are dropped.
- ``blocks``: the synthetic graphs' planted blocks (``data.block``), one per client.

Each client is the **induced** subgraph (``torch_geometric.utils.subgraph``, relabelled
in increasing global id) with x, edge_index, y, train/val/test masks and ``global_id``
(int64 [n], kept on the client), and its 1-hop halo (``halo_global_id``,
``halo_edge_index``: the links it holds to other nodes, which only FedGCN reads).
``split="global"`` inherits the global split masks; ``split="per-client"`` draws
FedSpray's 40/30/30 split per client (louvain's default).

The cache (``ensure_partitions``) writes ``<data-root>/partitions/<name>/`` with
``client_<i>.pt`` (a plain dict of tensors) and ``manifest.json``; several processes may
call it at once (file lock + build in a temp folder + atomic rename).

``manifest.json`` holds per-client counts (``clients[i].class_hist`` is client i's label
histogram) and ``diagnostics`` (:mod:`.noniid`): the edge cut and FedAux's non-IIDness
ξ = JSD + MMD. Manifests written before ``diagnostics`` existed stay valid;
:func:`ensure_diagnostics` computes the missing block on demand and adds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from ..atomic import file_lock
from ..config import METIS_LIBRARIES
from . import files, noniid
from .datasets import (
    _not_available,
    canonical_name,
    default_data_root,
    fetch_dataset,
    get_spec,
    load_dataset,
    missing_raw_files,
    num_classes_of,
    user_cache_dir,
)
from .splits import per_client_split, random_split, split_ratios

if TYPE_CHECKING:
    from ..config import ClientSettings

MODES = ("metis", "metis-overlapping", "louvain", "blocks")
SPLITS = ("global", "per-client")
CLIENTS_PER_PART = 5  # FedIIH overlapping setting
# 2: client files also hold their 1-hop halo (halo_global_id, halo_edge_index; FedGCN).
FORMAT_VERSION = 2
SYNTHETIC_GRAPH_SEED = 0  # synthetic datasets are one fixed graph; seeds vary split/partition


# --------------------------------------------------------------------------------------
# partitioners: node sets per client
# --------------------------------------------------------------------------------------
def csr_adjacency(edge_index: torch.Tensor, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric CSR (xadj [n+1], adjncy [2m]) without self loops or duplicate edges."""
    ei = edge_index.numpy() if isinstance(edge_index, torch.Tensor) else np.asarray(edge_index)
    row, col = ei[0].astype(np.int64), ei[1].astype(np.int64)
    keep = row != col
    row, col = np.concatenate([row[keep], col[keep]]), np.concatenate([col[keep], row[keep]])
    # Sort by (row, col) and drop duplicates: one int64 key per directed edge. (sort + diff:
    # np.unique is ~100x slower here on numpy 2.x.)
    key = np.sort(row * num_nodes + col)
    key = key[np.concatenate([[True], key[1:] != key[:-1]])] if key.size else key
    row, col = key // num_nodes, key % num_nodes
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=num_nodes), out=xadj[1:])
    return xadj, col


def metis_membership(edge_index: torch.Tensor, num_nodes: int, num_parts: int,
                     metis_seed: int | None = None, library: str = "pymetis") -> np.ndarray:
    """METIS k-way part id per node, int64 [num_nodes].

    ``metis_seed=None`` keeps METIS' default options (deterministic; matches the
    reference code). An int sets METIS' own random seed option. ``library``:
    ``pymetis`` (its bundled METIS, 64-bit ``idx_t``) or ``system`` (a METIS shared
    library via :mod:`.libmetis`; a 32-bit one gives the reference code's partitions).
    """
    if library not in METIS_LIBRARIES:
        raise ValueError(f"unknown metis-library {library!r}; valid: {', '.join(METIS_LIBRARIES)}")
    if num_parts == 1:
        return np.zeros(num_nodes, dtype=np.int64)
    xadj, adjncy = csr_adjacency(edge_index, num_nodes)
    if library == "system":
        from .libmetis import part_graph_kway

        return part_graph_kway(xadj, adjncy, num_parts, seed=metis_seed)
    import pymetis

    options = pymetis.Options()
    if metis_seed is not None:
        options.seed = int(metis_seed)
    if hasattr(pymetis, "CSRAdjacency"):
        adjacency = pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy)
        _, parts = pymetis.part_graph(num_parts, adjacency, recursive=False, options=options)
    else:  # older pymetis
        _, parts = pymetis.part_graph(num_parts, xadj=xadj, adjncy=adjncy, recursive=False,
                                      options=options)
    return np.asarray(parts, dtype=np.int64)


def _groups(membership: np.ndarray, num_groups: int) -> list[np.ndarray]:
    """Sorted node ids of each group 0..num_groups-1 (one argsort, no per-node loop)."""
    order = np.argsort(membership, kind="stable")
    counts = np.bincount(membership, minlength=num_groups)
    return np.split(order, np.cumsum(counts)[:-1])


def louvain_communities(edge_index: torch.Tensor, num_nodes: int, seed: int,
                        resolution: float = 1.0) -> list[np.ndarray]:
    """networkx Louvain communities, largest first (ties: smallest node id), each sorted."""
    import networkx as nx
    import scipy.sparse as sp

    xadj, adjncy = csr_adjacency(edge_index, num_nodes)
    adj = sp.csr_matrix((np.ones(adjncy.size, dtype=np.float64), adjncy, xadj),
                        shape=(num_nodes, num_nodes))
    graph = nx.from_scipy_sparse_array(adj)
    comms = nx.community.louvain_communities(graph, resolution=resolution, seed=seed)
    arrays = [np.sort(np.fromiter(c, dtype=np.int64, count=len(c))) for c in comms]
    arrays.sort(key=lambda a: (-a.size, int(a[0])))
    return arrays


def client_node_sets(data: Data, num_clients: int, mode: str, seed: int,
                     metis_seed: int | None = None, resolution: float = 1.0,
                     metis_library: str = "pymetis") -> list[np.ndarray]:
    """Global node ids (sorted) of each client under ``mode``."""
    n = int(data.num_nodes)
    if num_clients < 1:
        raise ValueError(f"num-clients must be >= 1, got {num_clients}")
    if num_clients > n:
        raise ValueError(f"num-clients={num_clients} exceeds the graph's {n} nodes")
    if mode == "metis":
        parts = metis_membership(data.edge_index, n, num_clients, metis_seed, metis_library)
        sets = _groups(parts, num_clients)
    elif mode == "metis-overlapping":
        if num_clients % CLIENTS_PER_PART:
            raise ValueError(f"metis-overlapping needs num-clients divisible by {CLIENTS_PER_PART}, "
                             f"got {num_clients}")
        num_parts = num_clients // CLIENTS_PER_PART
        parts = _groups(metis_membership(data.edge_index, n, num_parts, metis_seed, metis_library),
                        num_parts)
        rng = np.random.default_rng(seed)
        sets = [np.sort(rng.choice(part, size=part.size // 2, replace=False))
                for part in parts for _ in range(CLIENTS_PER_PART)]
    elif mode == "louvain":
        comms = louvain_communities(data.edge_index, n, seed, resolution)
        if len(comms) < num_clients:
            raise ValueError(f"louvain found only {len(comms)} communities, fewer than "
                             f"num-clients={num_clients}")
        sets = comms[:num_clients]
    elif mode == "blocks":
        if "block" not in data:
            raise ValueError("partition 'blocks' needs a graph with planted blocks (SBM, CSBM)")
        num_blocks = int(data.block.max()) + 1
        if num_blocks != num_clients:
            raise ValueError(f"this graph has {num_blocks} planted blocks; set num-clients={num_blocks}")
        sets = _groups(data.block.numpy(), num_blocks)
    else:
        raise ValueError(f"unknown partition mode {mode!r}; valid: {', '.join(MODES)}")
    empty = [i for i, s in enumerate(sets) if s.size == 0]
    if empty:
        raise ValueError(f"partition {mode} left client(s) {empty[:10]} without nodes")
    return sets


# --------------------------------------------------------------------------------------
# client subgraphs
# --------------------------------------------------------------------------------------
def halo(edge_index: torch.Tensor, nodes: torch.Tensor, num_nodes: int
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The 1-hop halo of the client holding ``nodes`` (sorted global ids): the sorted global
    ids [h] of the other nodes one edge away, and the edges [2, k] among the n + h nodes
    that are not between two of the client's own (local ids: own 0..n-1, then the halo in
    order), as FedGraph's ``get_in_comm_indexes`` gives its trainers (halo–halo edges too)."""
    own = torch.zeros(num_nodes, dtype=torch.bool)
    own[nodes] = True
    src, dst = edge_index
    touching = own[src] | own[dst]
    halo_ids = torch.unique(torch.cat((src[touching & ~own[src]], dst[touching & ~own[dst]])))
    local = torch.full((num_nodes,), -1, dtype=torch.long)
    local[nodes] = torch.arange(nodes.numel())
    local[halo_ids] = torch.arange(nodes.numel(), nodes.numel() + halo_ids.numel())
    inside = (local[src] >= 0) & (local[dst] >= 0) & ~(own[src] & own[dst])
    return halo_ids, local[edge_index[:, inside]]


def induced_client(data: Data, nodes: np.ndarray) -> Data:
    """The subgraph induced on ``nodes`` (sorted global ids), relabelled 0..n-1, with its
    halo (:func:`halo`)."""
    idx = torch.from_numpy(np.ascontiguousarray(nodes)).long()
    edge_index, _ = subgraph(idx, data.edge_index, relabel_nodes=True, num_nodes=data.num_nodes)
    halo_ids, halo_edges = halo(data.edge_index, idx, data.num_nodes)
    client = Data(x=data.x[idx], edge_index=edge_index, y=data.y[idx], global_id=idx,
                  halo_global_id=halo_ids, halo_edge_index=halo_edges)
    for key in files.MASK_KEYS:
        if key in data:
            client[key] = data[key][idx]
    return client


def default_split(mode: str) -> str:
    """FedSpray's louvain setting splits per client; the FED-PUB settings split globally."""
    return "per-client" if mode == "louvain" else "global"


def partition_graph(
    data: Data,
    num_clients: int,
    mode: str,
    seed: int,
    split: str | None = None,
    split_seed: int = 1234,
    metis_seed: int | None = None,
    resolution: float = 1.0,
    metis_library: str = "pymetis",
) -> list[Data]:
    """Split ``data`` into ``num_clients`` induced client subgraphs.

    ``data``: x [N, F], edge_index [2, E] (both directions), y [N]; with
    ``split="global"`` also train/val/test_mask [N] (see :func:`.splits.random_split`).
    ``seed``: the partition seed (overlapping halves, Louvain). ``split``: "global" |
    "per-client" | None (mode default). Raises ValueError (one line) on impossible
    requests or when a client ends up without a training node. ``metis_library``: see
    :func:`metis_membership`.
    """
    split = split or default_split(mode)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if split == "global" and not all(k in data for k in files.MASK_KEYS):
        raise ValueError("split='global' needs train_mask/val_mask/test_mask on the graph")
    sets = client_node_sets(data, num_clients, mode, seed, metis_seed, resolution, metis_library)
    clients = []
    for i, nodes in enumerate(sets):
        client = induced_client(data, nodes)
        if split == "per-client":
            client.train_mask, client.val_mask, client.test_mask = per_client_split(
                int(nodes.size), seed=split_seed + i)
        clients.append(client)
    no_train = [i for i, c in enumerate(clients) if not bool(c.train_mask.any())]
    if no_train:
        raise ValueError(f"client(s) {no_train[:10]} have no training node "
                         f"({mode}, {num_clients} clients); use fewer clients or another seed")
    return clients


# --------------------------------------------------------------------------------------
# the partition cache
# --------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    import networkx
    import torch_geometric

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "torch_geometric": torch_geometric.__version__, "numpy": np.__version__,
           "networkx": networkx.__version__}
    try:
        from importlib.metadata import version

        out["pymetis"] = version("pymetis")
    except Exception:  # noqa: BLE001 - version is informational only
        out["pymetis"] = "unknown"
    return out


def _metis_library_version(library: str) -> dict[str, str]:
    """The METIS build a partition came from, for the manifest."""
    if library != "system":
        return {}
    from .libmetis import idx_bits, library_path

    return {"metis_library": f"{library_path()} ({idx_bits()}-bit idx_t)"}


def cache_key(settings: ClientSettings) -> dict[str, Any]:
    """What identifies a partition build (everything that changes its files)."""
    mode = settings.partition
    if mode not in MODES:
        raise ValueError(f"unknown partition mode {mode!r}; valid: {', '.join(MODES)}")
    split = default_split(mode) if settings.partition_split == "auto" else settings.partition_split
    dataset = canonical_name(settings.dataset)
    train, test = split_ratios(get_spec(dataset).train_ratio)
    split_seed = settings.split_seed
    if settings.split_follows_seed:
        split_seed += settings.seed
    key = {
        "format": FORMAT_VERSION, "dataset": dataset, "mode": mode,
        "num_clients": settings.num_clients, "split": split,
        "split_seed": split_seed,
        "partition_seed": settings.partition_seed,
        "train_ratio": train, "test_ratio": test,
    }
    if settings.split_draw:  # >0 only to mirror the reference's RNG use
        key["split_draw"] = settings.split_draw
    library = settings.metis_library
    if library != "pymetis" and mode.startswith("metis"):  # older keys stay valid
        key["metis_library"] = library
    # Only where they differ from the default, so that earlier builds keep their keys.
    if settings.features != "normalized":
        key["features"] = settings.features
    if not settings.lcc:
        key["lcc"] = False
    if mode == "louvain":
        key["louvain_resolution"] = 1.0
    if get_spec(dataset).family == "synthetic":
        key["graph_seed"] = SYNTHETIC_GRAPH_SEED
    return key


def _graph_options(key: Mapping[str, Any]) -> dict[str, Any]:
    """``load_dataset``'s keyword arguments for the partition ``key``."""
    return {"seed": key.get("graph_seed", SYNTHETIC_GRAPH_SEED),
            "features": key.get("features", "normalized"), "lcc": key.get("lcc", True)}


def cache_name(key: Mapping[str, Any]) -> str:
    """Folder name, e.g. ``Cora-metis-10-s1234-p1234``."""
    name = (f"{key['dataset']}-{key['mode']}-{key['num_clients']}"
            f"-s{key['split_seed']}-p{key['partition_seed']}")
    if key["split"] != default_split(key["mode"]):
        name += f"-{key['split']}"
    if key.get("split_draw"):
        name += f"-d{key['split_draw']}"
    if key.get("metis_library"):
        name += f"-{key['metis_library']}metis"
    if key.get("features"):
        name += f"-{key['features']}features"
    if key.get("lcc") is False:
        name += "-nolcc"
    return name


def _config_root(config: ClientSettings) -> Path:
    return Path(config.data_root).expanduser() if config.data_root else default_data_root()


def partitions_root(config: ClientSettings) -> Path:
    """``<data-root>/partitions``, or the user cache's when the data root is read-only."""
    preferred = _config_root(config) / "partitions"
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    fallback = user_cache_dir() / "partitions"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest.json of a partition folder."""
    return json.loads((Path(folder) / "manifest.json").read_text())


def _is_valid(folder: Path, key: Mapping[str, Any], verify: bool) -> bool:
    """The folder holds a complete build for ``key`` (checksums too when ``verify``)."""
    try:
        manifest = read_manifest(folder)
        if manifest.get("key") != dict(key):
            return False
        for name, digest in manifest["files"].items():
            path = folder / name
            if not path.is_file() or (verify and _sha256(path) != digest):
                return False
        return True
    except (OSError, ValueError, KeyError):
        return False


def build_partitions(key: Mapping[str, Any], data_root: Path, out_dir: Path) -> dict[str, Any]:
    """Load, split and partition the dataset of ``key`` into ``out_dir``; return the manifest."""
    t0 = time.perf_counter()
    dataset = key["dataset"]
    graph = load_dataset(dataset, data_root, **_graph_options(key))
    num_classes = num_classes_of(graph, dataset)
    if key["split"] == "global":
        graph.train_mask, graph.val_mask, graph.test_mask = random_split(
            graph.num_nodes, key["train_ratio"], key["test_ratio"], key["split_seed"],
            skip=key.get("split_draw", 0))
    clients = partition_graph(graph, key["num_clients"], key["mode"], key["partition_seed"],
                              split=key["split"], split_seed=key["split_seed"],
                              resolution=key.get("louvain_resolution", 1.0),
                              metis_library=key.get("metis_library", "pymetis"))
    out_dir.mkdir(parents=True, exist_ok=True)
    digests, stats = {}, []
    for i, client in enumerate(clients):
        client.num_classes_total = num_classes
        name = f"client_{i}.pt"
        files.save_subgraph_file(client, out_dir / name, "pt", include_global_id=True)
        digests[name] = _sha256(out_dir / name)
        stats.append(files.client_stats(client, i, num_classes))
    covered = int((np.bincount(np.concatenate([c.global_id.numpy() for c in clients]),
                               minlength=graph.num_nodes) > 0).sum())
    diagnostics = noniid.partition_diagnostics(graph, clients, num_classes)
    manifest = {
        "key": dict(key), "dataset": dataset, "mode": key["mode"], "num_clients": key["num_clients"],
        "split": key["split"], "split_seed": key["split_seed"], "partition_seed": key["partition_seed"],
        "features": key.get("features", "normalized"), "lcc": key.get("lcc", True),
        "num_features": int(graph.num_features), "num_classes": num_classes,
        "graph": {"nodes": int(graph.num_nodes), "edges": int(graph.edge_index.size(1)),
                  "nodes_in_clients": covered},
        "clients": stats, "diagnostics": diagnostics, "files": digests,
        "versions": {**_versions(), **_metis_library_version(key.get("metis_library", "pymetis"))},
        "build_seconds": round(time.perf_counter() - t0, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def ensure_partitions(config: ClientSettings, verify: bool = True) -> Path:
    """Build (once) and return the cache folder of the run's partition.

    Reads run-config keys ``dataset``, ``num-clients``, ``partition``, ``split-seed``
    (1234), ``partition-seed`` (1234), ``data-root`` ("" = default root) and optionally
    ``partition-split`` ("auto" | "global" | "per-client"), ``split-draw`` (0),
    ``metis-library`` ("pymetis" | "system"), ``features`` ("normalized" | "raw"),
    ``lcc`` (true) and ``split-follows-seed`` (false; with ``seed``).
    Safe under concurrent calls.
    """
    key = cache_key(config)
    root = partitions_root(config)
    target = root / cache_name(key)
    if _is_valid(target, key, verify):
        return target
    with file_lock(root / f".{target.name}.lock"):
        if _is_valid(target, key, verify):  # another process built it while we waited
            return target
        if config.download:
            fetch_dataset(key["dataset"], _config_root(config), config.download_url)
        tmp = root / f".tmp-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            build_partitions(key, _config_root(config), tmp)
            if target.exists():  # stale or corrupt: move aside first, so the swap is atomic
                trash = root / f".trash-{target.name}-{uuid.uuid4().hex[:8]}"
                os.replace(target, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _has_diagnostics(manifest: Mapping[str, Any]) -> bool:
    diag = manifest.get("diagnostics")
    return isinstance(diag, dict) and diag.get("version") == noniid.DIAGNOSTICS_VERSION


def ensure_diagnostics(config: ClientSettings,
                       folder: Path | None = None) -> dict[str, Any]:
    """The partition's manifest with an up-to-date ``diagnostics`` block.

    A manifest from before diagnostics existed (or of an older diagnostics version) gets
    it computed from the cached clients and the dataset's global graph, and rewritten
    atomically in place (under the build lock; manifest.json is not checksummed, so the
    cache stays valid). If the folder cannot be written, the computed block is returned
    without being stored. ``folder``: the partition's cache folder when the caller
    already has it from :func:`ensure_partitions` (else that is called).
    """
    key = cache_key(config)
    folder = Path(folder) if folder is not None else ensure_partitions(config)
    manifest = read_manifest(folder)
    if _has_diagnostics(manifest):
        return manifest
    with file_lock(folder.parent / f".{folder.name}.lock"):
        manifest = read_manifest(folder)
        if _has_diagnostics(manifest):  # another process added it meanwhile
            return manifest
        graph = load_dataset(key["dataset"], _config_root(config), **_graph_options(key))
        clients = [files.load_subgraph_file(folder / f"client_{i}.pt")
                   for i in range(int(manifest["num_clients"]))]
        manifest["diagnostics"] = noniid.partition_diagnostics(
            graph, clients, int(manifest["num_classes"]))
        tmp = folder / f".manifest-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        try:
            tmp.write_text(json.dumps(manifest, indent=1) + "\n")
            os.replace(tmp, folder / "manifest.json")
        except OSError:
            tmp.unlink(missing_ok=True)
    return manifest


def unavailable_dataset(config: ClientSettings) -> str | None:
    """Why :func:`load_client` would fail for want of the dataset's raw files (the
    one-line message it would raise), or None: a synthetic dataset, the raw files under
    the data root, or a complete cached build of the partition. Reads only; cheap."""
    key = cache_key(config)
    spec = get_spec(key["dataset"])
    if spec.family == "synthetic":
        return None
    root = _config_root(config)
    for folder in (root / "partitions", user_cache_dir() / "partitions"):
        if _is_valid(folder / cache_name(key), key, verify=False):
            return None
    missing = missing_raw_files(spec.name, root)
    return str(_not_available(spec, root, missing)) if missing else None


def load_client(config: ClientSettings, partition_id: int) -> Data:
    """Client ``partition_id``'s subgraph from the cache (built if needed, checksum-verified).

    The returned Data carries ``num_classes_total`` (the dataset's label-space size).
    """
    folder = ensure_partitions(config, verify=False)
    manifest = read_manifest(folder)
    k = int(manifest["num_clients"])
    if not 0 <= int(partition_id) < k:
        raise ValueError(f"partition-id {partition_id} is outside 0..{k - 1} of {folder.name}")
    name = f"client_{int(partition_id)}.pt"
    path = folder / name
    if _sha256(path) != manifest["files"][name]:
        raise files.SubgraphFileError(f"{path}: checksum differs from manifest.json; delete "
                                      f"{folder} to rebuild")
    data = files.load_subgraph_file(path)
    data.num_classes_total = int(manifest["num_classes"])
    return data


def load_all_clients(config: ClientSettings) -> list[Data]:
    """Every client of the run's partition, in client order."""
    folder = ensure_partitions(config, verify=True)
    k = int(read_manifest(folder)["num_clients"])
    return [load_client(config, i) for i in range(k)]
