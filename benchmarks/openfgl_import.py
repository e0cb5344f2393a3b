"""Write one of this project's partitions as an OpenFGL cache, so OpenFGL trains on our files.

The reverse of ``openfgl_export.py``: it builds (or reads) the run's partition with the
same keys a run uses, and writes what OpenFGL 1.1.0's ``FGLDataset`` and node-classification
task load instead of simulating a split of their own:

    <root>/distrib/<simulation>_<dataset>_client_<K>/data_<i>.pt
        (x, edge_index, y, global_map, num_global_classes)
    <root>/distrib/.../node_cls/default_split/{train,val,test}_<i>.pt  (boolean masks)
    <root>/distrib/.../node_cls/default_split/glb_{train,val,test}_<i>.pkl  (global ids)

    python benchmarks/openfgl_import.py --root <openfgl-root> --set dataset=Cora \\
        partition=metis num-clients=20 data-root=<data>

then, in OpenFGL's environment, ``openfgl_side_by_side.py run <algorithm> <seed> <out.json>
--root <openfgl-root> --clients 20`` trains on exactly our clients' graphs, features, labels
and masks. ``<root>/global`` must hold OpenFGL's copy of the whole dataset (it reads the
global graph's size); the folder name uses ``--simulation`` (default ``subgraph_fl_metis``),
so give each partition its own root. The data files are written with ``torch.save`` of a
PyG ``Data``, as OpenFGL's own cache is.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path

import torch
from torch_geometric.data import Data

from fedgraph_flwr.config import ClientSettings
from fedgraph_flwr.data.partition import load_all_clients


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="OpenFGL's data root")
    parser.add_argument("--simulation", default="subgraph_fl_metis",
                        help="the simulation name OpenFGL will be run with")
    parser.add_argument("--set", nargs="+", required=True, metavar="KEY=VALUE",
                        help="the run-config keys that pick the partition (dataset, partition, "
                             "num-clients, data-root, ...)")
    args = parser.parse_args(argv)
    if bad := [item for item in args.set if "=" not in item]:
        parser.error(f"--set takes KEY=VALUE, not {bad[0]!r}")
    # As `fedgraph-experiments run --set` passes them: the partition's keys parse strings.
    config = dict(item.split("=", 1) for item in args.set)
    if missing := [key for key in ("dataset", "num-clients") if key not in config]:
        parser.error(f"--set needs {missing[0]}=...")
    try:
        clients = load_all_clients(ClientSettings.from_config(config))
    except ValueError as e:  # the partition's own one-line errors (dataset, client count, ...)
        raise SystemExit(f"openfgl_import: {e}") from None
    if missing := [i for i, c in enumerate(clients) if "global_id" not in c]:
        raise SystemExit(f"client {missing[0]}: the partition has no global ids")
    folder = args.root / "distrib" / f"{args.simulation}_{config['dataset']}_client_{len(clients)}"
    if folder.exists():
        raise SystemExit(f"{folder}: exists; give each partition its own --root")
    # Written beside it and renamed at the end: OpenFGL never finds a half-written cache.
    tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    split_dir = tmp / "node_cls" / "default_split"
    split_dir.mkdir(parents=True)
    for i, c in enumerate(clients):
        torch.save(Data(x=c.x, edge_index=c.edge_index, y=c.y,
                        global_map=dict(enumerate(c.global_id.tolist())),
                        num_global_classes=int(c.num_classes_total)),
                   tmp / f"data_{i}.pt")
        for key in ("train", "val", "test"):
            mask = c[f"{key}_mask"].bool()
            torch.save(mask, split_dir / f"{key}_{i}.pt")
            with open(split_dir / f"glb_{key}_{i}.pkl", "wb") as f:
                pickle.dump(c.global_id[mask].tolist(), f)
    tmp.rename(folder)
    sizes = ", ".join(str(int(c.num_nodes)) for c in clients)
    print(f"{len(clients)} clients written to {folder} (nodes: {sizes})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
