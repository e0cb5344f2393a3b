"""The deployment's process layout and command lines: one source for README, compose and tests.

Every long-running process of a deployment, as Flower 1.41 lays it out with
``--isolation process`` (its Docker guide's layout):

- ``superlink``: ``flower-superlink``; one TLS port serves the Fleet API (SuperNodes),
  the Control API (``flwr run``, ``flwr supernode register``) and the Runtime API
  (the ServerApp executor). SuperNode authentication on.
- ``superexec-serverapp``: ``flower-superexec`` next to the SuperLink; starts one
  ServerApp process per run.
- per data owner ``i``: ``supernode-<i>`` (``fedgraph-supernode``: ``flower-supernode``
  with its poll waits capped; its own partition file in ``--node-config``, its own auth
  key) and ``superexec-clientapp-<i>`` (``fedgraph-superexec``: ``flower-superexec``
  whose per-message ClientApp processes fork from a pre-imported parent; same host).
  Both take Flower's flags unchanged, so the stock programs can stand in for them.
  The SuperNode's Runtime API listens on 127.0.0.1 only, with TLS.

``tests/test_deploy.py`` starts exactly these commands on 127.0.0.1;
``deploy/docker-compose.yml`` runs them in containers (``tests/test_compose.py``
checks it against this module); ``deploy/README.md`` prints them for N machines
(the same test checks the README's command lines against :func:`readme_commands`).

Plain Python, no third-party imports: the tests load it by path.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from pathlib import Path, PurePosixPath

# --- names and ports -----------------------------------------------------------------
SUPERLINK_PORT = 8000  # the SuperLink's one port (Fleet + Control + Runtime API; Flower's default)
SUPERNODE_RUNTIME_PORT = 9094  # each SuperNode's Runtime API, on 127.0.0.1 of its host
NUM_SUPERNODES = 3  # the compose file's federation (the e2e test's too)
#: The walk-through's dataset signature (Cora), which an operator announces with the run
#: and each owner's pre-flight checks its file against.
README_FEATURES, README_CLASSES = 1433, 7
# Flower's gRPC health service (``--health-server-address``, no TLS): on 127.0.0.1 only,
# for the host's supervisor or the compose healthchecks (deploy/scripts/health_probe.py).
# A SuperLink or SuperNode uses HEALTH_PORT; the executor beside it (same host or, in
# compose, the same network namespace) EXECUTOR_HEALTH_PORT.
HEALTH_PORT = 9098
EXECUTOR_HEALTH_PORT = 9099
# Healthchecks: their timeout and start period are derived from what one probe and a
# SuperLink's start cost in CPU seconds, for a host with HEALTHCHECK_LOAD runnable
# processes on HEALTHCHECK_CORES cores: a CPU-bound process there gets cores/(load+1) of
# a core, so it takes its CPU time times (load+1)/cores; times HEALTHCHECK_MARGIN for
# what the container engine's exec adds and the spread between runs. A fixed 5 s timeout
# failed `compose up` at load 10-40 on 2 cores (issue #82). The costs, measured by
#   python deploy/scripts/measure_health.py --probes 10 --stress 40
# (2 cores, 45-46 runnable processes; the largest of the runs):
PROBE_CPU_S = 0.136  # the probe's user+system CPU (idle: 0.098)
SUPERLINK_START_CPU_S = 1.49  # the SuperLink's CPU from its start to SERVING (idle: 1.3)
HEALTHCHECK_LOAD = 40
HEALTHCHECK_CORES = 2
HEALTHCHECK_MARGIN = 4.0
# SuperLink log file rotation (Flower's own --log-file options; SuperNodes and executors
# have none in flwr 1.41: systemd/journald or logrotate, deploy/systemd/).
LOG_ROTATION_HOURS = 24
LOG_BACKUPS = 14
CONNECTION = "fedgraph"  # the SuperLink connection name in $FLWR_HOME/config.toml
SERVERAPP_EXECUTOR = "superexec-serverapp"
TLS_CERT_NAME = "superlink"  # make_tls.py --name for the SuperLink's certificate
RUNTIME_CERT_NAME = "runtime"  # make_tls.py --name for a SuperNode's Runtime API certificate

# Where things live inside the containers (docker-compose.yml mounts them here).
CONTAINER_APP = PurePosixPath("/app")
CONTAINER_TLS = CONTAINER_APP / "tls"
CONTAINER_KEYS = CONTAINER_APP / "keys"
CONTAINER_DATA = CONTAINER_APP / "data"
CONTAINER_STATE = CONTAINER_APP / "state"
CONTAINER_OUTPUTS = CONTAINER_APP / "outputs"
CONTAINER_NODE_TLS = CONTAINER_APP / "node-tls"
CONTAINER_FLWR_HOME = CONTAINER_APP / "flwr-home"
# XDG_CACHE_HOME of the ClientApp executors: the default data root is
# <XDG_CACHE_HOME>/fedgraph-flwr, so client-state="file" writes
# <it>/fedgraph-flwr/client-state/<run-name>/client_<id>/, on a named volume per client.
CONTAINER_CACHE = CONTAINER_APP / "cache"
HEALTH_PROBE = str(CONTAINER_APP / "deploy/scripts/health_probe.py")

# Outside the checkout: TLS material (ca.key among it), SuperNode keys, the SuperLink's
# database and the logs of the README's walk-through (never in git, never in an image).
DEPLOY_DIR_ENV = "FEDGRAPH_DEPLOY_DIR"
DEFAULT_DEPLOY_DIR = "~/fedgraph-deploy"


def deploy_dir() -> Path:
    """``$FEDGRAPH_DEPLOY_DIR``, else ``~/fedgraph-deploy``: the scripts' default output."""
    return Path(os.environ.get(DEPLOY_DIR_ENV) or DEFAULT_DEPLOY_DIR).expanduser()

