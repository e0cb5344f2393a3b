"""Client subgraph files: read, validate, write.

Format (the reference-partitions format, ``client_<i>.npz`` or ``client_<i>.pt``):

| key | dtype | shape |
|---|---|---|
| x | float (stored float32) | n × d |
| edge_index | integer (int64) | 2 × m, both directions of each undirected edge |
| y | integer (int64) | n |
| train_mask, val_mask, test_mask | bool | n |
| global_id (optional, never sent anywhere) | integer | n |
| halo_global_id (optional, with global_id) | integer | h |
| halo_edge_index (optional, with halo_global_id) | integer | 2 × k |
| num_classes (optional) | integer scalar | the run's label-space size |

The halo (FedGCN's): ``halo_global_id``, the sorted global ids of the nodes outside the
client one edge away; ``halo_edge_index``, the other edges among its n + h nodes (local ids
n.. are the halo in that order; halo–halo edges too), both directions.

``.npz`` is read with ``allow_pickle=False``; ``.pt`` with ``torch.load(weights_only=True)``
and may hold a dict of tensors/arrays or a PyG ``Data`` (allowlisted classes only).
Every problem raises :class:`SubgraphFileError` with a one-line message naming the file.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

REQUIRED_KEYS = ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")
MASK_KEYS = ("train_mask", "val_mask", "test_mask")
_CLIENT_FILE = re.compile(r"^client_(\d+)\.(npz|pt)$")


class SubgraphFileError(ValueError):
    """A client subgraph file is unreadable or inconsistent (one-line message)."""


def _fail(path: str | Path, problem: str) -> SubgraphFileError:
    return SubgraphFileError(f"{path}: {problem}")


def _read_npz(path: Path) -> dict[str, Any]:
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        # numpy treats a non-zip, non-.npy file as a pickle, which allow_pickle=False refuses.
        raise _fail(path, f"not a readable .npz file ({type(exc).__name__})") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise _fail(path, "holds a single .npy array, not an .npz archive of named arrays")
    out = {}
    with archive:
        for key in archive.files:
            try:
                out[key] = archive[key]
            except ValueError as exc:  # an object array needs pickle: refused
                raise _fail(path, f"array {key!r} holds Python objects (pickled); "
                                  "only plain numeric/bool arrays are accepted") from exc
            except (zipfile.BadZipFile, EOFError, OSError) as exc:
                raise _fail(path, f"array {key!r} is unreadable ({type(exc).__name__})") from exc
    return out


def _safe_pyg_globals() -> list[type]:
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]


def _read_pt(path: Path) -> dict[str, Any]:
    try:
        with torch.serialization.safe_globals(_safe_pyg_globals()):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unpickling errors come in many types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _fail(path, f"not a loadable tensor file with weights_only=True ({first[:160]})") from exc
    if isinstance(obj, Data):
        return {key: obj[key] for key in obj.keys()}
    if isinstance(obj, dict):
        return dict(obj)
    raise _fail(path, f"holds a {type(obj).__name__}; expected a dict of tensors or a PyG Data")


def _as_tensor(path: Path, key: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise _fail(path, f"{key!r} holds Python objects")
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (int, float, bool)):
        return torch.tensor(value)
    raise _fail(path, f"{key!r} is a {type(value).__name__}, not an array")


def validate_subgraph(arrays: dict[str, Any], path: str | Path = "<memory>") -> Data:
    """Check a dict of arrays against the format; return a Data with canonical dtypes."""
    path = Path(path)
    missing = [k for k in REQUIRED_KEYS if k not in arrays]
    if missing:
        raise _fail(path, f"missing key(s) {', '.join(missing)}; required: {', '.join(REQUIRED_KEYS)}")
    t = {k: _as_tensor(path, k, arrays[k]) for k in REQUIRED_KEYS}
    x, edge_index, y = t["x"], t["edge_index"], t["y"]
    if not x.is_floating_point():
        raise _fail(path, f"x has dtype {x.dtype}; expected a float type (float32)")
    if x.dim() != 2:
        raise _fail(path, f"x has shape {tuple(x.shape)}; expected n x d")
    n = x.size(0)
    if n == 0:
        raise _fail(path, "the subgraph has no nodes")
    if not torch.isfinite(x).all():
        raise _fail(path, "x holds NaN or infinite values")
    if edge_index.is_floating_point() or edge_index.dtype == torch.bool:
        raise _fail(path, f"edge_index has dtype {edge_index.dtype}; expected an integer type (int64)")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise _fail(path, f"edge_index has shape {tuple(edge_index.shape)}; expected 2 x m")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n):
        raise _fail(path, f"edge_index holds node ids in [{int(edge_index.min())}, "
                          f"{int(edge_index.max())}], outside [0, {n}) for n={n} nodes")
    if y.is_floating_point() or y.dtype == torch.bool:
        raise _fail(path, f"y has dtype {y.dtype}; expected an integer type (int64)")
    if y.dim() != 1 or y.size(0) != n:
        raise _fail(path, f"y has shape {tuple(y.shape)}; expected ({n},) to match x")
    if int(y.min()) < 0:
        raise _fail(path, f"y holds negative labels (min {int(y.min())})")
    for key in MASK_KEYS:
        mask = t[key]
        if mask.dtype != torch.bool:
            raise _fail(path, f"{key} has dtype {mask.dtype}; expected bool")
        if mask.dim() != 1 or mask.size(0) != n:
            raise _fail(path, f"{key} has shape {tuple(mask.shape)}; expected ({n},) to match x")
    if not bool(t["train_mask"].any()):
        raise _fail(path, "no training node (train_mask is all False)")
    data = Data(x=x.float().contiguous(), edge_index=edge_index.long().contiguous(),
                y=y.long().contiguous(), train_mask=t["train_mask"], val_mask=t["val_mask"],
                test_mask=t["test_mask"])
    if "global_id" in arrays:
        gid = _as_tensor(path, "global_id", arrays["global_id"])
        if gid.is_floating_point() or gid.shape != (n,):
            raise _fail(path, f"global_id must be integer with shape ({n},)")
        data.global_id = gid.long()
    if ("halo_global_id" in arrays) != ("halo_edge_index" in arrays) or (
            "halo_global_id" in arrays and "global_id" not in arrays):
        raise _fail(path, "halo_global_id and halo_edge_index come together, with global_id")
    if "halo_global_id" in arrays:
        halo = _as_tensor(path, "halo_global_id", arrays["halo_global_id"])
        halo_edges = _as_tensor(path, "halo_edge_index", arrays["halo_edge_index"])
        if halo.is_floating_point() or halo.dim() != 1:
            raise _fail(path, "halo_global_id must be a 1-d integer array")
        total = n + halo.numel()
        if (halo_edges.is_floating_point() or halo_edges.dim() != 2 or halo_edges.size(0) != 2
                or (halo_edges.numel() and (int(halo_edges.min()) < 0
                                            or int(halo_edges.max()) >= total))):
            raise _fail(path, f"halo_edge_index must be 2 x k integer ids in [0, {total})")
        data.halo_global_id = halo.long().contiguous()
        data.halo_edge_index = halo_edges.long().contiguous()
    if "num_classes" in arrays:
        nc = _as_tensor(path, "num_classes", arrays["num_classes"])
        if nc.numel() != 1 or nc.is_floating_point():
            raise _fail(path, "num_classes must be an integer scalar")
        if int(nc) <= int(data.y.max()):
            raise _fail(path, f"num_classes={int(nc)} but y holds label {int(data.y.max())}")
        data.num_classes_total = int(nc)
    return data


def load_subgraph_file(path: str | Path) -> Data:
    """Read and validate one client file (``.npz`` or ``.pt``); see the module docstring."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise _fail(path, "no such file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        arrays = _read_npz(path)
    elif suffix == ".pt":
        arrays = _read_pt(path)
    else:
        raise _fail(path, f"unknown file type {suffix!r}; expected .npz or .pt")
    return validate_subgraph(arrays, path)


