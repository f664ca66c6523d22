#!/usr/bin/env bash
# Capture `python -m sglang.launch_server --help` of one SGLang release, on a CPU machine, into
# tests/fixtures/sglang-help/VERSION.txt. Installs sglang[srt]==VERSION in a throwaway venv
# (never a gpufleet dependency). Usage: scripts/capture_sglang_help.sh 0.5.23
#
# 0.5.x prints its help directly. 0.4.x imports its CUDA kernels before parsing arguments, so
# on a machine without a driver the help is printed by the release's own parser
# (`sglang.srt.server_args.prepare_server_args(["--help"])`, exactly what launch_server.py
# calls first), with stand-ins for the triton driver and vllm's CUDA ops (nothing runs a model).
set -euo pipefail
version=$1
out=$(cd "$(dirname "$0")/.." && pwd)/tests/fixtures/sglang-help/$version.txt
venv=$(mktemp -d -t sglang-help-XXXX)
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "sglang[srt]==$version"
stub=$venv/stub
mkdir -p "$stub"
cat > "$stub/sitecustomize.py" <<'PY'
import importlib
import sys
from unittest.mock import MagicMock

try:
    importlib.import_module("triton.runtime.driver").driver.set_active(MagicMock())
except Exception:
    pass
for name in ("vllm", "vllm._custom_ops"):
    sys.modules.setdefault(name, MagicMock())
PY
cd "$venv"
if ! CUDA_VISIBLE_DEVICES= "$venv/bin/python" -m sglang.launch_server --help > "$out" 2>/dev/null; then
  launcher=$("$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("sglang.launch_server").origin)')
  PYTHONPATH=$stub CUDA_VISIBLE_DEVICES= "$venv/bin/python" -c "
import sys
sys.argv[0] = '$launcher'
from sglang.srt.server_args import prepare_server_args
prepare_server_args(['--help'])
" > "$out"
fi
echo "$version: $(grep -c '^  --' "$out") flags -> $out"
rm -rf "$venv"
