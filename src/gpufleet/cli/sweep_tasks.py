"""Tasks that run whole experiments: sweep and rehearse (Ctrl-C and --resume)."""

from __future__ import annotations

from gpufleet.cli.common import (
    HOSTS_HELP,
    INVENTORY_HELP,
    WORKLOAD_HELP,
    apply_workload,
    task,
    user_errors,
)
from gpufleet.cli.experiments import given_options, resume_command, run_sweep, sweep_request

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
    given = given_options(sweep.body, dict(locals()))  # first: only the task's arguments
    from gpufleet.cli.args import positive_int
    from gpufleet.control.arms import expand, parse_grid

    request = sweep_request(concurrency, num_prompts, output_len, prompts, seed, archive)
    apply_workload(
        request, workload, trace, trace_speedup, random_input_len, random_output_len,
        random_range_ratio, slo, flush,
    )  # fmt: skip
    names = [p.strip() for p in profiles.split(",") if p.strip()]
    repeats = positive_int(repeat, "--repeat", 1)
    arms = expand(names, parse_grid(grid), repeats)
    command = resume_command(["inv", "sweep"], given)
    run_sweep(
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
    request = sweep_request(["1,10,64"], None, "64", "coding", "0", archive)
    request.fixed_levels = REHEARSAL_LEVELS
    command = resume_command(["inv", "rehearse"], {"--archive": archive})
    profiles = ["baseline", "eagle3"]
    from gpufleet.control.arms import expand

    arms = expand(profiles, [], REHEARSAL_REPEATS)  # interleaved: baseline, eagle3, again
    run_sweep(
        profiles, request, hosts, inventory, resume, False, False, "sim", None, command,
        arms=arms,
    )  # fmt: skip
    line(f"rehearsal finished in {time.monotonic() - start:.0f}s")
