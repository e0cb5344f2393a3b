"""PNG figures drawn from saved results (matplotlib, headless)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_round_costs(rounds: list[dict[str, Any]], path: Path) -> Path:
    """Megabytes and seconds per round (from results.json's ``rounds``) in one PNG.

    Left: MB sent to and received from clients (sum over clients). Right: the round's
    wall time, the server's wait for replies, aggregation, and the clients' local
    training summed over clients. Legends sit under the panels and the y axes leave
    headroom, so flat lines (every round costs the same) stay visible.
    """
    plt = _pyplot()
    x = [r["round"] for r in rounds]
    sent = np.array([sum(r["bytes_sent"].values()) for r in rounds], dtype=np.float64) / 1e6
    received = np.array([sum(r["bytes_received"].values()) for r in rounds], dtype=np.float64) / 1e6

    def seconds(get) -> list[float]:
        return [float(get(r)) for r in rounds]

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
    # Sent and received are often equal (a model down, a model up): a solid line under a
    # dashed one with hollow markers keeps both visible.
    left.plot(x, sent, color="tab:blue", ls="-", lw=2.5, marker="o",
              label=f"sent to clients ({sent.sum():.2f} MB in all)")
    left.plot(x, received, color="tab:orange", ls="--", lw=1.5, marker="s", mfc="none",
              label=f"received from clients ({received.sum():.2f} MB in all)")
    left.set_ylabel("MB (10⁶ bytes, sum over clients)")
    left.set_title("megabytes per round")
    right.plot(x, seconds(lambda r: r["times"].get("round", np.nan)), marker="o", label="round")
    right.plot(x, seconds(lambda r: r["times"].get("wait", np.nan)), marker="s", ls="--",
               label="server wait for replies")
    right.plot(x, seconds(lambda r: r["times"].get("aggregate", np.nan)), marker="^", ls=":",
               label="aggregation")
    right.plot(x, seconds(lambda r: sum(t.get("train", 0.0) for t in r.get("client_times", {}).values())),
               marker="x", ls="-.", label="local training (sum over clients)")
    right.set_ylabel("seconds")
    right.set_title("seconds per round")
    for ax in (left, right):
        _round_axis(ax, x)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize="small",
                  frameon=False)
    out = _save(fig, path, dpi=100)
    plt.close(fig)
    return out


def _round_axis(ax, rounds: list[int]) -> None:
    """Integer round ticks, and y from 0 with headroom above the highest point."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    if rounds:
        ax.set_xlim(min(rounds) - 0.5, max(rounds) + 0.5)
    if 0 < len(rounds) <= 12:
        ax.set_xticks(rounds)  # MaxNLocator falls back to fractions on a span under 1
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    top = max((np.nanmax(line.get_ydata()) for line in ax.get_lines()
               if np.isfinite(line.get_ydata()).any()), default=0.0)
    ax.set_ylim(0, 1.25 * top if top > 0 else 1.0)


# Mixing weights within this fraction of their mean count as uniform (FedAvg's 1/K):
# a heatmap stretched over such noise would suggest structure that is not there.
UNIFORM_RTOL = 1e-3
MIXING_NAMES = ("weights", "mixing")
# Similarities (cosine-like, of order 1) that all lie within this of each other are
# drawn in one colour and called near-uniform: FedAux's APV similarity on Cora-10 spans
# 0.99996-1.00000, which a colour bar stretched over it turns into false structure.
UNIFORM_SIMILARITY_ATOL = 1e-3


def _decimals(lo: float, hi: float) -> int:
    """Decimal places that tell ``lo`` and ``hi`` apart (2 to 8)."""
    span = hi - lo
    if not span > 0:
        return 2
    return int(min(8, max(2, math.ceil(-math.log10(span) - 1e-9) + 1)))


def matrix_caption(name: str, matrix: np.ndarray) -> tuple[str, tuple[float, float] | None]:
    """A heatmap's subtitle and, for uniform mixing, the colour limits that draw it in one
    colour (else None: the colours span the data).

    Mixing weights (``weights``/``mixing`` diagnostics) that are all equal within
    :data:`UNIFORM_RTOL` read "uniform mixing: every weight = 1/K"; similarities
    (``similarity``, ``similarity.<k>``) within :data:`UNIFORM_SIMILARITY_ATOL` of each
    other read "near-uniform" and get one colour; any other matrix
    states its range with as many decimals as tell its ends apart. NaN entries (clients
    that sat out the round) are drawn blank and said so.
    """
    values = matrix[np.isfinite(matrix)]
    if values.size == 0:
        return "no data", None
    blank = "; blank: sat out" if values.size < matrix.size else ""
    lo, hi, mean = float(values.min()), float(values.max()), float(values.mean())
    mixing = name.rsplit(".", 1)[-1] in MIXING_NAMES
    if mixing and mean > 0 and hi - lo <= UNIFORM_RTOL * mean:
        k = round(1 / mean)
        value = f"1/{k}" if abs(k * mean - 1) <= UNIFORM_RTOL else f"{mean:.4g}"
        spread = max(hi - mean, mean - lo)
        within = f" (all within ±{spread:.1e})" if spread > 0 else ""
        return f"uniform mixing: every weight = {value}{within}{blank}", (0.0, 2 * mean)
    d = _decimals(lo, hi)
    if "similarity" in name.split(".") and hi - lo <= UNIFORM_SIMILARITY_ATOL:
        return (f"near-uniform (no structure at this scale):\nevery similarity in "
                f"{lo:.{d}f}–{hi:.{d}f}{blank}", (mean - 1.0, mean + 1.0))
    return f"range {lo:.{d}f}–{hi:.{d}f}{blank}", None


def _client_matrix(fig, ax, matrix: np.ndarray, client_ids: list[int], title: str,
                   name: str, **title_kw) -> None:
    """A K×K client matrix as a heatmap on ``ax`` with its colour bar: at most ~10
    partition-id ticks per axis, the range (or uniform mixing) under the title, and
    plain tick values (an offset such as ``1e-5+9.999e-1`` would collide with the title)."""
    from matplotlib.ticker import FormatStrFormatter, MaxNLocator

    caption, limits = matrix_caption(name, matrix)
    im = ax.imshow(matrix, cmap="viridis")
    if limits is not None:
        im.set_clim(*limits)
    ax.set_title(f"{title}\n{caption}", **title_kw)
    ax.set_xlabel("client (partition id)")
    ax.set_ylabel("client (partition id)")
    ticks = np.arange(len(client_ids))
    step = max(1, len(client_ids) // 10)
    ax.set_xticks(ticks[::step], [str(c) for c in client_ids][::step])
    ax.set_yticks(ticks[::step], [str(c) for c in client_ids][::step])
    bar = fig.colorbar(im, ax=ax, shrink=0.85)
    # Ticks at 1, 2 or 5 × 10^n, printed with exactly the decimals that step needs.
    bar.locator = MaxNLocator(5, steps=[1, 2, 5, 10])
    ticks = bar.locator.tick_values(*im.get_clim())
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    bar.formatter = FormatStrFormatter(f"%.{max(2, math.ceil(-math.log10(step) - 1e-9))}f")
    bar.update_ticks()


def draw_heatmaps(diagnostics: dict[str, np.ndarray], client_ids: list[int], out_dir: Path) -> list[Path]:
    """One heatmap per diagnostic matrix (last round with data), clients by partition id."""
    plt = _pyplot()

    paths = []
    for name, stacked in diagnostics.items():
        rounds = [i for i in range(stacked.shape[0]) if not np.isnan(stacked[i]).all()]
        if not rounds:
            continue
        last = rounds[-1]
        fig, ax = plt.subplots(figsize=(5.2, 4.6), layout="constrained")
        _client_matrix(fig, ax, stacked[last], client_ids, f"{name} (round {last + 1})", name,
                       fontsize=10)
        path = _save(fig, Path(out_dir) / f"heatmap_{name.replace('.', '_')}.png")
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
        _client_matrix(fig, ax, matrix, ids, name, name, fontsize=10)
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


def run_curves_png(result: dict[str, Any]) -> bytes:
    """One run's per-round curves as PNG bytes (for report.html, no file): mean val and
    test over all clients' held models, with the best mean-val round marked, and the
    mean training loss of the clients that trained."""
    import io

    plt = _pyplot()
    x = [r["round"] for r in result["rounds"]]
    fig, (acc, loss) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained",
                                    gridspec_kw={"width_ratios": [3, 2]})
    val, test = round_curve(result, "val"), round_curve(result, "test")
    acc.plot(x, val, color="tab:green", marker=".", label="val")
    acc.plot(x, test, color="tab:blue", marker=".", label="test")
    best = result["final"].get("best_round")
    if best in x:
        at = x.index(best)
        acc.axvline(best, color="k", ls=":", lw=1)
        # in the legend, not as a label on the curve: it never collides with the lines
        acc.plot([best], [test[at]], ls="none", marker="*", ms=11, color="k",
                 label=f"best mean val: round {best}, test {test[at]:.2f}%")
    acc.set_ylabel(f"held mean {result['final'].get('metric', 'accuracy')} (%)")
    acc.set_title("val and test per round")
    acc.legend(loc="best", fontsize="small")
    loss.plot(x, [float(r.get("mean_train_loss", np.nan)) for r in result["rounds"]],
              color="tab:red", marker=".")
    loss.set_ylabel("mean train loss")
    loss.set_title("training loss per round")
    for ax in (acc, loss):
        _round_axis(ax, x)
        ax.grid(alpha=0.3)
    finite = test[np.isfinite(test)].tolist() + val[np.isfinite(val)].tolist()
    if finite:  # zoom on the curves: a flat run at 80% should not sit in the top fifth
        acc.set_ylim(max(0.0, min(finite) - 5), min(100.0, max(finite) + 5))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


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
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds, never 2.5
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
