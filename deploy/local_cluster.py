#!/usr/bin/env python3
"""A whole deployment on one machine (127.0.0.1): for trying it out, and for the tests.

    python deploy/local_cluster.py --partitions DIR --clients 3 --workdir /tmp/fedgraph-local

makes TLS material and SuperNode keys, starts the SuperLink (TLS, SuperNode auth,
process isolation) with its ServerApp executor, registers the keys, starts one
SuperNode + ClientApp executor per ``DIR/client_<i>.npz``, writes the connection
into ``WORKDIR/flwr-home/config.toml`` and waits (Ctrl-C stops everything). Then,
in another shell::

    FLWR_HOME=/tmp/fedgraph-local/flwr-home fedgraph-run . fedgraph --stream \\
        --run-config 'num-clients=3 rounds=5 output-dir="/tmp/fedgraph-local/outputs"'

The command lines are those of :mod:`layout` (the same the README gives for N
machines); only addresses (127.0.0.1, free ports) and paths differ. Each process
runs in its own process group with its own FLWR_HOME and log file under
``WORKDIR/logs``; :meth:`LocalDeployment.stop_all` ends every group it started.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layout as L  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group ``proc`` leads (started with ``start_new_session``), wait
    up to 5 s, then SIGKILL what is left of it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=5.0)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the group may outlive its leader (an app process mid-message)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def clean_env(flwr_home: Path) -> dict[str, str]:
    """The caller's environment minus any FLWR_* setting, plus our FLWR_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    env.update({"FLWR_HOME": str(flwr_home), "PYTHONUNBUFFERED": "1",
                "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"})
    return env


