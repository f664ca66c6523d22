"""inv tune: static draft depths measured, SGLang's adaptive table chosen (or, on an engine
with one depth for every load, that depth), a tuned profile written and verified against no
drafting and static speculation (control/tune/run.py)."""

from __future__ import annotations

from gpufleet.cli.experiment_context import LEFT_OUT, experiment, resume_command
from gpufleet.cli.tasksets import TUNE


@TUNE.task()
def tune(c, **given):
    """Measure draft depths by load, write SGLang's adaptive table (llama.cpp: the one depth)
    and a profile using it."""
    from gpufleet.cli.tune_output import print_choice, print_verdicts
    from gpufleet.control.server.options import LaunchOptions
    from gpufleet.control.tune import run as tunerun

    o = TUNE.parse(given)
    request = TUNE.request(o)
    command = resume_command(["inv", "tune"], TUNE.given(o, LEFT_OUT))
    launch = LaunchOptions(engine=o.engine, allow_unhealthy=o.allow_unhealthy)
    with experiment(o, command, launch) as exp:
        outcome = tunerun.run(
            o.profile, o.depths, request, o.min_request_speed, o.name, o.verify, o.resume, exp,
            print_choice, o.budget,
        )  # fmt: skip
    print_verdicts(outcome)
