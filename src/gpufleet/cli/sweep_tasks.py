"""Tasks that run whole experiments: sweep and rehearse (Ctrl-C and --resume)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit

from gpufleet.cli.common import (
    HOSTS_HELP,
    INVENTORY_HELP,
    WORKLOAD_HELP,
    apply_workload,
    forks_for,
    select_hosts,
    task,
    user_errors,
)
from gpufleet.cli.compare_tasks import show_compare


def _sweep_request(concurrency, num_prompts, output_len, prompts, seed, archive):
    from pathlib import Path

    from gpufleet.archive.layout import DEFAULT_ROOT
    from gpufleet.cli.args import int_list, non_negative_int, positive_int
    from gpufleet.control import bench as bench_control
    from gpufleet.errors import UserError

    levels = int_list(concurrency, "--concurrency")
    if not levels:
        raise UserError("--concurrency is required (e.g. --concurrency 1,10,64)")
    return bench_control.BenchRequest(
        concurrency=levels,
        num_prompts=non_negative_int(num_prompts, "--num-prompts", 0) or None,
        output_len=positive_int(output_len, "--output-len", 256),
        prompts=prompts,
        seed=non_negative_int(seed, "--seed", 0),
        archive_root=Path(archive) if archive else DEFAULT_ROOT,
    )


def _resume_command(base: list[str], options: dict[str, Any]) -> Callable[[Any, Any], str]:
    """Build the pasteable `--resume` line: the same options, inventory and hosts."""
    import shlex

    def command(inv: Any, hosts: list[str]) -> str:
        words = list(base)
        for flag, value in options.items():
            if value not in (None, False, ""):
                words += [flag] if value is True else [flag, str(value)]
        words += ["--inventory", inv.source, "--hosts", ",".join(hosts), "--resume"]
        return shlex.join(words)

    return command


@contextlib.contextmanager
def _ctrl_c_stops(cancel: Any, hint: Callable[[], str]):
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


def _do_sweep(
    profile_names, request, hosts, inventory, resume, dry_run, fail_fast, engine, forks,
    resume_command, fmt="table", arms=None, kind="sweep",
):  # fmt: skip
    from gpufleet.archive.layout import Layout
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import bench_progress, launch_progress
    from gpufleet.control import sweep
    from gpufleet.control.arms import expand
    from gpufleet.control.cancel import CancelToken
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
        line(f"resuming sweep {state.data['sweep_id']} ({state.data['status']})")
    cancel = CancelToken()
    hint = lambda: resume_command(inv, state.data["hosts"])  # noqa: E731
    with _ctrl_c_stops(cancel, hint):
        state = sweep.run(
            state, sweep.hosts_of(state, selected), request, engine, fail_fast,
            forks_for(inv, forks), line, launch_progress(), bench_progress(), cancel,
        )  # fmt: skip
        data = sweep.report_input(state, request.archive_root)
        if data.per_host or data.failures:
            show_compare(
                data, fmt, Layout(request.archive_root).compare_dir(state.data["sweep_id"])
            )
        line(f"sweep {state.data['sweep_id']}: {state.data['status']} (state: {state.path})")
    if state.data["status"] == SweepStatus.INTERRUPTED:
        raise Exit(f"gpufleet: interrupted; finish the sweep with `{hint()}`", code=130)
    if state.data["status"] != SweepStatus.DONE:
        raise Exit(f"gpufleet: some sweep cells failed (see above); retry them with `{hint()}`", 1)
    return state


SWEEP_HELP = {
    "profiles": "comma-separated profiles, the first is the reference (e.g. baseline,eagle3)",
    "concurrency": "levels, comma separated and/or repeated",
    "num-prompts": "requests per level (default max(10, 4 x C))",
    "output-len": "output tokens per request (default 256)",
    "prompts": "coding (default), chat, random (words), random-ids, or a file",
    **WORKLOAD_HELP,
    "seed": "prompt order seed",
    "resume": "finish the latest sweep of these profiles (re-attach, re-run failed cells)",
    "dry-run": "print the plan; start nothing",
    "fail-fast": "stop at the first failed cell",
    "grid": "server flag values to sweep, repeatable: FLAG=V1,V2 (e.g. speculative-num-steps="
    "1,3,5); every combination is a cell, relaunched",
    "repeat": "measure every cell N times, interleaved, for confidence intervals (default 1)",
    "engine": "override the engine (sim to rehearse)",
    "archive": "archive root",
    "hosts": HOSTS_HELP,
    "inventory": INVENTORY_HELP,
    "forks": "hosts in parallel",
}


@task(iterable=["concurrency", "grid"], help=SWEEP_HELP)
@user_errors
def sweep(
    c,
    profiles,
    concurrency=None,
    num_prompts=None,
    output_len=None,
    prompts="coding",
    seed=None,
    resume=False,
    dry_run=False,
    fail_fast=False,
    engine=None,
    archive=None,
    workload=None,
    trace=None,
    trace_speedup=None,
    random_input_len=None,
    random_output_len=None,
    random_range_ratio=None,
    slo=None,
    flush=True,
    grid=None,
    repeat=None,
    hosts=None,
    inventory=None,
    forks=None,
):
    """Each profile (x grid point x repeat) on all hosts: clean, launch, bench, stop; compare.

    Every cell runs gpu-clean, launch, bench, stop and a clean check, all hosts in parallel.
    """
    from gpufleet.cli.args import positive_int
    from gpufleet.control.arms import expand, parse_grid

    request = _sweep_request(concurrency, num_prompts, output_len, prompts, seed, archive)
    apply_workload(
        request, workload, trace, trace_speedup, random_input_len, random_output_len,
        random_range_ratio, slo, flush,
    )  # fmt: skip
    names = [p.strip() for p in profiles.split(",") if p.strip()]
    repeats = positive_int(repeat, "--repeat", 1)
    arms = expand(names, parse_grid(grid), repeats)
    options = {
        "--profiles": profiles,
        "--concurrency": ",".join(map(str, request.concurrency)),
        "--num-prompts": num_prompts,
        "--output-len": output_len,
        "--prompts": prompts if prompts != "coding" else None,
        "--seed": seed,
        "--fail-fast": fail_fast,
        "--engine": engine,
        "--archive": archive,
        "--forks": forks,
        "--workload": workload,
        "--trace": trace,
        "--trace-speedup": trace_speedup,
        "--random-input-len": random_input_len,
        "--random-output-len": random_output_len,
        "--random-range-ratio": random_range_ratio,
        "--slo": slo,
        "--no-flush": not flush,
        "--repeat": repeat,
    }
    base = ["inv", "sweep"] + [w for g in grid or [] for w in ("--grid", g)]
    command = _resume_command(base, options)
    _do_sweep(
        names, request, hosts, inventory, resume, dry_run, fail_fast, engine, forks, command,
        arms=arms,
    )  # fmt: skip


REHEARSAL_REPEATS = 3  # every figure of the rehearsal comes with its interval
REHEARSAL_LEVELS = [
    {"concurrency": 1, "num_prompts": 8},
    {"concurrency": 10, "num_prompts": 20},
    {"concurrency": 64, "num_prompts": 64},
]


@task(
    help={
        "inventory": "inventory (default: hosts/rehearsal.yaml)",
        "hosts": HOSTS_HELP,
        "archive": "archive root (default: logs/)",
        "resume": "finish an interrupted rehearsal",
    }
)
@user_errors
def rehearse(c, inventory="hosts/rehearsal.yaml", hosts=None, archive=None, resume=False):
    """The seeds' experiment on simulated 8-GPU hosts: baseline vs eagle3 at C=1,10,64, x3."""
    import time

    from gpufleet.cli.output import line

    start = time.monotonic()
    request = _sweep_request(["1,10,64"], None, "64", "coding", "0", archive)
    request.fixed_levels = REHEARSAL_LEVELS
    command = _resume_command(["inv", "rehearse"], {"--archive": archive})
    profiles = ["baseline", "eagle3"]
    from gpufleet.control.arms import expand

    arms = expand(profiles, [], REHEARSAL_REPEATS)  # interleaved: baseline, eagle3, again
    _do_sweep(
        profiles, request, hosts, inventory, resume, False, False, "sim", None, command,
        arms=arms,
    )  # fmt: skip
    line(f"rehearsal finished in {time.monotonic() - start:.0f}s")
