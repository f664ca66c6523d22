#!/usr/bin/env bash
# The real-engine tiers on the lent GPU machine (no internet): the carried wheels (.whl/) and
# llama.cpp's trimmed source (.engines/*.tar.gz) in, both put there first by
# scripts/engines-device-prepare.sh; llama-server built there, the tier run, the figures
# written to $OUT.
#   scripts/engines-device.sh [PYTEST ARGS]          CPU build (~105 s at -j 16), tests/engines
#   scripts/engines-device.sh --cuda [PYTEST ARGS]   CUDA build for this GPU's architecture
#                                                    only, tests/gpu/test_real_engine.py
# The build: scripts/llama-build.sh (kept in .engine-build/ on a warm machine). The path a
# user follows is scripts/gpu-prepare.sh then scripts/gpu-run.sh (docs/GPU-VALIDATION.md).
set -uo pipefail
cd "$(dirname "$0")/.."
cuda=0
if [ "${1:-}" = "--cuda" ]; then
  cuda=1
  shift
fi
# scratch space: $GPUFLEET_DEVICE_WORK, else a fresh temporary folder
WORK=${GPUFLEET_DEVICE_WORK:-$(mktemp -d)}
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$WORK/site" .whl/*.whl >/dev/null 2>&1
export PYTHONPATH="$WORK/site:$PWD/src"
CACHE=${GPUFLEET_ENGINE_CACHE:-$PWD/.engines}
started=$(date +%s)
SERVER=$(bash scripts/llama-build.sh $([ $cuda = 1 ] && echo --cuda)) || exit 1
echo "llama-server ready in $(( $(date +%s) - started )) s: $SERVER" | tee "${OUT:-$WORK}/build.txt"
"$SERVER" --version 2>&1 | tail -2
export GPUFLEET_LLAMA_SERVER=$SERVER GPUFLEET_ENGINE_CACHE=$CACHE
export GPUFLEET_ENGINE_FIGURES=${OUT:-$WORK}/engine-figures.json
export GPUFLEET_GPU_FIGURES=${OUT:-$WORK}/gpu-engine-figures.json
rm -rf "$WORK/pytest"
if [ $cuda = 1 ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv || true
  tier=tests/gpu/test_real_engine.py
else
  tier=tests/engines
fi
"$PY" -m pytest "$tier" -v -p no:cacheprovider -o addopts="" --basetemp="$WORK/pytest" "$@"
status=$?
if [ -n "${OUT:-}" ] && [ -d "$WORK/pytest" ]; then
  (cd "$WORK/pytest" && tar czf "$OUT/site.tgz" --exclude='*.gguf' --exclude='prompts.jsonl' \
    --exclude='requests-*' -- */logs) 2>/dev/null
fi
exit $status
