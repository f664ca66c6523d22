"""The Invoke collection: every task, grouped in modules by what they act on.

A task parses options, calls one control-plane (or archive) function and prints through
cli/output.py; it holds no logic of its own (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from invoke import Collection

from gpufleet.cli import parsing
from gpufleet.cli.bench_tasks import bench, runs
from gpufleet.cli.compare_tasks import compare, report
from gpufleet.cli.gpu_tasks import gpu_clean, hosts, status, sysinfo
from gpufleet.cli.server_tasks import launch, logs, profiles, stop, wait
from gpufleet.cli.sweep_tasks import rehearse, sweep
from gpufleet.cli.tune_tasks import tune

parsing.install()

ns = Collection(
    gpu_clean,
    status,
    sysinfo,
    hosts,
    profiles,
    launch,
    wait,
    stop,
    logs,
    bench,
    runs,
    compare,
    sweep,
    tune,
    rehearse,
    report,
)
