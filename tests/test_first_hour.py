"""A newcomer's first hour: errors said once, with the fix, in seconds; a usable exit status.

Unit tests: the handshake's failures collapse into one line per reason (with what fixes
a data root that never reached the clients), a simulation that runs its ClientApps
one after another is detected from what Ray gave them, and ``fedgraph-run`` reads its
arguments and the run's final status right.

The ``simulation`` tests run ``fedgraph-run`` (``python -m fedgraph_flwr.run``) and
``flwr run`` for real against the local SuperLink that ``flwr run`` starts, each in a
private network and PID namespace (``unshare``): the SuperLink and everything it
started end with the namespace, and no port of the machine is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedgraph_flwr import run as fedgraph_run
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.engine import client_runtime as rt
from fedgraph_flwr.engine import flower_transport
from fedgraph_flwr.engine.contract import ERROR_DATA, ERROR_DATA_ROOT, missing_dataset
from fedgraph_flwr.engine.driver import RunAborted
from fedgraph_flwr.engine.flower_transport import FlowerTransport, serialised_note

from conftest import DATASETS, requires_datasets

ROOT = Path(__file__).resolve().parents[1]


# --- the handshake's failures, once -----------------------------------------------------
class InMemoryGrid:
    """A simulation's grid as the transport sees it: its nodes never heartbeat (Flower's
    simulation registers them with an endless interval); every node answers the
    handshake with ``answer(node)``."""

    def __init__(self, nodes: list[int], answer) -> None:
        self.nodes, self.answer, self.sent = nodes, answer, {}

    def get_node_ids(self):
        return list(self.nodes)

    def get_nodes(self):
        return [SimpleNamespace(node_id=n, heartbeat_interval=1e300) for n in self.nodes]

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = f"m{len(self.sent)}"
            self.sent[mid] = m.metadata.dst_node_id
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self.answer(self.sent[mid], mid) for mid in message_ids]


def test_simulation_is_told_by_the_nodes_heartbeat_through_public_get_nodes():
    """Flower's simulation registers its SuperNodes with an endless heartbeat interval;
    deployed ones report theirs (30 s by default); a grid without node infos (Grid's
    default get_nodes: node ids only), none, or one that fails to answer: deployment."""
    from fedgraph_flwr.engine.flower_transport import is_simulation

    def grid(*intervals, fails=False):
        def get_nodes():
            if fails:
                raise ConnectionError("SuperLink unreachable")
            return [SimpleNamespace(node_id=i, heartbeat_interval=h) for i, h in enumerate(intervals)]
        return SimpleNamespace(get_nodes=get_nodes)

    assert is_simulation(InMemoryGrid([1, 2], None))
    assert is_simulation(grid(1e300, float("inf")))
    assert not is_simulation(grid(30.0, 30.0))
    assert not is_simulation(grid(1e300, 30.0))
    assert not is_simulation(grid())
    assert not is_simulation(grid(1e300, fails=True))
    assert not is_simulation(SimpleNamespace(get_nodes=lambda: [SimpleNamespace(node_id=1)]))
    assert not is_simulation(object())


def _error(code: int, reason: str):
    def answer(node, mid):
        return SimpleNamespace(metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=mid),
                               has_error=lambda: True, error=SimpleNamespace(code=code, reason=reason))
    return answer


def _info(resources: dict):
    def answer(node, mid):
        info = {"partition-id": node - 1, "num-nodes": 5, "num-features": 3, "num-classes": 2,
                "num-train": 2, **resources(node)}
        return SimpleNamespace(metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=mid),
                               has_error=lambda: False, content={"info": info})
    return answer


CONFIG = {"algorithm": "fedavg", "dataset": "Cora", "num-clients": 10, "handshake-timeout": 5.0}
MISSING = ("DataRootError: dataset 'Cora' is not available under /home/u/.cache/fedgraph-flwr: "
           "missing Cora/raw/ind.cora.x (the default data root: neither data-root nor "
           "FEDGRAPH_DATA_ROOT is set here)")


@pytest.fixture(autouse=True)
def _messages_without_a_run(monkeypatch):
    """Flower's Message needs a run to be built in; the fake grid reads only its node."""
    def message(content, dst_node_id, message_type, group_id=""):
        return SimpleNamespace(content=content, metadata=SimpleNamespace(
            dst_node_id=dst_node_id, message_type=message_type, group_id=group_id))

    monkeypatch.setattr(flower_transport, "Message", message)
    # The handshake's own lines: no dataset check before it (tested on its own below).
    monkeypatch.setattr(flower_transport, "missing_dataset", lambda config, fetch=False: None)