# What deploy/scripts/prepare.py writes under deploy/generated/ (the compose file mounts it).
GENERATED = "generated"
GEN_TLS = f"{GENERATED}/tls"
GEN_KEYS = f"{GENERATED}/keys"
GEN_PARTITIONS = f"{GENERATED}/partitions"
GEN_STATE = f"{GENERATED}/state"
GEN_OUTPUTS = f"{GENERATED}/outputs"
GEN_NODE_TLS = f"{GENERATED}/node-tls"
GEN_FLWR_HOME = f"{GENERATED}/flwr-home"  # the host's flwr CLI -> 127.0.0.1:SUPERLINK_PORT
GEN_FLWR_HOME_COMPOSE = f"{GENERATED}/flwr-home-compose"  # the register service -> superlink

# A ClientApp executor polls its own SuperNode (same host) for tasks: a tighter poll than
# Flower's 1 s default, since a round on a small graph takes well under a second of
# compute.
# The ServerApp executor gets the same (README step 3 and the compose file): it launches
# one ServerApp per run, so a new run starts within 0.1 s instead of up to 1 s.
# Both executors also switch off Flower's telemetry: every ClientApp process posts a usage
# event to telemetry.flower.ai (platform, CPU count, an install id), which a privacy
# officer did not sign off on, and building its TLS context was a fifth of a forked
# ClientApp's CPU (docs/performance.md, "Where a deployed round's time goes").
EXECUTOR_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1", "FLWR_TELEMETRY_ENABLED": "0"}
# The ServerApp executor's also opts its ServerApps in to the speed-ups that patch Flower
# (fedgraph_flwr.engine.accelerate.OPT_IN_ENV: a reply's objects retried after 20 ms, given
# up at the round's deadline); stock flower-superexec without it runs Flower untouched.
SERVERAPP_ENV = {**EXECUTOR_ENV, "FEDGRAPH_FLOWER_SPEEDUPS": "1"}
# A container's ClientApp executor shares its SuperNode's network namespace: when that
# SuperNode's container restarts, the executor is left in the dead namespace. It exits
# after this many seconds without its SuperNode (fedgraph_flwr/engine/accelerate/
# superexec.py) and the restart policy starts it again in the new one.
# The demo's owners share one host: each ClientApp gets its share of the cores
# (deploy/.env's FEDGRAPH_CLIENTAPP_THREADS, written by prepare.py), not all of them, so
# that three torch processes do not each spin two threads on two cores.
CONTAINER_EXECUTOR_ENV = {"FEDGRAPH_EXIT_IF_SUPERNODE_GONE_S": "10",
                          "OMP_NUM_THREADS": "${FEDGRAPH_CLIENTAPP_THREADS:-1}",
                          "MKL_NUM_THREADS": "${FEDGRAPH_CLIENTAPP_THREADS:-1}"}


def supernode_name(i: int) -> str:
    return f"supernode-{i}"


def clientapp_executor_name(i: int) -> str:
    return f"superexec-clientapp-{i}"


def partition_file_name(i: int) -> str:
    """The file data owner ``i`` holds (``client_<i>`` also names its partition id)."""
    return f"client_{i}.npz"


# --- command lines ---------------------------------------------------------------------
def health_args(address: str | None) -> list[str]:
    return ["--health-server-address", address] if address else []


def superlink_cmd(ca: str, cert: str, key: str, host: str = "0.0.0.0",
                  port: int = SUPERLINK_PORT, database: str | None = None,
                  health: str | None = None, log_file: str | None = None) -> list[str]:
    """``flower-superlink`` with TLS, SuperNode auth, no runtime ``uv sync``, process isolation;
    optionally Flower's health service and its own rotating log file."""
    cmd = [
        "flower-superlink",
        "--ssl-ca-certfile", ca, "--ssl-certfile", cert, "--ssl-keyfile", key,
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--isolation", "process",
        "--host", host, "--port", str(port),
    ]
    if database:
        cmd += ["--database", database]
    cmd += health_args(health)
    if log_file:
        cmd += ["--log-file", log_file,
                "--log-rotation-interval-hours", str(LOG_ROTATION_HOURS),
                "--log-rotation-backup-count", str(LOG_BACKUPS)]
    return cmd