def client_files(folder: str | Path) -> dict[int, Path]:
    """``{i: path}`` of the ``client_<i>.npz`` / ``client_<i>.pt`` files in ``folder``."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise SubgraphFileError(f"{folder}: not a folder")
    found: dict[int, Path] = {}
    for p in sorted(folder.iterdir()):
        m = _CLIENT_FILE.match(p.name)
        if m:
            cid = int(m.group(1))
            if cid in found:
                raise SubgraphFileError(f"{folder}: client {cid} has both {found[cid].name} and {p.name}")
            found[cid] = p
    return found


def load_partition_dir(path: str | Path, num_clients: int) -> list[Data]:
    """Load ``client_0 .. client_<K-1>`` from a folder and check they fit together.

    All files must share the feature width; every client gets ``num_classes_total``
    (the largest declared or observed label space across files).
    """
    folder = Path(path).expanduser()
    found = client_files(folder)
    if sorted(found) != list(range(num_clients)):
        raise SubgraphFileError(
            f"{folder}: expected client_0..client_{num_clients - 1} (num-clients={num_clients}), "
            f"found {len(found)} client file(s) with ids {sorted(found)[:10]}"
        )
    clients = [load_subgraph_file(found[i]) for i in range(num_clients)]
    widths = {int(c.num_features) for c in clients}
    if len(widths) != 1:
        raise SubgraphFileError(f"{folder}: client files disagree on the feature width: {sorted(widths)}")
    declared = {c.num_classes_total for c in clients if hasattr(c, "num_classes_total")}
    if len(declared) > 1:
        raise SubgraphFileError(f"{folder}: client files declare different num_classes: {sorted(declared)}")
    observed = max(int(c.y.max()) + 1 for c in clients)
    num_classes = max(declared | {observed})
    for c in clients:
        c.num_classes_total = num_classes
    return clients


def subgraph_arrays(data: Data, include_global_id: bool = False) -> dict[str, torch.Tensor]:
    """The file format's tensors of a client Data (canonical dtypes, contiguous)."""
    out = {
        "x": data.x.float().contiguous(), "edge_index": data.edge_index.long().contiguous(),
        "y": data.y.long().contiguous(),
        **{k: data[k].bool().contiguous() for k in MASK_KEYS},
    }
    if include_global_id and "global_id" in data:
        out["global_id"] = data.global_id.long().contiguous()
        if "halo_global_id" in data:  # global ids too
            out["halo_global_id"] = data.halo_global_id.long().contiguous()
            out["halo_edge_index"] = data.halo_edge_index.long().contiguous()
    if getattr(data, "num_classes_total", None) is not None:
        out["num_classes"] = torch.tensor(int(data.num_classes_total), dtype=torch.long)
    return out


