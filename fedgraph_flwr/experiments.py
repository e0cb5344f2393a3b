"""Experiment runner: expand a YAML grid, run every cell × seed, tabulate mean ± std.

    fedgraph-experiments run configs/paper/fedaux-cora.yaml --seeds 0 1 2
    fedgraph-experiments report outputs/experiments/fedaux-cora

A grid file::

    name: fedaux-cora
    base: {dataset: Cora, partition: metis, rounds: 100}     # run-config keys
    grid: {algorithm: [fedaux], num-clients: [5, 10, 20]}    # cartesian product
    seeds: [0, 1, 2]
    paper: {"fedaux|Cora|metis|5": 84.57}                    # optional, per cell
                                                             # (a key naming no cell is an error)

Each ``run``/``report`` also draws ``curves.png`` (mean test accuracy per round with a
±1 std band over seeds), ``per_client.png`` (each client's best-val test accuracy, per
cell), ``minority.png`` where runs report FedSpray's pooled figures (overall, majority
and minority test accuracy per cell) and, with ``plot-x: <key>``, ``by_<key>.png``,
and writes ``report.html``: the table, those figures and every run linked to its own
report.html (one self-contained page each, see fedgraph_flwr/report.py).
``grid`` may also be a list of such mappings (their union). A cell is
``algorithm|dataset|partition|num-clients``, plus ``|key=value`` for every other key in
which runs of that cell differ (ablation switches).

Cells whose ``results.json`` exists are skipped (resumable), unless it was saved with a
different config than the grid now resolves to (a default changed, or a switch added
since whose default is not what the run did), cannot be read, or stopped before its last
round (a memory-guard or fail-fast abort): such a run is moved under ``stale/`` and re-run.
``--engine flower`` runs each cell as a Flower simulation; the default ``inprocess`` runs the same
client and server code without messaging (identical numbers, see
tests/test_engine.py), which is what a sweep on one machine wants.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .config import ConfigError, RunConfig, resolve_config
from .plots import draw_client_bars, draw_curves, draw_minority, draw_versus, round_curve
from .report import write_grid_report

CELL_KEYS = ("algorithm", "dataset", "partition", "num-clients")
# Figures of results.json's ``final`` every table shows, and those a paper may be compared on.
FIXED_COLUMNS = ("test_at_best_val", "per_client_best_val_test")
PAPER_METRICS = (*FIXED_COLUMNS, "pooled_test_at_best_val_loss")


def load_grid(path: str | Path) -> dict[str, Any]:
    spec = yaml.safe_load(Path(path).read_text()) or {}
    for key in ("name", "grid"):
        if key not in spec:
            raise ConfigError(f"{path}: missing top-level key {key!r}")
    spec.setdefault("base", {})
    spec.setdefault("seeds", [0])
    spec.setdefault("paper", {})
    cells = grid_cells(spec)
    unknown = sorted(set(spec["paper"]) - cells)
    if unknown:
        raise ConfigError(f"{path}: paper key {unknown[0]!r} names no cell of this grid; its cells: "
                          f"{', '.join(sorted(cells))}")
    return spec


def expand(spec: dict[str, Any], seeds: list[int] | None = None) -> list[dict[str, Any]]:
    """Every (cell, seed) as a full override dict, validated before anything runs."""
    # A list of grids is their union (e.g. ablations that switch one key each).
    grids = spec["grid"] if isinstance(spec["grid"], list) else [spec["grid"]]
    runs = []
    for grid in grids:
        keys = list(grid)
        axes = (grid[k] if isinstance(grid[k], list) else [grid[k]] for k in keys)
        for values in itertools.product(*axes):
            for seed in seeds if seeds is not None else spec["seeds"]:
                overrides = dict(spec["base"], **dict(zip(keys, values)), seed=int(seed))
                resolve_config(None, overrides)  # fail early, before hours of training
                runs.append(overrides)
    return runs


def run_name(overrides: dict[str, Any]) -> str:
    cfg = resolve_config(None, overrides)
    values = cfg.to_config()
    extra = [f"{k}={v}" for k, v in sorted(overrides.items())
             if k not in (*CELL_KEYS, *NOT_IN_RUN_NAME)]
    base = "-".join(str(values[k]) for k in CELL_KEYS) + f"-seed{cfg.seed}"
    if extra:
        import hashlib

        base += "-" + hashlib.sha1(",".join(extra).encode()).hexdigest()[:8]
    return base


class PlainLog:
    """Progress as plain lines when stdout is no terminal (``nohup ... > log``), where
    rich's bar draws nothing: a cell's start and end, its rounds at most every
    ``every_s`` seconds (and its first and last), and every other engine message
    (a failed client, a void round) as it comes."""

    ROUND = re.compile(r"round (\d+)/\d+:")

    def __init__(self, cell: str, total: int, enabled: bool, every_s: float = 30.0) -> None:
        self.cell, self.total, self.enabled, self.every_s = cell, total, enabled, every_s
        self.t0 = self.last = time.monotonic()

    def say(self, text: str) -> None:
        if self.enabled:
            print(f"{time.strftime('%H:%M:%S')} {self.cell}: {text} "
                  f"({time.monotonic() - self.t0:.0f}s)", flush=True)

    def on_message(self, msg: str) -> int | None:
        """The round a round-summary message completes (None for other messages)."""
        match = self.ROUND.match(msg)
        now = time.monotonic()
        if match is None:
            self.say(msg)
            return None
        done = int(match.group(1))
        if done in (1, self.total) or now - self.last >= self.every_s:
            self.last = now
            self.say(msg)
        return done


def run_grid(spec: dict[str, Any], out_root: Path, seeds: list[int] | None, engine: str,
             extra: dict[str, Any]) -> Path:
    """Run every cell of an experiment grid and write its results under ``out_root``."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    out = out_root / spec["name"]
    runs = expand(spec, seeds)
    done = {run_identity(res["config"]): name for name, res in completed_runs(out).items()}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TimeRemainingColumn()) as progress:
        cells = progress.add_task("cells", total=len(runs))
        rounds = progress.add_task("rounds", total=1)
        for i, overrides in enumerate(runs, 1):
            overrides = dict(overrides, **extra, **{"output-dir": str(out)})
            overrides["run-name"] = run_name(overrides)
            overrides.update(tracker_keys(spec["name"], overrides, out_root))
            target = out / overrides["run-name"] / "results.json"
            progress.update(cells, description=f"cell {i}/{len(runs)} {overrides['run-name']}")
            cfg = resolve_config(None, overrides)
            identity = run_identity(cfg.to_config())
            twin = done.get(identity)
            if twin not in (None, overrides["run-name"]) and not target.is_file():
                # Another row of the grid (or an earlier grid run into this folder) spelt the
                # same configuration: e.g. a tau sweep's tau=10 is an L sweep's L=5.
                progress.console.print(f"{overrides['run-name']}: the same run as {twin}; not re-run")
                progress.advance(cells)
                continue
            if target.is_file():
                try:
                    saved = json.loads(target.read_text())
                    changed: list[str] | None = stale_keys(saved["config"], cfg)
                    if changed == [] and dp_accounted_add_remove(saved):
                        changed = ["dp accounting (add/remove, before issue #76)"]
                    stopped = stopped_after(saved)
                except (ValueError, KeyError, TypeError):  # not a results.json we can read
                    changed, stopped = None, None
                if changed == [] and stopped is None:
                    progress.advance(cells)
                    continue
                # A run cut short (memory guard, fail-fast) is re-run from round 1, not
                # resumed: with client-state=context a resume restarts the clients' state.
                why = ("its results.json is unreadable" if changed is None else
                       f"saved with different {', '.join(changed)} than this grid now asks for"
                       if changed else f"it stopped after round {stopped} of {cfg.rounds}")
                moved = move_aside(target.parent, out / "stale")
                progress.console.print(f"[yellow]{overrides['run-name']}: {why}; re-running "
                                       f"(old run kept in {moved})")
            total = cfg.rounds
            progress.reset(rounds, total=total)
            log = PlainLog(f"cell {i}/{len(runs)} {overrides['run-name']}", total,
                           enabled=not progress.console.is_terminal)
            log.say("started")

            def on_round(msg: str, log: PlainLog = log) -> None:
                done = log.on_message(msg)
                if done is not None:
                    progress.update(rounds, completed=done, description=msg[:60])

            if engine == "flower":
                run_flower_cell(overrides)
            else:
                from .engine.loop import run_federation

                run_federation(overrides, log=on_round)
            log.say("done")
            done[identity] = overrides["run-name"]
            progress.advance(cells)
    # The report shows the grid as run: the seeds asked for and the --set overrides.
    write_tables(out, {**spec, "seeds": list(seeds) if seeds else spec["seeds"],
                       **({"set": extra} if extra else {})})
    return out