def executor_cmd(ca: str, runtime_address: str, health: str | None = None) -> list[str]:
    """``flower-superexec``: runs the ServerApp processes for the SuperLink."""
    return ["flower-superexec", "--root-certificates", ca, "--runtime-api-address",
            runtime_address, *health_args(health)]


def clientapp_executor_cmd(ca: str, runtime_address: str, health: str | None = None) -> list[str]:
    """``fedgraph-superexec``: ``flower-superexec`` whose per-message ClientApp processes
    fork from a parent that has imported torch/PyG once (fedgraph_flwr/engine/accelerate/).
    ``flower-superexec`` with the same flags works too, seconds slower per round."""
    return ["fedgraph-superexec", "--root-certificates", ca, "--runtime-api-address",
            runtime_address, *health_args(health)]


def health_probe_cmd(address: str) -> list[str]:
    """A healthcheck: exit 0 iff Flower's health service at ``address`` answers SERVING."""
    rpc = healthcheck_timing()["rpc_timeout_s"]
    return ["python", HEALTH_PROBE, address, "--timeout", f"{rpc:g}"]


def healthcheck_timing(load: int = HEALTHCHECK_LOAD, cores: int = HEALTHCHECK_CORES) -> dict:
    """The healthcheck's ``timeout`` and ``start_period`` (whole seconds) for ``load``
    runnable processes on ``cores`` cores, from the measured CPU costs above, and the
    probe's own gRPC deadline (half the timeout: the interpreter's start and grpc's
    import take the rest; a probe past it says why before compose kills it)."""
    slowdown = HEALTHCHECK_MARGIN * (load + 1) / cores
    timeout = math.ceil(PROBE_CPU_S * slowdown)
    return {"timeout_s": timeout, "rpc_timeout_s": timeout / 2,
            "start_period_s": math.ceil(SUPERLINK_START_CPU_S * slowdown),
            "interval_s": max(10, timeout)}


def node_config(partition_file: str, partition_id: int | None = None) -> str:
    """The ``--node-config`` value: strings need TOML quotes, or Flower rejects the value."""
    value = f'partition-file="{partition_file}"'
    if partition_id is not None:
        value += f" partition-id={partition_id}"
    return value


def supernode_cmd(superlink: str, ca: str, auth_key: str, partition_file: str,
                  runtime_cert: str, runtime_key: str, runtime_ca: str,
                  runtime_port: int = SUPERNODE_RUNTIME_PORT,
                  partition_id: int | None = None, health: str | None = None) -> list[str]:
    """``fedgraph-supernode`` (``flower-supernode`` with its 3 s idle poll capped, see
    fedgraph_flwr/engine/accelerate/): TLS to the SuperLink, auth key, its
    partition, local Runtime API. ``flower-supernode`` takes the same flags."""
    return [
        "fedgraph-supernode",
        "--superlink", superlink,
        "--root-certificates", ca,
        "--auth-supernode-private-key", auth_key,
        "--node-config", node_config(partition_file, partition_id),
        "--isolation", "process",
        "--host", "127.0.0.1", "--port", str(runtime_port),
        "--ssl-certfile", runtime_cert, "--ssl-keyfile", runtime_key, "--ssl-ca-certfile", runtime_ca,
        *health_args(health),
    ]


def preflight_cmd(partition_file: str, features: int | str = README_FEATURES,
                  classes: int | str = README_CLASSES) -> list[str]:
    """``fedgraph-preflight``: the owner's file checked as the handshake will check it, and
    against the run's dataset signature (feature width, classes), before the SuperNode starts."""
    return ["fedgraph-preflight", partition_file, "--features", str(features),
            "--classes", str(classes)]


def register_cmd(public_key: str, connection: str = CONNECTION) -> list[str]:
    return ["flwr", "supernode", "register", public_key, connection]


def run_cmd(app: str = ".", connection: str = CONNECTION, run_config: str | None = None,
            stream: bool = True) -> list[str]:
    """``fedgraph-run``: ``flwr run`` whose exit status is the run's outcome (0 completed,
    1 failed or stopped), where ``flwr run --stream`` exits 0 either way."""
    cmd = ["fedgraph-run", app, connection]
    if run_config:
        cmd += ["--run-config", run_config]
    if stream:
        cmd.append("--stream")
    return cmd


