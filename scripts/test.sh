#!/usr/bin/env bash
# Quick start, tests: install what the suite needs (openssh-server, Python deps), run it all.
set -euo pipefail
if [ ! -x /usr/sbin/sshd ]; then
  apt-get update -q && apt-get install -y -q openssh-server
fi
source "$(dirname "$0")/setup-venv.sh"
ruff check src tests benchmarks tasks.py
ruff format --check src tests benchmarks tasks.py
python -m pytest -q "$@"