def tracker_keys(grid: str, overrides: dict[str, Any], out_root: Path) -> dict[str, str]:
    """With ``trackers`` set: one tracker run per grid run, grouped by grid and cell
    (``tracker-group``: the seeds of a cell land together), in one store for every grid
    under ``out_root`` (``tracker-dir``, unless the grid or ``--set`` names one)."""
    cfg = resolve_config(None, overrides)
    if not cfg.tracker_names:
        return {}
    word = lambda text: re.sub(r"[^A-Za-z0-9._-]+", "-", text)  # noqa: E731
    cell = word(overrides["run-name"].replace(f"-seed{cfg.seed}", "", 1))
    return {"tracker-group": overrides.get("tracker-group") or f"{word(grid)}/{cell}",
            "tracker-dir": overrides.get("tracker-dir") or str(out_root / "trackers")}


def run_flower_cell(overrides: dict[str, Any], num_cpus: int | None = None) -> None:
    """One cell as a Flower simulation (Ray backend) with num-clients SuperNodes, one CPU
    per ClientApp; ``num_cpus``: the CPUs Ray may use in all (default: every core)."""
    from .engine.client_app import make_client_app
    from .engine.server_app import make_server_app
    from .engine.simulation import simulate
    from .secure_aggregation import ensure_run_keys

    cfg = resolve_config(None, overrides)
    keyed = ensure_run_keys(cfg)  # ckks: the run's key pair; the ServerApp loads its public half
    if keyed is not cfg:
        overrides = {**overrides, "ckks-secret-context": keyed.ckks_secret_context,
                     "ckks-public-context": keyed.ckks_public_context}
    import torch

    # Every simulated ClientApp gets an equal share of one GPU (Ray's num_gpus): the K
    # clients of a cell share it, as they share the machine's CPU cores.
    gpus = 1.0 / cfg.num_clients if cfg.device != "cpu" and torch.cuda.is_available() else 0.0
    init_args: dict[str, Any] = {"include_dashboard": False}
    if num_cpus is not None:
        init_args["num_cpus"] = num_cpus
    simulate(make_server_app(overrides), make_client_app(), num_supernodes=cfg.num_clients,
             backend_config={"client_resources": {"num_cpus": 1, "num_gpus": gpus},
                             "init_args": init_args})


