"""deploy/README.md replayed as printed: one operator and three data owners on 127.0.0.1.

The test reads the README's fenced blocks of steps 0–6 and runs them with bash, in order.
Each organisation has its own HOME, so each has its own ``$HOME/fedgraph-deploy`` and
``~/.flwr``, as on separate machines. Only what a one-host replay must change is
substituted, and each substitution first checks that its text is still in the block, so
a README that drifts fails here:
- the host name becomes 127.0.0.1;
- the ports become free ports, one set per organisation;
- ``/srv/fedgraph`` becomes a temporary folder per organisation;
- owner 0's names (``supernode-0``, ``client_0``) become owner i's;
- ``rounds=100`` becomes 2;
- ``git clone ...`` becomes ``cd`` into a copy of the checkout under test (a folder named
  ``fedgraph-flwr``, as the clone, from whose parent ``flwr ... fedgraph`` must work);
- ``pip install -e .`` is dropped (the environment under test is installed already).

The steps README gives in prose are done here as it says: the CA certificate is handed
to the owners, the public keys to the operator, and the subgraph files are made with its
partition command, as printed (with ``FEDGRAPH_DATA_ROOT`` on its command line: no
variable of the caller's reaches the replay). Step 4's connection block runs before any
``flwr`` command, so it must create ``~/.flwr/config.toml`` itself. The long-running
commands (SuperLink, SuperNodes, executors) run in the background, each in its own
process group, stopped at the end. The run must end with ``fedgraph-run`` exiting 0 and
two rounds in results.json.

It uses free ports on 127.0.0.1, not network namespaces: CI may not allow ``unshare``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "deploy" / "README.md"


def _load_local_cluster():
    """deploy/local_cluster.py (a script, not a package), as tests/test_deploy.py loads it."""
    name = "deploy_local_cluster"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "deploy" / "local_cluster.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


cluster = _load_local_cluster()
OWNERS = 3
HOST = "superlink.example.org"

pytestmark = [pytest.mark.deploy, pytest.mark.slow]


def readme_blocks() -> dict[int, list[tuple[str, str]]]:
    """``{step: [(language, text), ...]}`` for the README's numbered steps (## 0. .. ## 6.)."""
    text = README.read_text()
    heads = [(m.start(), int(m.group(1))) for m in re.finditer(r"^## (\d)\. ", text, re.M)]
    ends = [m.start() for m in re.finditer(r"^## (?!\d\. )", text, re.M)]
    steps: dict[int, list[tuple[str, str]]] = {}
    for n, (start, step) in enumerate(heads):
        stop = heads[n + 1][0] if n + 1 < len(heads) else min(e for e in ends if e > start)
        steps[step] = [(m.group(1), m.group(2)) for m in
                       re.finditer(r"^```(\w*)\n(.*?)^```", text[start:stop], re.M | re.S)]
    return steps


def need(block: str, text: str) -> str:
    """``block``; fails when the README's block no longer has ``text``."""
    assert text in block, f"deploy/README.md drifted: {text!r} is gone from\n{block}"
    return block


def swap(block: str, old: str, new: str) -> str:
    """``block`` with ``old`` replaced; fails when the README no longer has ``old``."""
    return need(block, old).replace(old, new)


