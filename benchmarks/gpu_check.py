"""Every algorithm on a GPU against the CPU, Flower rounds on it, and arxiv-size runs (issue #55).

One prepared script for a short GPU slot (at most about 8 minutes with the defaults),
which runs the same way with ``--device cpu`` (tested so, where there is no GPU):

    python benchmarks/gpu_check.py --out OUT --data-root DATA [--device cuda]
        [--parts algorithms flower simulation arxiv cpu-cores] [--budget-s 480]

Parts, each given its share of ``--budget-s`` (what one leaves is passed on):

1. ``algorithms``: every registered algorithm, in process, ``--dataset`` (Cora) METIS
   ``--clients`` (10), ``--rounds`` (5), seed 0: once on ``--device``, once on the CPU. Per
   algorithm: the largest per-round difference of mean test and mean train loss, the
   test at the best mean-validation round of each, s/round of each (median of rounds
   2..R), peak GPU memory, with ``--deterministic`` the ops that
   ``torch.use_deterministic_algorithms`` (warn-only) names as having no deterministic
   version, with ``--syncs`` the host round trips per round and where they are made, or
   the one-line error.
2. ``flower``: FedAux and FedIIH as a real Flower deployment on 127.0.0.1 (SuperLink,
   ``--clients`` SuperNodes and their ClientApp executors: ``benchmarks/deploy_round.py``,
   no Ray), every ClientApp on ``--device``: s/round. Needs flwr and the client files of
   ``--partitions`` (client_<i>.npz).
3. ``simulation``: the same two as a Flower simulation (``run_simulation``, Ray), each
   ClientApp reserving one CPU and 1/K of the GPU, all K sharing it at once: s/round. Needs
   Ray (a 70 MB wheel: ``gpu_carry.sh --ray`` splits it over two device calls).
4. ``arxiv``: FedAux and FedIIH on ``--arxiv-dataset`` (Synthetic-arxiv: ogbn-arxiv's size)
   with 5 METIS clients, ``--arxiv-rounds`` (10), in process, ``client-state=file`` (one
   client's trainer alive at a time, as on one organisation's GPU): s/round, peak GPU
   memory and the projected 100-round time (the first round + 99 median rounds).
5. ``cpu-cores``: part 2 with every ClientApp on the CPU (``device=cpu``, one thread each
   where the machine has a core per client).

Writes ``OUT/gpu_check.json`` (after every algorithm and part, so a cut-off run keeps
what it measured) and ``OUT/gpu_check.md`` (the tables).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import platform
import re
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTS = ("algorithms", "flower", "simulation", "arxiv", "cpu-cores")
#: The project's own methods first: a slot cut short has measured them.
FIRST = ("fedaux", "fediih", "fedspray")
FEDIIH_CORA_10 = ROOT / "configs" / "fediih" / "cora-disjoint-10.yaml"
DEFAULT_PARTITIONS = ROOT.parent / "shared" / "reference-partitions" / "fedaux-cora-disjoint-10"
#: What torch's warn-only determinism says of an op without a deterministic version.
NONDETERMINISTIC = re.compile(r"^(\S+) does not have a deterministic implementation")


def short_run_keys(algorithm: str, rounds: int) -> dict[str, Any]:
    """Keys an algorithm needs to be scored within ``rounds``: AdaFGL's step 1 shortened so
    that its step 2 runs (it refuses otherwise), FedSage+'s generator rounds (unscored,
    20 by default) cut to half the run."""
    return {"adafgl": {"adafgl-rounds-step1": max(1, rounds - 2)},
            "fedsage": {"fedsage-gen-rounds": max(1, rounds // 2)}}.get(algorithm, {})


def extra_keys(args: argparse.Namespace) -> dict[str, str]:
    """``--set KEY=VALUE ...`` as run-config overrides (typed when the config resolves)."""
    return dict(kv.split("=", 1) for kv in args.set)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def median_round_s(rounds: list[dict[str, Any]]) -> float:
    """Median s/round over rounds 2..R (round 1 builds the trainers)."""
    times = [r["times"]["round"] for r in rounds]
    return statistics.median(times[1:] if len(times) > 1 else times)


class Check:
    """The run's record: every part's rows, written out after each one."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()
        cuda = torch.cuda.is_available()
        self.record: dict[str, Any] = {
            "benchmark": "gpu_check", "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "cpu_cores": os.cpu_count(),
            "cpu_threads": torch.get_num_threads(), "budget_s": args.budget_s,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "parts": {}}

    def left_s(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def save(self) -> None:
        self.record["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        (self.out / "gpu_check.json").write_text(json.dumps(self.record, indent=1) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.record))


def rows_within(check: Check, part: str, names: list[str], budget: float
                ) -> Iterator[dict[str, Any]]:
    """A row per name in the part's record (``check.record["parts"][part]["rows"]``), each
    handed out while the part's ``budget`` lasts (the rest say so), then printed and saved."""
    rows = check.record["parts"][part]["rows"]
    deadline = time.perf_counter() + budget
    for name in names:
        row: dict[str, Any] = {"algorithm": name}
        rows.append(row)
        if time.perf_counter() > deadline:
            row["error"] = "not run: the part's time was spent"
        else:
            yield row
        shown = {k: v for k, v in row.items() if k != "traceback"}
        print(f"gpu_check {part}: {json.dumps(shown)}", flush=True)
        check.save()


# --- part 1: every algorithm, the device against the CPU ----------------------------------
def run_in_process(overrides: dict[str, Any], syncs: bool = False) -> dict[str, Any]:
    """One in-process federation (no files); its rounds, final figures, s/round, peak GPU
    memory, the ops torch named as nondeterministic, and on CUDA with ``syncs`` the host
    round trips (torch's sync debug mode: each warns where it is made; the run is slower,
    so its s/round is not the device's)."""
    import torch

    from fedgraph_flwr.engine.loop import run_federation

    cuda = str(overrides.get("device", "")).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if syncs:  # every op that waits for the GPU (a host round trip) warns, with its line
            torch.cuda.set_sync_debug_mode("warn")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("always")
            res = run_federation(overrides, write=False)
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    wall = time.perf_counter() - t0
    ops = sorted({m.group(1) for w in caught if (m := NONDETERMINISTIC.match(str(w.message)))})
    sites = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                if "synchronizing CUDA operation" in str(w.message))
    rounds = max(1, len(res["rounds"]))
    return {"rounds": res["rounds"], "final": res["final"], "wall_s": round(wall, 2),
            "s_per_round": round(median_round_s(res["rounds"]), 4),
            "devices": sorted({c["device"] for c in res["clients"].values()}),
            "peak_gpu_mib": (round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda
                             else None),
            "nondeterministic_ops": ops,
            "host_syncs_per_round": round(sum(sites.values()) / rounds, 1) if cuda else None,
            "sync_sites": [f"{site} ×{n}" for site, n in sites.most_common(5)]}


def compare(device_run: dict[str, Any], cpu_run: dict[str, Any]) -> dict[str, Any]:
    """Largest per-round differences (test in points, loss absolute) and the final figures."""
    def column(run: dict[str, Any], key: str) -> list[float]:
        return [float(r.get(key, float("nan"))) for r in run["rounds"]]

    def largest(key: str, scale: float) -> float:
        pairs = zip(column(device_run, key), column(cpu_run, key))
        gaps = [abs(a - b) * scale for a, b in pairs if a == a and b == b]
        return round(max(gaps), 4) if gaps else float("nan")

    return {"max_round_test_diff_pp": largest("mean_test", 100.0),
            "max_round_loss_diff": largest("mean_train_loss", 1.0),
            "final_test_device": round(device_run["final"]["test_at_best_val"], 2),
            "final_test_cpu": round(cpu_run["final"]["test_at_best_val"], 2)}


def part_algorithms(check: Check, budget: float) -> None:
    from fedgraph_flwr.algorithms import ALGORITHMS

    args = check.args
    names = args.algorithms or [*FIRST, *sorted(set(ALGORITHMS) - set(FIRST))]
    check.record["parts"]["algorithms"] = {
        "dataset": args.dataset, "clients": args.clients, "rounds": args.rounds, "rows": []}
    base = {"dataset": args.dataset, "num-clients": args.clients, "rounds": args.rounds,
            "seed": 0, "data-root": args.data_root, "round-timeout": 1800.0,
            **extra_keys(args)}
    for row in rows_within(check, "algorithms", names, budget):
        name = row["algorithm"]
        try:
            keys = {**base, **short_run_keys(name, args.rounds), "algorithm": name}
            on_device = run_in_process({**keys, "device": args.device}, syncs=args.syncs)
            row.update(device_s_per_round=on_device["s_per_round"], device_wall_s=on_device["wall_s"],
                       devices=on_device["devices"], peak_gpu_mib=on_device["peak_gpu_mib"],
                       nondeterministic_ops=on_device["nondeterministic_ops"])
            if args.syncs:
                row.update(host_syncs_per_round=on_device["host_syncs_per_round"],
                           sync_sites=on_device["sync_sites"])
            if not args.no_cpu_reference:
                on_cpu = run_in_process({**keys, "device": "cpu"})
                row.update(cpu_s_per_round=on_cpu["s_per_round"], cpu_wall_s=on_cpu["wall_s"],
                           **compare(on_device, on_cpu))
            else:
                row["final_test_device"] = round(on_device["final"]["test_at_best_val"], 2)
        except Exception as exc:  # noqa: BLE001 - one algorithm's failure is a finding
            row["error"] = one_line(exc)
            row["traceback"] = traceback.format_exc(limit=-4)


# --- parts 2 and 5: a real Flower deployment on this machine ------------------------------
def deployment_round(check: Check, algorithm: str, device: str) -> dict[str, Any]:
    """``benchmarks/deploy_round.py`` for ``algorithm`` with ``device``: its JSON row."""
    sys.path.insert(0, str(HERE))
    import deploy_round

    args = check.args
    rounds = max(2, args.flower_rounds)
    keys = [f'device="{device}"', *args.set]
    hidden = 256  # FedAux: the defaults
    if algorithm == "fediih":  # its Cora-10 config's training keys (the files are the partition)
        from fedgraph_flwr.config import all_defaults, app_config_defaults

        settings = yaml.safe_load(FEDIIH_CORA_10.read_text())
        hidden = settings.pop("hidden")
        # A reproduction-profile switch is not in pyproject's block, so --run-config cannot
        # carry it (Flower refuses the key); the file's are at their defaults (fediih-mode=code).
        defaults = all_defaults()
        switches = set(defaults) - set(app_config_defaults())
        changed = {k: v for k, v in settings.items() if k in switches and v != defaults[k]}
        if changed:
            raise ValueError(f"{FEDIIH_CORA_10} sets profile switches {changed}: use a config-file")
        keys += [f"{k}={json.dumps(v)}" for k, v in settings.items()
                 if k not in ("algorithm", "dataset", "num-clients", "partition", "rounds", "seed")
                 and k not in switches]
    argv = ["--partitions", str(args.partitions), "--clients", str(args.clients),
            "--rounds", str(rounds), "--algorithm", algorithm, "--hidden", str(hidden),
            "--set", *keys]
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = deploy_round.main(argv)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("{")]
    if code != 0 or not lines:
        raise RuntimeError(f"deploy_round exited {code}: {out.getvalue().strip()[-300:]}")
    row = json.loads(lines[-1])
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def part_deployment(check: Check, part: str, device: str, budget: float) -> None:
    check.record["parts"][part] = {"clients": check.args.clients, "device": device, "rows": []}
    for row in rows_within(check, part, ["fedaux", "fediih"], budget):
        try:
            row.update(deployment_round(check, row["algorithm"], device))
        except Exception as exc:  # noqa: BLE001
            row["error"] = one_line(exc)