# Config keys that never define a cell (they differ between seeds or machines). A run on a
# GPU and one on a CPU are the same run: torch's kernels differ there only by rounding.
NOT_CELL_KEYS = ("seed", "run-name", "output-dir", "data-root", "config-file", "verbose",
                 "device", "trackers", "tracker-dir", "tracker-group")
# The NOT_CELL_KEYS a run folder's name leaves out: config-file and verbose stay in it, as
# the folders of grids already run were named with them.
NOT_IN_RUN_NAME = ("seed", "output-dir", "run-name", "data-root", "device", "trackers",
                   "tracker-dir", "tracker-group")
# Engine keys that change how a run is served, not its numbers.
NOT_RESULT_KEYS = (*NOT_CELL_KEYS, "round-timeout", "handshake-timeout", "fail-fast", "resume",
                   "client-state", "client-state-dir", "max-array-bytes", "memory-limit",
                   "ckks-secret-context", "ckks-public-context")


def saved_config(config: dict[str, Any]) -> dict[str, Any]:
    """A results.json's run config with the keys it predates filled in.

    A key added after the run counts as its default, unless the run's algorithm names a
    legacy value for it (what runs did before the key existed), or a function of the
    filled config giving it.
    """
    from .config import all_defaults
    from .core.registry import get_algorithm

    filled = {**all_defaults(), **config}
    try:
        legacy = get_algorithm(str(filled["algorithm"])).legacy_values
    except ValueError:  # an algorithm since removed: nothing more is known
        legacy = {}
    return {**filled, **{k: v(filled) if callable(v) else v
                         for k, v in legacy.items() if k not in config}}


