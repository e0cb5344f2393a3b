r"""Build (or reuse) a partition cache and print its per-client table.

    python -m fedgraph_flwr.partition --dataset Cora --num-clients 10 --partition metis \
        [--data-root D] [--split-seed 1234] [--partition-seed 1234] [--split-draw 0]
        [--metis-library pymetis|system] [--export DIR --format npz]

Prints the per-client table, each client's label histogram, the edge cut (undirected
edges of the global graph whose endpoints no client holds together) and FedAux's
non-IIDness ξ = JSD + MMD (Eqs. 62-63, docs/reading/fedaux.md §3; definitions in
``fedgraph_flwr.data.noniid``); all of it is also in the cache's ``manifest.json``.

Also installed as the console script ``fedgraph-partition``. ``--export`` writes the
clients as ``client_<i>.npz|pt`` + ``stats.json`` (without ``global_id``), the format a
SuperNode reads with ``--node-config "partition-file=..."``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _table(manifest: dict[str, Any]) -> str:
    head = (f"{'client':>6} {'nodes':>7} {'edges':>8} {'train':>6} {'val':>6} {'test':>6} "
            f"{'classes':>7} {'majority':>9}")
    lines = [head, "-" * len(head)]
    for c in manifest["clients"]:
        present = sum(1 for h in c["class_hist"] if h > 0)
        lines.append(f"{c['client']:>6} {c['nodes']:>7} {c['edges']:>8} {c['train']:>6} {c['val']:>6} "
                     f"{c['test']:>6} {present:>7} {100 * c['majority_share']:>8.1f}%")
    tot = {k: sum(c[k] for c in manifest["clients"]) for k in ("nodes", "edges", "train", "val", "test")}
    lines.append("-" * len(head))
    lines.append(f"{'total':>6} {tot['nodes']:>7} {tot['edges']:>8} {tot['train']:>6} "
                 f"{tot['val']:>6} {tot['test']:>6}")
    return "\n".join(lines)


def _label_table(manifest: dict[str, Any]) -> str:
    num_classes = int(manifest["num_classes"])
    width = max(5, len(str(max((max(c["class_hist"]) for c in manifest["clients"]), default=0))) + 1)
    head = f"{'client':>6}: " + " ".join(f"{'c' + str(j):>{width}}" for j in range(num_classes))
    lines = ["label histogram (nodes per class):", head, "-" * len(head)]
    for c in manifest["clients"]:
        lines.append(f"{c['client']:>6}: " + " ".join(f"{h:>{width}}" for h in c["class_hist"]))
    return "\n".join(lines)


def _diagnostics_lines(manifest: dict[str, Any]) -> str:
    cut, nn = manifest["diagnostics"]["edge_cut"], manifest["diagnostics"]["noniid"]
    line = (f"edge cut: {cut['cut']} of {cut['undirected_edges']} undirected edges "
            f"({100 * cut['cut_fraction']:.2f}%) join different clients")
    if cut["uncovered"]:
        line += (f"; {cut['uncovered']} ({100 * cut['uncovered_fraction']:.2f}%) touch a node "
                 f"in no client")
    xi = (f"non-IIDness xi = JSD + MMD = {nn['jsd']:.4f} + {nn['mmd']:.4f} = {nn['xi']:.4f} "
          f"(FedAux Eqs. 62-63; RBF bandwidth {nn['bandwidth']:.4g}"
          + (f", MMD on <= {nn['max_nodes_per_client']} nodes per client" if nn["subsampled"] else "")
          + ")")
    return line + "\n" + xi


def build_parser() -> argparse.ArgumentParser:
    """The command line's argument parser."""
    from .data.partition import MODES

    p = argparse.ArgumentParser(prog="fedgraph-partition", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, help="registry name, e.g. Cora, PubMed, Minesweeper, SBM")
    p.add_argument("--num-clients", type=int, required=True)
    p.add_argument("--partition", default="metis", choices=MODES)
    p.add_argument("--data-root", default="", help="folder holding <root>/<Name>/raw (default: "
                   "$FEDGRAPH_DATA_ROOT or ~/.cache/fedgraph-flwr)")
    p.add_argument("--split-seed", type=int, default=1234)
    p.add_argument("--partition-seed", type=int, default=1234)
    p.add_argument("--partition-split", default="auto", choices=("auto", "global", "per-client"))
    p.add_argument("--split-draw", type=int, default=0,
                   help="discard this many split permutations first "
                        "(1 reproduces the reference Cora-10 split)")
    p.add_argument("--metis-library", default="pymetis", choices=("pymetis", "system"),
                   help="METIS build: pymetis (bundled, 64-bit idx_t) or system ($METIS_DLL or the "
                        "system's libmetis; Debian's 32-bit libmetis5 gives the reference code's partitions)")
    p.add_argument("--features", default="normalized", choices=("normalized", "raw"),
                   help="raw: skip the row normalisation of Planetoid/Amazon features")
    p.add_argument("--no-lcc", action="store_true",
                   help="keep every connected component (default: the largest, where the papers do)")
    p.add_argument("--export", default="", help="also write client_<i>.<format> + stats.json here")
    p.add_argument("--format", default="npz", choices=("npz", "pt"))
    p.add_argument("--json", action="store_true", help="print the manifest as JSON instead of a table")
    return p


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    from .config import ClientSettings
    from .data.datasets import DatasetNotAvailable
    from .data.files import SubgraphFileError, export_partitions
    from .data.libmetis import LibMetisNotFound
    from .data.partition import ensure_diagnostics, ensure_partitions, load_all_clients

    try:
        config = ClientSettings.from_config({
            "dataset": args.dataset, "num-clients": args.num_clients, "partition": args.partition,
            "data-root": args.data_root, "split-seed": args.split_seed,
            "partition-seed": args.partition_seed, "partition-split": args.partition_split,
            "split-draw": args.split_draw, "metis-library": args.metis_library,
            "features": args.features, "lcc": not args.no_lcc,
        })
        folder = ensure_partitions(config)
        manifest = ensure_diagnostics(config, folder)  # computes them for an older cache
        if args.export:
            out = export_partitions(load_all_clients(config), args.export, args.format)
    except (DatasetNotAvailable, SubgraphFileError, LibMetisNotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(manifest, indent=1))
        return 0
    g = manifest["graph"]
    print(f"{manifest['dataset']}: {g['nodes']} nodes, {g['edges']} directed edges, "
          f"{manifest['num_features']} features, {manifest['num_classes']} classes; "
          f"{manifest['mode']} into {manifest['num_clients']} clients, split={manifest['split']} "
          f"(split-seed {manifest['split_seed']}, partition-seed {manifest['partition_seed']})")
    print(_table(manifest))
    print(_label_table(manifest))
    print(_diagnostics_lines(manifest))
    print(f"cache: {folder}")
    if args.export:
        print(f"exported {manifest['num_clients']} {args.format} files + stats.json to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
