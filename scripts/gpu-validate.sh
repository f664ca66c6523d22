#!/usr/bin/env bash
# Run tests/gpu on a GPU machine in one go (what the lent H200 ran): install the carried
# wheels (.whl/, see docs/GPU-VALIDATION.md) into $WORK/site, then pytest with real NVML.
set -euo pipefail
cd "$(dirname "$0")/.."
# scratch space: $GPUFLEET_DEVICE_WORK, else a fresh temporary folder
WORK=${GPUFLEET_DEVICE_WORK:-$(mktemp -d)}
PY=${PYTHON:-python3}  # the GPU machine's Python (PYTHON=... where torch lives)
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $WORK/site .whl/*.whl
fi
export PYTHONPATH="$WORK/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export GPUFLEET_GPU_FIGURES=${OUT:-$WORK}/gpu-figures.json
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv || true
"$PY" -c 'import pynvml; pynvml.nvmlInit(); print("driver", pynvml.nvmlSystemGetDriverVersion(), "cuda", pynvml.nvmlSystemGetCudaDriverVersion())'
"$PY" -m pytest tests/gpu -v -p no:cacheprovider -o addopts="" "$@"
