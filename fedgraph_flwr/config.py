"""Run configuration: typed, frozen settings resolved once, before any training.

Keys are kebab-case, as in ``[tool.flwr.app.config]`` of ``pyproject.toml``; each is a
field of :class:`ClientSettings` (what a client reads), :class:`ServerSettings` (what
only the server reads) or of an algorithm's typed options
(:mod:`fedgraph_flwr.core.options`), each with its type, default, range and a
one-line doc. The pyproject block is generated from them by
``python -m fedgraph_flwr.config --write-pyproject`` (a test checks it is current).

Precedence: defaults < ``config-file`` YAML < explicit run-config overrides. Flower
hands the ServerApp the pyproject defaults merged with ``--run-config``, so a
run-config value counts as explicit when it differs from the default; every key of a
YAML file or of ``overrides`` is explicit. Explicitly setting an option of an
algorithm other than ``algorithm`` is an error.

:func:`resolve_config` returns a :class:`RunConfig` (the server's view: every common key
plus the algorithm's options object); :meth:`RunConfig.client_config` is the
:class:`ClientConfig` a client is sent (its keys, its algorithm's options and the
round's facts, nothing else). Everything else reads these objects' attributes; only
this module reads keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import yaml

from .core.options import ConfigError, Options, coerce, context, option  # ConfigError re-exported
from .core.registry import ALGORITHMS, Algorithm, get_algorithm
from .generated import replace_block, write_or_check
from .privacy import scope as privacy_scope
from .privacy.scope import DP_SCOPES

OptionsT = TypeVar("OptionsT", bound=Options)

PARTITIONS = ("metis", "metis-overlapping", "louvain", "blocks", "files")
#: Where METIS comes from (data/partition.py reads the key).
METIS_LIBRARIES = ("pymetis", "system")
#: The backbones of the GCN-family baselines (nn/personal_gnn.py builds each).
BACKBONES = ("gcn", "sgc", "sage")
PARTITION_SPLITS = ("auto", "global", "per-client")
FEATURES = ("normalized", "raw")
METRICS = ("auto", "accuracy", "roc_auc")
CLIENT_STATE_MODES = ("context", "file")
MIX_DTYPES = ("float64", "float32")
SECURE_AGGREGATIONS = ("off", "ckks", "ckks-threshold")
ROBUST_RULES = ("none", "norm-bound", "trimmed-mean", "median", "krum", "multi-krum", "bulyan")
#: The robust rules that replace a row of the mixing plan (they need the algorithm's plan).
ROBUST_ROW_RULES = ("median", "trimmed-mean", "bulyan")
RUN_NAME = re.compile(r"[A-Za-z0-9._-]*")
#: The experiment trackers a run can log to (engine/trackers.py implements each).
TRACKERS = ("tensorboard", "wandb", "mlflow")
#: ``tracker-group``: a grid and its cell, each a run-name-like word.
TRACKER_GROUP = re.compile(r"[A-Za-z0-9._-]+/[A-Za-z0-9._-]+")
DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def resolve_metric(metric: str, num_classes: int) -> str:
    """``metric=auto`` means ROC-AUC for binary tasks, accuracy otherwise."""
    if metric == "auto":
        return "roc_auc" if num_classes == 2 else "accuracy"
    return metric


def robust_min_clients(rule: str, malicious: int) -> int:
    """The fewest clients robust ``rule`` tolerates ``malicious`` hostile ones among
    (Flower's bounds: Krum n ≥ 2f + 3, Bulyan n ≥ 4f + 3)."""
    if rule in ("krum", "multi-krum"):
        return 2 * malicious + 3
    if rule == "bulyan":
        return 4 * malicious + 3
    return 1


@dataclass(frozen=True)
class ClientSettings(Options):
    """The common keys a client reads: what it loads, how it trains, where it keeps state."""

    # what it loads: dataset, partition and splits (data/partition.py, engine/client_runtime.py)
    algorithm: str = option("fedaux", "the algorithm, by its registered name")
    dataset: str = option("Cora", "dataset (name or alias; partition=files: a label only)")
    num_clients: int = option(10, "number of clients K", low=1)
    partition: str = option("metis", "how the graph is split into clients", choices=PARTITIONS)
    partition_dir: str = option("", "partition=files: the folder of client_<i> files")
    partition_split: str = option("auto", "train/val/test split: per partition (auto) or fixed",
                                  choices=PARTITION_SPLITS)
    split_draw: int = option(0, "extra RNG draws before the split (mirrors the reference code)",
                             low=0)
    metis_library: str = option("pymetis", "pymetis (bundled, 64-bit idx_t) | system (libmetis; "
                                "Debian's 32-bit one = the reference's partitions)",
                                choices=METIS_LIBRARIES)
    features: str = option("normalized", "normalized: row-normalised where the papers do "
                           "(Planetoid, Amazon) | raw: never", choices=FEATURES)
    lcc: bool = option(True, "keep only the largest connected component, where the dataset's "
                       "papers do")
    split_seed: int = option(1234, "seed of the train/val/test draw")
    split_follows_seed: bool = option(False, "true: the split uses split-seed + seed (FedSpray's "
                                      "code); false: one split for every seed (FED-PUB)")
    partition_seed: int = option(1234, "seed of the partition")
    data_root: str = option("", "where datasets and partitions live (else FEDGRAPH_DATA_ROOT, "
                            "else the user cache)")
    download: bool = option(True, "fetch a dataset missing from the data root once, through "
                            "PyG's own download (false: offline sites, deployments)")
    download_url: str = option("", "download: a mirror of the PyG class's host, same file "
                               "layout (empty: PyG's own)")
    # how it trains (algorithms/)
    seed: int = option(0, "model and training seed")
    local_epochs: int = option(1, "local epochs per round", low=1)
    lr: float = option(0.01, "learning rate", low=0.0, low_inclusive=False)
    weight_decay: float = option(1e-6, "weight decay", low=0.0)
    hidden: int = option(256, "hidden width", low=1)
    num_layers: int = option(2, "GNN layers", low=1)
    gnn: str = option("gcn", "backbone of the GCN-family baselines (Local, FedAvg, ...)",
                      choices=BACKBONES)
    dropout: float = option(0.5, "dropout", low=0.0, high=1.0, high_inclusive=False)
    metric: str = option("auto", "auto: the dataset's (accuracy, or ROC-AUC for binary)",
                         choices=METRICS)
    device: str = option("auto", "where a client trains: auto (CUDA when its machine has it) | "
                         "cpu | cuda | cuda:N (N counts the GPUs CUDA_VISIBLE_DEVICES leaves)")
    # its state between rounds and its memory guard
    client_state: str = option("context", "where a client keeps its state between rounds: "
                               "Flower's context | a file", choices=CLIENT_STATE_MODES)
    client_state_dir: str = option("", "client-state=file: the folder (else "
                                   "<data-root>/client-state/<run-name>)")
    run_name: str = option("", "output folder name (else algorithm-dataset-partitionK-seedS)")
    memory_limit: float = option(0.9, "a client refuses a phase when memory is this full "
                                 "(Ray's OOM killer acts at 0.95); 0 = off",
                                 low=0.0, high=1.0, high_inclusive=False)
    # differential privacy on what it sends (privacy/): the client clips and noises
    dp: str = option("off", "differential privacy: off | signature (what the server reads in the "
                     "clear to mix) | client (everything a client sends)", choices=DP_SCOPES)
    dp_clip: float = option(1.0, "dp: L2 norm C each reply is clipped to", low=0.0,
                            low_inclusive=False)
    dp_noise_multiplier: float = option(0.0, "dp: Gaussian noise std / C (0: calibrated to "
                                        "dp-epsilon)", low=0.0)
    # secure aggregation (fedgraph_flwr/secure_aggregation.py, docs/secure-aggregation.md)
    secure_aggregation: str = option("off", "ckks: train uploads encrypted under a CKKS key the "
                                     "server does not hold (one shared by every client); "
                                     "ckks-threshold: under OpenFHE's threshold CKKS, each "
                                     "client holds a key share (docs/secure-aggregation.md)",
                                     choices=SECURE_AGGREGATIONS)
    ckks_secret_context: str = option("", "ckks: the client's secret-context file (env "
                                      "FEDGRAPH_CKKS_SECRET_CONTEXT wins; in-process/simulation: "
                                      "the run's own)")

    def check(self) -> None:
        """``device`` is a device's name; whether this machine has it, the client checks."""
        if not DEVICE.fullmatch(self.device):
            raise ConfigError(f"device={self.device!r} is not a valid choice: must be auto, cpu, "
                              f"cuda or cuda:N")

    @property
    def data_root_path(self) -> Path:
        """``data-root`` if set, else env FEDGRAPH_DATA_ROOT, else a user cache dir."""
        if self.data_root:
            return Path(self.data_root).expanduser()
        env = os.environ.get("FEDGRAPH_DATA_ROOT")
        if env:
            return Path(env).expanduser()
        return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedgraph-flwr"

    @property
    def data_root_source(self) -> str:
        """Where :attr:`data_root_path` came from, in words (for error messages)."""
        if self.data_root:
            return "data root from run-config data-root"
        if os.environ.get("FEDGRAPH_DATA_ROOT"):
            return "data root from env FEDGRAPH_DATA_ROOT"
        return "the default data root: neither data-root nor FEDGRAPH_DATA_ROOT is set here"


@dataclass(frozen=True)
class ServerSettings(Options):
    """The common keys only the server reads: the rounds, sampling, timeouts and outputs."""

    rounds: int = option(100, "federated rounds", low=1)
    fraction: float = option(1.0, "share of the clients sampled each round", low=0.0, high=1.0,
                             low_inclusive=False)
    output_dir: str = option("outputs", "where run folders are written")
    config_file: str = option("", "a YAML file of run-config keys (below explicit ones)")
    round_timeout: float = option(120.0, "seconds a round may take", low=0.0, low_inclusive=False)
    handshake_timeout: float = option(600.0, "seconds to wait for every client to answer the "
                                      "handshake", low=0.0, low_inclusive=False)
    min_clients: int = option(0, "fewest valid replies a round needs; a round with fewer is "
                              "void and, when set (> 0), ends the run (0: rounds go on)", low=0)
    fail_fast: bool = option(False, "stop the run at a client's first failure")
    resume: bool = option(False, "continue from the run folder's checkpoint")
    max_array_bytes: int = option(512 * 1024 * 1024, "largest reply a client may send (bytes)",
                                  low=1)
    robust: str = option("none", "robust aggregation against hostile clients: each client's "
                         "row of the mixing plan by none | norm-bound | trimmed-mean | median | "
                         "krum | multi-krum | bulyan (docs/robustness.md)", choices=ROBUST_RULES)
    robust_malicious: int = option(1, "robust: f, the hostile clients tolerated (krum, "
                                   "multi-krum, bulyan)", low=0)
    robust_trim_beta: float = option(0.2, "robust=trimmed-mean: the share of each row's weight "
                                     "cut from each end", low=0.0, high=0.5, high_inclusive=False)
    server_mix_dtype: str = option("float64", "float64: the published numbers; float32 halves "
                                   "personalized mixing for many clients", choices=MIX_DTYPES)
    verbose: bool = option(True, "log each round")
    dp_epsilon: float = option(0.0, "dp: the run's privacy budget ε (0: none); the run stops "
                               "before a round would exceed it", low=0.0)
    dp_delta: float = option(1e-5, "dp: δ of the (ε, δ) guarantee", low=0.0, high=1.0,
                             low_inclusive=False, high_inclusive=False)
    ckks_public_context: str = option("", "ckks: the server's public-context file (else "
                                      "<output-dir>/<run-name>/ckks/public.ckks)")
    trackers: str = option("", "experiment trackers the server logs every round to, comma-"
                           "separated: tensorboard, wandb, mlflow (none: '')")
    tracker_dir: str = option("", "where the trackers write (else <output-dir>/trackers)")
    tracker_group: str = option("", "'<grid>/<cell>': groups a grid's runs in the trackers "
                                "(fedgraph-experiments sets it)")


class _WithOptions:
    """The typed access to an algorithm's options, shared by the client's and server's configs."""

    algorithm: str
    options: Options

    def options_of(self, kind: type[OptionsT]) -> OptionsT:
        """The algorithm's options as ``kind`` (one line if this run's algorithm has others)."""
        if not isinstance(self.options, kind):
            raise ConfigError(f"algorithm={self.algorithm} has {type(self.options).__name__}, "
                              f"not {kind.__name__}")
        return self.options


def _options_of(algorithm: str, config: Mapping[str, Any]) -> Options:
    return get_algorithm_or_fail(algorithm).options.from_config(config)


@dataclass(frozen=True)
class ClientConfig(ClientSettings, _WithOptions):
    """What a client is sent: :class:`ClientSettings`, its algorithm's options, and the
    facts of this round (set by the engine, not run-config keys)."""

    options: Options = context(Options, "the algorithm's typed options")
    server_round: int = context(0, "this round (0: the phases before round 1)")
    num_classes_global: int = context(0, "classes over all clients (the handshake's)")
    num_features_global: int = context(0, "feature width (the handshake's)")
    client_state_token: str = context("", "names this run's client-state files")
    client_state_expected: str = context("", "client-state=file: where the server knows this "
                                         "client's last state to be ('<round>:<place>')")
    partition_id: int = context(-1, "this client's partition (-1: not known)")

    #: The round facts' wire keys and types (the settings' keys are their names, kebab-case).
    ROUND_KEYS: ClassVar[dict[str, tuple[str, type]]] = {
        "server-round": ("server_round", int), "num-classes-global": ("num_classes_global", int),
        "num-features-global": ("num_features_global", int),
        "client-state-token": ("client_state_token", str),
        "client-state-expected": ("client_state_expected", str),
        "partition-id": ("partition_id", int)}

    def __post_init__(self) -> None:
        super().__post_init__()
        _attach_options(self)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Self:
        """A client's config from a message's (or a test's) key/value mapping: missing
        keys default; the algorithm's options come from their own keys."""
        fields = {f.name: config[f.key] for f in cls._fields() if f.key in config}
        fields.update({name: coerce(key, config[key], kind)
                       for key, (name, kind) in cls.ROUND_KEYS.items() if key in config})
        algorithm = str(config.get("algorithm", ClientSettings.algorithm))
        return cls(**fields, options=_options_of(algorithm, config))

    def to_config(self) -> dict[str, Any]:
        """The wire form: the settings' keys, the algorithm's options and the round facts."""
        out = super().to_config()
        out.update(self.options.to_config())
        # Round facts at their defaults stay off the wire (a client is sent what it needs).
        out.update({key: getattr(self, name) for key, (name, _) in self.ROUND_KEYS.items()
                    if getattr(self, name) != _ROUND_DEFAULTS[name]})
        return out

    def with_keys(self, keys: Mapping[str, Any]) -> Self:
        """This config with some run-config keys (or round facts) replaced, checked again; a
        new ``algorithm`` takes its options from ``keys`` (the others' keys are ignored)."""
        current = ClientConfig.to_config(self)
        if self.options.profile_key() in keys:  # the new profile sets the switches keys leave out
            for key in self.options.switch_keys():
                current.pop(key, None)
        return type(self).from_config({**current, **keys})

    def without_round_facts(self) -> Self:
        """This config with every round fact at its default: what may shape a model, the
        same for every client and round (a cache key)."""
        return dataclasses.replace(self, **_ROUND_DEFAULTS)

    def with_round(self, **facts: Any) -> Self:
        """This config with round facts replaced (``server_round=3``, ``partition_id=1``)."""
        return dataclasses.replace(self, **facts)


@dataclass(frozen=True)
class RunConfig(ServerSettings, ClientConfig):
    """The server's resolved run configuration: every common key and the algorithm's options.

    It is a :class:`ClientConfig` too (its round facts at their defaults), so the server
    builds the initial model from it as a client would; what a client is sent is
    :meth:`client_config`, nothing of :class:`ServerSettings`.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self.options.check_run(self)

    def check(self) -> None:
        """The checks across keys, and those that look at files, made once on the server."""
        super().check()
        if self.partition != "files":
            from .data.datasets import canonical_name  # local import: heavy PyG modules

            try:
                canonical_name(self.dataset)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.partition == "metis-overlapping" and self.num_clients % 5:
            raise ConfigError(f"partition=metis-overlapping needs num-clients divisible by 5 "
                              f"(5 clients per METIS part), got {self.num_clients}")
        if self.partition == "files":
            _check_partition_dir(self.partition_dir, self.num_clients)
        elif self.partition_dir:
            # Otherwise the files would be silently ignored and the run trained on a new partition.
            raise ConfigError(
                f"partition-dir is set but partition={self.partition} builds its own "
                "partition and would ignore it: set partition=files to train on those client "
                "files, or drop partition-dir"
            )
        if self.min_clients > self.num_clients:
            raise ConfigError(f"min-clients must be in [0, num-clients={self.num_clients}], "
                              f"got {self.min_clients}")
        self._check_dp()
        if not RUN_NAME.fullmatch(self.run_name):
            raise ConfigError(f"run-name {self.run_name!r} may hold only letters, digits, . _ -")
        self._check_secure_aggregation()
        self._check_robust()
        self._check_trackers()

    def _check_dp(self) -> None:
        """dp settings this algorithm can honour, and none set while dp=off."""
        if self.dp == "off":
            stray = [k for k, v in (("dp-noise-multiplier", self.dp_noise_multiplier),
                                    ("dp-epsilon", self.dp_epsilon)) if v]
            if stray:
                raise ConfigError(f"{stray[0]} is set but dp=off, so nothing would be noised: "
                                  f"set dp=signature or dp=client, or drop {stray[0]}")
            return
        why = privacy_scope.refusal(get_algorithm(self.algorithm).trainer, self.algorithm,
                                    self.dp)
        if why:
            raise ConfigError(why)
        if not self.dp_noise_multiplier and not self.dp_epsilon:
            raise ConfigError(f"dp={self.dp} needs dp-epsilon (a budget the noise is calibrated "
                              f"to) or dp-noise-multiplier > 0")

    def _check_secure_aggregation(self) -> None:
        """Refuse ``secure-aggregation`` for a method whose server needs the weights in the
        clear (its aggregator has no ``mixing_plan``), and ``ckks-threshold`` with what its
        protocol does not cover (yet)."""
        mode = self.secure_aggregation
        if mode == "off":
            return
        if not get_algorithm(self.algorithm).aggregator.has_mixing_plan():
            able = sorted(n for n, a in ALGORITHMS.items() if a.aggregator.has_mixing_plan())
            raise ConfigError(
                f"secure-aggregation={mode}: algorithm={self.algorithm}'s server needs the clients' "
                f"weights in the clear; {mode} works with {', '.join(able)}")
        if mode == "ckks-threshold":
            for setting, unsupported in (("dp", self.dp != "off"),
                                         ("client-state=file", self.client_state == "file"),
                                         ("fraction < 1", self.fraction < 1.0)):
                if unsupported:
                    raise ConfigError(
                        f"secure-aggregation=ckks-threshold does not support {setting}: every "
                        f"client holds a key share and decrypts every round "
                        f"(docs/secure-aggregation.md)")

    @property
    def tracker_names(self) -> tuple[str, ...]:
        """``trackers`` as names, in the order given (empty: none)."""
        return tuple(n.strip() for n in self.trackers.split(",") if n.strip())

    @property
    def tracker_path(self) -> Path:
        """Where the trackers write: ``tracker-dir``, else ``<output-dir>/trackers``."""
        return Path(self.tracker_dir or Path(self.output_dir) / "trackers").expanduser()

    def _check_trackers(self) -> None:
        """Known tracker names, each once, and a well-formed ``tracker-group``."""
        names = self.tracker_names
        for name in names:
            if name not in TRACKERS:
                close = difflib.get_close_matches(name, TRACKERS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"trackers: unknown tracker {name!r}, choose from "
                                  f"{', '.join(TRACKERS)} (comma-separated){hint}")
        if len(set(names)) < len(names):
            raise ConfigError(f"trackers={self.trackers!r} names a tracker twice")
        if self.tracker_group and not TRACKER_GROUP.fullmatch(self.tracker_group):
            raise ConfigError(f"tracker-group={self.tracker_group!r} must be '<grid>/<cell>', "
                              f"each of letters, digits, . _ -")

    def _check_robust(self) -> None:
        """A ``robust`` setting this run can honour (engine/robust.py applies it)."""
        rule = self.robust
        if rule == "none":
            return
        if self.secure_aggregation != "off":
            raise ConfigError(
                f"robust={rule} needs the uploads in the clear, but under secure-aggregation="
                f"{self.secure_aggregation} the server holds only ciphertexts: use one of the "
                f"two (docs/robustness.md, 'Under ckks')")
        if rule in ROBUST_ROW_RULES and not get_algorithm(self.algorithm).aggregator.has_mixing_plan():
            raise ConfigError(
                f"robust={rule} makes each client's row of the mixing plan robust, and "
                f"algorithm={self.algorithm} has no mixing plan: use robust=norm-bound, krum "
                f"or multi-krum, which screen the updates before its own aggregation")
        need = robust_min_clients(rule, self.robust_malicious)
        if self.num_clients < need:
            raise ConfigError(
                f"robust={rule} with robust-malicious={self.robust_malicious} needs at least "
                f"{need} clients, num-clients={self.num_clients}: lower robust-malicious")

    def to_config(self) -> dict[str, Any]:
        """``{key: value}``: the common keys, then the algorithm's (results.json, checkpoints)."""
        return {**Options.to_config(self), **self.options.to_config()}

    def all_keys(self) -> dict[str, Any]:
        """Every key: this run's, plus every other algorithm's options at their defaults (as
        results.json files and checkpoints have always held)."""
        out = all_defaults()
        out.update(self.to_config())
        return out

    def run_config_text(self, **changes: Any) -> str:
        """The ``--run-config`` text that gives this run (every key not at its default,
        ``changes`` applied), e.g. ``algorithm='fedaux' num-clients=20``: for printed fixes,
        so that a command run as printed keeps the user's own settings. Only this run's
        method is looked at (its keys and the common ones are all a RunConfig holds): no
        other method is imported, so a fix is printed within seconds of the start."""
        defaults = {**common_defaults(), **get_algorithm(self.algorithm).config_defaults}
        values = {**self.to_config(), **changes}
        if values["run-name"] == self.replace(run_name="").resolved_run_name:
            del values["run-name"]  # the name the server derives: let it derive it again
        profile_key = self.options.profile_key()
        # Switches at their profile's value are left to the profile (pyproject lacks their keys).
        profiled = self.options.profile_values(str(values[profile_key])) if profile_key else {}
        return " ".join(f"{key}={_run_config_value(value)}" for key, value in values.items()
                        if (key not in defaults or defaults[key] != value)
                        and not (key in profiled and profiled[key] == value))

    def replace(self, **changes: Any) -> Self:
        """This config with some fields replaced (field names, ``run_name=...``), checked again."""
        return dataclasses.replace(self, **changes)

    @property
    def resolved_run_name(self) -> str:
        """``run-name``, else a readable, deterministic name: algorithm-dataset-partitionK-seedS."""
        return self.run_name or (f"{self.algorithm}-{self.dataset}-{self.partition}"
                                 f"{self.num_clients}-seed{self.seed}")

    def client_config(self, **facts: Any) -> ClientConfig:
        """What a client is sent: its settings, the algorithm's options, and ``facts``
        (round facts as :class:`ClientConfig` field names)."""
        settings = {f.name: getattr(self, f.name) for f in ClientSettings._fields()}
        return ClientConfig(**settings, options=self.options, **facts)


_ROUND_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ClientConfig)
                   if "context" in f.metadata and f.name != "options"}