def _connect(grid, **config):
    lines: list[str] = []
    transport = FlowerTransport(grid, log=lines.append)
    roster = transport.connect(resolve_config(dict(CONFIG, **config)))
    return roster, lines


def test_a_data_root_that_reached_no_client_is_one_line_with_the_fix(monkeypatch):
    monkeypatch.delenv("FEDGRAPH_DATA_ROOT", raising=False)
    grid = InMemoryGrid(list(range(1, 11)), _error(ERROR_DATA_ROOT, MISSING))
    with pytest.raises(RunAborted) as failed:
        _connect(grid)
    message = str(failed.value)
    assert message.count("DataRootError") == 1 and "\n" not in message
    assert message.startswith(f"handshake failed: all 10 clients: {MISSING}")
    # The trap, and both ways out.
    assert "environment the local SuperLink had when it started" in message
    assert "a FEDGRAPH_DATA_ROOT exported since is not seen" in message
    assert "--run-config \"data-root='/path/to/datasets'\"" in message
    assert ('pgrep -u "$(id -u)" -a -f "[f]lower-superlink .*${FLWR_HOME:-$HOME/.flwr}/'
            'local-superlink/"; kill that PID') in message
    assert "export FEDGRAPH_DATA_ROOT=" in message and "pkill" not in message


def test_data_root_hint_only_where_it_applies(monkeypatch):
    monkeypatch.delenv("FEDGRAPH_DATA_ROOT", raising=False)
    grid = InMemoryGrid(list(range(1, 11)), _error(ERROR_DATA_ROOT, MISSING))
    with pytest.raises(RunAborted) as failed:  # an explicit data-root: the reason names it
        _connect(grid, **{"data-root": "/data"})
    assert str(failed.value) == f"handshake failed: all 10 clients: {MISSING}"
    grid = InMemoryGrid(list(range(1, 11)), _error(ERROR_DATA, "ClientDataError: bad file"))
    with pytest.raises(RunAborted) as failed:  # not a data-root problem
        _connect(grid)
    assert str(failed.value) == "handshake failed: all 10 clients: ClientDataError: bad file"


def test_different_reasons_get_a_line_each():
    def answer(node, mid):
        reason = "ClientDataError: node a" if node <= 7 else f"ClientDataError: node {node}"
        return _error(ERROR_DATA, reason)(node, mid)

    with pytest.raises(RunAborted) as failed:
        _connect(InMemoryGrid(list(range(1, 11)), answer))
    assert str(failed.value) == (
        "handshake failed: 7 of 10 clients (nodes 1, 2, 3, 4, 5, ...): ClientDataError: node a; "
        "node 8: ClientDataError: node 8; node 9: ClientDataError: node 9; "
        "node 10: ClientDataError: node 10")


