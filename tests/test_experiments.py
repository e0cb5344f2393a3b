"""The experiment runner: grid expansion, resumable cells, tables with ablation cells apart."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from fedgraph_flwr.config import ConfigError, resolve_config
from fedgraph_flwr.experiments import (
    PlainLog,
    best_test_round,
    collect,
    expand,
    load_grid,
    main,
    matching_cell_key,
    run_grid,
    run_name,
    saved_config,
    seed_mean_curve_at_best_val,
    stale_keys,
    write_tables,
)

from conftest import NO_DATASETS


def _spec(tmp_path):
    return {
        "name": "tiny",
        "base": {"dataset": "SBM", "num-clients": 2, "rounds": 2, "hidden": 8,
                 "data-root": str(tmp_path / "data")},
        "grid": [{"algorithm": ["fedavg", "local"]},
                 {"algorithm": "fedaux", "fedaux-server": ["personalized", "average"]}],
        "seeds": [0, 1],
        "paper": {"fedavg|SBM|metis|2": 50.0},
    }


def test_expand_list_of_grids_and_validates_early(tmp_path):
    spec = _spec(tmp_path)
    runs = expand(spec)
    assert [(r["algorithm"], r["seed"]) for r in runs] == [
        ("fedavg", 0), ("fedavg", 1), ("local", 0), ("local", 1),
        ("fedaux", 0), ("fedaux", 1), ("fedaux", 0), ("fedaux", 1)]
    assert runs[-1]["fedaux-server"] == "average" and "fedaux-server" not in runs[0]
    spec["grid"] = {"algorithm": ["fedavg", "nonsense"]}
    with pytest.raises(ConfigError, match="nonsense"):
        expand(spec)


@pytest.mark.slow
def test_run_grid_is_resumable_and_tables_keep_ablations_apart(tmp_path):
    spec = _spec(tmp_path)
    out = run_grid(spec, tmp_path / "exp", None, "inprocess", {})
    results = sorted(out.glob("*/results.json"))
    assert len(results) == 8
    stamps = {p: p.stat().st_mtime_ns for p in results}
    run_grid(spec, tmp_path / "exp", None, "inprocess", {})  # every cell done: nothing reruns
    assert {p: p.stat().st_mtime_ns for p in results} == stamps

    md, path_csv = write_tables(out, dict(spec, **{"plot-x": "seed"}))
    for png in ("curves.png", "by_seed.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {r["cell"]: r for r in csv.DictReader(path_csv.open())}
    # fedaux-server differs between fedaux's runs, so it names those cells; not the others'.
    assert set(rows) == {"fedavg|SBM|metis|2", "local|SBM|metis|2",
                         "fedaux|SBM|metis|2|fedaux-server=personalized",
                         "fedaux|SBM|metis|2|fedaux-server=average"}
    assert all(r["seeds"] == "0,1" for r in rows.values())
    fedavg = rows["fedavg|SBM|metis|2"]
    mean = float(fedavg["test_at_best_val"].split(" ± ")[0])
    assert fedavg["paper"] == "50.00" and float(fedavg["diff"]) == pytest.approx(mean - 50.0, abs=0.01)
    assert "| fedaux\\|SBM\\|metis\\|2\\|fedaux-server=average | 0,1 |" in md.read_text()

    # FedSpray's protocol as the compared figure, its minority accuracy as a column, and
    # the per-client and majority/minority bar charts.
    spec = dict(spec, **{"paper-metric": "pooled_test_at_best_val_loss",
                         "columns": ["pooled_minority_at_best_val_loss"]})
    md, path_csv = write_tables(out, spec)
    rows = {r["cell"]: r for r in csv.DictReader(path_csv.open())}
    results = [json.loads(p.read_text()) for p in out.glob("fedavg-*/results.json")]
    minority = [r["final"]["pooled_minority_at_best_val_loss"] for r in results]
    assert rows["fedavg|SBM|metis|2"]["pooled_minority_at_best_val_loss"].startswith(
        f"{sum(minority) / len(minority):.2f} ± ")
    pooled = sum(r["final"]["pooled_test_at_best_val_loss"] for r in results) / len(results)
    assert float(rows["fedavg|SBM|metis|2"]["diff"]) == pytest.approx(pooled - 50.0, abs=0.01)
    assert "pooled_minority_at_best_val_loss (%)" in md.read_text().splitlines()[0]
    for png in ("per_client.png", "minority.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ConfigError, match="paper-metric"):
        write_tables(out, dict(spec, **{"paper-metric": "best"}))
    with pytest.raises(ConfigError, match="pooled_minorty_at_best_val_loss"):  # a typo
        write_tables(out, dict(spec, columns=["pooled_minorty_at_best_val_loss"]))

    # A results.json written before a config key existed groups with runs that have the
    # key at its default, instead of splitting the cell.
    old_run = results[0]
    path = out / old_run["config"]["run-name"] / "results.json"
    del old_run["config"]["server-mix-dtype"]
    path.write_text(json.dumps(old_run))
    _, path_csv = write_tables(out, spec)
    rows = {r["cell"]: r for r in csv.DictReader(path_csv.open())}
    assert rows["fedavg|SBM|metis|2"]["seeds"] == "0,1"

    # Runs shorter than the grid file plans (run with --set rounds=2) are not compared with
    # the paper's figure, and the report shows the grid as run (its --set and seeds).
    planned_longer = dict(spec, base=dict(spec["base"], rounds=3), set={"rounds": "2"})
    _, path_csv = write_tables(out, planned_longer)
    fedavg = {r["cell"]: r for r in csv.DictReader(path_csv.open())}["fedavg|SBM|metis|2"]
    assert fedavg["paper"] == "not compared: 2 rounds, the paper's 3" and fedavg["diff"] == ""
    html = (out / "report.html").read_text()
    assert "set:" in html and "rounds: &#x27;2&#x27;" in html


@pytest.mark.slow
def test_one_configuration_spelt_twice_runs_and_counts_once(tmp_path, capsys):
    """Sweeps share their default point (a tau sweep's tau=10 is an L sweep's L=5): the
    grid runs it once, and a folder holding it twice (an earlier version ran both, or two
    grids wrote there) reports it once, not as two seeds."""
    spec = {"name": "twice", "base": {"dataset": "SBM", "num-clients": 2, "rounds": 2,
                                       "hidden": 8, "data-root": str(tmp_path / "data")},
            "grid": [{"algorithm": ["fedavg"], "lr": [0.01, 0.02]},
                     {"algorithm": ["fedavg"], "rounds": [2]}],  # lr's default is 0.01
            "seeds": [0]}
    out = run_grid(spec, tmp_path / "exp", None, "inprocess", {})
    assert len(list(out.glob("*/results.json"))) == 2
    assert "the same run as" in capsys.readouterr().out
    first = sorted(out.glob("*/results.json"))[0].parent
    shutil.copytree(first, out / "copy-of-a-run")  # an earlier version's second run of it
    cells = collect(out)
    assert sorted(len(runs) for runs in cells.values()) == [1, 1]
    assert "counted once" in capsys.readouterr().err


def test_a_partly_run_grid_still_finds_its_paper_keys():
    """With only some of a grid's cells run, fewer keys vary, so a cell's name is shorter
    than the paper key written for the whole grid; the key is still found through the
    runs' configs, and only when exactly one key fits."""
    paper = ["fediih|M|metis|10|factors=6|inference=variational|prior=hierarchical",
             "fediih|M|metis|10|factors=6|inference=deterministic|prior=hierarchical",
             "fediih|M|metis|10|factors=1|inference=variational|prior=hierarchical",
             "fediih|M|metis|10|factors=6|inference=variational|prior=standard"]
    full = [{"config": {"factors": 6, "inference": "variational", "prior": "hierarchical"}}]
    assert matching_cell_key(paper[0], full, paper) == paper[0]  # the whole grid ran
    assert matching_cell_key("fediih|M|metis|10|inference=variational", full, paper) == paper[0]
    assert matching_cell_key("fediih|M|metis|10", full, paper) == paper[0]
    assert matching_cell_key("fediih|M|metis|20", full, paper) is None  # another cell
    other = [{"config": {"factors": 6, "inference": "variational", "prior": "uniform"}}]
    assert matching_cell_key("fediih|M|metis|10", other, paper) is None  # no key fits its runs
    both = ["fedaux|M|metis|10|x=1", "fedaux|M|metis|10|y=2"]
    assert matching_cell_key("fedaux|M|metis|10", [{"config": {"x": 1, "y": 2}}], both) is None


