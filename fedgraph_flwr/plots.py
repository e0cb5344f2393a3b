"""PNG figures drawn from saved results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def draw_heatmaps(diagnostics: dict[str, np.ndarray], client_ids: list[int], out_dir: Path) -> list[Path]:
    """One heatmap per diagnostic matrix (last round with data), clients by partition id."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, stacked in diagnostics.items():
        rounds = [i for i in range(stacked.shape[0]) if not np.isnan(stacked[i]).all()]
        if not rounds:
            continue
        last = rounds[-1]
        fig, ax = plt.subplots(figsize=(5, 4.2))
        im = ax.imshow(stacked[last], cmap="viridis")
        ax.set_title(f"{name} (round {last + 1})")
        ax.set_xlabel("client (partition id)")
        ax.set_ylabel("client (partition id)")
        ticks = np.arange(len(client_ids))
        step = max(1, len(client_ids) // 10)
        ax.set_xticks(ticks[::step], [str(c) for c in client_ids][::step])
        ax.set_yticks(ticks[::step], [str(c) for c in client_ids][::step])
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("nothing to draw")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    for ax, (name, matrix) in zip(axes[0], panels.items()):
        matrix = np.asarray(matrix, dtype=np.float64)
        ids = client_ids if client_ids is not None else list(range(matrix.shape[0]))
        im = ax.imshow(matrix, cmap="viridis")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("client (partition id)")
        ax.set_ylabel("client (partition id)")
        ticks = np.arange(len(ids))
        step = max(1, len(ids) // 10)
        ax.set_xticks(ticks[::step], [str(c) for c in ids][::step])
        ax.set_yticks(ticks[::step], [str(c) for c in ids][::step])
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