def copy_app(dst: Path) -> Path:
    """The app as ``flwr run`` reads it (pyproject, the two component modules, the package,
    configs), copied outside the repository: flwr may rewrite a pyproject.toml."""
    dst.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "server_app.py", "client_app.py"):
        shutil.copy(ROOT / name, dst / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("fedgraph_flwr", "configs"):
        shutil.copytree(ROOT / name, dst / name, ignore=ignore)
    return dst


def check_call(cmd: list[str], env: dict[str, str], timeout: float = 120) -> str:
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{L.shell(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


class LocalDeployment:
    """SuperLink, ServerApp executor, and per client a SuperNode + ClientApp executor."""

    def __init__(self, workdir: Path, superlink_database: bool = True,
                 stock_flower: bool = False) -> None:
        """``superlink_database=False``: the SuperLink keeps its state in memory (Flower's
        default; lost on restart). ``stock_flower``: ``flower-supernode`` and
        ``flower-superexec`` for the data owners instead of our ``fedgraph-*`` wrappers
        (same flags), to compare."""
        self.workdir = Path(workdir)
        self.superlink_database = superlink_database
        self.stock_flower = stock_flower
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.tls = self.workdir / "tls"  # the operator's CA and SuperLink certificate
        self.keys = self.workdir / "keys"  # every SuperNode's key pair (one machine here)
        self.node_tls = self.workdir / "node-tls"  # the SuperNodes' Runtime API certificate
        self.flwr_home = self.workdir / "flwr-home"  # the operator's flwr CLI configuration
        self.env = clean_env(self.flwr_home)
        self.procs: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        self.runtime_ports: dict[str, int] = {}
        self.health: dict[str, str] = {}  # process name -> its health service's address
        self.port = 0
        self.address = ""
        # The data owners share this one machine: split its cores between their
        # ClientApps (on their own machines each would use all of its cores).
        self.clientapp_env: dict[str, str] = {}

    # --- processes --------------------------------------------------------------------
    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``cmd`` in a new process group, with its own FLWR_HOME and log file."""
        home = self.workdir / "homes" / name  # executors install FABs here, as on their own machine
        home.mkdir(parents=True, exist_ok=True)
        mode = "ab" if name in self.procs else "wb"  # a restart appends to its log
        with open(self.logs / f"{name}.log", mode) as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=home,
                                    env={**self.env, "FLWR_HOME": str(home), **(env or {})},
                                    start_new_session=True)
        self.procs[name] = proc
        self.commands[name] = (cmd, env)
        return proc

    def restart(self, name: str) -> subprocess.Popen:
        """Start ``name`` again with the same command line (same key, same node id)."""
        cmd, env = self.commands[name]
        return self.start(name, cmd, env)

    def restart_until_online(self, name: str, timeout: float = 180.0) -> float:
        """Restart SuperNode ``name`` the way a supervisor does (compose's ``restart:``);
        returns the seconds until it was activated again.

        After a crash the SuperLink counts the node's old session as online for two
        heartbeat intervals (20 s for fedgraph-supernode, 60 s for flower-supernode) and
        refuses to activate it again: the SuperNode exits with code 305. Start it again
        every few seconds until its log shows a new ``SuperNode ID``."""
        pattern = r"SuperNode ID: \d+"
        seen = len(re.findall(pattern, self.log(name)))
        t0 = time.time()
        deadline = t0 + timeout
        while time.time() < deadline:
            proc = self.restart(name)
            while proc.poll() is None and time.time() < deadline:
                if len(re.findall(pattern, self.log(name))) > seen:
                    return time.time() - t0
                time.sleep(0.2)
            time.sleep(3.0)
        raise RuntimeError(f"{name} was not activated again within {timeout:.0f}s; its log:\n"
                           f"{self.log(name)[-3000:]}")

    def kill(self, name: str) -> None:
        """SIGKILL the process group: a crash, no goodbye to the SuperLink."""
        try:
            os.killpg(self.procs[name].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.procs[name].wait(timeout=10)

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_log(self, name: str, pattern: str, timeout: float, count: int = 1) -> None:
        """Until ``pattern`` occurs ``count`` times in the log; fail early if the process ends."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if len(re.findall(pattern, self.log(name))) >= count:
                return
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"{name} never logged {pattern!r}; its log:\n{self.log(name)[-3000:]}")

    def stop(self, name: str) -> None:
        """SIGTERM the process group (the executors' app processes too), then SIGKILL."""
        proc = self.procs.get(name)
        if proc is not None:
            stop_process_group(proc)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)

    # --- the steps of deploy/README.md ------------------------------------------------
    def make_tls(self) -> None:
        """The operator's CA + SuperLink certificate; the SuperNodes' Runtime API certificate."""
        for cmd in (L.make_tls_cmd(str(self.tls), L.TLS_CERT_NAME, ["127.0.0.1"]),
                    L.make_tls_cmd(str(self.node_tls), L.RUNTIME_CERT_NAME, [])):
            check_call([sys.executable, *cmd[1:]], self.env)

    def make_keys(self, supernode_names: list[str]) -> None:
        cmd = L.make_keys_cmd(str(self.keys), supernode_names)
        check_call([sys.executable, *cmd[1:]], self.env)

    def start_superlink(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.health["superlink"] = f"127.0.0.1:{free_port()}"
        self.start("superlink", L.superlink_cmd(
            str(self.tls / "ca.crt"), str(self.tls / f"{L.TLS_CERT_NAME}.pem"),
            str(self.tls / f"{L.TLS_CERT_NAME}.key"), host="127.0.0.1", port=self.port,
            database=str(self.workdir / "superlink.db") if self.superlink_database else None,
            health=self.health["superlink"], log_file=str(self.logs / "superlink-flower.log")))
        self.wait_for_log("superlink", r"Uvicorn running on https://", 60)
        self.start(L.SERVERAPP_EXECUTOR, L.executor_cmd(str(self.tls / "ca.crt"), self.address),
                   env=dict(L.SERVERAPP_ENV))
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        (self.flwr_home / "config.toml").write_text(
            '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n\n'
            + L.connection_toml(self.address, str(self.tls / "ca.crt")))

    def register(self, name: str) -> None:
        check_call(L.register_cmd(str(self.keys / f"{name}.pub")), self.env)

    def start_supernode(self, name: str, partition_file: Path, executor: str | None,
                        partition_id: int | None = None) -> None:
        """A SuperNode with key ``keys/<name>``; with its ClientApp executor unless ``executor`` is None."""
        port = self.runtime_ports.setdefault(name, free_port())
        health = self.health.setdefault(name, f"127.0.0.1:{free_port()}")
        node = L.supernode_cmd(
            self.address, str(self.tls / "ca.crt"), str(self.keys / name), str(partition_file),
            str(self.node_tls / f"{L.RUNTIME_CERT_NAME}.pem"),
            str(self.node_tls / f"{L.RUNTIME_CERT_NAME}.key"), str(self.node_tls / "ca.crt"),
            runtime_port=port, partition_id=partition_id, health=health)
        if self.stock_flower:
            node[0] = "flower-supernode"
        self.start(name, node)
        if executor is not None:
            exe = L.clientapp_executor_cmd(str(self.node_tls / "ca.crt"), f"127.0.0.1:{port}")
            if self.stock_flower:
                exe[0] = "flower-superexec"
            # Each owner's own DP noise key (docs/privacy.md, "Whose noise"): a secret of
            # its ClientApps that the server never sees; a dp run is refused without it.
            noise_key = {"FEDGRAPH_DP_NOISE_KEY": f"{name}-{secrets.token_hex(16)}"}
            self.start(executor, exe, env={**L.EXECUTOR_ENV, **self.clientapp_env, **noise_key})

    def up(self, partition_files: list[Path]) -> None:
        """Everything for clients ``0..len(partition_files)-1``, keys registered, nodes online."""
        names = [L.supernode_name(i) for i in range(len(partition_files))]
        threads = max(1, (os.cpu_count() or 1) // len(partition_files))
        self.clientapp_env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        self.make_tls()
        self.make_keys(names)
        self.start_superlink()
        for name in names:
            self.register(name)
        for i, (name, path) in enumerate(zip(names, partition_files)):
            self.start_supernode(name, path, L.clientapp_executor_name(i))
        for name in names:
            self.wait_for_log(name, r"SuperNode ID: \d+", 60)

    def healthy(self, name: str) -> bool:
        """Whether ``name``'s Flower health service answers SERVING (deploy/scripts/health_probe.py)."""
        probe = [sys.executable, str(ROOT / "deploy" / "scripts" / "health_probe.py"), self.health[name]]
        return subprocess.run(probe, env=self.env, capture_output=True).returncode == 0

    def flwr_run(self, run_config: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(L.run_cmd(run_config=run_config), cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", required=True, type=Path,
                        help="folder with client_<i>.npz files (copied: each node gets its own)")
    parser.add_argument("--clients", type=int, default=L.NUM_SUPERNODES)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fedgraph-local"))
    args = parser.parse_args(argv)

    def interrupt(signum, frame):  # SIGTERM/SIGINT: stop everything, then exit
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)  # also when started in the background
    files = []
    for i in range(args.clients):
        src = args.partitions / L.partition_file_name(i)
        owner = args.workdir / f"owner-{i}"
        owner.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, owner)
        files.append(owner / src.name)
    dep = LocalDeployment(args.workdir)
    try:
        dep.up(files)
        print(f"SuperLink at {dep.address}; {args.clients} SuperNodes online; logs in {dep.logs}")
        run = L.shell(L.run_cmd(run_config=f"num-clients={args.clients}"))
        print(f"run:  FLWR_HOME={dep.flwr_home} {run}")
        ended: set[str] = set()
        while True:  # report processes that end; keep the rest running until Ctrl-C
            for name, proc in dep.procs.items():
                if name not in ended and proc.poll() is not None:
                    ended.add(name)
                    print(f"{name} exited with {proc.returncode}; see {dep.logs / name}.log",
                          file=sys.stderr)
            time.sleep(1)
    except KeyboardInterrupt:
        return 0
    finally:
        dep.stop_all()


if __name__ == "__main__":
    sys.exit(main())
