#!/usr/bin/env bash
# The compose demo, end to end, in real containers: build the image, bring up
# deploy/docker-compose.yml (SuperLink + 3 SuperNodes, TLS and SuperNode auth on), run
# FedAux for a few rounds with README's run command, check results.json, tear down.
#
#   deploy/scripts/compose_smoke.sh [--rounds 3] [--torch-wheels DIR] [--keep]
#                                   [--kill-after-round N [--kill-node I]] [--run-timeout S]
#
# --kill-after-round N: once round N is done, SIGKILL SuperNode I's process from the host
# (a crash, as the OOM killer's; `docker kill` would count as a manual stop, which no
# restart policy undoes). Then nothing is touched: the restart policies must bring that
# SuperNode and its ClientApp executor back, and a later round must complete with all
# three clients. Prints how long each took. --run-timeout S: fedgraph-run's limit (1800).
# Compose tool: the first found of Docker Compose v2 (`docker compose`), Debian's
# docker-compose (>= 1.29) and podman-compose (COMPOSE_TOOL=... picks one); it says which. Base image: $BASE_IMAGE if
# set, else python:3.11-slim if it is here or can be pulled, else one built from Debian
# packages by make_base_image.sh (needs root). --torch-wheels DIR serves DIR's wheels to
# the build (a local CPU torch wheel, where download.pytorch.org is out of reach).
# Partitions: the first 3 of ../shared/reference-partitions/fedaux-cora-disjoint-10 if present, else $DATA_ROOT (Cora raw files).
# Everything the run writes (TLS material, keys, state, outputs) lies in a temporary
# folder, never in the checkout; the compose project has its own name, and teardown
# (`down -v`) removes its containers, network and volumes, then checks none is left.
set -euo pipefail
DEPLOY="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="$(dirname "$DEPLOY")"
ROUNDS=3
KEEP=0
WHEELS=""
KILL_AFTER=""
KILL_NODE=1
RUN_TIMEOUT=1800  # fedgraph-run's limit: an 8-round kill smoke took over 900 s at load 40
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --torch-wheels) WHEELS="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --kill-after-round) KILL_AFTER="$2"; shift 2 ;;
    --kill-node) KILL_NODE="$2"; shift 2 ;;
    --run-timeout) RUN_TIMEOUT="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "compose_smoke.sh: error: unknown argument $1" >&2; exit 2 ;;
  esac
done
say() { echo "compose_smoke: $*"; }
die() { echo "compose_smoke.sh: error: $*" >&2; exit 1; }

# --- which engine and compose tool ------------------------------------------------------
if [ -n "${COMPOSE_TOOL:-}" ]; then  # "docker compose", docker-compose or podman-compose
  read -r -a COMPOSE <<<"$COMPOSE_TOOL"
  case "${COMPOSE[0]}" in podman*) ENGINE=podman ;; *) ENGINE=docker ;; esac
elif command -v docker >/dev/null && docker compose version >/dev/null 2>&1; then
  ENGINE=docker; COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null && command -v docker >/dev/null; then
  ENGINE=docker; COMPOSE=(docker-compose)
elif command -v podman-compose >/dev/null && command -v podman >/dev/null; then
  ENGINE=podman; COMPOSE=(podman-compose)
else
  die "no compose tool: install Docker Compose v2, Debian's docker-compose or podman-compose"
fi
"$ENGINE" info >/dev/null 2>&1 || die "$ENGINE cannot reach its engine (is dockerd running?)"
say "engine: $("$ENGINE" --version)"
say "compose: ${COMPOSE[*]} ($("${COMPOSE[@]}" version 2>/dev/null | head -1))"

# --- base image -------------------------------------------------------------------------
if [ -z "${BASE_IMAGE:-}" ]; then
  if "$ENGINE" image inspect python:3.11-slim >/dev/null 2>&1 \
     || timeout 60 "$ENGINE" pull -q python:3.11-slim >/dev/null 2>&1; then
    BASE_IMAGE=python:3.11-slim
  else
    BASE_IMAGE=fedgraph-base:bookworm
    if ! "$ENGINE" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
      say "python:3.11-slim cannot be pulled: building $BASE_IMAGE from Debian packages"
      CONTAINER_ENGINE="$ENGINE" "$DEPLOY/scripts/make_base_image.sh" "$BASE_IMAGE"
    fi
  fi
fi
say "base image: $BASE_IMAGE"

