"""Hostile clients (issue #76): honest clients' accuracy when some clients attack, per
method and ``robust`` aggregation option, beside the clean run.

    OMP_NUM_THREADS=1 python benchmarks/hostile_clients.py --data-root DATA \
        [--methods fedavg fedaux fediih fedpub] [--robust none krum ...] \
        [--attacks scale-10 ...] [--hostile 1 3] [--seeds 0] [--rounds 50] \
        [--out docs/results/robustness/hostile-clients.jsonl] [--set KEY=VALUE ...]
    python benchmarks/hostile_clients.py --table [--out ...] [--doc docs/results/robustness.md]
    python benchmarks/hostile_clients.py --cost --data-root DATA [...]   # clean runs only

Every run is a whole federation in process (the ClientApps' own code, the round driver,
the reply validation and the aggregator of the product; :class:`hostile_attacks.HostileTransport`
turns the chosen clients hostile: ``benchmarks/hostile_attacks.py`` says what each attack
does). Cora, 10 METIS clients, each method with its Cora-10 settings
(``configs/paper/comparison-cora-10.yaml``, FedIIH ``configs/fediih/cora-disjoint-10.yaml``)
but ``--rounds`` rounds. The hostile clients are the ``--hostile`` clients with the largest
training sets (they weigh most in FedAvg); on Cora-10 (pymetis) client 7 (75 training
nodes), then 3 (53) and 6 (52).

The grid: methods × ``--robust`` options × (the clean run + ``--attacks`` × ``--hostile``)
× seeds. A ``--robust`` value is an option name, optionally with auxiliary keys:
``krum:robust-malicious=3,robust-trim-beta=0.1``; ``none`` passes no ``robust`` key at
all. Each finished run is one JSON line appended to ``--out``; a run already there is
skipped (the runs resume). An exception inside a run is that run's result ("ended
early", with its one-line reason), never the grid's end.

Honest clients' accuracy: the headline protocol (``held``: mean test accuracy of the held
models at the round of best mean validation accuracy, engine/protocols.py) taken over the
honest clients only, in the attacked run and in the clean run alike (the clean run holds it
for every count of hostile clients). The difference is to the clean run with
``robust=none`` of the same method and seed: what the honest clients would have had in a
federation without attackers and without a robust rule.

``--table`` writes the tables of ``--doc`` (between its markers) from ``--out``; ``--cost``
runs the clean runs only (the seconds per round of the aggregation and of the whole round
per option are read from them; the table's cost section).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # hostile_attacks beside this file (benchmarks/ is no package)

from hostile_attacks import ATTACKS, HostileTransport, hostile_ids  # noqa: E402

METHODS: dict[str, dict[str, Any]] = {
    "fedavg": {"algorithm": "fedavg", "hidden": 128, "lr": 0.01, "weight-decay": 1e-6,
               "dropout": 0.5},
    "fedaux": {"algorithm": "fedaux", "hidden": 256, "lr": 0.01, "weight-decay": 1e-6,
               "dropout": 0.5},
    "fediih": {"config-file": str(ROOT / "configs" / "fediih" / "cora-disjoint-10.yaml")},
    "fedpub": {"algorithm": "fedpub", "hidden": 128, "lr": 0.01, "weight-decay": 1e-6,
               "dropout": 0.5},
}
BASE: dict[str, Any] = {"dataset": "Cora", "partition": "metis", "num-clients": 10,
                        "local-epochs": 1, "verbose": False}
ROBUST = ("none", "norm-bound", "trimmed-mean", "median", "krum", "multi-krum", "bulyan")
CLEAN = "clean"
#: The goal (issue #76): honest clients within this many points of clean, per hostile count.
TOLERANCE = {1: 2.0, 3: 5.0}
DOC_BEGIN = "<!-- hostile-clients tables: begin -->"
DOC_END = "<!-- hostile-clients tables: end -->"
DEFAULT_ROUNDS = 50
DEFAULT_OUT = ROOT / "docs" / "results" / "robustness" / "hostile-clients.jsonl"
DEFAULT_DOC = ROOT / "docs" / "results" / "robustness.md"


# --- the cells -------------------------------------------------------------------------------
def parse_robust(spec: str) -> dict[str, Any]:
    """A ``--robust`` value as run-config overrides: ``none`` -> {} (no key passed),
    ``krum:robust-malicious=3,robust-trim-beta=0.1`` -> those keys and ``robust=krum``."""
    name, _, extra = spec.partition(":")
    if not name:
        raise ValueError(f"--robust {spec!r}: no option name")
    keys = dict(parse_setting(kv) for kv in extra.split(",") if kv)
    if name == "none":
        if keys:
            raise ValueError(f"--robust {spec!r}: robust=none takes no auxiliary keys")
        return {}
    return {"robust": name, **keys}


def parse_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as YAML (3 -> int, 0.1 -> float, true -> bool)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r} is not KEY=VALUE")
    return key.strip(), yaml.safe_load(value)


@dataclass(frozen=True)
class Cell:
    """One run of the grid. ``attack`` is :data:`CLEAN` (then ``hostile`` = 0) or an attack name."""

    method: str
    robust: str
    attack: str
    hostile: int
    seed: int
    rounds: int
    settings: tuple[tuple[str, Any], ...] = ()  # --set, sorted

    def key(self) -> str:
        """What identifies the run in the results file."""
        return json.dumps([self.method, self.robust, self.attack, self.hostile, self.seed,
                           self.rounds, [list(kv) for kv in self.settings]])

    def overrides(self, data_root: str, output_dir: str) -> dict[str, Any]:
        """The run-config overrides of this run."""
        return {**BASE, **METHODS[self.method], "rounds": self.rounds, "seed": self.seed,
                "data-root": data_root, "output-dir": output_dir,
                "run-name": f"hostile-{self.method}", **dict(self.settings),
                **parse_robust(self.robust)}


def grid(methods: Sequence[str], robust: Sequence[str], attacks: Sequence[str],
         hostile: Sequence[int], seeds: Sequence[int], rounds: int,
         settings: Sequence[tuple[str, Any]] = ()) -> Iterator[Cell]:
    """Seed by seed, method by method, option by option: the clean run, then each attack
    with each count of hostile clients."""
    fixed = tuple(sorted(settings))
    for seed in seeds:
        for method in methods:
            for spec in robust:
                yield Cell(method, spec, CLEAN, 0, seed, rounds, fixed)
                for attack in attacks:
                    for count in hostile:
                        yield Cell(method, spec, attack, count, seed, rounds, fixed)


# --- one run ---------------------------------------------------------------------------------
def honest_figures(rounds: list[Any], honest: list[int], metric: str, num_classes: int
                   ) -> dict[str, Any]:
    """The headline protocol over the honest clients only: test accuracy (%) at the round
    of best honest mean validation accuracy, that round, and the honest held models' mean
    test accuracy after the last round."""
    from fedgraph_flwr.engine import protocols

    kept = [dataclasses.replace(r, clients={c: m for c, m in r.clients.items() if c in honest})
            for r in rounds]
    held = protocols.held_at_best_val(kept, honest, metric, num_classes)
    last = protocols.held_means(kept, honest)[kept[-1].round][1] if kept else math.nan
    return {"test_at_best_val": held["test_at_best_val"], "best_round": held["best_round"],
            "last_test": 100 * last}


def test_by_round(rounds: list[Any], clients: list[int]) -> list[float | None]:
    """Per round, the mean test accuracy (%) of ``clients``' held models (None before each
    has reported): the run's trajectory."""
    from fedgraph_flwr.engine import protocols

    kept = [dataclasses.replace(r, clients={c: m for c, m in r.clients.items() if c in clients})
            for r in rounds]
    means = protocols.held_means(kept, clients)
    return [None if math.isnan(means[r.round][1]) else round(100 * means[r.round][1], 2)
            for r in kept]


