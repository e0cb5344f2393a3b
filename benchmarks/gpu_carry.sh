#!/usr/bin/env bash
# Fill gpu-carry/ (git-ignored) with what benchmarks/gpu_session.sh needs on a lent GPU
# machine, which has torch + CUDA, torch-geometric, numba and triton but no network, flwr,
# Ray or pymetis (.library/device/KINDS.md): Python 3.12 wheels of flwr and the packages the
# image lacks, this project's own wheel, Cora's raw files and the ten reference client files.
# About 24 MB, under the device tool's 64 MiB a call. With --ray, also Ray's 70 MB wheel
# cut in three, gpu-carry-ray-1/ (a third, its sha256 and its deps) and gpu-carry-ray-2/
# (two thirds), one for each of two device calls (docs/performance.md, "On a GPU"). Run here, where the
# registry answers:
#     bash benchmarks/gpu_carry.sh [--ray] [SHARED]   # SHARED: ../shared beside the checkout
set -euo pipefail
cd "$(dirname "$0")/.."
ray=false
if [ "${1:-}" = "--ray" ]; then ray=true; shift; fi
shared=${1:-../shared}
fetch() {  # py3.12 manylinux wheels of exactly these versions, no dependencies
  local dest=$1; shift
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dest" "$@"
}
carry=gpu-carry
rm -rf "$carry" && mkdir -p "$carry/wheels" "$carry/data/Cora" "$carry/partitions"
# The versions this checkout is tested with; the image already holds the rest (grpcio,
# protobuf, numpy, scipy, rich, typer, click, pyyaml, requests, httpx, wrapt, ...).
fetch "$carry/wheels" \
  flwr==1.42.0 alembic==1.20.1 annotated-types==0.7.0 cffi==2.0.0 cryptography==50.0.2 \
  dm-tree==0.1.10 dp-accounting==0.6.0 fastapi==0.138.2 finch-clust==0.2.3 greenlet==3.5.6 \
  grpcio-health-checking==1.81.1 iterators==0.0.2 Mako==1.4.3 prompt_toolkit==3.0.52 \
  pycparser==3.0 pycryptodome==3.24.1 pydantic==2.13.4 pydantic_core==2.46.4 \
  pymetis==2025.2.2 SQLAlchemy==2.1.9 starlette==1.3.1 tenseal==0.3.18 tomli==2.5.0 \
  tomli_w==1.2.0 typing-inspection==0.4.2 uvicorn==0.49.0 wcwidth==0.7.0
python -m pip wheel -q --no-deps -w "$carry/wheels" .
cp -r "$shared/datasets/Cora/raw" "$carry/data/Cora/raw"
cp "$shared"/reference-partitions/fedaux-cora-disjoint-10/client_*.npz "$carry/partitions/"
du -sh "$carry"
if $ray; then
  rm -rf gpu-carry-ray-1 gpu-carry-ray-2 && mkdir -p gpu-carry-ray-1/wheels gpu-carry-ray-2
  tmp=$(mktemp -d)
  fetch "$tmp" ray==2.55.1
  fetch gpu-carry-ray-1/wheels jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
    referencing==0.37.0 rpds-py==0.30.0
  wheel=$(basename "$tmp"/ray-*.whl)
  # A third goes with the first call (beside gpu-carry/), two thirds with the second.
  (cd "$tmp" && sha256sum "$wheel" > wheel.sha256 && split -n 3 -d "$wheel" part.)
  mv "$tmp/wheel.sha256" "$tmp/part.00" gpu-carry-ray-1/
  mv "$tmp/part.01" "$tmp/part.02" gpu-carry-ray-2/
  rm -rf "$tmp"
  du -sh gpu-carry-ray-1 gpu-carry-ray-2
fi