# --- the project image --------------------------------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/fedgraph-compose.XXXXXX")"
PROJECT="fedgraph-smoke-$$"
SERVER_PID=""
teardown() {
  local rc=$?
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then say "kept: project $PROJECT in $WORK"; exit $rc; fi
  if [ -f "$WORK/docker-compose.yml" ]; then
    (cd "$WORK" && "${COMPOSE[@]}" -p "$PROJECT" down -v --remove-orphans >"$WORK/down.log" 2>&1) \
      || { cat "$WORK/down.log" >&2; rc=1; }
    left="$("$ENGINE" ps -aq --filter "label=com.docker.compose.project=$PROJECT")"
    left+="$("$ENGINE" volume ls -q --filter "label=com.docker.compose.project=$PROJECT")"
    if [ -n "$left" ]; then echo "compose_smoke.sh: error: left behind: $left" >&2; rc=1
    else say "teardown: no container, network or volume of $PROJECT left"; fi
  fi
  rm -rf "$WORK" 2>/dev/null || say "could not remove $WORK (files written by the containers' user)"
  exit $rc
}
trap teardown EXIT

BUILD_ARGS=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
if [ -n "$WHEELS" ]; then
  wheel="$(cd "$WHEELS" && ls torch-*.whl 2>/dev/null | head -1)"
  [ -n "$wheel" ] || die "no torch-*.whl in $WHEELS"
  version="$(echo "$wheel" | cut -d- -f2)"
  # A fixed port where it is free: build arguments are part of the layer cache key.
  port="$(python3 -c 'import socket
s = socket.socket()
try: s.bind(("127.0.0.1", 38765))
except OSError: s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
  python3 -m http.server --bind 127.0.0.1 "$port" --directory "$WHEELS" >"$WORK/wheels.log" 2>&1 &
  SERVER_PID=$!
  BUILD_ARGS+=(--build-arg "TORCH_FIND_LINKS=http://127.0.0.1:$port/" --build-arg "TORCH_SPEC=torch==$version")
  say "torch: $wheel from $WHEELS"
fi
say "building fedgraph-flwr:cpu"
t0=$(date +%s)
# --network host: the build reaches the wheel server on 127.0.0.1 and the registry as the
# host does. DOCKER_BUILDKIT=0: Debian's docker.io has no buildx; the file needs nothing
# BuildKit-only.
DOCKER_BUILDKIT=0 "$ENGINE" build -q --network host -f "$DEPLOY/Dockerfile" "${BUILD_ARGS[@]}" \
  -t fedgraph-flwr:cpu "$ROOT" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log" >&2; die "image build failed"; }
say "image built in $(( $(date +%s) - t0 )) s"

# --- prepare: partitions, TLS, keys, .env (outside the checkout) -------------------------
PARTS="$ROOT/../shared/reference-partitions/fedaux-cora-disjoint-10"
if [ -d "$PARTS" ]; then PREP=(--from-dir "$PARTS")
elif [ -n "${DATA_ROOT:-}" ]; then PREP=(--data-root "$DATA_ROOT")
else die "no partitions: put the reference files at ../shared/reference-partitions or set DATA_ROOT"; fi
python3 "$DEPLOY/scripts/prepare.py" --out "$WORK/generated" "${PREP[@]}" >"$WORK/prepare.log"
cp "$DEPLOY/docker-compose.yml" "$WORK/docker-compose.yml"
cp "$WORK/generated/.env" "$WORK/.env"
chmod -R a+rX "$WORK"

# --- up, run, check -----------------------------------------------------------------------
cd "$WORK"
say "up: $("${COMPOSE[@]}" -p "$PROJECT" config --services 2>/dev/null | wc -l) services, project $PROJECT"
t0=$(date +%s)
"${COMPOSE[@]}" -p "$PROJECT" up -d --no-build >"$WORK/up.log" 2>&1 \
  || { cat "$WORK/up.log" >&2; "${COMPOSE[@]}" -p "$PROJECT" logs --tail 30 >&2 || true; die "compose up failed"; }
say "up in $(( $(date +%s) - t0 )) s"
"${COMPOSE[@]}" -p "$PROJECT" ps