def client_stats(data: Data, client: int, num_classes: int | None = None) -> dict[str, Any]:
    """Counts of one client: nodes, directed edges, split sizes, class histogram, majority share."""
    num_classes = num_classes or int(data.y.max()) + 1
    hist = torch.bincount(data.y, minlength=num_classes)
    return {
        "client": client, "nodes": int(data.num_nodes), "edges": int(data.edge_index.size(1)),
        "train": int(data.train_mask.sum()), "val": int(data.val_mask.sum()),
        "test": int(data.test_mask.sum()), "class_hist": hist.tolist(),
        "majority_class": int(hist.argmax()),
        "majority_share": round(float(hist.max()) / max(int(data.num_nodes), 1), 4),
    }


def save_subgraph_file(data: Data, path: str | Path, fmt: str = "npz",
                       include_global_id: bool = False) -> None:
    """Write one client file (``npz``: np.savez; ``pt``: torch.save of a plain dict)."""
    arrays = subgraph_arrays(data, include_global_id)
    path = Path(path)
    if fmt == "npz":
        with open(path, "wb") as fh:  # a file object: np.savez must not append ".npz"
            np.savez(fh, **{k: v.numpy() for k, v in arrays.items()})
    elif fmt == "pt":
        torch.save(arrays, path)
    else:
        raise ValueError(f"unknown format {fmt!r}; expected npz or pt")


def export_partitions(clients: list[Data], out_dir: str | Path, fmt: str = "npz",
                      include_global_id: bool = False) -> Path:
    """Write ``client_<i>.<fmt>`` for every client plus ``stats.json``; return the folder.

    ``global_id`` is left out by default: these files go to other machines.
    """
    if fmt not in ("npz", "pt"):
        raise ValueError(f"unknown format {fmt!r}; expected npz or pt")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    # Never delete anything: a leftover client_<i> beyond K would silently join a later run.
    extra = sorted(i for i in client_files(out) if i >= len(clients))
    if extra:
        raise SubgraphFileError(f"{out}: already holds client file(s) {extra[:5]} beyond the "
                                f"{len(clients)} being exported; use an empty folder")
    stats = []
    for i, c in enumerate(clients):
        save_subgraph_file(c, out / f"client_{i}.{fmt}", fmt, include_global_id)
        stats.append(client_stats(c, i, getattr(c, "num_classes_total", None)))
    (out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    return out