def stale_keys(saved: dict[str, Any], config: RunConfig) -> list[str]:
    """Keys that change results where a saved run's config differs from ``config``.

    Only the common keys and the run's algorithm's own keys count; other algorithms'
    switches cannot change its numbers, nor can ``<method>-reproduce`` itself (the switches
    it set are compared; runs saved before it existed lack it).
    """
    from .config import common_defaults

    saved = saved_config(saved)
    current = config.to_config()
    own = (set(common_defaults()) | set(config.options.keys())) - {config.options.profile_key()}
    return sorted(k for k in own - set(NOT_RESULT_KEYS)
                  if json.dumps(saved.get(k), default=str) != json.dumps(current.get(k), default=str))


def dp_accounted_add_remove(res: dict[str, Any]) -> bool:
    """Whether a dp run's ε was accounted add/remove (sensitivity C), as before issue #76:
    its dp-epsilon then calibrated half the noise the replace-one accounting asks for, so
    a grid re-runs it rather than keep it under the same label."""
    dp = res.get("dp")
    return isinstance(dp, dict) and "neighbours" not in dp


def move_aside(run_dir: Path, stale_root: Path) -> Path:
    """Move a run folder under ``stale_root`` (never overwriting) and return where it went."""
    stale_root.mkdir(parents=True, exist_ok=True)
    dest = stale_root / run_dir.name
    n = 1
    while dest.exists():
        n += 1
        dest = stale_root / f"{run_dir.name}.{n}"
    run_dir.rename(dest)
    return dest


def stopped_after(res: dict[str, Any]) -> int | None:
    """The last round a results.json recorded, if the run stopped before its ``rounds``
    (an abort writes the rounds it reached); None for a finished run, and for one that
    ended early by design (``stopped``: its dp budget was spent)."""
    if res.get("stopped"):
        return None
    last = res["rounds"][-1]["round"] if res["rounds"] else 0
    return int(last) if int(last) < int(res["config"]["rounds"]) else None


def collect(out: Path) -> dict[str, list[dict[str, Any]]]:
    """results.json files under ``out`` grouped by cell.

    A cell is ``algorithm|dataset|partition|num-clients``; where runs of one such cell
    differ in other run-config keys (an ablation switch such as ``fedaux-variant``), each
    of those keys is appended as ``|key=value`` so ablations never merge with the main
    method's seeds. A key a run's results.json lacks (written before the key existed)
    is read by :func:`saved_config`. Runs moved aside under ``out/stale`` are not read,
    nor is a results.json that cannot be parsed (a run cut off mid-write) or one of a run
    that stopped before its last round (an abort): each is named on stderr and left for
    ``run`` to move aside and redo. A second run of one configuration
    (:func:`run_identity`) is named on stderr and counted once.
    """
    results = []
    seen: dict[str, str] = {}  # run identity -> the run folder counted for it
    for name, res in completed_runs(out, report=True).items():
        identity = run_identity(res["config"])
        if identity in seen:  # e.g. tau=10 of a tau sweep and L=5 of an L sweep: one run
            print(f"fedgraph-experiments: skipping {out / name / 'results.json'}: the same run "
                  f"as {seen[identity]} (counted once)", file=sys.stderr)
            continue
        seen[identity] = name
        results.append(res)
    return group_cells(results)


def run_identity(config: dict[str, Any]) -> str:
    """What makes a run's results: its seed and every key that changes them. Two grid rows
    can spell one configuration differently; equal identities are one run."""
    return json.dumps({k: v for k, v in saved_config(config).items()
                       if k == "seed" or k not in NOT_RESULT_KEYS}, sort_keys=True, default=str)


