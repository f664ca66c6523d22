# Sourced by the quick-start scripts: a .venv with gpufleet installed (Debian/Ubuntu, as root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "gpufleet needs Python >= 3.11"'
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
  apt-get update -q && apt-get install -y -q python3-venv
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${GPUFLEET_EXTRAS:-dev}]"
export PATH="$PWD/.venv/bin:$PATH"
