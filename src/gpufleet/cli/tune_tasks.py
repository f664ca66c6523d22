"""inv tune: static draft depths measured, SGLang's adaptive table chosen, a tuned profile
written and verified against no drafting and static speculation (control/tune.py)."""

from __future__ import annotations

from gpufleet.cli.common import HOSTS_HELP, INVENTORY_HELP, task, user_errors
from gpufleet.cli.experiments import given_options, resume_command, run_sweep, sweep_request


@task(
    help={
        "profile": "an EAGLE/EAGLE3 profile to tune (e.g. eagle3-adaptive)",
        "depths": "static draft depths to measure besides 0 (default 1,2,3,5,7; topk 1)",
        "concurrency": "the load ladder (default 1,2,4,8,16,32,64)",
        "min-request-speed": "per-request tok/s floor: a depth below it is not chosen",
        "name": "name of the tuned profile (default <profile>-tuned)",
        "num-prompts": "requests per level (default max(10, 4 x C))",
        "output-len": "output tokens per request (default 256)",
        "prompts": "coding (default), chat, random, random-ids, or a file",
        "verify": "run tuned vs no drafting vs static afterwards (default; --no-verify skips)",
        "resume": "finish the latest tune of this profile",
        "engine": "override the engine (sim to rehearse)",
        "archive": "archive root",
        "hosts": HOSTS_HELP,
        "inventory": INVENTORY_HELP,
        "forks": "hosts in parallel",
    }
)
@user_errors
def tune(
    c,
    profile,
    depths=None,
    concurrency=None,
    min_request_speed=None,
    name=None,
    num_prompts=None,
    output_len=None,
    prompts="coding",
    verify=True,
    resume=False,
    engine=None,
    archive=None,
    hosts=None,
    inventory=None,
    forks=None,
):
    """Measure draft depths by load, write SGLang's adaptive table and a profile using it."""
    given = given_options(tune.body, dict(locals()))  # first: only the task's arguments
    import json

    from gpufleet.cli.args import positive_float
    from gpufleet.cli.output import line, table
    from gpufleet.control import tune as tuning
    from gpufleet.control import tunerun

    ladder = concurrency or ",".join(map(str, tuning.DEFAULT_LADDER))
    request = sweep_request([ladder], num_prompts, output_len, prompts, None, archive)
    floor = positive_float(min_request_speed, "--min-request-speed", 0) or None
    depth_list = tuning.parse_depths(depths)
    command = resume_command(["inv", "tune"], given)

    def sweep(profiles, arms, kind, again):  # the CLI's: Ctrl-C, progress, resume line
        return run_sweep(profiles, request, hosts, inventory, again, False, False, engine,
                         forks, command, arms=arms, kind=kind)  # fmt: skip

    def show_choice(outcome: tunerun.TuneOutcome) -> None:
        result = outcome.result
        table(
            "measured: output tok/s (per-request tok/s) by depth",
            ["C", *(f"depth {d}" for d in sorted(result.measured)), "chosen"],
            [
                [str(ch.concurrency)]
                + [
                    f"{result.measured[d][ch.concurrency]['output_throughput']:.0f} "
                    f"({result.measured[d][ch.concurrency]['per_request']:.1f})"
                    for d in sorted(result.measured)
                ]
                + [str(ch.depth)]
                for ch in result.choices
            ],
        )
        for text in result.ranges:
            line(f"tune: {text}")
        for text in result.notes:
            line(f"tune: note: {text}")
        line(f"tune: wrote {outcome.config_path} {json.dumps(result.table)}")
        line(f"tune: wrote {outcome.profile_path} (inv launch --profile "
             f"{outcome.profile_path.stem})")  # fmt: skip

    outcome = tunerun.run(
        profile, depth_list, request, floor, name, verify, resume, sweep, show_choice
    )
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
    line(f"tune: archived {outcome.record_path}")
