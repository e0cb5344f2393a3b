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
