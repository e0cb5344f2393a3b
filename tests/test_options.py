"""Typed algorithm options: validated on the server before any client, one line per problem;
the pyproject defaults are generated from them; a client gets only the keys it reads."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedgraph_flwr.algorithms import ALGORITHMS, Options, option
from fedgraph_flwr.algorithms.fedaux import FedAuxOptions
from fedgraph_flwr.algorithms.fedavg import FedAvgAggregator, FedAvgOptions
from fedgraph_flwr.algorithms.fedprox import FedProxAggregator
from fedgraph_flwr.algorithms.fedspray import FedSprayOptions
from fedgraph_flwr.config import (
    ClientConfig,
    ClientSettings,
    ConfigError,
    RunConfig,
    ServerSettings,
    all_defaults,
    app_config_defaults,
    client_keys,
    common_defaults,
    main,
    pyproject_with_block,
    resolve_config,
)

ROOT = Path(__file__).resolve().parents[1]


def one_line_error(run_config=None, overrides=None) -> str:
    with pytest.raises(ConfigError) as err:
        resolve_config(run_config, overrides)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"fedaux-sigma": -1}, "fedaux-sigma=-1.0 is out of range: must be > 0"),
        ({"algorithm": "fedspray", "fedspray-kd-threshold": 1.5},
         "fedspray-kd-threshold=1.5 is out of range: must be in [0, 1]"),
        ({"fedpub-tau": 5}, "fedpub-tau is an option of fedpub, not of algorithm=fedaux"),
        ({"fedaux-sigmaa": 2}, "unknown config key 'fedaux-sigmaa'; did you mean 'fedaux-sigma'?"),
        ({"fedaux-variant": "sofft"},
         "fedaux-variant='sofft' is not a valid choice: must be one of soft, hard"),
        ({"fedaux-hard-kernel": 4}, "fedaux-hard-kernel=4 is invalid: must be odd"),
        ({"fedaux-alpha": "ten"}, "fedaux-alpha='ten' is not a valid float"),
        ({"algorithm": "apfl", "apfl-alpha": 1.5}, "apfl-alpha=1.5 is out of range: must be in [0, 1]"),
        ({"algorithm": "gcfl", "gcfl-mode": "kmeans"}, "gcfl-mode='kmeans' is not a valid choice"),
        ({"algorithm": "fediih", "fediih-factors": 0}, "fediih-factors=0 is out of range: must be >= 1"),
        ({"algorithm": "fedpub", "fedpub-proxy-p": 2.0}, "fedpub-proxy-p=2.0 is out of range"),
        ({"algorithm": "fedprox", "fedprox-mu": -0.1}, "fedprox-mu=-0.1 is out of range: must be >= 0"),
    ],
)
def test_bad_option_is_one_line_naming_the_key(overrides, message):
    assert one_line_error({}, overrides).startswith(message)


def test_another_algorithms_option_counts_only_when_explicit(tmp_path):
    # Flower hands the ServerApp every pyproject key: other algorithms' at their defaults pass.
    flwr = dict(all_defaults(), algorithm="fedavg", **{"fedaux-sigma": 1})
    assert resolve_config(flwr).algorithm == "fedavg"
    # A value that differs from the default was set on purpose: refused.
    flwr["fedaux-sigma"] = 2.0
    assert one_line_error(flwr) == "fedaux-sigma is an option of fedaux, not of algorithm=fedavg"
    # Overrides and YAML keys are explicit even at the default value.
    assert "fedpub-tau is an option of fedpub" in one_line_error(None, {"fedpub-tau": 10.0})
    path = tmp_path / "run.yaml"
    path.write_text("algorithm: fedavg\nfedspray-lambda1: 2.0\n")
    assert one_line_error(None, {"config-file": str(path)}) == (
        f"config-file {path}: fedspray-lambda1 is an option of fedspray, not of algorithm=fedavg")
    path.write_text("algorithm: fedavg\nfedavg-weighting: uniformm\n")
    assert one_line_error(None, {"config-file": str(path)}) == (
        "fedavg-weighting='uniformm' is not a valid choice: must be one of train, uniform")
    path.write_text("algorithm: fedaux\nfedaux-sigmaa: 2\n")
    assert one_line_error(None, {"config-file": str(path)}) == (
        f"config-file {path}: unknown config key 'fedaux-sigmaa'; did you mean 'fedaux-sigma'?")


def test_resolved_options_are_typed_and_other_algorithms_keep_their_defaults():
    cfg = resolve_config({}, {"fedaux-sigma": "2", "fedaux-hard-kernel": 5.0, "fedaux-masked": "no",
                              "rounds": "7"})
    assert isinstance(cfg, RunConfig) and cfg.rounds == 7
    opts = cfg.options_of(FedAuxOptions)
    assert opts.sigma == 2.0 and isinstance(opts.sigma, float)
    assert opts.hard_kernel == 5 and isinstance(opts.hard_kernel, int)
    assert opts.masked is False
    assert set(cfg.all_keys()) == set(all_defaults())  # results.json keeps every key
    assert cfg.all_keys()["fedpub-tau"] == 10.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rounds = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match="^algorithm=fedaux has FedAuxOptions, not FedSprayOptions$"):
        cfg.options_of(FedSprayOptions)


def test_common_keys_are_declared_with_a_doc_and_split_between_client_and_server():
    assert list(common_defaults()) == [*ClientSettings.keys(), *ServerSettings.keys()]
    assert len(ClientSettings.keys()) == 35 and len(ServerSettings.keys()) == 21
    docs = {**ClientSettings.docs(), **ServerSettings.docs()}
    assert all(doc.strip() and "\n" not in doc for doc in docs.values())
    assert ClientSettings.ranges()["dropout"] == "in [0, 1)"


def test_client_config_holds_the_common_client_keys_and_the_algorithms_own():
    cfg = resolve_config({}, {"fedaux-sigma": 0.5})
    client = cfg.client_config(server_round=3)
    assert type(client) is ClientConfig
    sent = client.to_config()
    assert len(client_keys()) == 35
    assert len(sent) == 50  # 35 common + 14 fedaux-* (fedaux-reproduce among them) + server-round
    assert list(sent) == [*client_keys(), *FedAuxOptions.keys(), "server-round"]
    assert sent["fedaux-sigma"] == 0.5
    assert not any(k.startswith(("fedpub-", "fedspray-", "fediih-", "gcfl-", "apfl-", "fedprox-",
                                 "fedavg-")) for k in sent)
    assert not set(ServerSettings.keys()) & set(sent)
    assert ClientConfig.from_config(sent) == client  # the wire form reads back as it was
    local = resolve_config({}, {"algorithm": "local"}).client_config()
    assert list(local.to_config()) == list(client_keys())


def test_pyproject_block_is_generated_and_current(tmp_path):
    text = (ROOT / "pyproject.toml").read_text()
    assert pyproject_with_block(text) == text, "run: python -m fedgraph_flwr.config --write-pyproject"
    parsed = tomllib.loads(text)["tool"]["flwr"]["app"]["config"]
    assert parsed == app_config_defaults() and list(parsed) == list(app_config_defaults())
    # The command finds a stale block and rewrites only it.
    stale = tmp_path / "pyproject.toml"
    stale.write_text(text.replace("fedaux-sigma = 1.0", "fedaux-sigma = 3.0"))
    assert main(["--check-pyproject", "--pyproject", str(stale)]) == 1
    assert main(["--write-pyproject", "--pyproject", str(stale)]) == 0
    assert stale.read_text() == text


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_option_has_a_doc_a_prefixed_key_and_a_valid_default(name):
    algo = ALGORITHMS[name]
    assert algo.trainer.options_class is algo.options is algo.aggregator.options_class
    docs = algo.options.docs()
    assert list(docs) == list(algo.config_defaults) == list(algo.options.keys())
    for field in dataclasses.fields(algo.options):
        key = algo.options.key(field.name)
        assert key == f"{name}-{field.name.replace('_', '-')}"
        assert docs[key].strip() and "\n" not in docs[key]
    assert algo.options.from_config(algo.config_defaults) == algo.options()


def test_options_are_frozen_and_validated_at_construction():
    opts = FedAuxOptions(sigma=2)
    assert opts.sigma == 2.0 and isinstance(opts.sigma, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.sigma = 3.0  # type: ignore[misc]
    with pytest.raises(ConfigError, match=r"^fedspray-kd-threshold=-0.5 is out of range"):
        FedSprayOptions(kd_threshold=-0.5)
    assert FedSprayOptions(kd_threshold=1).kd_threshold == 1.0  # 1: KD on labelled nodes only


def test_a_field_may_override_its_key_and_bounds_may_be_open():
    @dataclass(frozen=True)
    class Probe(Options, prefix="probe"):
        rate: float = option(0.5, "a rate", low=0.0, high=1.0, low_inclusive=False,
                             high_inclusive=False)
        width: int = option(8, "a width", low=1, key="probe-w")

    assert Probe.defaults() == {"probe-rate": 0.5, "probe-w": 8}
    assert Probe.from_config({"probe-w": "3", "width": 99}).width == 3
    with pytest.raises(ConfigError, match=r"^probe-rate=1.0 is out of range: must be in \(0, 1\)$"):
        Probe(rate=1)


def test_trainers_and_aggregators_get_their_algorithms_typed_options():
    cfg = resolve_config({}, {"algorithm": "fedavg", "fedavg-weighting": "uniform"})
    agg = FedAvgAggregator(cfg, [0, 1], {})
    assert agg.options == FedAvgOptions(weighting="uniform") and agg.weighting() == "uniform"
    # FedProx's server is FedAvg's, without the weighting option: train-node weights.
    assert FedProxAggregator(resolve_config({}, {"algorithm": "fedprox"}), [0], {}).weighting() == "train"


# --- reproduction profiles (<prefix>-reproduce) ----------------------------------------------
def test_a_profile_sets_its_switches_and_explicit_switches_win():
    official = resolve_config(None, {"algorithm": "fggp"}).options
    openfgl = resolve_config(None, {"algorithm": "fggp", "fggp-reproduce": "openfgl"}).options
    assert (official.reproduce, official.flavour, official.optimizer, official.knn_every) == (
        "official", "official", "sgd", 20)
    assert (openfgl.flavour, openfgl.evaluate, openfgl.optimizer, openfgl.knn_every) == (
        "openfgl", "logits", "adam", 1)
    expert = resolve_config(None, {"algorithm": "fggp", "fggp-reproduce": "openfgl",
                                   "fggp-knn-every": 20}).options
    assert (expert.flavour, expert.knn_every) == ("openfgl", 20)
    # an explicit switch at its default still wins over the profile
    assert resolve_config(None, {"algorithm": "fggp", "fggp-reproduce": "openfgl",
                                 "fggp-optimizer": "sgd"}).options.optimizer == "sgd"


def test_an_unknown_profile_is_one_line_with_the_closest_value():
    message = one_line_error(None, {"algorithm": "fggp", "fggp-reproduce": "openfg"})
    assert message == ("fggp-reproduce='openfg' is not a valid choice: must be one of official, "
                       "openfgl; did you mean 'openfgl'?")


def test_a_profile_from_flowers_run_config_and_a_config_file(tmp_path):
    # Flower hands the ServerApp pyproject's block (no switches) with the user's values.
    flwr = dict(app_config_defaults(), algorithm="feddc", **{"feddc-reproduce": "openfgl"})
    options = resolve_config(flwr).options
    assert (options.flavour, options.alpha, options.optimizer) == ("openfgl", 0.1, "adam")
    path = tmp_path / "run.yaml"
    path.write_text("algorithm: feddc\nfeddc-reproduce: openfgl\nfeddc-optimizer: sgd\n")
    options = resolve_config(dict(flwr, **{"config-file": str(path), "feddc-reproduce": "official"})).options
    assert (options.reproduce, options.flavour, options.optimizer) == ("openfgl", "openfgl", "sgd")


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if ALGORITHMS[n].options.profiles])
def test_the_default_profile_changes_nothing_and_every_profile_is_valid(name):
    kind = ALGORITHMS[name].options
    default = next(iter(kind.profiles))
    assert kind.keys()[0] == f"{name}-reproduce" and kind.defaults()[f"{name}-reproduce"] == default
    assert kind.from_config({}) == kind()  # the defaults are the default profile's
    for profile in kind.profiles:
        options = kind.from_config({f"{name}-reproduce": profile})
        assert {key: options.to_config()[key] for key in kind.switch_keys()} == kind.profile_values(profile)
        # the resolved options read back as they were (the wire form holds every switch)
        assert kind.from_config(options.to_config()) == options
        # rounds: room for AdaFGL's step 2 under every schedule
        cfg = resolve_config(None, {"algorithm": name, f"{name}-reproduce": profile,
                                    "rounds": 400}).client_config()
        assert cfg.with_keys({}) == cfg
        back = cfg.with_keys({f"{name}-reproduce": default}).options
        assert back == kind()  # a new profile resets the switches the old one set


def test_a_bad_profile_declaration_is_refused():
    # Algorithm(...) calls check_profiles when a method is registered.
    @dataclass(frozen=True)
    class Shifted(Options, prefix="bad", profiles={"code": {"mode": "b"}, "paper": {"mode": "a"}}):
        mode: str = option("a", "a | b", choices=("a", "b"))

    with pytest.raises(TypeError, match="the default profile 'code' sets mode='b', but its default is 'a'"):
        Shifted.check_profiles()

    @dataclass(frozen=True)
    class Unknown(Options, prefix="bad", profiles={"code": {}, "paper": {"mood": "a"}}):
        mode: str = option("a", "a | b", choices=("a", "b"))

    with pytest.raises(TypeError, match="profile 'paper' sets 'mood', not a switch"):
        Unknown.check_profiles()

    @dataclass(frozen=True)
    class Invalid(Options, prefix="bad", profiles={"code": {}, "paper": {"mode": "c"}}):
        mode: str = option("a", "a | b", choices=("a", "b"))

    with pytest.raises(TypeError, match="sets mode='c', which is not one of a, b"):
        Invalid.check_profiles()


def test_a_run_saved_before_the_profiles_is_not_stale_under_the_profile_that_sets_its_switches():
    from fedgraph_flwr.experiments import stale_keys

    saved = resolve_config(None, {"algorithm": "feddc", "feddc-flavour": "openfgl", "feddc-alpha": 0.1,
                                  "feddc-optimizer": "adam"}).to_config()
    del saved["feddc-reproduce"]  # as results.json files written before the key
    now = resolve_config(None, {"algorithm": "feddc", "feddc-reproduce": "openfgl"})
    assert stale_keys(saved, now) == []
    assert stale_keys(saved, resolve_config(None, {"algorithm": "feddc"})) == [
        "feddc-alpha", "feddc-flavour", "feddc-optimizer"]