# --- part 3: a Flower simulation (Ray) with the ClientApps sharing the device ----------------
def part_simulation(check: Check, budget: float) -> None:
    """Cora-``--clients`` FedAux and FedIIH as Flower simulations
    (:func:`fedgraph_flwr.experiments.run_flower_cell`: Ray, each ClientApp one CPU and
    1/K of the GPU unless ``device=cpu``), so all K share the GPU at once."""
    import tempfile

    from fedgraph_flwr.experiments import run_flower_cell

    args = check.args
    k = args.clients
    check.record["parts"]["simulation"] = {
        "clients": k, "device": args.device,
        "gpus_per_clientapp": 1.0 / k if args.device.startswith("cuda") else 0.0, "rows": []}
    out = Path(tempfile.mkdtemp(prefix="gpu-check-sim-"))
    for row in rows_within(check, "simulation", ["fedaux", "fediih"], budget):
        algorithm = row["algorithm"]
        overrides = {"algorithm": algorithm, "dataset": args.dataset, "num-clients": k,
                     "rounds": max(2, args.flower_rounds), "device": args.device,
                     "data-root": args.data_root, "output-dir": str(out), "run-name": algorithm,
                     "round-timeout": 600.0, **extra_keys(args)}
        if algorithm == "fediih":
            overrides["config-file"] = str(FEDIIH_CORA_10)
        try:
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                run_flower_cell(overrides, num_cpus=os.cpu_count() or 1)
            res = json.loads((out / algorithm / "results.json").read_text())
            times = [r["times"]["round"] for r in res["rounds"]]
            row.update(round_s_median=round(median_round_s(res["rounds"]), 3),
                       round_s_min=round(min(times[1:] or times), 3),
                       round_s_max=round(max(times[1:] or times), 3), round1_s=round(times[0], 3),
                       devices=sorted({c["device"] for c in res["clients"].values()}),
                       failures=sum(len(r["failures"]) for r in res["rounds"]),
                       wall_s=round(time.perf_counter() - t0, 1))
        except Exception as exc:  # noqa: BLE001
            row["error"] = one_line(exc)


