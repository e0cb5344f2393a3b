"""Run configuration: defaults, YAML files, overrides, and validation before any training.

Keys are kebab-case, as in ``[tool.flwr.app.config]`` of ``pyproject.toml``. The
single source of the defaults is :data:`COMMON_DEFAULTS` plus each registered
algorithm's typed options (:mod:`fedgraph_flwr.algorithms.options`); the pyproject
block is generated from them by ``python -m fedgraph_flwr.config --write-pyproject``
(a test checks it is current).

Precedence: defaults < ``config-file`` YAML < explicit run-config overrides. Flower
hands the ServerApp the pyproject defaults merged with ``--run-config``, so a
run-config value counts as explicit when it differs from the default; every key of a
YAML file or of ``overrides`` is explicit. Explicitly setting an option of an
algorithm other than ``algorithm`` is an error.

The resolved config holds every key, other algorithms' at their defaults (as
results.json files and checkpoints always have); :func:`client_config` is the part a
client needs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .algorithms import ALGORITHMS, get_algorithm
from .algorithms.options import ConfigError, coerce  # ConfigError re-exported

COMMON_DEFAULTS: dict[str, Any] = {
    # what to run
    "algorithm": "fedaux",
    "dataset": "Cora",
    "num-clients": 10,
    "partition": "metis",
    "partition-dir": "",
    "partition-split": "auto",
    "split-draw": 0,
    # pymetis (bundled, 64-bit idx_t) | system (libmetis; Debian's 32-bit one = the reference's partitions)
    "metis-library": "pymetis",
    # normalized: row-normalised where the papers do (Planetoid, Amazon) | raw: never
    "features": "normalized",
    # keep only the largest connected component, where the dataset's papers do
    "lcc": True,
    "rounds": 100,
    "local-epochs": 1,
    "fraction": 1.0,
    # model and optimiser
    "lr": 0.01,
    "weight-decay": 1e-6,
    "hidden": 256,
    "num-layers": 2,
    "gnn": "gcn",  # backbone of the GCN-family baselines (Local, FedAvg, ...): gcn | sgc | sage
    "dropout": 0.5,
    "metric": "auto",
    # seeds: model/training seed, and the data seeds of the papers' protocol
    "seed": 0,
    "split-seed": 1234,
    # true: the train/val/test draw uses split-seed + seed (a new split per run seed, as
    # FedSpray's official code); false: one split for every seed (the FED-PUB protocol)
    "split-follows-seed": False,
    "partition-seed": 1234,
    # where things live
    "data-root": "",
    "output-dir": "outputs",
    "run-name": "",
    "config-file": "",
    # engine behaviour
    "round-timeout": 120.0,
    "handshake-timeout": 600.0,
    "min-clients": 0,
    "fail-fast": False,
    "resume": False,
    "client-state": "context",
    "client-state-dir": "",
    "max-array-bytes": 512 * 1024 * 1024,
    # a ClientApp refuses a phase when its machine's (or container's) memory is this full
    # (Ray's OOM killer acts at 0.95); the run then stops with that one line. 0 = off
    "memory-limit": 0.9,
    # float64: the published numbers; float32 halves personalized mixing for many clients
    "server-mix-dtype": "float64",
    "verbose": True,
}

PARTITIONS = ("metis", "metis-overlapping", "louvain", "blocks", "files")
PARTITION_SPLITS = ("auto", "global", "per-client")
FEATURES = ("normalized", "raw")
CLIENT_STATE_MODES = ("context", "file")
MIX_DTYPES = ("float64", "float32")


# The common keys a client reads (engine/client_runtime.py, client_app.py, data/,
# algorithms/): what it loads, how it trains and where it keeps its state.
CLIENT_KEYS = (
    "algorithm",
    # its data: dataset, partition and splits (data/partition.py, engine/client_runtime.py)
    "dataset", "num-clients", "partition", "partition-dir", "partition-split", "split-draw",
    "metis-library", "features", "lcc", "split-seed", "split-follows-seed", "partition-seed",
    "data-root",
    # its model and local training (algorithms/)
    "seed", "local-epochs", "lr", "weight-decay", "hidden", "num-layers", "gnn", "dropout",
    "metric",
    # its state between rounds (client-state=file)
    "client-state", "client-state-dir", "run-name",
    # its memory guard
    "memory-limit",
)


def all_defaults() -> dict[str, Any]:
    """Common defaults plus every registered algorithm's own keys (registration order)."""
    out = dict(COMMON_DEFAULTS)
    for algo in ALGORITHMS.values():
        for key, value in algo.config_defaults.items():
            if key in out:
                raise RuntimeError(f"algorithm {algo.name!r} redefines key {key!r}")
            out[key] = value
    return out


