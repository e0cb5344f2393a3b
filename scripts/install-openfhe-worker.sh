#!/usr/bin/env bash
# secure-aggregation=ckks-threshold: a Python 3.10 venv with OpenFHE's PyPI wheel in
# .venv-openfhe (fedgraph_flwr/threshold_ckks/backend.py runs OpenFHE there: PyPI has no
# openfhe build for Python 3.11). Usage: scripts/install-openfhe-worker.sh [python3.10]
set -euo pipefail
cd "$(dirname "$0")/.."
OPENFHE_VERSION=1.6.1.0.22.4  # OpenFHE v1.6.1, Ubuntu 22.04 build (CPython 3.10 extension)
python=${1:-}
if [ -z "$python" ]; then
  for candidate in python3.10 "$HOME"/.pyenv/versions/3.10*/bin/python3.10; do
    if "$candidate" -c "" >/dev/null 2>&1; then python=$candidate; break; fi
  done
fi
if [ -z "$python" ]; then
  echo "no python3.10 found: pass one (scripts/install-openfhe-worker.sh /path/to/python3.10)" >&2
  exit 1
fi
"$python" -m venv .venv-openfhe
.venv-openfhe/bin/python -m pip install -q "openfhe==$OPENFHE_VERSION" "numpy<2.3"
.venv-openfhe/bin/python -c "import openfhe, numpy; print('openfhe', openfhe.__file__)"