# --- part 4: arxiv size ---------------------------------------------------------------------
def part_arxiv(check: Check, budget: float) -> None:
    args = check.args
    check.record["parts"]["arxiv"] = {"dataset": args.arxiv_dataset, "clients": 5,
                                      "rounds": args.arxiv_rounds, "rows": []}
    for row in rows_within(check, "arxiv", ["fedaux", "fediih"], budget):
        algorithm = row["algorithm"]
        overrides = {"config-file": str(ROOT / "configs" / "scale" / f"{algorithm}-synthetic-arxiv.yaml"),
                     "dataset": args.arxiv_dataset, "num-clients": 5, "rounds": args.arxiv_rounds,
                     "data-root": args.data_root, "device": args.device,
                     "client-state-dir": str(Path(args.data_root) / "client-state" / algorithm),
                     **extra_keys(args)}
        try:
            run = run_in_process(overrides)
            times = [r["times"]["round"] for r in run["rounds"]]
            row.update(s_per_round=run["s_per_round"], first_round_s=round(times[0], 2),
                       wall_s=run["wall_s"], peak_gpu_mib=run["peak_gpu_mib"],
                       devices=run["devices"],
                       projected_100_rounds_s=round(run["wall_s"] - sum(times) + times[0]
                                                    + 99 * run["s_per_round"], 1),
                       final_test=round(run["final"]["test_at_best_val"], 2))
        except Exception as exc:  # noqa: BLE001
            row["error"] = one_line(exc)
            row["traceback"] = traceback.format_exc(limit=-4)


