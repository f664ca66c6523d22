"""The Invoke collection: every task, grouped in modules by what they act on.

A task parses options, calls one control-plane (or archive) function and prints through
cli/output.py; it holds no logic of its own (docs/ARCHITECTURE.md). Each task's module
declares the task's own options (an OptionSet beside it, as vLLM's benchmark subcommands
do); what several share is cli/common_options.py.
"""

from __future__ import annotations

from invoke import Collection

from gpufleet.cli import (
    bench_tasks,
    compare_tasks,
    fleet_tasks,
    gpu_tasks,
    parsing,
    server_tasks,
    sweep_tasks,
    tune_tasks,
)
from gpufleet.cli.bench_tasks import bench, runs
from gpufleet.cli.compare_tasks import compare, report
from gpufleet.cli.fleet_tasks import fleet, history, metrics
from gpufleet.cli.gpu_tasks import gpu_clean, hosts, status, sysinfo
from gpufleet.cli.options import OptionSet
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
    fleet,
    history,
    metrics,
)


TASK_MODULES = (
    gpu_tasks,
    server_tasks,
    bench_tasks,
    compare_tasks,
    sweep_tasks,
    tune_tasks,
    fleet_tasks,
)


def option_sets() -> dict[str, OptionSet]:
    """Every task's declared options by set name (CLEAN, BENCH, TUNE, ...), from the modules
    that declare them: what the census tests walk."""
    return {
        name: value
        for module in TASK_MODULES
        for name, value in vars(module).items()
        if isinstance(value, OptionSet)
    }