def test_a_simulation_checks_the_dataset_before_the_handshake(tmp_path, monkeypatch):
    """Its ClientApps share the ServerApp's environment and files: no message is sent."""
    monkeypatch.delenv("FEDGRAPH_DATA_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(flower_transport, "missing_dataset", missing_dataset)
    grid = InMemoryGrid(list(range(1, 11)), _error(ERROR_DATA, "never asked"))
    with pytest.raises(RunAborted) as failed:  # an offline site (downloads: test_download.py)
        _connect(grid, download=False)
    assert not grid.sent
    assert str(failed.value).startswith(
        "the 10 simulated clients cannot load their data: DataRootError: dataset 'Cora' is not "
        f"available under {tmp_path / 'cache' / 'fedgraph-flwr'}: missing Cora/raw/ind.cora.x")
    assert "a FEDGRAPH_DATA_ROOT exported since is not seen" in str(failed.value)
    assert missing_dataset(resolve_config({"dataset": "SBM"})) is None


@requires_datasets
def test_no_check_failure_where_the_data_is(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert missing_dataset(resolve_config({"data-root": str(data_root)})) is None
    assert missing_dataset(resolve_config({"data-root": str(tmp_path)})).startswith(
        f"DataRootError: dataset 'Cora' is not available under {tmp_path}: missing ")


def test_missing_dataset_names_where_the_client_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDGRAPH_DATA_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = resolve_config({"dataset": "Cora", "num-clients": 2, "download": False})
    with pytest.raises(rt.DataRootError, match=r"not available under .*cache/fedgraph-flwr: "
                       r"missing Cora/raw/.* \(the default data root: neither data-root nor "
                       r"FEDGRAPH_DATA_ROOT is set here\)$"):
        rt.load_client_data(rt.ClientIdentity(0, "cache"), config)
    monkeypatch.setenv("FEDGRAPH_DATA_ROOT", str(tmp_path / "env"))
    with pytest.raises(rt.DataRootError, match=r"under .*env.*\(data root from env FEDGRAPH_DATA_ROOT\)$"):
        rt.load_client_data(rt.ClientIdentity(0, "cache"), config)


# --- a simulation that runs its clients one after another -------------------------------
def _ray(cpus, total, actor="a1"):
    return {"ray-cpus": cpus, "ray-cpus-total": total, "ray-actor": actor}


def test_serialised_simulation_is_detected_from_rays_resources():
    note = serialised_note([_ray(2.0, 2.0)] * 10, 10)
    assert note is not None and "one after another" in note
    assert "Flower gives each 2 of the 2 CPUs" in note
    assert "--federation-config \"client-resources-num-cpus=1\"" in note
    assert "flwr federation simulation-config @none/default local --client-resources-num-cpus 1" in note
    # 16 CPUs, 16 each: one at a time too.
    assert "client-resources-num-cpus=1" in serialised_note([_ray(16.0, 16.0)] * 10, 10)


@pytest.mark.parametrize("resources, clients", [
    ([_ray(1.0, 2.0)] * 10, 10),  # two at a time
    ([_ray(2.0, 16.0)] * 10, 10),  # eight at a time
    ([_ray(1.0, 1.0)] * 10, 10),  # one CPU: nothing to gain
    ([_ray(2.0, 2.0)], 1),  # one client
    ([_ray(2.0, 2.0, "a1"), _ray(2.0, 2.0, "a2")], 2),  # ran in two actors after all
    ([{}] * 10, 10),  # a deployment: no Ray
])
def test_no_serialised_note_when_nothing_is_to_gain(resources, clients):
    assert serialised_note(resources, clients) is None


def test_handshake_logs_the_note_once_and_keeps_ray_out_of_the_roster():
    grid = InMemoryGrid(list(range(1, 11)), _info(lambda node: _ray(2.0, 2.0)))
    roster, lines = _connect(grid, dataset="SBM")
    assert len([line for line in lines if "one after another" in line]) == 1
    assert sorted(roster) == list(range(10))
    assert not [k for facts in roster.values() for k in facts if k.startswith("ray-")]


def test_ray_resources_are_empty_outside_ray():
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            pytest.skip("a Ray session of another test is still up")
    assert rt.ray_resources() == {}


# --- fedgraph-run: arguments and the final status --------------------------------------
def test_split_args_knows_flwr_runs_options():
    positionals, options = fedgraph_run.split_args(
        [".", "local", "--run-config", "rounds=1", "-c", "x=1", "--stream",
         "--federation-config=num-supernodes=2", "--format", "default"])
    assert positionals == [".", "local"]
    assert options["--run-config"] == ["rounds=1"] and options["-c"] == ["x=1"]
    assert options["--federation-config"] == ["num-supernodes=2"] and "--stream" in options


def test_data_root_env_is_passed_on_only_where_it_applies(tmp_path, monkeypatch):
    monkeypatch.setattr(fedgraph_run, "is_local_superlink", lambda name: name in (None, "local"))
    env = {"FEDGRAPH_DATA_ROOT": str(tmp_path)}
    args, note = fedgraph_run.with_data_root([".", "--stream"], env)
    assert args == [".", "--stream", "--run-config", f'data-root="{tmp_path.resolve()}"']
    assert "FEDGRAPH_DATA_ROOT passed on" in note
    for given in ([".", "--run-config", "data-root='/x' rounds=1"],  # set explicitly
                  [".", "remote"],  # another SuperLink: its SuperNodes have their own
                  ):
        assert fedgraph_run.with_data_root(given, env) == (given, "")
    toml = tmp_path / "run.toml"
    toml.write_text('data-root = "/x"\n')
    assert fedgraph_run.with_data_root([".", "-c", str(toml)], env)[1] == ""
    assert fedgraph_run.with_data_root(["."], {}) == (["."], "")


def test_local_superlink_is_read_from_the_flower_config(tmp_path):
    env = {"FLWR_HOME": str(tmp_path)}
    assert fedgraph_run.is_local_superlink(None, env)  # no config yet: flwr makes local the default
    (tmp_path / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n\n[superlink.supergrid]\naddress = "api.flower.ai"\n\n'
        '[superlink.local]\naddress = ":local:"\n')
    assert fedgraph_run.is_local_superlink(None, env)
    assert fedgraph_run.is_local_superlink("local", env)
    assert not fedgraph_run.is_local_superlink("supergrid", env)
    assert not fedgraph_run.is_local_superlink("nowhere", env)


@pytest.mark.parametrize("run_config, words", [
    ("fedaux-sigmaa=2", "unknown config key 'fedaux-sigmaa'; did you mean 'fedaux-sigma'?"),
    ("lr=-0.01", "lr=-0.01 is out of range: must be > 0"),
    ("dataset='Corra'", "unknown dataset 'Corra'"),
    ("algorithm='fedavg' fedaux-sigma=2", "fedaux-sigma is an option of fedaux"),
    ("config-file='configs/nope.yaml'", "does not exist"),
    # a profile's switch is not in pyproject's block: Flower would refuse it (code 15)
    ("algorithm='fggp' fggp-flavour='openfgl'",
     "fggp-flavour is a switch of fggp-reproduce (docs/methods/fggp.md), not in"),
])
@pytest.mark.smoke
def test_fedgraph_run_refuses_a_bad_run_config_in_one_line_before_submitting(run_config, words,
                                                                                capsys):
    """No SuperLink is needed: the check runs before ``flwr run`` and names the key."""
    root = Path(__file__).resolve().parents[1]
    assert fedgraph_run.main([str(root), "--run-config", run_config]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(fedgraph_run.ERROR_LINE) and words in err and "\n" not in err


@pytest.mark.smoke
def test_fedgraph_run_checks_the_federation_size_and_the_data_root_before_submitting(
        tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))  # no config.toml: the local SuperLink
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no cached partitions either
    root = str(Path(__file__).resolve().parents[1])
    error = fedgraph_run.config_error(
        [root, "--run-config", "num-clients=10", "--federation-config", "num-supernodes=5"])
    assert error == (f"{fedgraph_run.ERROR_LINE}--federation-config sets num-supernodes=5 but "
                     "num-clients=10; make them equal")
    error = fedgraph_run.config_error([root, "--run-config", f"data-root='{tmp_path}'"])
    assert error.startswith(f"{fedgraph_run.ERROR_LINE}dataset 'Cora' is not available under "
                            f"{tmp_path}") and "\n" not in error
    # A remote SuperLink's data root is not this machine's: left to the clients.
    (tmp_path / "config.toml").write_text(
        '[superlink]\ndefault = "far"\n[superlink.far]\naddress = "10.0.0.1:9093"\n')
    assert fedgraph_run.config_error([root, "--run-config", f"data-root='{tmp_path}'"]) is None


def test_run_config_is_parsed_as_flower_parses_it(tmp_path):
    toml = tmp_path / "over.toml"
    toml.write_text('rounds = 3\nalgorithm = "fedavg"\n')
    parse = fedgraph_run.run_config_values
    assert parse({"--run-config": ["rounds=3 algorithm='fedavg' data-root=\"/a b\""]}) == {
        "rounds": 3, "algorithm": "fedavg", "data-root": "/a b"}
    assert parse({"--run-config": [str(toml)]}) == {"rounds": 3, "algorithm": "fedavg"}
    assert parse({"--run-config": ["rounds=[oops"]}) is None  # Flower's own message then
    assert fedgraph_run.config_error([".", "--run-config", "rounds=3 algorithm='fedavg'"]) is None


def test_run_status_reads_flwr_ls_json():
    payload = {"success": True, "runs": [{"run-id": "7", "status": "finished:failed",
                                          "status-details": "ServerApp failed"}]}

    def runner(cmd, **_):
        assert cmd[-5:-3] == ["ls", "--run-id"] and cmd[-2:] == ["--format", "json"]
        return SimpleNamespace(stdout=json.dumps(payload), returncode=0)

    assert fedgraph_run.run_status(7, None, runner) == ("finished:failed", "ServerApp failed")
    assert fedgraph_run.run_status(8, None, runner) is None


def test_final_status_waits_for_the_run_to_finish():
    seen = iter([("running", ""), None, ("finished:completed", "")])
    assert fedgraph_run.final_status(1, None, 10, lambda *_: next(seen)) == ("finished:completed", "")
    assert fedgraph_run.final_status(1, None, 0, lambda *_: ("running", "")) == ("running", "")


@pytest.mark.parametrize("status, code", [
    (("finished:completed", ""), 0), (("finished:failed", "x"), 1), (("finished:stopped", ""), 1),
    (("running", ""), 2), (None, 2),
])
def test_exit_codes(status, code):
    assert fedgraph_run.exit_code(status) == code


# --- for real: flwr run against a local SuperLink in private namespaces ------------------
# Own network (loopback only) and PID namespace: whatever a step starts, the local SuperLink
# included, is killed with the namespace's first process.
UNSHARE = ["unshare", "-n", "-p", "-f", "--mount-proc", "--kill-child"]


def _can_unshare() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run([*UNSHARE, "sh", "-c", "ip link set lo up"], capture_output=True)
    return probe.returncode == 0


needs_unshare = pytest.mark.skipif(not _can_unshare(),
                                   reason="needs unshare -n -p (root or user namespaces)")


def _local_cluster():
    """deploy/local_cluster.py (not a package): its ``copy_app``."""
    import importlib.util

    path = ROOT / "deploy" / "local_cluster.py"
    spec = importlib.util.spec_from_file_location("deploy_local_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _in_namespace(tmp_path: Path, steps: list[tuple[str, str]], env: dict | None = None,
                  timeout: float = 420) -> dict[str, dict]:
    """Run ``steps`` ``(name, shell command)`` one after another in the app's folder, in a
    fresh network + PID namespace with its own FLWR_HOME (so its own local SuperLink,
    started by the first step and killed with the namespace); each step's output, exit
    status and seconds."""
    app = _local_cluster().copy_app(tmp_path / "app")
    out = tmp_path / "steps"
    out.mkdir()
    lines = ["ip link set lo up", f"cd {app}"]
    for name, command in steps:
        lines.append(f"date +%s.%N > {out}/{name}.t; {command} > {out}/{name}.log 2>&1; "
                     f"echo $? > {out}/{name}.rc; date +%s.%N >> {out}/{name}.t")
    base = {k: v for k, v in os.environ.items() if k != "FEDGRAPH_DATA_ROOT"}
    base.update({"FLWR_HOME": str(tmp_path / "flwr-home"),
                 "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                 "XDG_CACHE_HOME": str(tmp_path / "cache"),  # no dataset, no partition of the user's
                 "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                 **(env or {})})
    subprocess.run([*UNSHARE, "sh", "-c", "\n".join(lines)], env=base, timeout=timeout, check=True)
    results = {}
    for name, _ in steps:
        t0, t1 = (float(t) for t in (out / f"{name}.t").read_text().split())
        results[name] = {"out": (out / f"{name}.log").read_text(),
                         "rc": int((out / f"{name}.rc").read_text()), "s": t1 - t0}
    return results


FEDGRAPH_RUN = f"{sys.executable} -m fedgraph_flwr.run"
SBM = "dataset='SBM' num-clients=2 rounds=1 hidden=8"  # (partition=blocks wants 20 clients)


def _show(results: dict) -> str:
    return "\n".join(f"--- {k} (rc {v['rc']}, {v['s']:.1f}s)\n{v['out'][-3000:]}" for k, v in results.items())


@pytest.mark.simulation
@pytest.mark.slow
@needs_unshare
def test_fedgraph_run_exit_status_and_the_serialised_note(tmp_path):
    output = str(tmp_path / "outputs")
    steps = [
        # A dataset the clients do not have: fails at the handshake, said once.
        ("bad", f"{FEDGRAPH_RUN} . --run-config \"dataset='Cora' num-clients=2 rounds=1 "
                f"output-dir='{output}'\" --federation-config 'num-supernodes=2 "
                f"client-resources-num-cpus=1'"),
        # Two CPUs per ClientApp out of two: one client at a time, said once.
        ("serial", f"{FEDGRAPH_RUN} . --run-config \"{SBM} output-dir='{output}' run-name='serial'\" "
                   f"--federation-config 'num-supernodes=2 client-resources-num-cpus=2 "
                   f"init-args-num-cpus=2'"),
        ("parallel", f"{FEDGRAPH_RUN} . --run-config \"{SBM} output-dir='{output}' "
                     f"run-name='parallel'\" --federation-config 'num-supernodes=2 "
                     f"client-resources-num-cpus=1 init-args-num-cpus=2'"),
    ]
    results = _in_namespace(tmp_path, steps)
    shown = _show(results)
    bad, serial, parallel = results["bad"], results["serial"], results["parallel"]
    assert bad["rc"] == 1, shown
    assert bad["out"].count("fedgraph-flwr: error: the 2 simulated clients cannot load their data: "
                            "DataRootError: dataset 'Cora' is not available under") == 1, shown
    assert "finished:failed (the reason is above)" in bad["out"], shown
    assert "fedgraph-flwr client error" not in bad["out"], shown  # no per-client repeats
    assert "a FEDGRAPH_DATA_ROOT exported since is not seen" in bad["out"], shown
    assert serial["rc"] == 0 and parallel["rc"] == 0, shown
    assert serial["out"].count("ClientApps one after another") == 1, shown
    assert "one after another" not in parallel["out"], shown
    for name in ("serial", "parallel"):
        assert (tmp_path / "outputs" / name / "results.json").is_file(), shown
    print(f"\nfedgraph-run in a fresh netns: bad config {bad['s']:.1f}s (rc 1), "
          f"good runs {serial['s']:.1f}s / {parallel['s']:.1f}s (rc 0)")


@pytest.mark.simulation
@pytest.mark.slow
@needs_unshare
@requires_datasets
def test_data_root_exported_after_the_superlink_started(tmp_path):
    """The trap: a local SuperLink started without FEDGRAPH_DATA_ROOT never sees it.
    Plain `flwr run` fails (and says why and how to fix it); fedgraph-run passes the
    variable on as data-root and the same run works."""
    data = tmp_path / "datasets"
    shutil.copytree(DATASETS / "Cora", data / "Cora")
    run_config = f"dataset='Cora' num-clients=2 rounds=1 hidden=8 output-dir='{tmp_path / 'out'}'"
    federation = "--federation-config 'num-supernodes=2 client-resources-num-cpus=1'"
    steps = [
        ("start", f"{FEDGRAPH_RUN} . --run-config \"{SBM} output-dir='{tmp_path / 'out'}'\" {federation}"),
        ("flwr", f"FEDGRAPH_DATA_ROOT={data} flwr run . --run-config \"{run_config}\" {federation} --stream"),
        ("ours", f"FEDGRAPH_DATA_ROOT={data} {FEDGRAPH_RUN} . --run-config \"{run_config}\" {federation}"),
    ]
    results = _in_namespace(tmp_path, steps)
    shown = _show(results)
    assert results["start"]["rc"] == 0, shown
    flwr = results["flwr"]
    assert flwr["rc"] == 0, shown  # Flower's own exit status says nothing
    assert "the 2 simulated clients cannot load their data: DataRootError" in flwr["out"], shown
    assert 'pgrep -u "$(id -u)" -a -f "[f]lower-superlink' in flwr["out"], shown
    assert "pkill" not in flwr["out"], shown
    ours = results["ours"]
    assert ours["rc"] == 0, shown
    assert f"FEDGRAPH_DATA_ROOT passed on as --run-config data-root={data}" in ours["out"], shown
    print(f"\nplain flwr run: {flwr['s']:.1f}s (rc 0, failed); fedgraph-run: {ours['s']:.1f}s (rc 0)")


def test_the_local_superlink_is_read_from_flowers_config_file(tmp_path, monkeypatch):
    """fedgraph-run tells the local SuperLink from a remote one by Flower's config.toml
    (read as a file: no Flower CLI internals imported)."""
    from fedgraph_flwr.run import is_local_superlink

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert is_local_superlink(None) and not is_local_superlink("prod")  # no file yet
    (tmp_path / "config.toml").write_text(
        '[superlink]\ndefault = "prod"\n[superlink.local]\naddress = ":local:"\n'
        '[superlink.prod]\naddress = "10.0.0.1:9093"\n')
    assert not is_local_superlink(None)  # the default is prod
    assert is_local_superlink("local") and not is_local_superlink("prod")


# --- plain `flwr run`: the ServerApp's checks before any method is imported (#81) --------
@pytest.mark.smoke
def test_algorithm_names_are_case_insensitive_and_a_typo_gets_the_closest(tmp_path):
    from fedgraph_flwr.config import ConfigError

    assert resolve_config(None, {"algorithm": "FedIIH"}).algorithm == "fediih"
    with pytest.raises(ConfigError, match=r"^unknown algorithm 'FedIIHH'; did you mean 'fediih'\? valid: "):
        resolve_config(None, {"algorithm": "FedIIHH"})


@pytest.mark.smoke
def test_a_missing_config_file_names_its_base_and_the_closest_file(tmp_path, monkeypatch):
    from fedgraph_flwr.config import ConfigError

    (tmp_path / "configs" / "fediih").mkdir(parents=True)
    (tmp_path / "configs" / "fediih" / "cora-disjoint-10.yaml").write_text("rounds: 2\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve_config(None, {"config-file": "configs/fediih/cora-disjont-10.yaml"})
    assert str(err.value) == (f"config-file 'configs/fediih/cora-disjont-10.yaml' does not exist "
                              f"(relative to {tmp_path}); did you mean "
                              f"'configs/fediih/cora-disjoint-10.yaml'?")
    with pytest.raises(ConfigError, match=r"no YAML file like it under /$"):
        resolve_config(None, {"config-file": "/no-such-folder-here/x.yaml"})


@pytest.mark.smoke
def test_an_offline_data_root_error_says_how_to_fix_it(tmp_path):
    config = resolve_config(None, {"data-root": str(tmp_path), "download": False})
    reason = missing_dataset(config, fetch=True)
    assert reason.startswith(f"DataRootError: dataset 'Cora' is not available under {tmp_path}: "
                             "missing Cora/raw/ind.cora.x")
    assert (f"download=false: copy the dataset's raw files (PyG's layout, as named above) into "
            f"{tmp_path}/Cora/raw/, or point data-root (or FEDGRAPH_DATA_ROOT") in reason
    assert "\n" not in reason
    online = resolve_config(None, {"data-root": str(tmp_path), "download": True,
                                   "download-url": "http://127.0.0.1:9/"})
    assert "download=false" not in (missing_dataset(online, fetch=False) or "")


@pytest.mark.smoke
def test_only_the_keys_the_user_changed_are_resolved():
    from fedgraph_flwr.config import declared_app_config
    from fedgraph_flwr.engine.server_app import changed_keys

    declared = declared_app_config(ROOT)
    assert declared is not None and declared["algorithm"] == "fedaux" and "fediih-reproduce" in declared
    flower_run_config = dict(declared, rounds=3, **{"fediih-reproduce": declared["fediih-reproduce"]})
    assert changed_keys(flower_run_config, declared) == {"rounds": 3}


def test_federation_preview_reads_the_config_file_and_prints_the_users_keys(tmp_path):
    from fedgraph_flwr.config import ConfigError, FederationPreview

    file = tmp_path / "run.yaml"
    file.write_text("num-clients: 20\nalgorithm: fedavg\n")
    preview = FederationPreview.of({"config-file": str(file), "rounds": 3})
    assert preview.num_clients == 20 and preview.handshake_timeout == 600.0
    assert preview.run_config_text(**{"num-clients": 10}) == f"config-file='{file}' rounds=3"
    assert FederationPreview.of({"num-clients": "ten"}) is None  # resolve_config says why
    with pytest.raises(ConfigError, match="did you mean 'fediih'"):
        FederationPreview.of({"algorithm": "FedIHH"})


CHECK_WITHOUT_TORCH = """
import sys, json
from types import SimpleNamespace
from pathlib import Path
from fedgraph_flwr.config import ConfigError, declared_app_config
from fedgraph_flwr.engine.server_app import check_before_clients
from fedgraph_flwr.engine.transport import RunAborted

class Grid:  # a simulation's grid: ten nodes that never heartbeat
    def get_node_ids(self): return list(range(1, 11))
    def get_nodes(self): return [SimpleNamespace(node_id=n, heartbeat_interval=1e300) for n in range(1, 11)]

declared = declared_app_config(Path(sys.argv[1]))
said = []
for change in json.loads(sys.argv[2]):
    try:
        check_before_clients(Grid(), dict(declared, **change), None, declared)
    except (ConfigError, RunAborted) as exc:
        said.append(str(exc))
print(json.dumps({"said": said, "torch": "torch" in sys.modules}))
"""


@pytest.mark.smoke
def test_a_simulations_size_and_names_are_checked_before_torch_is_imported():
    """What plain `flwr run` gets wrong most (the federation's size, a name, a file) is
    said before the ServerApp imports torch, PyG or any method: seconds, not the minute
    that importing them beside the ClientApp takes on a loaded machine."""
    changes = [{"num-clients": 5, "rounds": 3}, {"algorithm": "FedIHH"},
               {"config-file": "configs/fediih/cora-disjont-10.yaml"}]
    out = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_TORCH, str(ROOT), json.dumps(changes)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["torch"]
    size, name, file = result["said"]
    assert size.startswith("the federation has 10 SuperNodes but num-clients=5; in simulation run: "
                           "flwr run . --run-config \"num-clients=5 rounds=3\" "
                           "--federation-config \"num-supernodes=5\"")
    assert "did you mean 'fediih'" in name
    assert "did you mean 'configs/fediih/cora-disjoint-10.yaml'" in file


def test_the_simulation_is_stopped_only_from_flowers_simulation_process():
    """The ServerApp ends the process (Flower's SIGTERM handler) only where Flower
    registered one and runs the ServerApp beside its main thread: never in a test's or
    a runner's process, nor on a deployment's ServerApp main thread."""
    import threading

    from fedgraph_flwr.engine.server_app import in_flower_simulation_process

    assert not in_flower_simulation_process()
    seen = []
    thread = threading.Thread(target=lambda: seen.append(in_flower_simulation_process()))
    thread.start()
    thread.join()
    assert seen == [False]  # pytest's SIGTERM handler is not Flower's


def test_wait_for_clientapp_returns_once_the_module_has_its_app(monkeypatch):
    import types

    from fedgraph_flwr.engine.server_app import wait_for_clientapp

    module = types.ModuleType("some_client_app")
    monkeypatch.setitem(sys.modules, "some_client_app", module)
    assert not wait_for_clientapp("some_client_app:app", timeout=0.2)  # still importing
    module.app = object()
    assert wait_for_clientapp("some_client_app:app", timeout=5.0)


@pytest.mark.simulation
@pytest.mark.slow
@needs_unshare
def test_plain_flwr_run_says_a_config_error_and_ends_before_any_clientapp(tmp_path):
    """Plain `flwr run` (not fedgraph-run): a wrong federation size and an unknown
    algorithm are one line each from the ServerApp, and the simulation process ends at
    once (no traceback, no Ray actor); the SuperLink records the run as failed."""
    federation = "--federation-config 'num-supernodes=2 client-resources-num-cpus=1'"
    output = tmp_path / "outputs"
    steps = [
        ("size", f"flwr run . --run-config \"{SBM.replace('num-clients=2', 'num-clients=3')} "
                 f"output-dir='{output}'\" {federation} --stream"),
        ("name", f"flwr run . --run-config \"{SBM} algorithm='FedAVGG' output-dir='{output}'\" "
                 f"{federation} --stream"),
        ("ls", "flwr ls --format json"),
    ]
    results = _in_namespace(tmp_path, steps)
    shown = _show(results)
    size, name = results["size"], results["name"]
    assert size["out"].count("fedgraph-flwr: error: the federation has 2 SuperNodes but "
                             "num-clients=3") == 1, shown
    assert name["out"].count("fedgraph-flwr: error: unknown algorithm 'FedAVGG'; did you mean "
                             "'fedavg'?") == 1, shown
    for step in (size, name):
        assert step["rc"] == 0, shown  # Flower's own exit status: the app cannot change it
        assert "Traceback" not in step["out"] and "ClientAppActor" not in step["out"], shown
        assert "fedgraph-flwr: stopping the simulation now" in step["out"], shown
    ls = results["ls"]["out"]
    runs = json.loads(ls[ls.find("{"):])["runs"]
    assert len(runs) == 2 and all(run["status"] == "finished:failed" for run in runs), shown
    print(f"\nplain flwr run, config errors: size {size['s']:.1f}s, name {name['s']:.1f}s (rc 0, failed)")


@pytest.mark.smoke
def test_a_config_files_unknown_key_is_named_from_the_declared_keys(tmp_path):
    """With the app's declared keys, a misspelt key in a config-file is named without
    importing every method for their keys."""
    from fedgraph_flwr.config import ConfigError, FederationPreview, declared_app_config

    typo = tmp_path / "typo.yaml"
    typo.write_text("algorithm: fedaux\nfedaux-sigmaa: 2\n")
    with pytest.raises(ConfigError) as err:
        FederationPreview.of({"config-file": str(typo)}, declared_app_config(ROOT))
    assert str(err.value) == (f"config-file {typo}: unknown config key 'fedaux-sigmaa'; "
                              f"did you mean 'fedaux-sigma'?")


def test_a_misspelt_key_is_named_without_importing_its_method():
    """fedgraph-run's check of ``fedaux-sigmaa``: a typo of a block key, said at once; the
    profile-switch lookup (which imports the method: torch and PyG, seconds) is skipped."""
    code = ("import sys; from fedgraph_flwr.run import config_error; "
            "print(config_error(['.', '--run-config', 'fedaux-sigmaa=2'])); "
            "print('fedgraph_flwr.algorithms.fedaux' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0].endswith("unknown config key 'fedaux-sigmaa'; did you mean 'fedaux-sigma'?")
    assert out[1] == "False False"
