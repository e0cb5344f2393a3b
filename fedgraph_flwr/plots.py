"""PNG figures drawn from saved results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_round_costs(rounds: list[dict[str, Any]], path: Path) -> Path:
    """Bytes and seconds per round (from results.json's ``rounds``) in one PNG.

    Left: bytes sent to and received from clients (sum over clients). Right: the
    round's wall time, the server's wait for replies, aggregation, and the clients'
    local training summed over clients.
    """
    plt = _pyplot()
    x = [r["round"] for r in rounds]
    sent = [sum(r["bytes_sent"].values()) for r in rounds]
    received = [sum(r["bytes_received"].values()) for r in rounds]

    def seconds(get) -> list[float]:
        return [float(get(r)) for r in rounds]

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(x, sent, marker="o", label="sent to clients")
    left.plot(x, received, marker="s", label="received from clients")
    left.set_xlabel("round")
    left.set_ylabel("bytes")
    left.set_title("bytes per round")
    left.legend()
    right.plot(x, seconds(lambda r: r["times"].get("round", np.nan)), marker="o", label="round")
    right.plot(x, seconds(lambda r: r["times"].get("wait", np.nan)), marker="s",
               label="server wait for replies")
    right.plot(x, seconds(lambda r: r["times"].get("aggregate", np.nan)), marker="^",
               label="aggregation")
    right.plot(x, seconds(lambda r: sum(t.get("train", 0.0) for t in r.get("client_times", {}).values())),
               marker="x", label="local training (sum over clients)")
    from matplotlib.ticker import MaxNLocator

    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
    right.set_xlabel("round")
    right.set_ylabel("seconds")
    right.set_title("seconds per round")
    right.legend(fontsize="small")
    fig.tight_layout()
    out = _save(fig, path, dpi=100)
    plt.close(fig)
    return out


def _client_matrix(ax, matrix: np.ndarray, client_ids: list[int], title: str, **title_kw):
    """A K×K client matrix as a heatmap on ``ax``, at most ~10 partition-id ticks per axis."""
    im = ax.imshow(matrix, cmap="viridis")
    ax.set_title(title, **title_kw)
    ax.set_xlabel("client (partition id)")
    ax.set_ylabel("client (partition id)")
    ticks = np.arange(len(client_ids))
    step = max(1, len(client_ids) // 10)
    ax.set_xticks(ticks[::step], [str(c) for c in client_ids][::step])
    ax.set_yticks(ticks[::step], [str(c) for c in client_ids][::step])
    return im


def draw_heatmaps(diagnostics: dict[str, np.ndarray], client_ids: list[int], out_dir: Path) -> list[Path]:
    """One heatmap per diagnostic matrix (last round with data), clients by partition id."""
    plt = _pyplot()

    paths = []
    for name, stacked in diagnostics.items():
        rounds = [i for i in range(stacked.shape[0]) if not np.isnan(stacked[i]).all()]
        if not rounds:
            continue
        last = rounds[-1]
        fig, ax = plt.subplots(figsize=(5, 4.2))
        im = _client_matrix(ax, stacked[last], client_ids, f"{name} (round {last + 1})")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        path = Path(out_dir) / f"heatmap_{name.replace('.', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def draw_side_by_side(panels: dict[str, np.ndarray], path: str | Path, title: str = "",
                      client_ids: list[int] | None = None) -> Path:
    """K×K matrices in one row of heatmaps (each with its own colour bar), e.g. a
    method's client similarity beside the ground truth; writes a PNG to ``path``."""
    plt = _pyplot()
    if not panels:
        raise ValueError("nothing to draw")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    for ax, (name, matrix) in zip(axes[0], panels.items()):
        matrix = np.asarray(matrix, dtype=np.float64)
        ids = client_ids if client_ids is not None else list(range(matrix.shape[0]))
        im = _client_matrix(ax, matrix, ids, name, fontsize=10)
        bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        bar.formatter.set_useOffset(False)  # near-constant matrices: show values, not an offset
        bar.update_ticks()
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _save(fig, path: Path, dpi: int = 110) -> Path:
    """Write through a temp file, then rename: never a half-written PNG."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=dpi)
    tmp.replace(path)
    return path


def round_curve(result: dict[str, Any], which: str = "test") -> np.ndarray:
    """One run's mean-over-clients ``which`` (val | test) accuracy per round, in %.

    ``held_mean_<which>`` (all clients' held models) of results.json, or ``mean_<which>``
    where an older file lacks it.
    """
    return 100 * np.array([float(rnd.get(f"held_mean_{which}", rnd.get(f"mean_{which}", np.nan)))
                           for rnd in result["rounds"]])


def draw_curves(cells: dict[str, list[dict[str, Any]]], path: Path, which: str = "test") -> Path:
    """Mean over seeds of :func:`round_curve` vs round, one line per cell, with a ±1 std
    band across seeds; rounds a seed did not log are left out."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for cell, results in sorted(cells.items()):
        last = max(len(r["rounds"]) for r in results)
        grid = np.full((len(results), last), np.nan)
        for i, res in enumerate(results):
            curve = round_curve(res, which)
            grid[i, :len(curve)] = curve
        x = np.arange(1, last + 1)
        seen = np.isfinite(grid)
        count = seen.sum(axis=0)
        mean = np.where(seen, grid, 0.0).sum(axis=0) / np.maximum(count, 1)
        std = np.sqrt(np.where(seen, (grid - mean) ** 2, 0.0).sum(axis=0) / np.maximum(count, 1))
        mean[count == 0] = np.nan
        ax.plot(x, mean, label=f"{cell} (n={len(results)})")
        ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(f"held mean {which} (%)")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def draw_versus(series: dict[str, list[tuple[float, float, float]]], x_label: str,
                y_label: str, path: Path) -> Path:
    """One line per series of (x, mean, std) points, with error bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in sorted(series.items()):
        points = sorted(points)
        xs, ys, es = zip(*points)
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=name)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.legend(fontsize="small")
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def _short(cell: str) -> str:
    """A cell name for a tick label: without the partition, rarely what a figure compares."""
    parts = cell.split("|")
    return "|".join(parts[:2] + parts[3:]) if len(parts) > 3 else cell


def draw_client_bars(cells: dict[str, list[dict[str, Any]]], path: Path, ncols: int = 3) -> Path:
    """One panel per cell: each client's test metric at its own best-val round (results'
    ``final.per_client``), mean over seeds with ±1 std error bars; the dashed line is the
    cell's mean over clients."""
    plt = _pyplot()
    names = sorted(cells)
    nrows = max(1, -(-len(names) // ncols))
    fig, axes = plt.subplots(nrows, min(ncols, len(names)), squeeze=False,
                             figsize=(4.2 * min(ncols, len(names)), 2.8 * nrows))
    for ax, cell in zip(axes.flat, names):
        per_seed = [r["final"].get("per_client", {}) for r in cells[cell]]
        ids = sorted({int(c) for p in per_seed for c in p})
        values = np.array([[p.get(str(c), {}).get("test", np.nan) for c in ids] for p in per_seed])
        mean = np.nanmean(values, axis=0) if ids else np.array([])
        std = np.nanstd(values, axis=0) if ids else np.array([])
        ax.bar(ids, mean, yerr=std, capsize=2, color="tab:blue", alpha=0.8)
        if ids:
            ax.axhline(float(np.nanmean(mean)), color="k", ls="--", lw=1)
            ax.set_ylim(max(0.0, float(np.nanmin(mean - std)) - 10), 100)
        ax.set_title(_short(cell), fontsize="small")
        ax.set_xlabel("client")
        ax.set_ylabel("best-val test (%)")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def draw_minority(cells: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """FedSpray's view: pooled overall, majority and minority test accuracy at the round of
    lowest pooled val loss, one group of bars per cell (mean ± std over seeds)."""
    plt = _pyplot()
    names = [c for c in sorted(cells)
             if any("pooled_minority_at_best_val_loss" in r["final"] for r in cells[c])]
    kinds = (("pooled_test_at_best_val_loss", "overall"),
             ("pooled_majority_at_best_val_loss", "majority"),
             ("pooled_minority_at_best_val_loss", "minority"))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names) + 2), 4.2))
    x = np.arange(len(names))
    width = 0.27
    for i, (key, label) in enumerate(kinds):
        vals = [[r["final"].get(key, np.nan) for r in cells[c]] for c in names]
        ax.bar(x + (i - 1) * width, [np.nanmean(v) for v in vals], width,
               yerr=[np.nanstd(v) for v in vals], capsize=2, label=label)
    ax.set_xticks(x, [_short(c) for c in names], rotation=35, ha="right", fontsize="x-small")
    ax.set_ylabel("pooled test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize="small")
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out
