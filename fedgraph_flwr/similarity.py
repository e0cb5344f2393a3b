"""How well a method's client-similarity matrix recovers the data's ground truth.

Ground truth (computed from the clients' data, which the server never sees; FedAux
Fig. 3a / FedIIH Fig. 3a, whose exact definitions are unstated — these are the
readings recorded in docs/reading/fedaux.md §7.7 and docs/reading/fediih.md §9.19):

- ``features``: cosine similarity of the clients' mean-pooled propagated features
  mean_i (Â_k X_k)_i, with Â_k = D^{-1/2}(A_k + I)D^{-1/2} the GCN propagation matrix
  of client k's own subgraph.
- ``labels``: 1 − JS(P_k, P_l)/ln 2 of the clients' label distributions (JS in nats,
  so this lies in [0, 1]).
- ``combined``: the mean of the two.

All three are symmetric with unit diagonal. The match score of a method's K×K matrix
against a ground truth is Spearman's ρ (``scipy.stats.spearmanr``) over the
off-diagonal entries (k ≠ l) where both are finite (NaN rows: clients that did not take
part in that round). Only the ranking matters, so a softmax of a similarity, or any
other strictly increasing transform, scores the same as the similarity itself.

``report(run_dir, data_root)`` reads a finished run's ``results.json`` (config) and
``diagnostics.npz`` (``<name>`` → [rounds, K, K], written by the engine for FedAux's
``similarity`` / ``weights`` and FedIIH's ``similarity.<factor>``), rebuilds the ground
truth from the same partition, and writes ``similarity_match.json`` plus one
``similarity_vs_truth_<name>.png`` (last round beside the ground truths) per
similarity matrix into the run folder. CLI::

    python -m fedgraph_flwr.similarity RUN_DIR [--data-root D]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch_geometric.data import Data

from .core.mixing import cosine_similarity
from .data.noniid import js_divergence, label_histograms, propagated_features

GROUND_TRUTHS = ("features", "labels", "combined")


def ground_truth_similarity(clients: Sequence[Data], num_classes: int) -> dict[str, np.ndarray]:
    """{"features", "labels", "combined"} → symmetric K×K matrices with unit diagonal."""
    pooled = np.stack([propagated_features(c, "gcn").mean(0) for c in clients])
    features = cosine_similarity(pooled)
    np.fill_diagonal(features, 1.0)  # also for a client whose mean feature vector is 0
    hists = label_histograms(clients, num_classes).astype(np.float64)
    dist = hists / hists.sum(1, keepdims=True)
    labels = 1.0 - js_divergence(dist[:, None, :], dist[None, :, :]) / math.log(2.0)
    labels = np.clip(0.5 * (labels + labels.T), 0.0, 1.0)
    np.fill_diagonal(labels, 1.0)
    return {"features": features, "labels": labels, "combined": 0.5 * (features + labels)}


def match_score(method: np.ndarray, truth: np.ndarray) -> float:
    """Spearman ρ between the off-diagonal entries of two K×K matrices (NaN pairs
    dropped); NaN when fewer than 3 pairs remain or either side is constant."""
    from scipy.stats import spearmanr

    method, truth = np.asarray(method, np.float64), np.asarray(truth, np.float64)
    if method.shape != truth.shape or method.ndim != 2 or method.shape[0] != method.shape[1]:
        raise ValueError(f"need two K×K matrices of one size, got {method.shape} and {truth.shape}")
    off = ~np.eye(method.shape[0], dtype=bool)
    a, b = method[off], truth[off]
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(spearmanr(a, b).statistic)


def round_scores(stacked: np.ndarray, truths: Mapping[str, np.ndarray]) -> dict[str, list[float]]:
    """Per-round match scores of ``stacked`` [R, K, K] against every ground truth."""
    return {name: [match_score(m, truth) for m in stacked] for name, truth in truths.items()}


def load_run_clients(config: Mapping[str, Any], data_root: str | Path | None = None) -> list[Data]:
    """The clients of a run's partition (the cache under ``data_root`` or the run's own
    ``data-root``; or the ``partition-dir`` files of ``partition=files`` runs)."""
    from .config import ClientSettings
    from .data import files
    from .data.partition import load_all_clients

    settings = ClientSettings.from_config(config)
    if settings.partition == "files":
        return files.load_partition_dir(settings.partition_dir, settings.num_clients)
    if data_root:
        settings = dataclasses.replace(settings, data_root=str(data_root))
    return load_all_clients(settings)


def _json_float(x: float) -> float | None:
    return None if not math.isfinite(x) else round(float(x), 6)


def _last_round_with_data(stacked: np.ndarray) -> int | None:
    rounds = [i for i in range(stacked.shape[0]) if not np.isnan(stacked[i]).all()]
    return rounds[-1] if rounds else None


def report(run_dir: str | Path, data_root: str | Path | None = None, *, write: bool = True,
           log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Score a finished run's similarity matrices against the ground truth (module doc)."""
    from .plots import draw_side_by_side

    run_dir = Path(run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    config = results["config"]
    diag_path = run_dir / "diagnostics.npz"
    if not diag_path.is_file():
        raise FileNotFoundError(f"{diag_path}: no similarity diagnostics (only methods that "
                                f"compute client similarities write it, e.g. fedaux, fediih)")
    with np.load(diag_path, allow_pickle=False) as npz:
        diagnostics = {name: np.asarray(npz[name], np.float64) for name in npz.files}
    clients = load_run_clients(config, data_root)
    num_classes = int(results.get("num_classes") or max(
        int(getattr(c, "num_classes_total", 0) or int(c.y.max()) + 1) for c in clients))
    truths = ground_truth_similarity(clients, num_classes)
    k = len(clients)

    scores: dict[str, dict[str, list[float]]] = {}
    last: dict[str, dict[str, Any]] = {}
    for name, stacked in diagnostics.items():
        if stacked.ndim != 3 or stacked.shape[1:] != (k, k):
            raise ValueError(f"{diag_path}: {name!r} has shape {stacked.shape}, expected "
                             f"[rounds, {k}, {k}] for this run's {k} clients")
        scores[name] = round_scores(stacked, truths)
        r = _last_round_with_data(stacked)
        if r is not None:
            last[name] = {"round": r + 1, **{t: scores[name][t][r] for t in truths}}

    out = {
        "run": str(run_dir), "algorithm": config.get("algorithm"), "dataset": config.get("dataset"),
        "partition": config.get("partition"), "num_clients": k,
        "score": "Spearman rho over off-diagonal entries (scipy.stats.spearmanr)",
        "ground_truth_definitions": {
            "features": "cosine of client means of D^-1/2 (A+I) D^-1/2 X",
            "labels": "1 - JS(P_k, P_l) / ln 2 of label distributions",
            "combined": "(features + labels) / 2",
        },
        "ground_truth": {t: m.tolist() for t, m in truths.items()},
        "rounds": {name: {t: [_json_float(x) for x in v] for t, v in per.items()}
                   for name, per in scores.items()},
        "last_round": {name: {key: (_json_float(v) if key != "round" else v)
                              for key, v in d.items()} for name, d in last.items()},
        "figures": [],
    }
    if write:
        drawn = [n for n in diagnostics if n.startswith("similarity")] or list(diagnostics)
        for name in drawn:
            if name not in last:
                continue
            r = last[name]["round"] - 1
            panels = {f"{name} (round {r + 1})": diagnostics[name][r]}
            panels.update({f"ground truth: {t}\nrho = {last[name][t]:.3f}": truths[t]
                           for t in ("features", "labels")})
            path = run_dir / f"similarity_vs_truth_{name.replace('.', '_')}.png"
            draw_side_by_side(panels, path, title=f"{config.get('algorithm')} on "
                              f"{config.get('dataset')}, {k} clients")
            out["figures"].append(path.name)
        (run_dir / "similarity_match.json").write_text(json.dumps(out, indent=1) + "\n")
    if log:
        log(format_scores(out))
    return out


def format_scores(out: Mapping[str, Any]) -> str:
    """The per-round table printed by :func:`report`."""
    lines = [f"{out['algorithm']} on {out['dataset']} ({out['num_clients']} clients): Spearman rho "
             f"of each similarity matrix vs the ground truth, per round"]
    for name, per in out["rounds"].items():
        lines.append(f"{name}:")
        lines.append(f"{'round':>6} " + " ".join(f"{t:>9}" for t in GROUND_TRUTHS))
        rounds = len(next(iter(per.values())))
        for r in range(rounds):
            cells = [per[t][r] for t in GROUND_TRUTHS]
            if all(c is None for c in cells):
                continue
            lines.append(f"{r + 1:>6} " + " ".join(f"{'nan' if c is None else f'{c:.3f}':>9}"
                                                   for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m fedgraph_flwr.similarity",
                                description="Score a run's client similarities against the "
                                            "data's ground truth (Spearman).")
    p.add_argument("run_dir", help="a finished run's folder (results.json + diagnostics.npz)")
    p.add_argument("--data-root", default="", help="where the run's partition cache lives "
                   "(default: the run's own data-root)")
    args = p.parse_args(argv)
    try:
        report(args.run_dir, args.data_root or None)
    except (OSError, ValueError) as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"wrote {Path(args.run_dir) / 'similarity_match.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
