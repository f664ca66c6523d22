#!/usr/bin/env bash
# Quick start, tests: install what the suite needs (openssh-server, Debian's chromium for the
# report's browser tests, Slurm and MUNGE for a real cluster, Prometheus, Python deps), run it all.
#   scripts/test.sh            the whole suite (the README's command; CI runs it): the tests
#                              side by side on $GPUFLEET_TEST_WORKERS workers (default 8:
#                              the longest tests mostly wait on simulated decode and sshd,
#                              and on 6 the cores were 40-60% idle for the first two
#                              minutes; 10 were faster still, 561 s against 613 s, but CI
#                              failed a tune's timing premise at 10: docs/TESTING.md),
#                              then the `exclusive` ones alone (they change a shared
#                              directory or judge the load)
#   scripts/test.sh --fast     the unit tier: no sshd, no server, no other process, on
#                              $GPUFLEET_FAST_WORKERS workers (default 2: 28 s here on 2026-12-07)
#   scripts/test.sh ARGS...    pytest ARGS (e.g. tests/test_bench.py -k crash)
set -euo pipefail
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
missing=()
if [ $fast = 0 ]; then
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v strace >/dev/null || missing+=(strace)  # the root census traces sshd
  # a preloaded library the trust tests build (libc6-dev: gcc only recommends its headers)
  command -v gcc >/dev/null || missing+=(gcc libc6-dev)
  # the report's browser tests; the fonts are only a recommendation of chromium's, and the
  # layout tests measure text
  command -v chromium >/dev/null || missing+=(chromium fonts-liberation)
  # a real Slurm (munged, slurmctld, three slurmds) for tests/test_slurm_real.py; every
  # plugin it loads (proctrack/cgroup, select/cons_tres, auth/munge) is in its basic plugins
  [ -x /usr/sbin/slurmctld ] || missing+=(slurmctld)
  [ -x /usr/sbin/slurmd ] || missing+=(slurmd)
  command -v srun >/dev/null || missing+=(slurm-client)
  [ -x /usr/sbin/munged ] || missing+=(munge)
  # a real Prometheus scrapes `inv metrics --serve`; promtool checks the exposition
  command -v prometheus >/dev/null || missing+=(prometheus)
fi
if [ ${#missing[@]} -gt 0 ]; then
  # without recommends (issue 64: Slurm's pulled ~160 packages, printer and X11 tools among
  # them): what the suite needs is named above
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
source "$(dirname "$0")/setup-venv.sh"
# with PYTHONDONTWRITEBYTECODE set (as on CI's machine) every process of the suite would
# compile gpufleet's modules again (0.1 s a CLI call): compiled once here, read by all
python -m compileall -q src
# pytest rewrites each test module's asserts on import and, with bytecode writes off, does it
# again in every worker (3.7 CPU-s a collection here, 1.3 from its cache): one collection
# writes the cache, which the workers read
PYTHONDONTWRITEBYTECODE= python -m pytest -q --collect-only -p no:cacheprovider >/dev/null || true
ruff check src tests benchmarks tasks.py
ruff format --check src tests benchmarks tasks.py
if [ $fast = 1 ]; then
  exec python -m pytest -q -n "${GPUFLEET_FAST_WORKERS:-2}" -m unit "$@"
fi
if [ $# -gt 0 ]; then
  exec python -m pytest -q "$@"
fi
status=0
python -m pytest -q -n "${GPUFLEET_TEST_WORKERS:-8}" --maxschedchunk 1 -m "not exclusive" \
  || status=$?
python -m pytest -q -m exclusive || status=$?
exit $status
