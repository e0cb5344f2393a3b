"""Run-config resolution and validation: every bad input is a one-line ConfigError."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedgraph_flwr.config import ConfigError, all_defaults, app_config_defaults, resolve_config
from fedgraph_flwr.core.registry import ALGORITHMS

pytestmark = pytest.mark.smoke  # the fast tier: README's Test, .ci/run's first step

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_mirrors_every_default():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    flwr_config = pyproject["tool"]["flwr"]["app"]["config"]
    assert flwr_config == app_config_defaults()
    # Left out: only the switches a reproduction profile sets.
    assert {key for algo in ALGORITHMS.values() for key in algo.options.behaviour_switch_keys()} == (
        set(all_defaults()) - set(flwr_config))


def test_defaults_resolve():
    cfg = resolve_config({})
    assert cfg.algorithm == "fedaux" and cfg.dataset == "Cora" and cfg.num_clients == 10


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"no-such-key": 1}, "unknown config key 'no-such-key'; valid keys:"),
        ({"algorithm": "fedsgd"}, "unknown algorithm 'fedsgd'; did you mean"),
        ({"dataset": "Kora"}, "unknown dataset 'Kora'"),
        ({"partition": "random"}, "partition='random' is not a valid choice: must be one of metis,"),
        ({"rounds": 0}, "rounds=0 is out of range: must be >= 1"),
        ({"lr": -0.1}, "lr=-0.1 is out of range: must be > 0"),
        ({"num-clients": 0}, "num-clients=0 is out of range: must be >= 1"),
        ({"fraction": 1.5}, "fraction=1.5 is out of range: must be in (0, 1]"),
        ({"rounds": "ten"}, "rounds='ten' is not a valid int"),
        ({"partition": "files"}, "partition=files needs partition-dir"),
        ({"partition-dir": "outputs/partitions/x"},
         "partition-dir is set but partition=metis builds its own partition"),
        ({"config-file": "/nonexistent/x.yaml"}, "does not exist"),
        ({"server-mix-dtype": "float16"}, "server-mix-dtype='float16' is not a valid choice"),
        ({"metis-library": "metis5"},
         "metis-library='metis5' is not a valid choice: must be one of pymetis, system"),
        ({"memory-limit": 1.0}, "memory-limit=1.0 is out of range: must be in [0, 1)"),
        ({"min-clients": 11}, "min-clients must be in [0, num-clients=10], got 11"),
    ],
)
def test_bad_input_is_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        resolve_config({}, overrides)
    message = str(err.value)
    assert fragment in message
    assert "\n" not in message


def test_yaml_file_and_precedence(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm: fedavg\nrounds: 7\nlr: 0.05\n")
    defaults = all_defaults()
    # Flower passes every pyproject default; only values that differ count as explicit.
    run_config = dict(defaults, **{"config-file": str(path), "lr": 0.2})
    cfg = resolve_config(run_config)
    assert cfg.algorithm == "fedavg" and cfg.rounds == 7
    assert cfg.lr == 0.2  # explicit --run-config beats the YAML file


def test_yaml_unknown_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rounds: 3\nlearning-rate: 0.1\n")
    with pytest.raises(ConfigError, match="unknown config key 'learning-rate'"):
        resolve_config({}, {"config-file": str(path)})


def test_types_are_coerced():
    cfg = resolve_config({}, {"rounds": "5", "lr": "0.1", "fail-fast": "true"})
    assert cfg.rounds == 5 and cfg.lr == 0.1 and cfg.fail_fast is True


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "scale").glob("*.yaml")), ids=lambda p: p.stem)
def test_scale_configs_resolve_on_the_offline_arxiv_graph(path):
    cfg = resolve_config(None, {"config-file": str(path)})
    assert path.stem == f"{cfg.algorithm}-synthetic-arxiv"
    assert cfg.dataset == "Synthetic-arxiv" and cfg.client_state == "file"
    real = resolve_config(None, {"config-file": str(path), "dataset": "ogbn-arxiv"})
    assert real.dataset == "ogbn-arxiv"


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("fed*/*.yaml")), ids=lambda p: p.stem)
def test_shipped_run_configs_resolve_to_what_their_names_say(path):
    cfg = resolve_config(None, {"config-file": str(path)})
    assert cfg.algorithm == path.parent.name  # configs/<algorithm>/...
    if path.parent.name == "fediih":  # <dataset>-<disjoint|overlapping>-<clients>.yaml
        dataset, setting, clients = path.stem.rsplit("-", 2)
        assert cfg.dataset.lower() == dataset.replace("arxiv", "ogbn-arxiv")
        assert cfg.partition == {"disjoint": "metis", "overlapping": "metis-overlapping"}[setting]
        assert cfg.num_clients == int(clients)


def test_run_config_text_gives_the_run_back_through_flowers_parser():
    """A printed fix's --run-config keeps the user's settings: every key off its default,
    nothing else (not the run name the server derives), and Flower parses it back."""
    from flwr.common.config import parse_config_args

    config = resolve_config(None, {"algorithm": "fedavg", "dataset": "SBM", "num-clients": 20,
                                   "lr": 0.05, "fail-fast": True, "data-root": "/srv/data"})
    config = config.replace(run_name=config.resolved_run_name)
    text = config.run_config_text(**{"num-clients": 5})
    assert "run-name" not in text
    parsed = parse_config_args([text])
    assert parsed == {"algorithm": "fedavg", "dataset": "SBM", "num-clients": 5, "lr": 0.05,
                      "fail-fast": True, "data-root": "/srv/data"}
    assert resolve_config(None, parsed) == config.replace(num_clients=5, run_name="")
    assert parse_config_args([config.run_config_text(**{"num-clients": 10})])["algorithm"] == "fedavg"
