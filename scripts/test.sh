#!/usr/bin/env bash
# Quick start, tests: install what the suite needs (openssh-server, Debian's chromium for the
# report's browser tests, Python deps), run it all.
set -euo pipefail
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v strace >/dev/null || missing+=(strace)  # the root census traces sshd
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -q && apt-get install -y -q "${missing[@]}"
fi
source "$(dirname "$0")/setup-venv.sh"
ruff check src tests benchmarks tasks.py
ruff format --check src tests benchmarks tasks.py
python -m pytest -q "$@"
