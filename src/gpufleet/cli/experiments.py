"""Running a sweep from a task: the request from options, the pasteable `--resume` line,
Ctrl-C handling and the printed progress and comparison. Used by `inv sweep`, `inv tune`
and `inv rehearse` (the orchestration itself is control/sweep.py and control/tunerun.py).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit

from gpufleet.cli.common import forks_for, select_hosts
from gpufleet.cli.compare_tasks import show_compare


def experiment_request(options: Any, parsed: dict[str, Any]) -> Any:
    """The request every cell of a sweep or tune benches with (one BenchRequest)."""
    from gpufleet.control.benchrequest import BenchRequest
    from gpufleet.errors import UserError

    request = BenchRequest(**options.request_fields(parsed))
    if not request.concurrency:
        raise UserError("--concurrency is required (e.g. --concurrency 1,10,64)")
    return request


LEFT_OUT = ("c", "resume", "dry_run", "hosts", "inventory")  # the resume line sets these


def given_options(body: Callable[..., Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """The options a task was given, as `--flag: value`, read off its own signature: what
    its `--resume` line repeats, with no hand-kept copy of the options to drift. A bool
    given against its default True becomes `--no-<flag>`."""
    params = inspect.signature(body).parameters
    out: dict[str, Any] = {}
    for name, param in params.items():  # in the order the task declares them
        if name in LEFT_OUT or name not in arguments:
            continue
        value, default = arguments[name], param.default
        if value is None or value == default or value == []:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            out[flag if value else f"--no-{flag[2:]}"] = True
        else:
            out[flag] = value
    return out


def resume_command(base: list[str], options: dict[str, Any]) -> Callable[[Any, Any], str]:
    """Build the pasteable `--resume` line: the same options, inventory and hosts (a list
    value is the flag repeated, as it was given)."""
    import shlex

    def command(inv: Any, hosts: list[str]) -> str:
        words = list(base)
        for flag, value in options.items():
            for item in value if isinstance(value, list | tuple) else [value]:
                if item not in (None, False, ""):
                    words += [flag] if item is True else [flag, str(item)]
        words += ["--inventory", inv.source, "--hosts", ",".join(hosts), "--resume"]
        return shlex.join(words)

    return command


@contextlib.contextmanager
def ctrl_c_stops(cancel: Any, hint: Callable[[], str]):
    """First Ctrl-C: nothing new starts, the cells in flight stop cleanly (see sweep.py).
    Second Ctrl-C: exit at once; what runs on the hosts goes on and --resume finishes it."""
    import os
    import signal
    import sys

    from gpufleet.cli.output import line

    def on_sigint(signum: int, frame: Any) -> None:
        if not cancel.requested:
            cancel.request()
            line("gpufleet: stopping: no new cell starts, cells in flight stop cleanly "
                 "(Ctrl-C again to abort now)", sys.stderr)  # fmt: skip
            return
        line(f"gpufleet: aborted; finish the sweep with `{hint()}`", sys.stderr)
        os._exit(130)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_sweep(
    profile_names, request, hosts, inventory, resume, dry_run, fail_fast, engine, forks,
    resume_command, fmt="table", arms=None, kind="sweep", allow_unhealthy=False,
):  # fmt: skip
    from gpufleet.archive.layout import Layout
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import bench_progress, launch_progress
    from gpufleet.control import sweep
    from gpufleet.control.arms import expand
    from gpufleet.control.cancel import CancelToken
    from gpufleet.control.lifecycle import LaunchOptions
    from gpufleet.kinds import SweepStatus

    arms = arms or expand(profile_names, [], 1)
    sweep.check_arms(profile_names, arms)  # a bad profile or flag fails before anything starts
    inv, selected = select_hosts(inventory, hosts)
    if dry_run:
        for text in sweep.plan_lines(arms, selected, request, engine):
            line(text)
        line("dry run: nothing started")
        return None
    state = sweep.open_state(
        request.archive_root, profile_names, selected, request.concurrency, resume, arms, kind
    )
    if resume:
        line(f"resuming sweep {state.sweep_id} ({state.record.status})")
    cancel = CancelToken()
    hint = lambda: resume_command(inv, state.record.hosts)  # noqa: E731
    with ctrl_c_stops(cancel, hint):
        state = sweep.run(
            state, sweep.hosts_of(state, selected), request,
            LaunchOptions(engine=engine, allow_unhealthy=allow_unhealthy), fail_fast,
            forks_for(inv, forks), line, launch_progress(), bench_progress(), cancel,
        )  # fmt: skip
        data = sweep.report_input(state, request.archive_root)
        if data.per_host or data.failures:
            show_compare(data, fmt, Layout(request.archive_root).compare_dir(state.sweep_id))
        line(f"sweep {state.sweep_id}: {state.record.status} (state: {state.path})")
    if state.record.status == SweepStatus.INTERRUPTED:
        raise Exit(f"gpufleet: interrupted; finish the sweep with `{hint()}`", code=130)
    if state.record.status != SweepStatus.DONE:
        raise Exit(f"gpufleet: some sweep cells failed (see above); retry them with `{hint()}`", 1)
    return state