def test_cli_reports_bad_grid_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing top-level key 'grid'" in err


def test_a_paper_key_that_names_no_cell_is_an_error(tmp_path, capsys):
    """A misspelt paper key would silently leave its cell without the paper's figure."""
    spec = _spec(tmp_path)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(dict(spec, paper={
        "fedavg|SBM|metis|2": 50.0, "fedaux|SBM|metis|2|fedaux-server=average": 40.0})))
    assert set(load_grid(good)["paper"]) == {"fedavg|SBM|metis|2",
                                             "fedaux|SBM|metis|2|fedaux-server=average"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(dict(spec, paper={"fedaux|SBM|metis|2": 40.0})))  # 2 cells
    assert main(["report", str(tmp_path), "--grid", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'fedaux|SBM|metis|2' names no cell" in err
    assert "fedaux|SBM|metis|2|fedaux-server=personalized" in err


@pytest.mark.parametrize("path", sorted(Path(__file__).parent.parent.glob("configs/paper/*.yaml")),
                         ids=lambda p: p.stem)
def test_shipped_grids_load_and_their_paper_keys_name_cells(path, monkeypatch):
    monkeypatch.chdir(path.parent.parent.parent)  # their config-file paths are from the repo root
    spec = yaml.safe_load(path.read_text())
    grid = spec.get("grid") or []
    def listed(value):  # a grid value: one folder or a list of them
        return [value] if isinstance(value, str) else list(value or [])

    folders = listed((spec.get("base") or {}).get("partition-dir")) + [
        f for entry in (grid if isinstance(grid, list) else [grid])
        for f in listed(entry.get("partition-dir"))]
    for folder in filter(None, folders):  # reference client files: ../shared, or built by hand
        if not Path(folder).is_dir():
            pytest.skip(f"{path.name}: its partition-dir {folder} is not here ({NO_DATASETS})")
    load_grid(path)  # raises on a bad run config or a paper key that names no cell


@pytest.mark.slow
def test_saved_runs_are_read_as_what_they_ran_and_stale_ones_rerun(tmp_path, capsys):
    spec = dict(_spec(tmp_path), grid={"algorithm": ["fedaux", "fedavg"]}, seeds=[0])
    out = run_grid(spec, tmp_path / "exp", None, "inprocess", {})
    fedaux_path = next(out.glob("fedaux-*/results.json"))
    fedavg_path = next(out.glob("fedavg-*/results.json"))
    for path in (fedaux_path, fedavg_path):  # as written before fedaux-classifier-init existed
        res = json.loads(path.read_text())
        del res["config"]["fedaux-classifier-init"]
        path.write_text(json.dumps(res))
    stamp = fedavg_path.stat().st_mtime_ns

    # Such a FedAux run drew its head as nn.Linear does: the table says so ...
    rows = {r["cell"] for r in csv.DictReader(write_tables(out, spec)[1].open())}
    assert rows == {"fedaux|SBM|metis|2", "fedavg|SBM|metis|2"}
    assert saved_config(json.loads(fedaux_path.read_text())["config"])["fedaux-classifier-init"] == "torch"
    assert stale_keys(json.loads(fedaux_path.read_text())["config"],
                      resolve_config(None, dict(spec["base"], algorithm="fedaux"))) == [
        "fedaux-classifier-init"]

    # ... and the grid, which now asks for the Xavier head, re-runs it, keeping the old
    # run aside. FedAvg has no such switch: its run stands.
    run_grid(spec, tmp_path / "exp", None, "inprocess", {})
    assert json.loads(fedaux_path.read_text())["config"]["fedaux-classifier-init"] == "xavier"
    kept = out / "stale" / fedaux_path.parent.name / "results.json"
    assert "fedaux-classifier-init" not in json.loads(kept.read_text())["config"]
    assert fedavg_path.stat().st_mtime_ns == stamp
    assert sum(len(v) for v in collect(out).values()) == 2  # the stale run is not tabulated

    # A results.json that cannot be read is left out of the tables, named on stderr ...
    fedavg_path.write_text("{not json")
    capsys.readouterr()
    assert set(collect(out)) == {"fedaux|SBM|metis|2"}
    assert str(fedavg_path) in capsys.readouterr().err
    # ... and kept aside by run, which does it again.
    run_grid(spec, tmp_path / "exp", None, "inprocess", {})
    assert json.loads(fedavg_path.read_text())["config"]["algorithm"] == "fedavg"
    assert (out / "stale" / fedavg_path.parent.name / "results.json").read_text() == "{not json"


@pytest.mark.slow
def test_a_run_cut_short_is_not_tabulated_and_is_rerun(tmp_path, capsys):
    from fedgraph_flwr.engine.driver import RunAborted

    spec = dict(_spec(tmp_path), grid={"algorithm": ["fedavg"]}, seeds=[0])
    # The memory guard stops the run in round 1, as when memory fills up (memory-limit
    # does not change numbers, so the saved config still matches the grid's; the folder
    # takes the name the grid gives the run): results.json holds that round only.
    with pytest.raises(RunAborted, match="memory guard"):
        run_grid(spec, tmp_path / "exp", None, "inprocess", {"memory-limit": 1e-9})
    out = tmp_path / "exp" / spec["name"]
    path = out / run_name(expand(spec)[0]) / "results.json"
    next(out.glob("fedavg-*/results.json")).parent.rename(path.parent)
    assert [r["round"] for r in json.loads(path.read_text())["rounds"]] == [1]
    capsys.readouterr()
    assert collect(out) == {}
    assert "stopped after round 1 of 2" in capsys.readouterr().err

    # Running the grid again redoes it from round 1, keeping the cut-short run aside.
    run_grid(spec, tmp_path / "exp", None, "inprocess", {})
    assert [r["round"] for r in json.loads(path.read_text())["rounds"]] == [1, 2]
    assert (out / "stale" / path.parent.name / "results.json").is_file()
    assert sum(len(v) for v in collect(out).values()) == 1


@pytest.mark.slow
def test_run_grid_logs_plain_progress_lines_when_stdout_is_no_terminal(tmp_path, capsys):
    # Under `nohup fedgraph-experiments run ... > log` rich's bar draws nothing; the log
    # still says which cell runs, how far it is and when it ended.
    spec = dict(_spec(tmp_path), grid={"algorithm": ["fedavg"]}, seeds=[0])
    run_grid(spec, tmp_path / "exp", None, "inprocess", {})
    name = run_name(expand(spec)[0])  # output-dir does not enter the name
    lines = [ln for ln in capsys.readouterr().out.splitlines() if f"cell 1/1 {name}:" in ln]
    said = [ln.split(f"{name}: ", 1)[1] for ln in lines]
    assert said[0].startswith("started") and said[-1].startswith("done")
    assert [s.split(":")[0] for s in said if s.startswith("round ")] == ["round 1/2", "round 2/2"]
    assert any(s.startswith("results written to ") for s in said)
    run_grid(spec, tmp_path / "exp", None, "inprocess", {})  # a finished cell is skipped quietly
    assert f"cell 1/1 {name}: started" not in capsys.readouterr().out


def test_plain_log_throttles_rounds_but_not_other_messages(capsys):
    log = PlainLog("cell 1/1 x", total=5, enabled=True, every_s=3600)
    assert [log.on_message(f"round {r}/5: mean val 1.00 test 1.00") for r in range(1, 6)] == [1, 2, 3, 4, 5]
    assert log.on_message("round 3: client 2 failed: boom") is None
    out = capsys.readouterr().out
    assert "round 1/5" in out and "round 5/5" in out and "round 3/5" not in out
    assert "client 2 failed: boom" in out
    PlainLog("cell 1/1 x", total=5, enabled=False).say("hidden")
    assert capsys.readouterr().out == ""


def test_seed_mean_curve_picks_one_round_for_all_runs():
    """The reference visualizer's Acc @ Best Val: average the curves, then pick the round."""

    def run(val, test):
        return {"rounds": [{"held_mean_val": v, "held_mean_test": t} for v, t in zip(val, test)]}

    a = run([0.50, 0.60, 0.55], [0.40, 0.45, 0.70])
    b = run([0.50, 0.52, 0.70, 0.99], [0.10, 0.20, 0.30, 0.99])  # cut to the shorter run
    # Mean val 50 / 56 / 62.5: round 3 for both runs, though run a's own best is round 2.
    assert seed_mean_curve_at_best_val([a, b]) == pytest.approx([70.0, 30.0])
    assert seed_mean_curve_at_best_val([]) == []


def test_best_test_round_is_each_runs_highest_test_over_rounds():
    def run(test):
        return {"rounds": [{"held_mean_val": 0.5, "held_mean_test": t} for t in test]}

    assert best_test_round([run([0.40, 0.71, 0.70]), run([0.90, 0.20])]) == pytest.approx([71.0, 90.0])
    assert best_test_round([run([]), run([0.3])]) == pytest.approx([30.0])


def test_register_refuses_a_legacy_value_for_a_key_without_a_default():
    from dataclasses import dataclass

    from fedgraph_flwr.algorithms import ALGORITHMS, Options, option, register
    from fedgraph_flwr.algorithms.fedavg import FedAvgAggregator, GCNTrainer

    @dataclass(frozen=True)
    class ProbeOptions(Options, prefix="legacy-probe"):
        depth: int = option(2, "depth", low=1)

    class ProbeTrainer(GCNTrainer):
        options_class = ProbeOptions

    class ProbeAggregator(FedAvgAggregator):
        options_class = ProbeOptions

    with pytest.raises(ValueError, match=r"legacy_values for keys it has no default for: "
                                         r"\['legacy-probe-init'\]"):
        register("legacy-probe", ProbeTrainer, ProbeAggregator, ProbeOptions,
                 legacy_values={"legacy-probe-init": "torch"})
    with pytest.raises(ValueError, match="GCNTrainer.options_class is FedAvgOptions, not ProbeOptions"):
        register("legacy-probe", GCNTrainer, ProbeAggregator, ProbeOptions)
    assert "legacy-probe" not in ALGORITHMS  # nothing half-registered