def completed_runs(out: Path, report: bool = False) -> dict[str, dict[str, Any]]:
    """The readable results.json of runs under ``out`` that reached their last round (their
    config read by :func:`saved_config`), by run name; with ``report``, each one left out is
    named on stderr."""
    runs = {}
    for path in sorted(out.glob("*/results.json")):
        try:
            res = json.loads(path.read_text())
            res["config"] = saved_config(res["config"])
        except (ValueError, KeyError, TypeError) as exc:
            if report:
                print(f"fedgraph-experiments: skipping unreadable {path} ({type(exc).__name__}: "
                      f"{exc}); `fedgraph-experiments run` on its grid redoes it", file=sys.stderr)
            continue
        stopped = stopped_after(res)
        if stopped is not None:
            if report:
                print(f"fedgraph-experiments: skipping {path}: it stopped after round {stopped} of "
                      f"{res['config']['rounds']}; `fedgraph-experiments run` on its grid redoes it",
                      file=sys.stderr)
            continue
        runs[path.parent.name] = res
    return runs


def grid_cells(spec: dict[str, Any]) -> set[str]:
    """The cell names a grid's runs will be tabulated under (as :func:`collect` names
    them), from its configs alone."""
    return set(planned_rounds(spec))


def planned_rounds(spec: dict[str, Any]) -> dict[str, int]:
    """Each cell's rounds as its grid file plans them (``--set`` aside): a paper's figure is
    compared only with runs of that length."""
    runs = expand(spec, seeds=[0])
    cells = group_cells([{"config": saved_config(resolve_config(None, o).all_keys())} for o in runs])
    return {cell: int(results[0]["config"]["rounds"]) for cell, results in cells.items()}


