"""Tasks that run whole experiments: sweep and rehearse (Ctrl-C and --resume)."""

from __future__ import annotations

from gpufleet.cli.args import name_list
from gpufleet.cli.common_options import (
    archive_option,
    experiment_options,
    fleet_options,
    positive_int,
)
from gpufleet.cli.experiment_context import LEFT_OUT, experiment, resume_command
from gpufleet.cli.options import Option, OptionSet, switch
from gpufleet.control.bench.request import BenchRequest
from gpufleet.errors import UserError

SWEEP = OptionSet(
    BenchRequest,
    profiles=Option("comma-separated profiles, the first is the reference (e.g. "
                    "baseline,eagle3)", name_list, required=True, to_request=False),
) | experiment_options() | OptionSet(
    BenchRequest,
    dry_run=switch("print the plan; start nothing", short="n"),
    fail_fast=switch("stop at the first failed cell"),
    grid=Option("server flag values to sweep, repeatable: FLAG=V1,V2 (e.g. "
                "speculative-num-steps=1,3,5); every combination is a cell, relaunched",
                iterable=True, default=None, to_request=False),
    repeat=Option("measure every cell N times, interleaved, for confidence intervals",
                  positive_int, default=1, to_request=False, most=100),
    baseline=Option("the profile every other one is answered against (default: the first "
                    "of --profiles)", default=None, to_request=False),
)  # fmt: skip


def reference_first(profiles: list[str], baseline: str | None) -> list[str]:
    """The profiles with `--baseline` first: the comparison's reference is the first arm,
    and every other profile gets its own sentence against it."""
    if baseline is None:
        return profiles
    if baseline not in profiles:
        raise UserError(
            f"--baseline {baseline}: not one of --profiles ({', '.join(profiles)}); "
            "expected one of them"
        )
    return [baseline] + [p for p in profiles if p != baseline]


REHEARSE = OptionSet(
    inventory=Option("inventory", default="hosts/rehearsal.yaml", short="i"),
    hosts=fleet_options().options["hosts"],
    archive=archive_option(),
    resume=switch("finish an interrupted rehearsal"),
)


@SWEEP.task()
def sweep(c, **given):
    """Each profile (x grid point x repeat) on all hosts: clean, launch, bench, stop; compare.

    Every cell runs gpu-clean, launch, bench, stop and a clean check, all hosts in parallel.
    """
    from gpufleet.cli.common import select_hosts
    from gpufleet.cli.output import line
    from gpufleet.control.server.host_options import LaunchOptions
    from gpufleet.control.sweep import sweep_state as sweep_state
    from gpufleet.control.sweep.cells import expand, parse_grid, plan_lines

    o = SWEEP.parse(given)
    request = SWEEP.request(o)
    profiles = reference_first(o.profiles, o.baseline)
    arms = expand(profiles, parse_grid(o.grid), o.repeat)
    sweep_state.check_arms(profiles, arms)  # a bad profile or flag fails before anything starts
    if o.dry_run:
        for text in plan_lines(arms, select_hosts(o).hosts, request, o.engine):
            line(text)
        line("dry run: nothing started")
        return
    command = resume_command(["inv", "sweep"], SWEEP.given(o, LEFT_OUT))
    launch = LaunchOptions(engine=o.engine, allow_unhealthy=o.allow_unhealthy)
    with experiment(o, command, launch, o.fail_fast) as exp:
        exp.sweep(profiles, arms, "sweep", o.resume, request=request)


REHEARSAL_REPEATS = 3  # every figure of the rehearsal comes with its interval
REHEARSAL_LEVELS = [
    {"concurrency": 1, "num_prompts": 8},
    {"concurrency": 10, "num_prompts": 20},
    {"concurrency": 64, "num_prompts": 64},
]


@REHEARSE.task()
def rehearse(c, **given):
    """The seeds' experiment on simulated 8-GPU hosts: baseline vs eagle3 at C=1,10,64, x3."""
    import time

    from gpufleet.cli.output import line
    from gpufleet.control.bench.request import BenchRequest
    from gpufleet.control.server.host_options import LaunchOptions
    from gpufleet.control.sweep.cells import expand

    start = time.monotonic()
    o = REHEARSE.parse(given)
    levels = [level["concurrency"] for level in REHEARSAL_LEVELS]
    request = BenchRequest(levels, output_len=64, archive=o.archive, fixed_levels=REHEARSAL_LEVELS)
    command = resume_command(["inv", "rehearse"], REHEARSE.given(o, LEFT_OUT))
    profiles = ["baseline", "eagle3"]
    arms = expand(profiles, [], REHEARSAL_REPEATS)  # interleaved: baseline, eagle3, again
    with experiment(o, command, LaunchOptions(engine="sim")) as exp:
        exp.sweep(profiles, arms, "sweep", o.resume, request=request)
    line(f"rehearsal finished in {time.monotonic() - start:.0f}s")
