"""inv tune: static draft depths measured, SGLang's adaptive table chosen (or, on an engine
with one depth for every load, that depth), a tuned profile written and verified against no
drafting and static speculation (control/tune/tune_run.py)."""

from __future__ import annotations

from gpufleet.cli.args import choice, depths, nonzero
from gpufleet.cli.common_options import experiment_options, positive_float, positive_int
from gpufleet.cli.experiment_context import LEFT_OUT, experiment, resume_command
from gpufleet.cli.options import Option, OptionSet
from gpufleet.control.bench.request import BenchRequest
from gpufleet.engine_facts import ADAPTIVE_ALGORITHMS, named

TUNE_LADDER = [1, 2, 4, 8, 16, 32, 64]  # tune's default load ladder

TUNE = OptionSet(
    BenchRequest,
    profile=Option(f"a drafting profile to tune: SGLang {named(ADAPTIVE_ALGORITHMS, '/')} "
                   "(e.g. eagle3-adaptive) or "
                   "llama.cpp with a draft model", required=True,
                   to_request=False, short="p"),
    depths=Option("static draft depths to measure besides 0 (topk 1)", depths,
                  default=[1, 2, 3, 5, 7], most=16, to_request=False),
    min_request_speed=Option("per-request tok/s floor: a depth below it is not chosen",
                             nonzero(positive_float), default=None, to_request=False,
                             most=1_000_000, expected="a speed in tokens per second, such as 20"),
    name=Option("name of the tuned profile", default=None, default_text="<profile>-tuned",
                to_request=False),
    verify=Option("run tuned vs no drafting vs static afterwards (--no-verify skips)",
                  flag_default=True, default=True, default_text="on", to_request=False),
    repeat=Option("measure every level N times on each server, in rounds: cells are judged by "
                  "median minus spread, noisy or failed ones rejected", positive_int, most=100),
    budget=Option("seconds the tune may take: the least informative cells are dropped to fit "
                  "(bursts, load step, depth 0's skip variant, deep depths; each said)",
                  nonzero(positive_float), default=None, to_request=False, most=30 * 86400,
                  expected="seconds, such as 1800"),
    budget_may_drop=Option("what --budget may leave out besides the extra verdicts: 'depths' "
                           "lets it drop depths you asked for, deepest first (without it, a "
                           "budget that cannot measure every depth is refused)",
                           choice("depths"), default=None, to_request=False),
    shape_rounds=Option("runs of each server on the load step and the bursts, interleaved: "
                        "3 or more give the headline figure its 95% interval",
                        positive_int, default=3, most=20, to_request=False),
    verify_trace=Option("replay this trace (Mooncake JSONL, as inv bench --trace reads, at "
                        "--trace-speedup) against the tuned server and every static in the "
                        "verification, interleaved, for its own headline figure",
                        default=None, to_request=False),
) | experiment_options().replace(
    "concurrency", help="the load ladder", default=TUNE_LADDER
)  # fmt: skip


@TUNE.task()
def tune(c, **given):
    """Measure draft depths by load, write SGLang's adaptive table (llama.cpp: the one depth)
    and a profile using it."""
    from gpufleet.cli.tune_output import print_choice, print_verdicts
    from gpufleet.control.server.host_options import LaunchOptions
    from gpufleet.control.tune import tune_run as tunerun
    from gpufleet.control.tune.unverified import Unverified
    from gpufleet.errors import UserError

    o = TUNE.parse(given)
    request = TUNE.request(o)
    command = resume_command(["inv", "tune"], TUNE.given(o, LEFT_OUT))
    launch = LaunchOptions(engine=o.engine, allow_unhealthy=o.allow_unhealthy)
    with experiment(o, command, launch, own_servers=True) as exp:  # its arms: its own
        ask = tunerun.TuneAsk(
            o.profile,
            o.depths,
            o.min_request_speed,
            o.name,
            o.verify,
            o.resume,
            o.budget,
            o.budget_may_drop == "depths",
            o.shape_rounds,
            o.verify_trace,
        )
        try:
            outcome = tunerun.run(ask, request, exp, print_choice)
        except Unverified as stop:  # the line ends with the command that finishes it
            words = [*TUNE.given(o, (*LEFT_OUT, "budget")), "--budget", str(stop.budget_hint)]
            finish = resume_command(["inv", "tune"], words)(exp.fleet.source, exp.fleet.names)
            raise UserError(stop.finished_by(finish)) from None
    print_verdicts(outcome)