def connection_toml(address: str, root_certificates: str, name: str = CONNECTION) -> str:
    """The block that goes into ``$FLWR_HOME/config.toml`` (``~/.flwr/config.toml``)."""
    return (f"[superlink.{name}]\n"
            f'address = "{address}"\n'
            f'root-certificates = "{root_certificates}"\n')


def make_tls_cmd(out: str, name: str, hosts: list[str]) -> list[str]:
    cmd = ["python", "deploy/scripts/make_tls.py", "--out", out, "--name", name]
    for host in hosts:
        cmd += ["--host", host]
    return cmd


def make_keys_cmd(out: str, names: list[str]) -> list[str]:
    return ["python", "deploy/scripts/make_keys.py", "--out", out, *names]


_ENV_WORD = re.compile(r'"\$[A-Za-z_][A-Za-z0-9_]*[^"$`\\]*"')


def _quote(word: str) -> str:
    """shlex.quote, except a word already in double quotes that starts with one
    variable (``"$FEDGRAPH_DEPLOY_DIR/tls"``): the shell must expand it."""
    return word if _ENV_WORD.fullmatch(word) else shlex.quote(word)


def shell(cmd: list[str], env: dict[str, str] | None = None) -> str:
    """One copy-pasteable shell line (``VAR=value ... cmd`` when ``env`` is given)."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return prefix + " ".join(_quote(str(w)) for w in cmd)


# --- the README's N-machine walk-through (rendered with its placeholder values) -------------
README_HOST = "superlink.example.org"
# Expanded by the shell when step 4's block writes it: an absolute path, which the CLI
# reads from any folder.
README_CA_PATH = "$FEDGRAPH_DEPLOY_DIR/tls/ca.crt"
README_DIR = f'"${DEPLOY_DIR_ENV}"'  # the scripts write under it (outside the checkout)
# client-state="file": each owner keeps its optimizer state on its own disk (it survives
# a SuperNode restart, and 10 MB of FedAux state no longer travels between the SuperNode
# and its ClientApp with every message).
README_RUN_CONFIG = ('algorithm="fedaux" num-clients=3 rounds=100 client-state="file" '
                     'output-dir="/srv/fedgraph/outputs" run-name="cora-fedaux"')


# The compose walk-through's run: README's, with the container's output folder and 20 rounds.
COMPOSE_RUN_CONFIG = ('algorithm="fedaux" num-clients=3 rounds=20 client-state="file" '
                      f'output-dir="{CONTAINER_OUTPUTS}"')


def readme_commands() -> dict[str, str]:
    """Each command of deploy/README.md, keyed by step; the README must contain each verbatim."""
    addr = f"{README_HOST}:{SUPERLINK_PORT}"
    out = README_DIR[:-1]  # '"$FEDGRAPH_DEPLOY_DIR' + '/tls"'
    local_health = f"127.0.0.1:{HEALTH_PORT}"
    return {
        "tls": shell(make_tls_cmd(f'{out}/tls"', TLS_CERT_NAME, [README_HOST])),
        "keys": shell(make_keys_cmd(f'{out}/keys"', ["supernode-0"])),
        "superlink": shell(superlink_cmd("tls/ca.crt", f"tls/{TLS_CERT_NAME}.pem",
                                         f"tls/{TLS_CERT_NAME}.key", database="state/superlink.db",
                                         health=local_health, log_file="logs/superlink.log")),
        "serverapp-executor": shell(executor_cmd("tls/ca.crt", f"127.0.0.1:{SUPERLINK_PORT}"),
                                    SERVERAPP_ENV),
        "register": shell(register_cmd("keys/supernode-0.pub")),
        "runtime-tls": shell(make_tls_cmd(f'{out}/node-tls"', RUNTIME_CERT_NAME, [])),
        "preflight": shell(preflight_cmd("/srv/fedgraph/client_0.npz")),
        "supernode": shell(supernode_cmd(
            addr, "ca.crt", "keys/supernode-0", "/srv/fedgraph/client_0.npz",
            f"node-tls/{RUNTIME_CERT_NAME}.pem", f"node-tls/{RUNTIME_CERT_NAME}.key",
            "node-tls/ca.crt", health=local_health)),
        "clientapp-executor": shell(clientapp_executor_cmd("node-tls/ca.crt",
                                                 f"127.0.0.1:{SUPERNODE_RUNTIME_PORT}"),
                                    EXECUTOR_ENV),
        "connection": connection_toml(addr, README_CA_PATH),
        "run": shell(run_cmd(run_config=README_RUN_CONFIG)),
        "compose-run": shell(run_cmd("..", run_config=COMPOSE_RUN_CONFIG),
                             {"FLWR_HOME": f"$PWD/{GEN_FLWR_HOME}"}).replace(
                                 f"'$PWD/{GEN_FLWR_HOME}'", f"$PWD/{GEN_FLWR_HOME}"),
    }