def option_owners() -> dict[str, str]:
    """``{key: algorithm name}`` for every algorithm option key."""
    return {key: algo.name for algo in ALGORITHMS.values() for key in algo.options.keys()}


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a flat YAML mapping of run-config keys."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"config-file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config-file {str(p)!r} is not valid YAML: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config-file {str(p)!r} must hold a mapping of run-config keys")
    return data


def resolve_config(
    run_config: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Merge defaults, the YAML ``config-file`` and overrides; validate; return a dict.

    ``run_config`` is Flower's ``context.run_config``; ``overrides`` are applied
    last (used by tests and the experiment runner). Every problem is one
    :class:`ConfigError` line: an unknown key (with the closest valid one), an option
    of another algorithm set explicitly, or a bad value.
    """
    defaults = all_defaults()
    explicit: dict[str, Any] = {}
    for source in (run_config or {}), (overrides or {}):
        for key, value in source.items():
            if key not in defaults:
                raise ConfigError(_unknown_key(key, defaults))
            if source is overrides or value != defaults[key]:
                explicit[key] = value
    from_file: dict[str, Any] = {}
    config_file = explicit.get("config-file", "")
    if config_file:
        for key, value in load_yaml(config_file).items():
            if key not in defaults:
                raise ConfigError(f"config-file {config_file}: " + _unknown_key(key, defaults))
            from_file[key] = value
    config = {**defaults, **from_file, **explicit}
    for key in COMMON_DEFAULTS:
        config[key] = coerce(key, config[key], type(COMMON_DEFAULTS[key]))
    algo = get_algorithm_or_fail(config["algorithm"])
    owners = option_owners()
    for where, keys in ((f"config-file {config_file}: ", from_file), ("", explicit)):
        for key in keys:
            if owners.get(key, algo.name) != algo.name:
                raise ConfigError(f"{where}{key} is an option of {owners[key]}, not of "
                                  f"algorithm={algo.name}")
    options = algo.options.from_config(config)
    config.update(options.to_config())
    validate(config)
    options.check_run(config)
    return config


def _unknown_key(key: str, defaults: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(defaults), n=1)
    if close:
        return f"unknown config key {key!r}; did you mean {close[0]!r}?"
    return f"unknown config key {key!r}; valid keys: {', '.join(sorted(defaults))}"


def client_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """What a client needs of a resolved config: :data:`CLIENT_KEYS` plus the algorithm's own
    options, nothing else (the engine adds its per-round keys on top)."""
    algo = get_algorithm_or_fail(str(config["algorithm"]))
    return {key: config[key] for key in (*CLIENT_KEYS, *algo.options.keys())}


def validate(config: Mapping[str, Any]) -> None:
    """Check everything that can be checked without data; raise ConfigError."""
    get_algorithm_or_fail(config["algorithm"])
    from .data.datasets import canonical_name  # local import: data pulls in heavy PyG modules

    if config["partition"] != "files":
        try:
            canonical_name(str(config["dataset"]))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if config["partition-split"] not in PARTITION_SPLITS:
        raise ConfigError(f"unknown partition-split {config['partition-split']!r}; "
                          f"valid: {', '.join(PARTITION_SPLITS)}")
    if config["features"] not in FEATURES:
        raise ConfigError(f"unknown features {config['features']!r}; valid: {', '.join(FEATURES)}")
    if config["partition"] == "metis-overlapping" and config["num-clients"] % 5:
        raise ConfigError(f"partition=metis-overlapping needs num-clients divisible by 5 "
                          f"(5 clients per METIS part), got {config['num-clients']}")
    if config["partition"] not in PARTITIONS:
        raise ConfigError(
            f"unknown partition {config['partition']!r}; valid: {', '.join(PARTITIONS)}"
        )
    from .data.partition import METIS_LIBRARIES

    if config["metis-library"] not in METIS_LIBRARIES:
        raise ConfigError(f"unknown metis-library {config['metis-library']!r}; "
                          f"valid: {', '.join(METIS_LIBRARIES)}")
    if config["partition"] == "files":
        _check_partition_dir(str(config["partition-dir"]), int(config["num-clients"]))
    elif config["partition-dir"]:
        # Otherwise the files would be silently ignored and the run trained on a new partition.
        raise ConfigError(
            f"partition-dir is set but partition={config['partition']} builds its own "
            "partition and would ignore it: set partition=files to train on those client "
            "files, or drop partition-dir"
        )
    for key in ("rounds", "local-epochs", "num-clients", "hidden", "num-layers"):
        if config[key] <= 0:
            raise ConfigError(f"{key} must be positive, got {config[key]}")
    for key in ("lr", "round-timeout", "handshake-timeout"):
        if not config[key] > 0:
            raise ConfigError(f"{key} must be positive, got {config[key]}")
    if config["weight-decay"] < 0:
        raise ConfigError(f"weight-decay must be >= 0, got {config['weight-decay']}")
    if not 0.0 <= config["memory-limit"] < 1.0:
        raise ConfigError(f"memory-limit must be in [0, 1) (0 = off), got {config['memory-limit']}")
    if not 0.0 <= config["dropout"] < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {config['dropout']}")
    if not 0.0 < config["fraction"] <= 1.0:
        raise ConfigError(f"fraction must be in (0, 1], got {config['fraction']}")
    if config["min-clients"] < 0 or config["min-clients"] > config["num-clients"]:
        raise ConfigError(
            f"min-clients must be in [0, num-clients={config['num-clients']}], "
            f"got {config['min-clients']}"
        )
    from .nn.personal_gnn import BACKBONES

    if config["gnn"] not in BACKBONES:
        raise ConfigError(f"unknown gnn {config['gnn']!r}; valid: {', '.join(BACKBONES)}")
    if config["metric"] not in ("auto", "accuracy", "roc_auc"):
        raise ConfigError(f"unknown metric {config['metric']!r}; valid: auto, accuracy, roc_auc")
    if config["server-mix-dtype"] not in MIX_DTYPES:
        raise ConfigError(f"unknown server-mix-dtype {config['server-mix-dtype']!r}; "
                          f"valid: {', '.join(MIX_DTYPES)}")
    if config["client-state"] not in CLIENT_STATE_MODES:
        raise ConfigError(
            f"unknown client-state {config['client-state']!r}; valid: {', '.join(CLIENT_STATE_MODES)}"
        )
    if config["run-name"] and not re.fullmatch(r"[A-Za-z0-9._-]+", config["run-name"]):
        raise ConfigError(f"run-name {config['run-name']!r} may hold only letters, digits, . _ -")


def _check_partition_dir(folder: str, num_clients: int) -> None:
    """partition=files: the folder holds exactly client_0 .. client_<num-clients - 1>."""
    if not folder:
        raise ConfigError("partition=files needs partition-dir=<folder of client_<i> files>")
    from .data.files import SubgraphFileError, client_files  # local import: pulls in torch

    path = Path(folder).expanduser()
    try:
        ids = sorted(client_files(path))
    except SubgraphFileError as exc:
        raise ConfigError(f"partition-dir: {exc}") from None
    if ids != list(range(num_clients)):
        raise ConfigError(
            f"partition-dir {path} holds {len(ids)} client file(s) (ids {ids[:10]}) but "
            f"num-clients={num_clients}: set num-clients={len(ids)} or point partition-dir "
            f"at a folder of client_0..client_{num_clients - 1}"
        )


def get_algorithm_or_fail(name: str):
    try:
        return get_algorithm(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def data_root(config: Mapping[str, Any]) -> Path:
    """``data-root`` if set, else env FEDGRAPH_DATA_ROOT, else a user cache dir."""
    if config.get("data-root"):
        return Path(str(config["data-root"])).expanduser()
    env = os.environ.get("FEDGRAPH_DATA_ROOT")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedgraph-flwr"


def data_root_source(config: Mapping[str, Any]) -> str:
    """Where :func:`data_root` came from, in words (for error messages)."""
    if config.get("data-root"):
        return "data root from run-config data-root"
    if os.environ.get("FEDGRAPH_DATA_ROOT"):
        return "data root from env FEDGRAPH_DATA_ROOT"
    return "the default data root: neither data-root nor FEDGRAPH_DATA_ROOT is set here"


def default_run_name(config: Mapping[str, Any]) -> str:
    """A readable, deterministic name for a run's output folder."""
    return (
        f"{config['algorithm']}-{config['dataset']}-{config['partition']}"
        f"{config['num-clients']}-seed{config['seed']}"
    )


# --- pyproject.toml's [tool.flwr.app.config], generated from the defaults -------------------
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
PYPROJECT_BEGIN = ("# BEGIN generated by `python -m fedgraph_flwr.config --write-pyproject` from "
                   "fedgraph_flwr/config.py\n# and the algorithms' options: edit those, not this "
                   "block (a test checks it is current).\n")
PYPROJECT_END = "# END generated\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def pyproject_block() -> str:
    """The generated ``[tool.flwr.app.config]`` block, markers included: the common keys,
    then each algorithm's options in registration order, each with its doc."""
    lines = [PYPROJECT_BEGIN.rstrip("\n"), "[tool.flwr.app.config]", "# common keys"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in COMMON_DEFAULTS.items()]
    for algo in ALGORITHMS.values():
        docs, ranges = algo.options.docs(), algo.options.ranges()
        if not docs:
            continue
        lines.append(f"# {algo.name} ({algo.options.__module__}.{algo.options.__name__})")
        lines += [f"{key} = {_toml_value(value)}  # {docs[key]}"
                  + (f" (must be {ranges[key]})" if key in ranges else "")
                  for key, value in algo.config_defaults.items()]
    return "\n".join(lines) + "\n" + PYPROJECT_END


def pyproject_with_block(text: str) -> str:
    """``text`` (a pyproject.toml) with its generated block replaced by the current one."""
    begin, end = text.find(PYPROJECT_BEGIN), text.find(PYPROJECT_END)
    if begin < 0 or end < begin:
        raise ConfigError("pyproject.toml lacks the generated block's BEGIN/END marker lines")
    return text[:begin] + pyproject_block() + text[end + len(PYPROJECT_END):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgraph_flwr.config",
                                     description="Run-config defaults and pyproject.toml.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write-pyproject", action="store_true",
                       help="rewrite [tool.flwr.app.config] of pyproject.toml from the defaults")
    group.add_argument("--check-pyproject", action="store_true",
                       help="exit 1 if pyproject.toml's block is not current")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT, help="default: %(default)s")
    args = parser.parse_args(argv)
    text = args.pyproject.read_text()
    try:
        new = pyproject_with_block(text)
    except ConfigError as exc:
        print(f"{args.pyproject}: {exc}", file=sys.stderr)
        return 2
    if args.check_pyproject:
        if new != text:
            print(f"{args.pyproject} is not current: run python -m fedgraph_flwr.config "
                  f"--write-pyproject", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.pyproject.write_text(new)
        print(f"wrote {args.pyproject}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
