#!/usr/bin/env bash
# The Flower-facing tests on the next Flower (flwr-nightly), in a virtualenv of its own.
#
#   scripts/test-flwr-nightly.sh [VENV_DIR]     (default: ~/.cache/fedgraph-flwr/venv-flwr-nightly)
#   FLWR_NIGHTLY="flwr-nightly==1.43.0.dev20261026" scripts/test-flwr-nightly.sh   (pin one build)
#
# Opt-in, not part of .ci/run (CI has 90 min on 2 cores and already takes ~35): run it by
# hand or from a scheduled job before widening pyproject's flwr pin. The venv has no
# system site-packages: flwr-nightly installs the same `flwr` package as flwr, so the two
# must not share one environment. docs/running.md, "Testing on the next Flower".
#
# What runs: the checks that Flower's public API is all the default path uses
# (test_flower_surface), the engine over real simulations (test_engine), the first-hour
# path with `flwr run` against a local SuperLink in private namespaces (test_first_hour),
# the accelerators' seams (test_accelerate: the tests through the commands' version guard
# skip, since the commands run stock Flower on an untested release), and the golden
# figures of the Flower simulations (test_golden -k flower).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-${FEDGRAPH_NIGHTLY_VENV:-$HOME/.cache/fedgraph-flwr/venv-flwr-nightly}}
FLWR_NIGHTLY=${FLWR_NIGHTLY:-flwr-nightly}

[ -x "$VENV/bin/python" ] || python -m venv "$VENV"
PY="$VENV/bin/python"
# torch first (the README's CPU wheel; a bare requirement would pull the CUDA build).
"$PY" -m pip install -q torch==2.13.0
# pyproject's dependencies with flwr-nightly[simulation] in place of flwr[simulation].
mapfile -t DEPS < <("$PY" - <<'PYEOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for dep in project["dependencies"] + project["optional-dependencies"]["test"]:
    if not dep.startswith(("flwr", "torch>", "ruff")):
        print(dep)
PYEOF
)
"$PY" -m pip install -q "$FLWR_NIGHTLY[simulation]" "${DEPS[@]}"
# The package itself, without its flwr pin, so the `fedgraph-*` console scripts exist.
"$PY" -m pip install -q --no-deps -e .
"$PY" - <<'PYEOF'
from importlib import metadata
try:
    metadata.version("flwr")
    raise SystemExit("this venv has the stable flwr distribution too: use a fresh VENV_DIR")
except metadata.PackageNotFoundError:
    import flwr
    print(f"flwr-nightly {metadata.version('flwr-nightly')} (flwr.__version__ {flwr.__version__})")
PYEOF

export PATH="$VENV/bin:$PATH" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" FEDGRAPH_FLWR_NIGHTLY=1
status=0
"$PY" -m pytest -q -p no:cacheprovider tests/test_flower_surface.py tests/test_engine.py \
    tests/test_first_hour.py tests/test_accelerate.py || status=$?
"$PY" -m pytest -q -p no:cacheprovider tests/test_golden.py -k flower || status=$?
exit "$status"
