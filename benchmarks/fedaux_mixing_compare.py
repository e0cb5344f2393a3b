"""FedAux's server mixing, round by round: the authors' code against ours (issue #58).

    python benchmarks/fedaux_mixing_compare.py --authors A0.npz [A1.npz ...] \
        --ours O0.npz [O1.npz ...] [--ours-uniform U0.npz ...] \
        --out docs/figures/fedaux-mixing-authors-vs-ours.png

Every input is one run's per-round K×K matrices: ``sim`` or ``similarity`` (the APV
cosines S_kl = cos(a_k, a_l)) and ``weights`` (the mixing weights W = row-softmax(α S)
the server applied), stacked [R, K, K]. Ours: a run folder's ``diagnostics.npz``; the
authors': the ``mixing.npz`` that the out-of-repository harness writes from their
server's ``sim_matrices`` (docs/results/fedaux.md, "Does the authors' code
personalize?"); ``--ours-uniform``: our runs with the reference code's U(0, 1)
APV init (``fedaux-apv-init=uniform``), drawn as a third row. The first file of each
code gives the heatmaps (rounds 1, 10, 50, 100, one colour scale for all rows); every
file gives a line in the per-round panels: mean off-diagonal cosine, the spectral gap
ρ = ‖W − 11ᵀ/K‖₂ and max |W − 1/K|. Prints one JSON line: per code and file, the mean
and min off-diagonal cosine, ρ and max |W − 1/K| at the heatmap rounds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROUNDS = (1, 10, 50, 100)


def load(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(similarity [R,K,K], weights [R,K,K]) of one run's npz."""
    with np.load(path) as f:
        sim = f["sim"] if "sim" in f else f["similarity"]
        return np.asarray(sim, dtype=np.float64), np.asarray(f["weights"], dtype=np.float64)


def per_round(sim: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Mean and min off-diagonal cosine, ρ and max |W − 1/K| for every round."""
    k = sim.shape[1]
    off = ~np.eye(k, dtype=bool)
    uniform = np.full((k, k), 1.0 / k)
    return {
        "sim_mean": np.array([s[off].mean() for s in sim]),
        "sim_min": np.array([s[off].min() for s in sim]),
        "rho": np.array([np.linalg.norm(w - uniform, ord=2) for w in weights]),
        "w_maxdev": np.array([np.abs(w - uniform).max() for w in weights]),
    }


def summary(stats: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """The four figures at the heatmap rounds that the run has."""
    n = len(stats["rho"])
    return {str(r): {key: float(v[r - 1]) for key, v in stats.items()} for r in ROUNDS if r <= n}


def draw(runs: dict[str, list[tuple[np.ndarray, np.ndarray]]], out: Path) -> None:
    """Heatmaps of the first run of each code plus the per-round panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs)
    shown = {name: [r for r in ROUNDS if r <= len(runs[name][0][0])] for name in names}
    lows = [runs[n][0][0][r - 1].min() for n in names for r in shown[n]]
    vmin, vmax = float(min(lows)), 1.0
    if vmax - vmin < 1e-6:
        vmin = vmax - 1e-6
    ncols = max(len(v) for v in shown.values())
    fig = plt.figure(figsize=(3.1 * ncols + 1.2, 3.0 * len(names) + 3.4))
    grid = fig.add_gridspec(len(names) + 1, ncols, height_ratios=[1.0] * len(names) + [1.15])
    image = None
    for i, name in enumerate(names):
        sim = runs[name][0][0]
        for j, r in enumerate(shown[name]):
            ax = fig.add_subplot(grid[i, j])
            image = ax.imshow(sim[r - 1], vmin=vmin, vmax=vmax, cmap="viridis")
            ax.set_title(f"{name}: round {r}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    if image is not None:
        fig.colorbar(image, ax=fig.axes, fraction=0.02, pad=0.01, label="APV cosine")
    bottom = grid[len(names), :].subgridspec(1, 3, wspace=0.35)
    panels = [("sim_mean", "mean off-diagonal cosine", False),
              ("rho", "spectral gap ρ = ‖W − 11ᵀ/K‖₂", True),
              ("w_maxdev", "max |W − 1/K|", True)]
    colours = dict(zip(names, ("tab:red", "tab:blue", "tab:green")))
    for p, (key, title, log) in enumerate(panels):
        ax = fig.add_subplot(bottom[0, p])
        for name in names:
            for s, (sim, weights) in enumerate(runs[name]):
                v = per_round(sim, weights)[key]
                ax.plot(np.arange(1, len(v) + 1), v, color=colours.get(name), lw=1.0, alpha=0.8,
                        label=name if s == 0 else None)
        if log:
            ax.set_yscale("log")
        ax.axhline(1.0 if key == "sim_mean" else 0.0, color="grey", lw=0.5)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
        ax.legend(fontsize=8)
    spread = 1.0 - vmin
    words = (f"all cosines within {spread:.1e} of 1: near-uniform mixing" if spread < 0.01
             else f"cosines from {vmin:.3f} to 1")
    fig.suptitle(f"FedAux APV similarity, Cora-10 reference files — colour scale {vmin:.5f}…1 ({words})",
                 fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors", type=Path, nargs="+", required=True,
                        help="mixing.npz of the authors' code, one per seed")
    parser.add_argument("--ours", type=Path, nargs="+", required=True,
                        help="diagnostics.npz of our runs, one per seed")
    parser.add_argument("--ours-uniform", type=Path, nargs="+", default=[],
                        help="diagnostics.npz of our runs with fedaux-apv-init=uniform")
    parser.add_argument("--labels", nargs=3, default=["authors' code", "ours", "ours, U(0,1) APV"])
    parser.add_argument("--out", type=Path, default=Path("docs/figures/fedaux-mixing-authors-vs-ours.png"))
    args = parser.parse_args(argv)
    runs = {args.labels[0]: [load(p) for p in args.authors], args.labels[1]: [load(p) for p in args.ours]}
    if args.ours_uniform:
        runs[args.labels[2]] = [load(p) for p in args.ours_uniform]
    draw(runs, args.out)
    result = {name: [summary(per_round(*run)) for run in group] for name, group in runs.items()}
    print(json.dumps({"figure": str(args.out), "rounds": list(ROUNDS), "runs": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