RUN_NAME=compose-smoke
t0=$(date +%s)
# README's run command (deploy/README.md, "Docker Compose"), with fewer rounds and a run name.
FLWR_HOME="$WORK/generated/flwr-home" timeout "$RUN_TIMEOUT" fedgraph-run "$ROOT" fedgraph --stream --run-config \
  "algorithm=\"fedaux\" num-clients=3 rounds=$ROUNDS client-state=\"file\" output-dir=\"/app/outputs\" run-name=\"$RUN_NAME\"" \
  >"$WORK/run.log" 2>&1 &
RUN_PID=$!
if [ -n "$KILL_AFTER" ]; then
  # In the background: the crash after round KILL_AFTER, then both containers watched.
  (
    cid() { "$ENGINE" ps -aq --filter "label=com.docker.compose.project=$PROJECT" \
              --filter "label=com.docker.compose.service=$1"; }
    restarts() { "$ENGINE" inspect -f '{{.RestartCount}}' "$1"; }
    running() { [ "$("$ENGINE" inspect -f '{{.State.Running}}' "$1")" = true ]; }
    # The server's progress.json (on the host, rewritten after every round) says when round
    # KILL_AFTER is done; the streamed log says it later, minutes later at load 40.
    progress="$WORK/generated/outputs/$RUN_NAME/progress.json"
    until python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["round"] < int(sys.argv[2]))' \
            "$progress" "$KILL_AFTER" 2>/dev/null; do
      kill -0 "$RUN_PID" 2>/dev/null || exit 0; sleep 0.2
    done
    node="$(cid "supernode-$KILL_NODE")"; exe="$(cid "superexec-clientapp-$KILL_NODE")"
    n0="$(restarts "$node")"; e0="$(restarts "$exe")"
    pid="$("$ENGINE" inspect -f '{{.State.Pid}}' "$node")"
    t0=$(date +%s.%N)
    kill -9 "$pid"
    say "round $KILL_AFTER done: SIGKILL to supernode-$KILL_NODE's process (host pid $pid); no manual step from here"
    node_back=""; exe_back=""
    while kill -0 "$RUN_PID" 2>/dev/null && { [ -z "$node_back" ] || [ -z "$exe_back" ]; }; do
      now=$(date +%s.%N)
      if [ -z "$node_back" ] && [ "$(restarts "$node")" -gt "$n0" ] && running "$node"; then
        node_back=$(python3 -c "print(f'{$now - $t0:.1f}')")
        say "supernode-$KILL_NODE restarted by its policy ${node_back} s after the kill (restarts: $n0 -> $(restarts "$node"))"
      fi
      if [ -z "$exe_back" ] && [ "$(restarts "$exe")" -gt "$e0" ] && running "$exe"; then
        exe_back=$(python3 -c "print(f'{$now - $t0:.1f}')")
        say "superexec-clientapp-$KILL_NODE restarted by its policy ${exe_back} s after the kill (restarts: $e0 -> $(restarts "$exe"))"
      fi
      sleep 0.5
    done
    echo "$node_back $exe_back" >"$WORK/kill.result"
  ) &
  WATCH_PID=$!
fi
tail -n +1 -f --pid="$RUN_PID" "$WORK/run.log" | grep --line-buffered -E "round [0-9]+/|test at|results written|rror|fedgraph-run" || true
RUN_RC=0; wait "$RUN_PID" || RUN_RC=$?
[ -z "$KILL_AFTER" ] || wait "$WATCH_PID"  # the kill watcher (not the wheel server)
say "fedgraph-run took $(( $(date +%s) - t0 )) s, exit status $RUN_RC"
RESULTS="$WORK/generated/outputs/$RUN_NAME/results.json"
[ "$RUN_RC" = 0 ] || { tail -n 20 "$WORK/run.log" >&2; die "fedgraph-run exited with status $RUN_RC"; }
[ -f "$RESULTS" ] || { "${COMPOSE[@]}" -p "$PROJECT" logs --tail 40 >&2 || true; die "no $RESULTS"; }
if [ -n "$KILL_AFTER" ]; then
  read -r node_back exe_back <"$WORK/kill.result" 2>/dev/null || true
  [ -n "${node_back:-}" ] || die "supernode-$KILL_NODE was not restarted by its policy"
  [ -n "${exe_back:-}" ] || die "superexec-clientapp-$KILL_NODE was not restarted by its policy"
fi
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" python3 "$DEPLOY/scripts/smoke_check.py" "$RESULTS" "$ROUNDS" --kill-after-round "${KILL_AFTER:-0}" \
  --kill-node "$KILL_NODE" || die "results.json does not pass"
say "OK"
