#!/usr/bin/env bash
# The 128-host point of benchmarks/fleet_scale.py on the lent 16-core GPU machine, which has
# no sshd: Debian 12's OpenSSH travels as .debs in .sshdeb/ (docs/SCALE.md says which) and
# is unpacked under /tmp/ssh, never over /. Run there as root: bash scripts/fleet-scale-device.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/opt/torch/.venv/bin/python}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD/src"
mkdir -p /tmp/ssh
for deb in .sshdeb/*.deb; do dpkg -x "$deb" /tmp/ssh; done
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd
if [ ! -x /usr/sbin/sshd ]; then
  libs=/tmp/ssh/usr/lib/x86_64-linux-gnu:/tmp/ssh/lib/x86_64-linux-gnu
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec /tmp/ssh/usr/sbin/sshd "$@"\n' "$libs" >/usr/sbin/sshd
  chmod 755 /usr/sbin/sshd
fi
export PATH="/tmp/ssh/usr/bin:$PATH"
ulimit -n 65536 || true
nproc
"$PY" benchmarks/fleet_scale.py "$@"