def _attach_options(config: ClientConfig | RunConfig) -> None:
    """Default ``options`` to the algorithm's defaults; refuse another algorithm's."""
    kind = get_algorithm_or_fail(config.algorithm).options
    if type(config.options) is Options and kind is not Options:
        object.__setattr__(config, "options", kind())
    elif type(config.options) is not kind:
        raise ConfigError(f"algorithm={config.algorithm} takes {kind.__name__}, "
                          f"not {type(config.options).__name__}")


def common_defaults() -> dict[str, Any]:
    """``{key: default}`` of the common keys (client keys, then server keys)."""
    return {**ClientSettings.defaults(), **ServerSettings.defaults()}


def client_keys() -> tuple[str, ...]:
    """The common keys a client is sent."""
    return ClientSettings.keys()


def all_defaults() -> dict[str, Any]:
    """Common defaults plus every registered algorithm's own keys (registration order)."""
    out = common_defaults()
    for algo in ALGORITHMS.values():
        for key, value in algo.config_defaults.items():
            if key in out:
                raise RuntimeError(f"algorithm {algo.name!r} redefines key {key!r}")
            out[key] = value
    return out


def app_config_defaults() -> dict[str, Any]:
    """What ``[tool.flwr.app.config]`` holds: :func:`all_defaults` but the switches the
    methods' reproduction profiles set (those are taken from a ``config-file`` or
    ``overrides``; Flower refuses a ``--run-config`` key its block lacks)."""
    switches = {key for algo in ALGORITHMS.values() for key in algo.options.behaviour_switch_keys()}
    return {key: value for key, value in all_defaults().items() if key not in switches}


