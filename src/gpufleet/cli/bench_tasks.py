"""Tasks about benchmarks: bench (start, attach) and the archive listing, runs."""

from __future__ import annotations

from invoke.exceptions import Exit

from gpufleet.cli.common import finish, forks_for, select_hosts, task, user_errors
from gpufleet.cli.options import bench_options
from gpufleet.control.benchrequest import BenchRequest

BENCH = bench_options(BenchRequest)


@BENCH.task()
def bench(c, **given):
    """Run the load sweep against the launched server and archive it per host."""
    import re

    from gpufleet.cli.output import (
        line,
        print_runs,
        repeat_lines,
        report_lost_hosts_at_once,
        table,
    )
    from gpufleet.cli.progress import bench_progress
    from gpufleet.control import bench as bench_control
    from gpufleet.errors import UserError
    from gpufleet.report.tables import headers, rows

    o = BENCH.parse(given)
    request = BenchRequest(**BENCH.request_fields(o))
    if not request.concurrency and not (o["attach"] or o["find_max"]):
        raise UserError("--concurrency is required (e.g. --concurrency 1,10,64)")
    client, attach = o["client"], o["attach"]
    if client == "local" and o["find_max"]:
        raise UserError("--find-max runs on the hosts: drop --client local")
    if o["api_key_env"] and client != "local":
        raise UserError("--api-key-env is for --client local (on the hosts the key is read "
                        "from the launched server)")  # fmt: skip
    if client == "local":
        run_id, value = bench_control.bench_local(request, bench_progress())
        table(f"{run_id} ({value.status})", headers(value.results), rows(value.results))
        for text in repeat_lines(value.results):
            line(text)
        line(f"archived {value.path}")
        if not value.done:
            raise Exit(f"gpufleet: run archived as FAILED: {value.reason}", code=1)
        return
    inv, selected = select_hosts(o["inventory"], o["hosts"])
    forks = forks_for(inv, o["forks"])
    if o["find_max"]:
        _find_max(request, selected, forks, o)
        return
    if attach and not re.match(r"^[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9_.-]+$", attach):
        raise UserError(
            f"--attach {attach!r}: expected a run id such as 20261129T101500Z-eagle3-1a2b3c"
        )
    run_id = attach or bench_control.fresh_run_id(request, selected, forks)
    try:
        now = report_lost_hosts_at_once
        if attach:
            results = bench_control.attach(selected, attach, request, forks, bench_progress(), now)
        else:
            results = bench_control.bench(selected, request, run_id, forks, bench_progress(), now)
    except KeyboardInterrupt:
        hint = bench_control.attach_hint(run_id, selected)
        raise Exit(
            f"gpufleet: interrupted; the benchmark goes on on the hosts: fetch it with `{hint}`",
            code=130,
        ) from None
    print_runs(results)
    finish(results, with_tail=True)


def _find_max(request, selected, forks, o):
    """`inv bench --find-max`: the search per host, its answer, the exit code."""
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import bench_progress
    from gpufleet.control import findmax
    from gpufleet.report.capacity import describe

    by = o["by"]
    limit = o["max_load"] or (1024 if by == "concurrency" else 1000)
    results = findmax.find_max(
        selected, request, by, o["target"], limit, o["max_probes"], forks, bench_progress()
    )
    for res in results:
        if res.ok and res.value:
            record, path = res.value
            line(f"{res.host.name}: {describe(record)}; archived {path}")
    finish(results)


@task(
    help={
        "host": "only runs of this host",
        "profile": "only runs of this profile",
        "since": "only runs started on or after this date (YYYY-MM-DD)",
        "verify": "check every archived file against the manifest's sha256",
        "archive": "archive root (default: logs/ or $GPUFLEET_ARCHIVE)",
    }
)
@user_errors
def runs(c, host=None, profile=None, since=None, verify=False, archive=None):
    """List archived runs (and verify their checksums)."""
    from pathlib import Path

    from gpufleet.archive import store
    from gpufleet.archive.layout import DEFAULT_ROOT
    from gpufleet.cli.output import line, table

    root = Path(archive) if archive else DEFAULT_ROOT
    items = [
        r
        for r in store.list_runs(root)
        if (host is None or r.host == host)
        and (profile is None or (r.manifest and r.manifest.profile) == profile)
        and (since is None or r.started_at >= since)
    ]
    rows = []
    bad = 0
    for r in items:
        levels = ",".join(str(lv.concurrency) for lv in (r.manifest.levels if r.manifest else []))
        check = "-"
        if verify:
            problems = store.verify(r.path)
            check = "ok" if not problems else "; ".join(problems[:3])
            bad += bool(problems)
        rows.append(
            [
                r.host,
                r.run_id,
                r.manifest.profile if r.manifest else None,
                r.started_at[:19],
                levels,
                r.status,
                check,
            ]
        )
    table(
        f"runs in {root}/",
        ["host", "run", "profile", "started (UTC)", "levels", "status", "verify"],
        rows,
    )
    if not items:
        line("no archived runs match")
    if bad:
        raise Exit(f"gpufleet: {bad} run(s) failed verification", code=1)