def normalise_reason(reason: str) -> str:
    """A failure's reason with names and numbers masked, so that the same check on other
    arrays or sizes counts as one reason."""
    reason = re.sub(r"'[^']*'", "'…'", reason.splitlines()[0] if reason else "")
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", reason)[:160]


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_cell(cell: Cell, data_root: str, log: Any = None) -> dict[str, Any]:
    """Run one cell in process; its results line (nothing else written)."""
    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.driver import RoundDriver

    attack = None if cell.attack == CLEAN else ATTACKS[cell.attack]
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        # a ConfigError here is the harness's (a key this version lacks): it stops the grid
        config = resolve_config(None, cell.overrides(data_root, tmp))
        transport = HostileTransport(attack, cell.hostile)
        driver = RoundDriver(config, transport, log=log, write=False)
        ended = None
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            driver.run()
        except Exception as exc:  # noqa: BLE001 - an attack that ends a run is a result
            if driver.federation is None:
                raise  # before the first round: the harness's or the data's, not an attack's
            ended = f"round {len(driver.federation.rounds) + 1}: {one_line(exc)}"
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    fed = driver.federation
    assert fed is not None
    rounds = fed.rounds
    facts = fed.roster.facts
    line: dict[str, Any] = {
        **dataclasses.asdict(cell), "settings": dict(cell.settings),
        "rounds_done": len(rounds), "ended": ended, "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu, 3),
        "round_s": median([r.times.get("round", math.nan) for r in rounds]),
        "aggregate_s": median([r.times.get("aggregate", math.nan) for r in rounds]),
        "num_train": {str(c): int(f["num-train"]) for c, f in facts.items()},
    }
    metric, classes = config.metric, fed.num_classes
    if attack is None:
        line["all_clients"] = honest_figures(rounds, list(facts), metric, classes)
        line["test_by_round"] = test_by_round(rounds, list(facts))  # all clients
        line["honest"] = {str(h): honest_figures(rounds, honest_of(facts, h), metric, classes)
                          for h in range(1, len(facts) // 2 + 1)}
    else:
        hostile = transport.hostile
        honest = [c for c in facts if c not in hostile]
        line.update(hostile_ids=hostile, victim=transport.victim, mutated=transport.mutated)
        line["honest"] = honest_figures(rounds, honest, metric, classes)
        line["test_by_round"] = test_by_round(rounds, honest)  # the honest clients
        line["attacker_accepted"] = sum(c in r.clients for r in rounds for c in hostile)
        line["attacker_failures"] = reasons(rounds, hostile)
        line["honest_failures"] = reasons(rounds, honest)
    return line


def honest_of(facts: dict[int, dict[str, Any]], count: int) -> list[int]:
    hostile = hostile_ids(facts, count)
    return [c for c in facts if c not in hostile]


def reasons(rounds: list[Any], clients: Iterable[int]) -> dict[str, int]:
    """How often each (normalised) failure reason struck ``clients``, over the rounds."""
    wanted = set(clients)
    out: dict[str, int] = defaultdict(int)
    for r in rounds:
        for cid, reason in r.failures.items():
            if cid in wanted:
                out[normalise_reason(reason)] += 1
    return dict(sorted(out.items()))


def median(values: Sequence[float]) -> float | None:
    kept = [v for v in values if not math.isnan(v)]
    return round(statistics.median(kept), 6) if kept else None


# --- the results file ------------------------------------------------------------------------
def load_results(path: Path) -> dict[str, dict[str, Any]]:
    """The finished runs of ``path`` by :meth:`Cell.key` (a torn last line is ignored)."""
    out: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return out
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        out[cell_of(line).key()] = line
    return out


def cell_of(line: dict[str, Any]) -> Cell:
    return Cell(line["method"], line["robust"], line["attack"], int(line["hostile"]),
                int(line["seed"]), int(line["rounds"]), tuple(sorted(line["settings"].items())))


def append_result(path: Path, line: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(line, default=float) + "\n")


# --- the tables ------------------------------------------------------------------------------
def mean_std(values: Sequence[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def signed(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


#: The two honest figures the tables show: the headline protocol's, and after the last round.
FIGURES = {"test_at_best_val": "best-val", "last_test": "last"}


def honest_value(line: dict[str, Any], count: int, figure: str) -> float:
    """A run's honest figure for ``count`` hostile clients (a clean run holds every count)."""
    honest = line["honest"][str(count)] if line["attack"] == CLEAN else line["honest"]
    value = honest[figure]
    return math.nan if value is None else float(value)


class Tables:
    """The results lines, grouped; the markdown tables of :func:`table`."""

    def __init__(self, lines: Sequence[dict[str, Any]]) -> None:
        self.lines = list(lines)
        self.by: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for line in lines:
            self.by[(line["method"], line["robust"], line["attack"], line["hostile"])].append(line)
        keys = list(self.by)
        self.methods = ordered([k[0] for k in keys], METHODS)
        self.options = ordered([k[1] for k in keys], ROBUST)
        self.attacks = [a for a in ATTACKS if any(k[2] == a for k in keys)]
        self.counts = sorted({k[3] for k in keys if k[3]})

    def clean_none(self, method: str, seed: int, count: int, figure: str) -> float | None:
        """Clean ``robust=none``'s honest figure for this method, seed and hostile count."""
        for line in self.by[(method, "none", CLEAN, 0)]:
            if line["seed"] == seed:
                return honest_value(line, count, figure)
        return None

    def diffs(self, cell_lines: Sequence[dict[str, Any]], count: int, figure: str) -> list[float]:
        """Per seed, the honest figure minus clean robust=none's (seeds without one left out)."""
        out = []
        for line in cell_lines:
            ref = self.clean_none(line["method"], line["seed"], count, figure)
            value = honest_value(line, count, figure)
            if ref is not None and not math.isnan(value) and not math.isnan(ref):
                out.append(value - ref)
        return out

    def figure(self, cell_lines: Sequence[dict[str, Any]], count: int, figure: str
               ) -> tuple[str, float | None]:
        """"mean ± std (difference)" over the seeds, and the mean difference."""
        text = mean_std([honest_value(line, count, figure) for line in cell_lines])
        diffs = self.diffs(cell_lines, count, figure)
        if not diffs:
            return text, None
        mean = statistics.mean(diffs)
        return f"{text} ({signed(mean)})", mean

    def accuracy(self, method: str, count: int) -> list[str]:
        """One method and hostile count: a row per attack, a column per option."""
        tol = TOLERANCE.get(count)
        out = [f"**{method}, {count} hostile of 10**", "",
               "| attack | " + " | ".join(f"`{o}`" for o in self.options) + " |",
               "|---|" + "---|" * len(self.options)]
        met = {(o, f): True for o in self.options for f in FIGURES}
        ran = dict.fromkeys(self.options, 0)
        for attack in [CLEAN, *self.attacks]:
            row = [attack]
            for o in self.options:
                cell_lines = self.by[(method, o, attack, 0 if attack == CLEAN else count)]
                if not cell_lines:
                    row.append("—")
                    met.update({(o, f): False for f in FIGURES})
                    continue
                ended = any(line["ended"] for line in cell_lines)
                lost = any(line.get("honest_failures") for line in cell_lines)
                parts = []
                for f, label in FIGURES.items():
                    text, diff = self.figure(cell_lines, count, f)
                    parts.append(text if f == "test_at_best_val" else f"{label} {text}")
                    if ended or lost or diff is None or (tol is not None and diff < -tol):
                        met[(o, f)] = False
                if attack != CLEAN:
                    ran[o] += 1
                row.append("; ".join(parts) + (" †" if ended else "") + (" ‡" if lost else ""))
            out.append("| " + " | ".join(row) + " |")
        if tol is not None:
            total = len(self.attacks)
            for f, label in FIGURES.items():
                verdicts = [("yes" if met[(o, f)] else "no")
                            + ("" if ran[o] == total else f" ({ran[o]}/{total} run)")
                            for o in self.options]
                out.append(f"| **{label}: within {tol:g}, none ended, no honest reply lost** | "
                           + " | ".join(verdicts) + " |")
        return out + [""]


def ordered(names: Iterable[str], order: Iterable[str]) -> list[str]:
    """``names`` once each: those of ``order`` first, in its order, then the rest sorted."""
    present = set(names)
    first = [n for n in order if n in present]
    return first + sorted(present - set(first))


def table(lines: Sequence[dict[str, Any]]) -> str:
    """The markdown block (markers included): per method and hostile count, honest
    accuracy per attack and option beside clean robust=none; whether the goal is met; what
    the server did with the attackers' replies; the cost of each option without attackers."""
    t = Tables(lines)
    rounds = sorted({line["rounds"] for line in lines})
    seeds = sorted({line["seed"] for line in lines})
    commands = sorted({line.get("command", "?") for line in lines})
    out = [DOC_BEGIN, "", f"Written by `python benchmarks/hostile_clients.py --table` from "
           f"{len(lines)} runs ({', '.join(map(str, rounds))} rounds, seeds "
           f"{', '.join(map(str, seeds))}), made by:", "", *(f"    {c}" for c in commands), "",
           "Each cell: the honest clients' test accuracy (%) under the headline protocol "
           "(held models at the round of best honest mean validation accuracy), then `last`: "
           "their held models' mean test accuracy after the last round; in brackets the "
           "difference to the clean run with `robust=none` (same method, seed and honest "
           "clients); mean ± std over seeds; † a run ended early, ‡ honest clients' replies "
           "were rejected (their held models then keep their last figures; table below). Goal "
           "rows: every attack's mean difference within the tolerance, no run ended and no "
           "honest client's reply rejected.", ""]
    for method in t.methods:
        for count in t.counts:
            out += t.accuracy(method, count)
    out += events(lines, t.attacks, t.counts)
    out += costs(t.by, t.methods, t.options)
    out += [DOC_END]
    return "\n".join(out) + "\n"


def events(lines: Sequence[dict[str, Any]], attacks: Sequence[str], counts: Sequence[int]
           ) -> list[str]:
    """Per attack and hostile count, over methods, options and seeds: runs ended early
    (why), the attackers' replies rejected (why) and accepted, honest clients' failures."""
    out = ["**What the server did with the attackers' replies**, per attack and hostile "
           "count over every method, option and seed (replies: one per hostile client and "
           "round; reasons with names and numbers masked as … and N):", "",
           "| attack | hostile | runs | ended early (why) | attackers' replies rejected "
           "(why) | accepted | honest clients' failures |", "|---|---|---|---|---|---|---|"]
    for attack in attacks:
        for count in counts:
            group = [ln for ln in lines if ln["attack"] == attack and ln["hostile"] == count]
            if not group:
                continue
            ended: dict[str, list[str]] = defaultdict(list)
            for ln in group:
                if ln["ended"]:
                    why = normalise_reason(ln["ended"].split(": ", 1)[1])
                    ended[why].append(f"{ln['method']}/{ln['robust']}")
            rejected: dict[str, int] = defaultdict(int)
            honest: dict[str, int] = defaultdict(int)
            for ln in group:
                for why, n in ln["attacker_failures"].items():
                    rejected[why] += n
                for why, n in ln["honest_failures"].items():
                    honest[why] += n
            mutated = sum(ln["mutated"] for ln in group)
            out.append("| " + " | ".join([
                attack, str(count), str(len(group)),
                "; ".join(f"{len(set(w))}× {why} ({', '.join(sorted(set(w))[:4])}"
                          + (", …" if len(set(w)) > 4 else "") + ")"
                          for why, w in sorted(ended.items())) or "none",
                "; ".join(f"{n}× {why}" for why, n in sorted(rejected.items())) or "none",
                f"{sum(ln['attacker_accepted'] for ln in group)} of {mutated}"
                if mutated else str(sum(ln["attacker_accepted"] for ln in group)),
                "; ".join(f"{n}× {why}" for why, n in sorted(honest.items())) or "none",
            ]) + " |")
    return out + [""]


def costs(by: dict[tuple, list[dict[str, Any]]], methods: Sequence[str],
          options: Sequence[str]) -> list[str]:
    """Per method and option, without attackers: all clients' headline accuracy, the
    median seconds of the aggregation and of the whole round (mean over seeds)."""
    out = ["**The cost of each option without attackers** (the clean runs: all clients' "
           "headline test accuracy %; median seconds per round of the aggregation "
           "(`times.aggregate`) and of the whole round, ten clients trained in turn in one "
           "process, one torch thread, on a shared 2-core machine):", "",
           "| method | " + " | ".join(f"`{o}`" for o in options) + " |",
           "|---|" + "---|" * len(options)]
    for method in methods:
        row = [method]
        for o in options:
            cell_lines = by[(method, o, CLEAN, 0)]
            if not cell_lines:
                row.append("—")
                continue
            acc = mean_std([ln["all_clients"]["test_at_best_val"] for ln in cell_lines])
            agg = statistics.mean(ln["aggregate_s"] or math.nan for ln in cell_lines)
            rnd = statistics.mean(ln["round_s"] or math.nan for ln in cell_lines)
            row.append(f"{acc}; {agg:.4f} s; {rnd:.3f} s")
        out.append("| " + " | ".join(row) + " |")
    return out + [""]


def write_doc(doc: Path, block: str) -> None:
    """Replace the block between the markers of ``doc`` (a new file: a title and the block)."""
    from fedgraph_flwr.generated import replace_block

    text = (doc.read_text() if doc.exists()
            else "# Hostile clients (issue #76)\n\n" + DOC_BEGIN + "\n" + DOC_END + "\n")
    new = replace_block(text, DOC_BEGIN, DOC_END, block)
    if new is None:
        raise SystemExit(f"hostile_clients: error: {doc} lacks the markers {DOC_BEGIN} ... {DOC_END}")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new)


# --- main ------------------------------------------------------------------------------------
def commit() -> str:
    """The checkout's commit (``+dirty`` with uncommitted changes), for the results lines."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "fedgraph_flwr", "benchmarks"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data-root", default="", help="a writable data root holding Cora/raw "
                        "(the partition cache goes there)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--robust", nargs="+", default=list(ROBUST),
                        help="robust options, each NAME or NAME:KEY=VALUE,...; none passes no key")
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    parser.add_argument("--hostile", nargs="+", type=int, default=[1, 3],
                        help="counts of hostile clients (of 10)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"rounds per run (default {DEFAULT_ROUNDS}); with --table: the runs "
                             "of this many rounds, where the results file holds several")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config overrides for every run (part of each run's identity)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the results file (JSON lines)")
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--table", action="store_true", help="only write --doc's tables from --out")
    parser.add_argument("--cost", action="store_true", help="only the clean runs (the options' cost)")
    parser.add_argument("--verbose", action="store_true", help="the driver's log lines")
    args = parser.parse_args(argv)
    if args.table:
        lines = list(load_results(args.out).values())
        counts = sorted({line["rounds"] for line in lines})
        if args.rounds is not None:
            lines = [line for line in lines if line["rounds"] == args.rounds]
        elif len(counts) > 1:
            parser.error(f"{args.out} holds runs of {counts} rounds: pick one with --rounds")
        write_doc(args.doc, table(lines))
        print(f"wrote {args.doc} from {len(lines)} runs of {args.out}")
        return 0
    if not args.data_root:
        parser.error("--data-root is required to run")
    try:
        for spec in args.robust:
            parse_robust(spec)
        settings = [parse_setting(s) for s in args.set]
    except ValueError as exc:
        parser.error(str(exc))
    args.rounds = DEFAULT_ROUNDS if args.rounds is None else args.rounds
    if args.rounds < 1 or any(not 0 < h < 10 for h in args.hostile):
        parser.error("--rounds must be >= 1 and each --hostile in 1..9")
    import torch

    from fedgraph_flwr.config import ConfigError

    torch.set_num_threads(args.threads)
    command = "python benchmarks/hostile_clients.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    done = load_results(args.out)
    version = commit()
    cells = list(grid(args.methods, args.robust, [] if args.cost else args.attacks,
                      args.hostile, args.seeds, args.rounds, settings))
    todo = [c for c in cells if c.key() not in done]
    print(f"{len(cells)} runs, {len(cells) - len(todo)} already in {args.out}", flush=True)
    for i, cell in enumerate(todo, 1):
        try:
            line = run_cell(cell, args.data_root, log=print if args.verbose else None)
        except ConfigError as exc:
            print(f"hostile_clients: error: {cell.method} robust={cell.robust}: {exc}",
                  file=sys.stderr)
            return 1
        line.update(command=command, commit=version)
        append_result(args.out, line)
        acc = (line["honest"]["test_at_best_val"] if cell.attack != CLEAN
               else line["all_clients"]["test_at_best_val"])
        who = "all" if cell.attack == CLEAN else "honest"
        print(f"[{i}/{len(todo)}] {cell.method} robust={cell.robust} {cell.attack} "
              f"hostile={cell.hostile} seed={cell.seed}: {who} {acc:.2f}"
              + (f" ENDED {line['ended']}" if line["ended"] else "")
              + f" ({line['seconds']:.1f} s, CPU {line['cpu_seconds']:.1f} s, "
              f"{line['round_s']} s/round)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