class Organisation:
    """One operator or data owner: a HOME, a checkout, ports, and the processes it runs."""

    def __init__(self, name: str, tmp: Path, checkout: Path, base_env: dict[str, str]) -> None:
        self.name = name
        self.home = tmp / name / "home"
        self.home.mkdir(parents=True)
        self.srv = tmp / name / "srv"
        self.srv.mkdir(parents=True)
        self.checkout = checkout
        self.deploy_dir = self.home / "fedgraph-deploy"
        self.env = {**base_env, "HOME": str(self.home)}
        self.procs: list[subprocess.Popen] = []
        self.logs = tmp / name / "replay-logs"
        self.logs.mkdir()
        self.profile = ""  # step 0's block: every later block runs after it, as from a profile

    def script(self, block: str) -> str:
        return f"set -euo pipefail\n{self.profile}\n{block}\n"

    def run(self, block: str, timeout: float = 120) -> subprocess.CompletedProcess:
        out = subprocess.run(["bash", "-c", self.script(block)], env=self.env, cwd=self.home,
                             capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, (f"{self.name}: exit {out.returncode}\n{block}\n"
                                     f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out

    def start(self, label: str, block: str) -> Path:
        log = self.logs / f"{label}.log"
        with open(log, "wb") as f:
            self.procs.append(subprocess.Popen(
                ["bash", "-c", self.script(block)], env=self.env, cwd=self.home, stdout=f,
                stderr=subprocess.STDOUT, start_new_session=True))
        return log

    def stop(self) -> None:
        for proc in reversed(self.procs):
            cluster.stop_process_group(proc)


def wait_for(log: Path, pattern: str, timeout: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if log.is_file() and re.search(pattern, log.read_text(errors="replace")):
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    pytest.fail(f"{log.name} never showed {pattern!r}:\n"
                f"{log.read_text(errors='replace')[-3000:] if log.is_file() else '(no log)'}")


def checkout_copy(dst: Path) -> Path:
    """What a clone holds that these steps read: the app (``copy_app``) and deploy/."""
    cluster.copy_app(dst)
    shutil.copytree(ROOT / "deploy", dst / "deploy",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def test_the_deploy_readme_replayed_for_three_owners_on_one_host(tmp_path, data_root):
    steps = readme_blocks()
    shape = {step: [lang for lang, _ in blocks] for step, blocks in steps.items()}
    assert shape == {0: ["bash"], 1: ["bash"], 2: ["bash"], 3: ["bash", "bash"],
                     4: ["bash", "bash"], 5: ["bash", "bash", "bash", "bash"], 6: ["bash"]}, shape
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("FLWR_", "FEDGRAPH_"))}
    base_env["PYTHONUNBUFFERED"] = "1"
    operator = Organisation("operator", tmp_path, checkout_copy(tmp_path / "operator" / "fedgraph-flwr"),
                            base_env)
    owners = [Organisation(f"owner-{i}", tmp_path, checkout_copy(tmp_path / f"owner-{i}" / "fedgraph-flwr"),
                           base_env) for i in range(OWNERS)]
    superlink_port, superlink_health = cluster.free_port(), cluster.free_port()
    everyone = [operator, *owners]
    try:
        # 0. Every machine.
        for org in everyone:
            block = swap(steps[0][0][1], "git clone <this repository> fedgraph-flwr && cd fedgraph-flwr",
                         f"cd {org.checkout}")
            block = swap(block, "pip install -e .", ": pip install -e .")
            org.profile = block
            org.run(":")
            assert (org.deploy_dir / "state").is_dir() and (org.deploy_dir / "logs").is_dir()
        # 1. Operator: TLS material; tls/ca.crt goes to every owner as ca.crt.
        operator.run(swap(steps[1][0][1], f"--host {HOST}", "--host 127.0.0.1"))
        for owner in owners:
            shutil.copy(operator.deploy_dir / "tls" / "ca.crt", owner.deploy_dir / "ca.crt")
        # 2. Each owner: keys; the public key goes to the operator's keys/.
        for i, owner in enumerate(owners):
            owner.run(swap(steps[2][0][1], "supernode-0", f"supernode-{i}"))
            (operator.deploy_dir / "keys").mkdir(exist_ok=True)
            shutil.copy(owner.deploy_dir / "keys" / f"supernode-{i}.pub",
                        operator.deploy_dir / "keys")
        # 3. Operator: SuperLink and its ServerApp executor.
        superlink, executor = (b for _, b in steps[3])
        superlink = swap(swap(superlink, "--port 8000", f"--port {superlink_port}"),
                         "127.0.0.1:9098", f"127.0.0.1:{superlink_health}")
        link_log = operator.start("superlink", superlink)
        wait_for(link_log, r"Uvicorn running on https://", 90, operator.procs)
        operator.start("serverapp-executor",
                       swap(executor, "127.0.0.1:8000", f"127.0.0.1:{superlink_port}"))
        # 4. Operator: the connection, added to ~/.flwr/config.toml as printed (no flwr
        #    command has run yet, so the file does not exist: the block must make it),
        #    then the keys, from the folder that holds the checkout (a `fedgraph` folder
        #    there would be read as an app).
        assert not (operator.home / ".flwr" / "config.toml").exists()
        operator.run(swap(steps[4][0][1], f"{HOST}:8000", f"127.0.0.1:{superlink_port}"))
        connection = (operator.home / ".flwr" / "config.toml").read_text()
        assert f'root-certificates = "{operator.deploy_dir}/tls/ca.crt"' in connection, connection
        register = steps[4][1][1]
        line = "flwr supernode register keys/supernode-0.pub fedgraph"
        register = swap(register, line, "\n".join(
            line.replace("supernode-0", f"supernode-{i}") for i in range(OWNERS)))
        listed = operator.run(f'cd "$FEDGRAPH_DEPLOY_DIR"\n{register}').stdout
        assert listed.count("registered successfully") == OWNERS, listed
        assert "fedgraph-flwr" in {p.name for p in operator.checkout.parent.iterdir()}
        operator.run(f"cd {operator.checkout.parent}\nflwr supernode list fedgraph")
        assert listed.count("│ registered │") == OWNERS, listed  # flwr supernode list
        # 5. Each owner: the subgraph file (README's partition command), pre-flight of
        #    the file and of the link to the SuperLink, SuperNode and ClientApp executor.
        files = tmp_path / "partition"
        printed = ("FEDGRAPH_DATA_ROOT=/path/to/datasets python -m fedgraph_flwr.partition "
                   f"--dataset Cora --num-clients {OWNERS} --export DIR --format npz")
        need(README.read_text(), printed)  # the prose's command, run as printed
        operator.run(printed.replace("/path/to/datasets", str(data_root)).replace("DIR", str(files)))
        preflight, link, supernode, clientapp = (b for _, b in steps[5])
        for i, owner in enumerate(owners):
            shutil.copy(files / f"client_{i}.npz", owner.srv / f"client_{i}.npz")

            def local(block: str, i: int = i, owner: Organisation = owner) -> str:
                return block.replace("/srv/fedgraph/client_0.npz",
                                     str(owner.srv / f"client_{i}.npz")).replace(
                    "supernode-0", f"supernode-{i}").replace("clientapp-0", f"clientapp-{i}")

            owner.run(local(need(preflight, "/srv/fedgraph/client_0.npz")))
            # The link before the SuperNode starts: TLS with ca.crt and the key registered.
            checked = owner.run(local(swap(link, f"{HOST}:8000", f"127.0.0.1:{superlink_port}")))
            assert checked.stdout.count("fedgraph-preflight: ") == 2, checked.stdout
            assert "is registered with the SuperLink" in checked.stdout, checked.stdout
            runtime, health = cluster.free_port(), cluster.free_port()
            node = local(need(supernode, "/srv/fedgraph/client_0.npz"))
            node = swap(swap(swap(node, f"{HOST}:8000", f"127.0.0.1:{superlink_port}"),
                             "--port 9094", f"--port {runtime}"),
                        "127.0.0.1:9098", f"127.0.0.1:{health}")
            owner.start("supernode", node)
            owner.start("clientapp-executor",
                        swap(local(clientapp), "127.0.0.1:9094", f"127.0.0.1:{runtime}"))
        # 6. Operator: run, from the checkout.
        run = swap(swap(steps[6][0][1], "rounds=100", "rounds=2"), "/srv/fedgraph/outputs",
                   str(operator.srv / "outputs"))
        out = subprocess.run(["bash", "-c", operator.script(run)], env=operator.env,
                             cwd=operator.home, capture_output=True, text=True, timeout=600)
        logs = "\n".join(f"--- {p.parent.parent.name}/{p.name}\n{p.read_text(errors='replace')[-1500:]}"
                         for org in everyone for p in sorted(org.logs.glob("*.log")))
        assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-2000:]}\n{logs}"
        results = json.loads((operator.srv / "outputs" / "cora-fedaux" / "results.json").read_text())
        assert [r["round"] for r in results["rounds"]] == [1, 2]
        assert sorted(results["clients"]) == [str(i) for i in range(OWNERS)]
        assert all(not r["failures"] for r in results["rounds"])
        # The SuperLink also wrote Flower's own log file where --log-file says.
        assert "Starting Flower SuperLink" in (operator.deploy_dir / "logs" / "superlink.log").read_text()
    finally:
        for org in everyone:
            org.stop()
