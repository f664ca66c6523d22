#!/usr/bin/env bash
# benchmarks/tune_surfaces.py on the lent 16-core GPU machine (the rehearsal needs no GPU,
# only cores for four tunes at once). gpufleet's dependencies travel as the wheels of
# .gpu-bundle/wheels (scripts/gpu-prepare.sh), gpufleet itself as this tree's src/; nothing
# is installed over the machine's own Python. Run there as root, from the project's root:
#   PYTHON=/opt/torch/.venv/bin/python bash scripts/tune-surfaces-device.sh --root logs/ts ...
# (every argument goes to tune_surfaces.py). A warm machine keeps between calls only what
# the project's .gitignore ignores: give --root under logs/, then a second call with
# --resume finishes what --stop-after interrupted (a root ignored only by this checkout's
# .git/info/exclude lost its profiles between calls).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SITE=${GPUFLEET_DEVICE_SITE:-/tmp/gpufleet-site}
if [ ! -d "$SITE/pydantic" ]; then
  wheels=$(ls .gpu-bundle/wheels/*.whl | grep -v '/gpufleet-')
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" $wheels
fi
export PYTHONPATH="$SITE:$PWD/src"
export PATH="$(dirname "$PY"):$PATH"  # the agent's `python: auto` finds this Python first
export PYTHONUNBUFFERED=1
echo "cores: $(nproc); python: $("$PY" -V)"
"$PY" benchmarks/tune_surfaces.py "$@"
