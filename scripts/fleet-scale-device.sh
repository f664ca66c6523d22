#!/usr/bin/env bash
# The 128-host point of benchmarks/fleet_scale.py on the lent 16-core GPU machine, which has
# no sshd: Debian 12's OpenSSH travels as .debs in .sshdeb/ (docs/SCALE.md says which) and
# is unpacked under $WORK/ssh, never over /. Run there as root: bash scripts/fleet-scale-device.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# scratch space: $GPUFLEET_DEVICE_WORK, else a fresh temporary folder
WORK=${GPUFLEET_DEVICE_WORK:-$(mktemp -d)}
PY=${PYTHON:-python3}  # the GPU machine's Python (PYTHON=... where torch lives)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target $WORK/site .whl/*.whl
export PYTHONPATH="$WORK/site:$PWD/src"
mkdir -p $WORK/ssh
for deb in .sshdeb/*.deb; do dpkg -x "$deb" $WORK/ssh; done
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd
if [ ! -x /usr/sbin/sshd ]; then
  libs=$WORK/ssh/usr/lib/x86_64-linux-gnu:$WORK/ssh/lib/x86_64-linux-gnu
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s/ssh/usr/sbin/sshd "$@"\n' "$libs" "$WORK" >/usr/sbin/sshd
  chmod 755 /usr/sbin/sshd
fi
export PATH="$WORK/ssh/usr/bin:$PATH"
ulimit -n 65536 || true
nproc
"$PY" benchmarks/fleet_scale.py "$@"
