"""Export an OpenFGL subgraph-FL split (its cached client graphs and node-classification
masks) to this project's client files, so both libraries train on identical data.

OpenFGL (``openfgl-lib``) caches what its simulation made under
``<root>/distrib/<simulation>_<dataset>_client_<K>/``: ``data_<i>.pt`` (a PyG ``Data`` with
``x``, ``edge_index``, ``y``, ``global_map``) and ``node_cls/default_split/{train,val,test}_<i>.pt``
(boolean masks). Run any OpenFGL algorithm once on the split to create them, then:

    python benchmarks/openfgl_export.py <root>/distrib/subgraph_fl_metis_Cora_client_10 \\
        --out outputs/partitions/openfgl-cora-metis-10

and run ours on the folder with ``--set partition='files' partition-dir='<out>' num-clients=10``.
The graph is made undirected without self-loops and ``x`` float32, as OpenFGL's own
``FGLDataset.get_client_data`` does when it loads a client. The files are OpenFGL's, so they
are read with ``weights_only=False``: export only a folder you made yourself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch_geometric.data import Data
from torch_geometric.utils import remove_self_loops, to_undirected

from fedgraph_flwr.data.files import export_partitions, load_partition_dir


def read_openfgl_split(split_dir: Path, split: str = "default_split") -> list[Data]:
    """The clients of one cached OpenFGL split, in this project's ``Data`` layout."""
    graphs = sorted(split_dir.glob("data_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    if not graphs:
        raise SystemExit(f"{split_dir}: no data_<i>.pt files (run an OpenFGL algorithm on it first)")
    masks_dir = split_dir / "node_cls" / split
    clients = []
    for i, path in enumerate(graphs):
        if path.stem != f"data_{i}":
            raise SystemExit(f"{split_dir}: client files are not data_0..data_{len(graphs) - 1}")
        raw = torch.load(path, weights_only=False)
        masks = {}
        for key in ("train", "val", "test"):
            mask_path = masks_dir / f"{key}_{i}.pt"
            if not mask_path.is_file():
                raise SystemExit(f"{mask_path}: missing (OpenFGL writes the masks on its first run)")
            masks[f"{key}_mask"] = torch.load(mask_path, weights_only=False).bool().cpu()
        edge_index = remove_self_loops(to_undirected(raw.edge_index.long()))[0]
        # global_map: OpenFGL's {local id: id in the whole graph}; kept in the files, never sent.
        global_id = torch.tensor([raw.global_map[j] for j in range(raw.num_nodes)], dtype=torch.long)
        clients.append(Data(x=raw.x.float(), edge_index=edge_index, y=raw.y.view(-1).long(),
                            global_id=global_id, **masks))
    num_classes = max(int(c.y.max()) + 1 for c in clients)
    for c in clients:
        c.num_classes_total = num_classes
    return clients


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("split_dir", type=Path,
                        help="OpenFGL's distrib/<simulation>_<dataset>_client_<K> folder")
    parser.add_argument("--out", type=Path, required=True, help="an empty folder for client_<i>.npz")
    parser.add_argument("--split", default="default_split", help="OpenFGL's node_cls split folder")
    args = parser.parse_args(argv)
    clients = read_openfgl_split(args.split_dir, args.split)
    out = export_partitions(clients, args.out, fmt="npz", include_global_id=True)
    # Read back through the loader every run uses: a file it refuses fails here, not in a run.
    back = load_partition_dir(out, len(clients))
    for i, (a, b) in enumerate(zip(clients, back)):
        same = (torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
                and a.edge_index.size(1) == b.edge_index.size(1)
                and all(torch.equal(a[k], b[k]) for k in ("train_mask", "val_mask", "test_mask")))
        if not same:
            raise SystemExit(f"client {i}: the written file does not read back equal")
    sizes = ", ".join(f"{int(c.num_nodes)}" for c in clients)
    print(f"{len(clients)} clients written to {out} (nodes: {sizes}; "
          f"{clients[0].num_classes_total} classes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