def declared_app_config(app: Path) -> dict[str, Any] | None:
    """The run-config keys a Flower app declares with their defaults (``[tool.flwr.app.config]``
    of ``app/pyproject.toml``, nested tables flattened with dots as Flower does), read
    without importing any method; None if unreadable."""
    import tomllib

    try:
        project = tomllib.loads((app / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    table = project.get("tool", {}).get("flwr", {}).get("app", {}).get("config")
    return flatten_table(table) if isinstance(table, Mapping) else None


def flatten_table(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A TOML table's leaves as ``{"a.b": value}``, as Flower flattens a run config."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        flat.update(flatten_table(value, name) if isinstance(value, Mapping) else {name: value})
    return flat


#: How many entries, and how many folders deep, :func:`missing_file_message` looks at, at most.
CLOSEST_FILE_SCAN = 5000
CLOSEST_FILE_DEPTH = 3


def missing_file_message(path: Path) -> str:
    """One line for a ``config-file`` that is not there: the folder a relative path was
    resolved against and the closest existing YAML file, from the deepest folder of the
    path that exists (``configs/fediih/cora-disjont-10.yaml``: ``configs/fediih/cora-disjoint-10.yaml``)."""
    base = Path.cwd()
    absolute = path if path.is_absolute() else base / path
    where = "" if path.is_absolute() else f" (relative to {base})"
    folder = absolute.parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    candidates: list[str] = []
    seen = 0
    # Not from the file system's root: nothing there is like a project's config file.
    for top, dirs, files in os.walk(folder) if folder != folder.parent else ():
        depth = len(Path(top).relative_to(folder).parts) if Path(top).is_relative_to(folder) else 0
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < CLOSEST_FILE_DEPTH else []
        seen += len(files) + len(dirs)
        for name in files:
            if name.endswith((".yaml", ".yml")):
                found = Path(top) / name
                relative = not path.is_absolute() and found.is_relative_to(base)
                candidates.append(str(found.relative_to(base) if relative else found))
        if seen > CLOSEST_FILE_SCAN:
            break
    close = difflib.get_close_matches(str(path), candidates, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else f"; no YAML file like it under {folder}"
    return f"config-file {str(path)!r} does not exist{where}{hint}"


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a flat YAML mapping of run-config keys."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(missing_file_message(p))
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
) -> RunConfig:
    """Merge defaults, the YAML ``config-file`` and overrides; validate; return a :class:`RunConfig`.

    ``run_config`` is Flower's ``context.run_config``; ``overrides`` are applied
    last (used by tests and the experiment runner). Every problem is one
    :class:`ConfigError` line: an unknown key (with the closest valid one), an option
    of another algorithm set explicitly, or a bad value.

    A method is imported only if a key of its own is given: Flower's ``run_config``
    holds every method's keys (at their defaults unless set), so under Flower every
    method is; ``overrides`` alone import only the methods they name.
    """
    common = common_defaults()
    known = dict(common)  # grows by each method's defaults as its keys are met
    explicit: dict[str, Any] = {}
    for source in (run_config or {}), (overrides or {}):
        for key, value in source.items():
            default = _default_of(key, known, "")
            if source is overrides or value != default:
                explicit[key] = value
    from_file: dict[str, Any] = {}
    config_file = explicit.get("config-file", "")
    if config_file:
        for key, value in load_yaml(config_file).items():
            _default_of(key, known, f"config-file {config_file}: ")
            from_file[key] = value
    merged = {**common, **from_file, **explicit}  # the method's keys missing here: defaults
    merged["algorithm"] = canonical_algorithm(str(merged["algorithm"]))
    algorithm = get_algorithm_or_fail(merged["algorithm"])
    for where, keys in ((f"config-file {config_file}: ", from_file), ("", explicit)):
        for key in keys:
            owner = None if key in common else ALGORITHMS.owner_of(key)
            if owner is not None and owner != algorithm.name:
                raise ConfigError(f"{where}{key} is an option of {owner}, not of "
                                  f"algorithm={algorithm.name}")
    return RunConfig.from_config(merged)


@dataclass(frozen=True)
class FederationPreview:
    """What the ServerApp checks of a simulated federation before the run config is
    resolved (resolving imports the chosen method, torch and PyG: seconds on a loaded
    machine): ``num-clients`` and ``handshake-timeout`` as :func:`resolve_config` will
    merge them, and the keys the user set, for the printed fix."""

    num_clients: int
    handshake_timeout: float
    explicit: Mapping[str, Any]

    @classmethod
    def of(cls, explicit: Mapping[str, Any], known: Mapping[str, Any] | None = None
           ) -> FederationPreview | None:
        """From the keys the user set; a missing or bad ``config-file``, a key of the file
        not in ``known`` (every key with its default: the app's declared run config) or an
        unknown algorithm raises its ConfigError (all read without importing a method);
        None where a value is not a plain number (resolve_config says why)."""
        common = common_defaults()
        config_file = explicit.get("config-file")
        from_file = load_yaml(config_file) if config_file else {}
        unknown = [key for key in from_file if known is not None and key not in known]
        if unknown and known is not None:
            raise ConfigError(f"config-file {config_file}: {_unknown_key(unknown[0], known)}")

        def value(key: str) -> Any:
            return explicit.get(key, from_file.get(key, common[key]))

        canonical_algorithm(str(value("algorithm")))
        clients, timeout = value("num-clients"), value("handshake-timeout")
        if isinstance(clients, bool) or not isinstance(clients, int) \
                or isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            return None
        return cls(clients, float(timeout), dict(explicit))

    def run_config_text(self, **changes: Any) -> str:
        """The ``--run-config`` text of the user's keys, ``changes`` applied (as
        :meth:`RunConfig.run_config_text`, with the keys as the user wrote them)."""
        values = {**self.explicit, **changes}
        common = common_defaults()
        return " ".join(f"{key}={_run_config_value(value)}" for key, value in values.items()
                        if key not in common or common[key] != value)


def _default_of(key: str, known: dict[str, Any], where: str) -> Any:
    """The default of run-config ``key``, from ``known`` or else its method's own keys (the
    method imported, its defaults added to ``known``); a ConfigError if there is no such key."""
    if key not in known:
        owner = ALGORITHMS.owner_of(key)
        if owner is not None:
            known.update(ALGORITHMS[owner].config_defaults)
    if key not in known:
        raise ConfigError(where + _unknown_key(key, all_defaults()))
    return known[key]


def _unknown_key(key: str, defaults: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(defaults), n=1)
    if close:
        return f"unknown config key {key!r}; did you mean {close[0]!r}?"
    return f"unknown config key {key!r}; valid keys: {', '.join(sorted(defaults))}"


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


def canonical_algorithm(name: str) -> str:
    """The registered algorithm ``name`` stands for, in any case (``FedIIH``: ``fediih``,
    as the papers and the docs' prose write it), or a ConfigError with the closest name."""
    if name in ALGORITHMS:
        return name
    by_lower = {registered.lower(): registered for registered in ALGORITHMS}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    hint = f"did you mean {by_lower[close[0]]!r}? " if close else ""
    raise ConfigError(f"unknown algorithm {name!r}; {hint}valid: {', '.join(sorted(ALGORITHMS))}")


def get_algorithm_or_fail(name: str) -> Algorithm:
    """The registered algorithm ``name``, or a ConfigError that lists the valid names."""
    try:
        return get_algorithm(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


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


def _run_config_value(value: Any) -> str:
    """A value as Flower's ``--run-config`` parses it inside a double-quoted shell word."""
    if isinstance(value, str) and "'" not in value and '"' not in value:
        return f"'{value}'"
    return _toml_value(value).replace('"', '\\"')


def pyproject_block() -> str:
    """The generated ``[tool.flwr.app.config]`` block, markers included: the common keys,
    then each algorithm's options in registration order, each with its doc, but the
    switches its reproduction profile sets (Flower refuses a ``--run-config`` key the block
    lacks, so those are set in a ``config-file``)."""
    lines = [PYPROJECT_BEGIN.rstrip("\n"), "[tool.flwr.app.config]", "# common keys"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in common_defaults().items()]
    for algo in ALGORITHMS.values():
        docs, ranges = algo.options.docs(), algo.options.ranges()
        if not docs:
            continue
        lines.append(f"# {algo.name} ({algo.options.__module__}.{algo.options.__name__})")
        switches = set(algo.options.behaviour_switch_keys())
        lines += [f"{key} = {_toml_value(value)}  # {docs[key]}"
                  + (f" (must be {ranges[key]})" if key in ranges else "")
                  for key, value in algo.config_defaults.items() if key not in switches]
        if switches:
            lines.append(f"# ({len(switches)} more switches, set by {algo.options.profile_key()}: "
                         f"docs/methods/{algo.name}.md; set them in a config-file)")
    return "\n".join(lines) + "\n" + PYPROJECT_END


def pyproject_with_block(text: str) -> str:
    """``text`` (a pyproject.toml) with its generated block replaced by the current one."""
    new = replace_block(text, PYPROJECT_BEGIN, PYPROJECT_END, pyproject_block())
    if new is None:
        raise ConfigError("pyproject.toml lacks the generated block's BEGIN/END marker lines")
    return new


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m fedgraph_flwr.config",
                                     description="Run-config defaults and pyproject.toml.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write-pyproject", action="store_true",
                       help="rewrite [tool.flwr.app.config] of pyproject.toml from the defaults")
    group.add_argument("--check-pyproject", action="store_true",
                       help="exit 1 if pyproject.toml's block is not current")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT, help="default: %(default)s")
    args = parser.parse_args(argv)
    return write_or_check(args.pyproject, pyproject_with_block, check=args.check_pyproject,
                          stale=f"{args.pyproject} is not current: run python -m "
                                f"fedgraph_flwr.config --write-pyproject")


if __name__ == "__main__":
    sys.exit(main())