# --- the tables --------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def _table(header: list[str], keys: list[str], rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['algorithm']} | " + row["error"].replace("|", "/")
                         + " |" * (len(header) - 1))
        else:
            lines.append("| " + " | ".join(_cell(row.get(k)) for k in keys) + " |")
    return lines


def markdown(record: dict[str, Any]) -> str:
    head = (f"gpu_check: device {record['device']} ({record['gpu'] or 'no GPU'}), torch "
            f"{record['torch']} (CUDA {record['cuda']}), {record['cpu_cores']} CPU cores, "
            f"{record.get('elapsed_s', 0)} s of a {record['budget_s']} s budget, "
            f"started {record['started']}")
    out = [head, ""]
    parts = record["parts"]
    if "algorithms" in parts:
        p = parts["algorithms"]
        out += [f"**Every algorithm**, {p['dataset']} METIS-{p['clients']}, {p['rounds']} rounds, "
                "seed 0, in process: on the device, then on the CPU.", ""]
        out += _table(["algorithm", "device", "s/round (device)", "s/round (CPU)",
                       "max Δ test per round (pp)", "max Δ loss per round",
                       "test @ best val, device / CPU (%)", "peak GPU MiB",
                       "nondeterministic ops"],
                      ["algorithm", "devices", "device_s_per_round", "cpu_s_per_round",
                       "max_round_test_diff_pp", "max_round_loss_diff", "finals", "peak_gpu_mib",
                       "nondeterministic_ops"],
                      [{**r, "finals": f"{r.get('final_test_device')} / {r.get('final_test_cpu')}"}
                       for r in p["rows"]])
        synced = [r for r in p["rows"] if r.get("sync_sites") is not None]
        if synced:
            out += ["", "Host round trips on the device (torch's sync debug mode), per round:", ""]
            out += _table(["algorithm", "syncs per round", "where most are made"],
                          ["algorithm", "host_syncs_per_round", "sync_sites"], synced)
        out.append("")
    for part, what in (("flower", "A Flower deployment on 127.0.0.1 (SuperLink + SuperNodes, no Ray)"),
                       ("simulation", "A Flower simulation (Ray), the ClientApps sharing the device"),
                       ("cpu-cores", "The deployment with every ClientApp on the CPU")):
        if part in parts:
            p = parts[part]
            out += [f"**{what}**, {p['clients']} clients, device {p['device']}.", ""]
            out += _table(["algorithm", "s/round (median)", "min", "max", "round 1 s",
                           "slowest client's compute s"],
                          ["algorithm", "round_s_median", "round_s_min", "round_s_max",
                           "round1_s", "slowest_client_compute_s_median"], p["rows"])
            out.append("")
    if "arxiv" in parts:
        p = parts["arxiv"]
        out += [f"**{p['dataset']}**, 5 METIS clients, {p['rounds']} rounds, in process, "
                "client-state=file.", ""]
        out += _table(["algorithm", "s/round (median)", "round 1 s", "peak GPU MiB",
                       "projected 100 rounds (s)", "test @ best val (%)"],
                      ["algorithm", "s_per_round", "first_round_s", "peak_gpu_mib",
                       "projected_100_rounds_s", "final_test"], p["rows"])
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--data-root", required=True, help="datasets (raw); the partition cache is "
                    "written here")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default cuda)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="seconds for all parts (default 480: an 8-minute slot)")
    ap.add_argument("--algorithms", nargs="+", help="part 1: these only (default: every "
                    "registered one, FedAux, FedIIH and FedSpray first)")
    ap.add_argument("--dataset", default="Cora")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-cpu-reference", action="store_true",
                    help="part 1: the device run only")
    ap.add_argument("--deterministic", action="store_true",
                    help="part 1 under torch.use_deterministic_algorithms(True, "
                    "warn_only=True): ops without a deterministic version are named, not "
                    "refused")
    ap.add_argument("--syncs", action="store_true",
                    help="part 1 on CUDA: count the host round trips (torch's sync debug "
                    "mode) and name the 5 lines making most; slows the device runs")
    ap.add_argument("--partitions", type=Path, default=DEFAULT_PARTITIONS,
                    help="parts 2 and 4: folder of client_<i>.npz")
    ap.add_argument("--flower-rounds", type=int, default=6)
    ap.add_argument("--arxiv-dataset", default="Synthetic-arxiv")
    ap.add_argument("--arxiv-rounds", type=int, default=10)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more run-config keys for every run")
    args = ap.parse_args(argv)
    if args.deterministic:
        # cuBLAS needs this before CUDA starts to be deterministic (torch's docs).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    from fedgraph_flwr.config import ConfigError
    from fedgraph_flwr.engine.client_runtime import pick_device

    try:
        pick_device(args.device)  # a GPU that is not here: one line, before anything runs
    except ConfigError as exc:
        ap.error(str(exc))
    check = Check(args)
    check.record.update(deterministic=args.deterministic, syncs=args.syncs)
    shares = {"algorithms": 0.5, "flower": 0.15, "simulation": 0.15, "arxiv": 0.25,
              "cpu-cores": 0.1}
    chosen = [p for p in PARTS if p in args.parts]
    for i, part in enumerate(chosen):
        rest = sum(shares[p] for p in chosen[i:])
        budget = max(0.0, check.left_s()) * shares[part] / rest
        print(f"gpu_check: part {part}, {budget:.0f} s", flush=True)
        if part == "algorithms":
            # Part 1 only: the deterministic versions are slower, and parts 2-4 time things.
            torch.use_deterministic_algorithms(args.deterministic, warn_only=True)
            part_algorithms(check, budget)
            torch.use_deterministic_algorithms(False)
        elif part == "flower":
            part_deployment(check, "flower", args.device, budget)
        elif part == "simulation":
            part_simulation(check, budget)
        elif part == "arxiv":
            part_arxiv(check, budget)
        else:
            part_deployment(check, "cpu-cores", "cpu", budget)
        check.save()
    print(markdown(check.record))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # A Flower simulation whose Ray runtime crashed leaves threads that keep the interpreter
    # alive, which on a GPU slot would burn its minutes: everything is written by now.
    os._exit(code)
