"""inv tune: static draft depths measured, SGLang's adaptive table chosen, a tuned profile
written and verified against no drafting and static speculation (control/tune.py)."""

from __future__ import annotations

from gpufleet.cli.experiments import experiment_request, given_options, resume_command, run_sweep
from gpufleet.cli.options import tune_options
from gpufleet.control.benchrequest import BenchRequest

TUNE = tune_options(BenchRequest, ladder="1,2,4,8,16,32,64")


@TUNE.task()
def tune(c, **given):
    """Measure draft depths by load, write SGLang's adaptive table and a profile using it."""
    import json

    from gpufleet.cli.output import line, table
    from gpufleet.control import tune as tuning
    from gpufleet.control import tunerun

    given["concurrency"] = given.get("concurrency") or [",".join(map(str, tuning.DEFAULT_LADDER))]
    o = TUNE.parse(given)
    request = experiment_request(TUNE, o)
    depth_list = tuning.parse_depths(o["depths"])
    command = resume_command(["inv", "tune"], given_options(tune.body, given))

    def sweep(profiles, arms, kind, again, what):  # the CLI's: Ctrl-C, progress, resume line
        return run_sweep(profiles, what, o["hosts"], o["inventory"], again, False, False,
                         o["engine"], o["forks"], command, arms=arms, kind=kind,
                         allow_unhealthy=o["allow_unhealthy"])  # fmt: skip

    def show_choice(outcome: tunerun.TuneOutcome) -> None:
        result = outcome.result
        columns = tuning.measured_columns(result.measured)
        table(
            "measured: output tok/s (per-request tok/s) by depth",
            ["C", *(title for _, title in columns), "chosen"],
            [
                [str(ch.concurrency)]
                + [
                    f"{result.measured[d][ch.concurrency]['output_throughput']:.0f} "
                    f"({result.measured[d][ch.concurrency]['per_request']:.1f})"
                    if ch.concurrency in result.measured[d] else "-"
                    for d, _ in columns
                ]
                + [str(ch.depth)]
                for ch in result.choices
            ],
        )  # fmt: skip
        for text in result.ranges:
            line(f"tune: {text}")
        for text in result.notes:
            line(f"tune: note: {text}")
        line(f"tune: wrote {outcome.config_path} {json.dumps(result.table)}")
        line(f"tune: wrote {outcome.profile_path} (inv launch --profile "
             f"{outcome.profile_path.stem})")  # fmt: skip

    outcome = tunerun.run(
        o["profile"], depth_list, request, o["min_request_speed"], o["name"], o["verify"],
        o["resume"], sweep, show_choice,
    )  # fmt: skip
    for v in outcome.verdicts:
        table(
            f"{v.host}: tuned vs the better of no drafting and static speculation",
            ["C", "wins", *(f"{a.label} req tok/s" for a in v.arms),
             *(f"{a.label} tok/s" for a in v.arms), "tuned kept"],
            [
                [str(r.concurrency), r.winner,
                 *(f"{x:.1f}" for x in r.per_request.values()),
                 *(f"{x:.0f}" for x in r.throughput.values()), f"{r.kept:.0%}"]
                for r in v.rows
            ],
        )  # fmt: skip
        line(f"{v.host}: {v.sentence}")
    for st in outcome.steps:
        labels = list(st.phases[0].per_request) if st.phases else []
        table(
            f"{st.host}: load step and bursts, each phase against its better static",
            ["phase", "C", "wins", *(f"{label} req tok/s" for label in labels),
             *(f"{label} tok/s" for label in labels), "tuned kept", "depth switches"],
            [
                [p.phase, str(p.concurrency), p.winner,
                 *(f"{x:.1f}" for x in p.per_request.values()),
                 *(f"{x:.0f}" for x in p.throughput.values()), f"{p.kept:.0%}",
                 "-" if p.switches is None else str(p.switches)]
                for p in st.phases
            ],
        )  # fmt: skip
        line(f"{st.host}: {st.sentence}")
    line(f"tune: archived {outcome.record_path}")
