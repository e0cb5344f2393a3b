#!/usr/bin/env bash
# The one command for a lent GPU machine (the device tool runs it in the checkout's copy,
# with gpu-carry/ carried: `bash benchmarks/gpu_carry.sh` fills it here first):
#     bash benchmarks/gpu_session.sh [gpu_check.py options]
# Installs the carried wheels (no network there), then runs benchmarks/gpu_check.py on CUDA
# with its 480 s budget, writing $OUT/gpu-check/gpu_check.{json,md} as it goes.
set -euo pipefail
cd "$(dirname "$0")/.."
carry=gpu-carry
out=${OUT:-outputs}/gpu-check
mkdir -p "$out"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps "$carry"/wheels/*.whl 2>&1 | tail -3
python3 -m pip check 2>&1 | grep -v "^uv\b" | head -20 > "$out/pip-check.txt" || true
echo "installed in $(( $(date +%s) - t0 )) s; $(python3 -c 'import flwr, torch; print("flwr", flwr.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" || true
# A writable data root outside $OUT (partition caches and client state stay on the machine).
data=$(mktemp -d) && cp -r "$carry/data/." "$data/"
python3 benchmarks/gpu_check.py --out "$out" --data-root "$data" --device "${DEVICE:-cuda}" \
  --partitions "$carry/partitions" --deterministic "$@"