def group_cells(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs (each with its full ``config``) grouped by cell name; see :func:`collect`."""
    base: dict[str, list[dict[str, Any]]] = {}
    for res in results:
        base.setdefault("|".join(str(res["config"][k]) for k in CELL_KEYS), []).append(res)
    cells: dict[str, list[dict[str, Any]]] = {}
    for name, group in base.items():
        keys = sorted({k for r in group for k in r["config"]} - set(CELL_KEYS) - set(NOT_CELL_KEYS))
        varying = [k for k in keys
                   if len({json.dumps(r["config"].get(k), default=str) for r in group}) > 1]
        for res in group:
            cell = name + "".join(f"|{k}={res['config'].get(k)}" for k in varying)
            cells.setdefault(cell, []).append(res)
    return cells


def matching_cell_key(cell: str, results: list[dict[str, Any]], keys: Iterable[str]) -> str | None:
    """The key among ``keys`` (a grid file's paper keys or planned cells) that names ``cell``:
    ``cell`` itself or, when only part of a grid ran and fewer keys vary (so the cell's name
    is shorter), the one key whose further ``k=v`` parts every run of the cell has in its
    config. None when no key, or more than one, does."""
    keys = list(keys)
    if cell in keys:
        return cell
    head, extra = _split_cell(cell)
    found = []
    for key in keys:
        key_head, key_extra = _split_cell(key)
        if key_head != head or any(key_extra.get(k) != v for k, v in extra.items()):
            continue
        if all(str(r["config"].get(k)) == v for r in results
               for k, v in key_extra.items() if k not in extra):
            found.append(key)
    return found[0] if len(found) == 1 else None


def _split_cell(name: str) -> tuple[str, dict[str, str]]:
    """A cell name's ``algorithm|dataset|partition|clients`` and its ``k=v`` parts."""
    fields = name.split("|")
    head = "|".join(fields[:len(CELL_KEYS)])
    return head, dict(f.split("=", 1) for f in fields[len(CELL_KEYS):])


def seed_mean_curve_at_best_val(results: list[dict[str, Any]]) -> list[float]:
    """The reference visualizer's "Acc @ Best Val" (FED-PUB/FedAux ``evaluations/visualizer.py``).

    Each run's mean-over-clients val and test curves (in %, rounded to 2 decimals as
    there) are averaged over the runs first, cut to the shortest run; the round of the
    highest averaged val is picked once for all runs. Returns each run's test at that
    round (their mean is the visualizer's figure), or [] when no round is scored. Our
    headline ``test_at_best_val`` instead picks each run's own best round, as the
    visualizer's "Acc @ Best Val All" does.
    """
    curves = [(np.round(round_curve(res, "val"), 2), np.round(round_curve(res, "test"), 2))
              for res in results]
    n = min((len(v) for v, _ in curves), default=0)
    if n == 0:
        return []
    val = np.round(np.mean([v[:n] for v, _ in curves], axis=0), 2)
    if np.all(np.isnan(val)):
        return []
    best = int(np.nanargmax(val))
    return [float(t[best]) for _, t in curves]


def best_test_round(results: list[dict[str, Any]]) -> list[float]:
    """Each run's highest mean-over-clients test accuracy over all rounds (%).

    An oracle, not a result: it selects on test data. It bounds what any rule that picks
    one round for all clients could report for these runs (not the per-client rule, where
    each client takes its own best-val round). Runs with no scored round are left out.
    """
    curves = [round_curve(res, "test") for res in results]
    return [float(np.nanmax(c)) for c in curves if len(c) and not np.all(np.isnan(c))]


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{np.mean(values):.2f} ± {std:.2f}"


def write_tables(out: Path, spec: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """table.md and table.csv: mean ± std per cell of both figures, beside the paper.

    ``paper-metric`` in the grid file names the figure the paper's numbers are compared
    with: ``test_at_best_val`` (FedAux/FED-PUB protocol, the default),
    ``per_client_best_val_test`` (FedIIH's: each client's test at its own best val round)
    or ``pooled_test_at_best_val_loss`` (FedSpray's: pooled accuracy at the round of lowest
    pooled val loss). ``columns`` lists further figures of results.json's ``final`` to
    tabulate (e.g. ``pooled_minority_at_best_val_loss``). Every table also has the
    reference visualizer's seed-mean-curve figure (:func:`seed_mean_curve_at_best_val`),
    mean ± std over runs at the one round it picks.
    """
    paper = (spec or {}).get("paper", {})
    paper_metric = (spec or {}).get("paper-metric", "test_at_best_val")
    if paper_metric not in PAPER_METRICS:
        raise ConfigError(f"unknown paper-metric {paper_metric!r}; valid: {', '.join(PAPER_METRICS)}")
    extra = [c for c in (spec or {}).get("columns", []) if c not in FIXED_COLUMNS]
    rows = []
    cells = collect(out)
    reported = {k for rs in cells.values() for r in rs for k in r["final"]}
    unknown = [c for c in extra if reported and c not in reported]
    if unknown:
        raise ConfigError(f"columns: no run reports {unknown[0]!r} in results.json's final; "
                          f"known: {', '.join(sorted(reported))}")
    planned = planned_rounds(spec) if spec and paper else {}
    for cell, results in sorted(cells.items()):
        figures = {key: [float(r["final"].get(key, float("nan"))) for r in results]
                   for key in (*FIXED_COLUMNS, *extra, paper_metric)}
        secs = [r["wall_time_s"] / max(1, len(r["rounds"])) for r in results]
        paper_key = matching_cell_key(cell, results, paper)
        ref = None if paper_key is None else paper[paper_key]
        planned_key = matching_cell_key(cell, results, planned)
        ran = sorted({int(r["config"]["rounds"]) for r in results})
        paper_cell = "" if ref is None else f"{ref:.2f}"
        if ref is not None and planned_key is not None and ran != [planned[planned_key]]:
            # e.g. --set rounds=10: not the paper's protocol, so no comparison
            paper_cell = (f"not compared: {'/'.join(map(str, ran))} rounds, the paper's "
                          f"{planned[planned_key]}")
            ref = None
        mean = float(np.mean(figures[paper_metric]))
        rows.append({
            "cell": cell, "seeds": ",".join(str(r["config"]["seed"]) for r in results),
            **{key: _fmt(figures[key]) for key in (*FIXED_COLUMNS, *extra)},
            "seed_mean_curve_test_at_best_val": _fmt(seed_mean_curve_at_best_val(results)),
            "best_test_round": _fmt(best_test_round(results)),
            "paper": paper_cell,
            "diff": "" if ref is None else f"{mean - ref:+.2f}",
            "s_per_round": f"{np.mean(secs):.3f}",
        })
    md = out / "table.md"
    header = ["cell (algorithm\\|dataset\\|partition\\|clients)", "seeds", "test @ best val (%)",
              "per-client best-val test (%)", *(f"{c} (%)" for c in extra),
              "seed-mean curve @ best val (%)", "oracle: best test round (%)",
              f"paper (vs {paper_metric})", "diff", "s/round"]
    table = [[r[k] for k in ("cell", "seeds", *FIXED_COLUMNS, *extra,
                             "seed_mean_curve_test_at_best_val", "best_test_round", "paper",
                             "diff", "s_per_round")] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for fields in table:
        # a literal | inside a Markdown table cell
        lines.append("| " + " | ".join([fields[0].replace("|", "\\|"), *fields[1:]]) + " |")
    md.write_text("\n".join(lines) + "\n")
    _draw(out, cells, spec or {}, paper_metric)
    write_grid_report(out, [h.replace("\\|", "|") for h in header], table, cells, spec)
    path_csv = out / "table.csv"
    with path_csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["cell"])
        w.writeheader()
        w.writerows(rows)
    return md, path_csv


def _draw(out: Path, cells: dict[str, list[dict[str, Any]]], spec: dict[str, Any],
          paper_metric: str) -> None:
    """curves.png (mean test accuracy per round, ±1 std over seeds, one line per cell),
    per_client.png, minority.png (when the runs report pooled minority figures); with
    ``plot-x: <key>`` in the grid file also ``by_<key>.png``: the headline figure
    against that key's value, one line per cell otherwise alike."""
    if not cells:
        return
    draw_curves(cells, out / "curves.png")
    draw_client_bars(cells, out / "per_client.png")
    if any("pooled_minority_at_best_val_loss" in r["final"] for rs in cells.values() for r in rs):
        draw_minority(cells, out / "minority.png")
    x_key = spec.get("plot-x")
    if not x_key:
        return
    series: dict[str, list[tuple[float, float, float]]] = {}
    for cell, results in cells.items():
        x = float(results[0]["config"][x_key])
        name = "|".join(p for p in cell.split("|") if not p.startswith(f"{x_key}="))
        values = [r["final"][paper_metric] for r in results]
        std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        series.setdefault(name, []).append((x, float(np.mean(values)), std))
    draw_versus(series, x_key, f"{paper_metric.replace('_', ' ')} (%)", out / f"by_{x_key}.png")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="fedgraph-experiments")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a YAML grid (resumable)")
    run.add_argument("grid")
    run.add_argument("--seeds", type=int, nargs="+")
    run.add_argument("--out", default="outputs/experiments")
    run.add_argument("--engine", choices=("inprocess", "flower"), default="inprocess")
    run.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                     help="extra run-config overrides for every cell (e.g. data-root=...)")
    rep = sub.add_parser("report", help="rewrite table.md/table.csv, the figures and "
                         "report.html from saved results")
    rep.add_argument("folder")
    rep.add_argument("--grid", help="the grid file, for the paper's figures")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "run":
            spec = load_grid(args.grid)
            extra = dict(kv.split("=", 1) for kv in args.set)
            t0 = time.time()
            out = run_grid(spec, Path(args.out), args.seeds, args.engine, extra)
            print((out / "table.md").read_text())
            print(f"{out} ({time.time() - t0:.0f}s)")
        else:
            saved_spec = load_grid(args.grid) if args.grid else None
            md, _ = write_tables(Path(args.folder), saved_spec)
            print(md.read_text())
    except ConfigError as exc:
        print(f"fedgraph-experiments: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["main", "run_grid", "write_tables", "expand"]
