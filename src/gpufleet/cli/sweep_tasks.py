"""Tasks that run whole experiments: sweep and rehearse (Ctrl-C and --resume)."""

from __future__ import annotations

from gpufleet.cli.common import HOSTS_HELP, task, user_errors
from gpufleet.cli.experiments import experiment_request, given_options, resume_command, run_sweep
from gpufleet.cli.options import sweep_options
from gpufleet.control.benchrequest import BenchRequest

SWEEP = sweep_options(BenchRequest)


@SWEEP.task()
def sweep(c, **given):
    """Each profile (x grid point x repeat) on all hosts: clean, launch, bench, stop; compare.

    Every cell runs gpu-clean, launch, bench, stop and a clean check, all hosts in parallel.
    """
    from gpufleet.control.arms import expand, parse_grid

    o = SWEEP.parse(given)
    request = experiment_request(SWEEP, o)
    names = [p.strip() for p in o["profiles"].split(",") if p.strip()]
    arms = expand(names, parse_grid(o["grid"]), o["repeat"])
    command = resume_command(["inv", "sweep"], given_options(sweep.body, given))
    run_sweep(
        names, request, o["hosts"], o["inventory"], o["resume"], o["dry_run"], o["fail_fast"],
        o["engine"], o["forks"], command, arms=arms, allow_unhealthy=o["allow_unhealthy"],
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
    request = experiment_request(
        SWEEP, SWEEP.parse({"profiles": "", "concurrency": ["1,10,64"], "output_len": "64",
                            "archive": archive})
    )  # fmt: skip
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
