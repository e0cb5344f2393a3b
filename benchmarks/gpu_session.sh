#!/usr/bin/env bash
# The command for a lent GPU machine (the device tool runs it in the checkout's copy, with
# gpu-carry/ carried; `bash benchmarks/gpu_carry.sh [--ray]` fills it here first):
#     bash benchmarks/gpu_session.sh [gpu_check.py options]
# installs the carried wheels (no network there), then runs benchmarks/gpu_check.py on CUDA
# (480 s budget unless told), writing $OUT/gpu-check/gpu_check.{json,md} as it goes.
#     bash benchmarks/gpu_session.sh --ray [gpu_check.py options]
# is the second call of a Ray session: it joins gpu-carry-ray-1/ (carried by the first
# call, kept there) and gpu-carry-ray-2/ (carried now), checks the wheel's sha256, installs
# Ray and runs gpu_check.py's simulation part into $OUT/gpu-check-simulation/.
# DEVICE=cpu rehearses either call on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
data=/tmp/gpu-check-data  # writable, outside $OUT: partition caches stay on the machine
if [ "${1:-}" = "--ray" ]; then
  shift
  out=${OUT:-outputs}/gpu-check-simulation
  mkdir -p "$out"
  wheel=$(cut -d' ' -f3 gpu-carry-ray-1/wheel.sha256)
  cat gpu-carry-ray-1/part.00 gpu-carry-ray-2/part.01 gpu-carry-ray-2/part.02 > "/tmp/$wheel"
  (cd /tmp && sha256sum -c "$OLDPWD/gpu-carry-ray-1/wheel.sha256")
  python3 -m pip install -q --no-index --no-deps "/tmp/$wheel" gpu-carry-ray-1/wheels/*.whl
  echo "Ray installed in $(( $(date +%s) - t0 )) s"
  python3 benchmarks/gpu_check.py --out "$out" --data-root "$data" --device "${DEVICE:-cuda}" \
    --parts simulation --budget-s 120 "$@"
  exit
fi
out=${OUT:-outputs}/gpu-check
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps gpu-carry/wheels/*.whl
python3 -m pip check > "$out/pip-check.txt" 2>&1 || true  # version notes, for the record
echo "installed in $(( $(date +%s) - t0 )) s: $(python3 -c 'import flwr, torch; print("flwr", flwr.__version__, "torch", torch.__version__, "CUDA", torch.cuda.is_available())')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
rm -rf "$data" && mkdir -p "$data" && cp -r gpu-carry/data/. "$data/"
python3 benchmarks/gpu_check.py --out "$out" --data-root "$data" --device "${DEVICE:-cuda}" \
  --partitions gpu-carry/partitions --deterministic "$@"
