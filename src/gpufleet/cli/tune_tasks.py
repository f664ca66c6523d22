"""inv tune: static draft depths measured, SGLang's adaptive table chosen, a tuned profile
written and verified against no drafting and static speculation (control/tune.py)."""

from __future__ import annotations

from gpufleet.cli.common import HOSTS_HELP, INVENTORY_HELP, task, user_errors
from gpufleet.cli.sweep_tasks import _do_sweep, _resume_command


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
    import json

    from gpufleet.archive import select, store
    from gpufleet.archive.layout import Layout
    from gpufleet.cli.args import positive_float
    from gpufleet.cli.output import line, table
    from gpufleet.cli.sweep_tasks import _sweep_request
    from gpufleet.control import tune as tuning

    ladder = concurrency or ",".join(map(str, tuning.DEFAULT_LADDER))
    request = _sweep_request([ladder], num_prompts, output_len, prompts, None, archive)
    floor = positive_float(min_request_speed, "--min-request-speed", 0) or None
    depth_list = tuning.parse_depths(depths)
    arms = tuning.depth_arms(profile, depth_list)
    options = {
        "--profile": profile, "--depths": depths, "--concurrency": concurrency,
        "--min-request-speed": min_request_speed, "--name": name,
        "--num-prompts": num_prompts, "--output-len": output_len,
        "--prompts": prompts if prompts != "coding" else None, "--verify": None,
        "--no-verify": not verify, "--engine": engine, "--archive": archive, "--forks": forks,
    }  # fmt: skip
    command = _resume_command(["inv", "tune"], options)
    state = _do_sweep(
        [profile], request, hosts, inventory, resume, False, False, engine, forks, command,
        arms=arms, kind="tune",
    )  # fmt: skip
    root = request.archive_root
    result = tuning.choose(tuning.rows_by_depth(arms, state.data, root), floor)
    config_path, profile_path = tuning.write_outputs(profile, result, name)
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
    line(f"tune: wrote {config_path} {json.dumps(result.table)}")
    line(f"tune: wrote {profile_path} (inv launch --profile {profile_path.stem})")
    record = {
        "tune_id": state.data["sweep_id"],
        "profile": profile,
        "depths": [0, *depth_list],
        "concurrency": request.concurrency,
        "min_request_speed": floor,
        "sweep_state": str(state.path),
        "measured": {str(d): {str(c): v for c, v in m.items()} for d, m in result.measured.items()},
        "choices": [ch.__dict__ for ch in result.choices],
        "table": result.table,
        "ranges": result.ranges,
        "notes": result.notes,
        "config": str(config_path),
        "tuned_profile": str(profile_path),
        "launches": sum(len(cells) for cells in state.data["cells"].values()),
    }
    record_path = Layout(root).tune_record(state.data["sweep_id"])
    store.make_dirs(record_path.parent)
    store.write_private_file(record_path, json.dumps(record, indent=2).encode())
    if verify:
        tuned = str(profile_path) if profile.endswith((".yaml", ".yml")) else profile_path.stem
        checks = tuning.verification_arms(profile, tuned)
        again = resume and _has_state(root, [profile, tuned], checks, "tune-verify")
        check = _do_sweep(
            [profile, tuned], request, hosts, inventory, again, False, False, engine, forks,
            command, arms=checks, kind="tune-verify",
        )  # fmt: skip
        data = select.report_for_sweep(root, check.path)
        for host, host_arms in data.per_host.items():
            rows, sentence = tuning.verdict(host_arms)
            table(
                f"{host}: tuned vs the better of no drafting and static speculation",
                ["C", "wins", *(f"{a.label} req tok/s" for a in host_arms),
                 *(f"{a.label} tok/s" for a in host_arms), "tuned kept"],
                [
                    [str(r.concurrency), r.winner,
                     *(f"{v:.1f}" for v in r.per_request.values()),
                     *(f"{v:.0f}" for v in r.throughput.values()), f"{r.kept:.0%}"]
                    for r in rows
                ],
            )  # fmt: skip
            line(f"{host}: {sentence}")
            record.setdefault("verify", {})[host] = {
                "sweep_id": check.data["sweep_id"],
                "rows": [r.__dict__ for r in rows],
                "sentence": sentence,
            }
        store.write_private_file(record_path, json.dumps(record, indent=2).encode())
    line(f"tune: archived {record_path}")


def _has_state(root, profiles, arms, kind) -> bool:
    """Whether an earlier (interrupted) tune got as far as this sweep."""
    from gpufleet.control.sweep import SweepState
    from gpufleet.errors import UserError

    try:
        SweepState.latest(root, profiles, arms, kind)
    except UserError:
        return False
    return True
