"""Tasks about benchmarks: bench (start, attach) and the archive listing, runs."""

from __future__ import annotations

from invoke.exceptions import Exit

from gpufleet.cli.common import finish, select_hosts
from gpufleet.cli.tasksets import BENCH, FIND_MAX_LIMIT, RUNS


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
    from gpufleet.control.bench import run as bench_control
    from gpufleet.errors import UserError
    from gpufleet.report.tables import headers, rows

    o = BENCH.parse(given)
    request = BENCH.request(o)
    attach = o.attach
    if o.client == "local":
        run_id, value = bench_control.bench_local(request, bench_progress())
        table(f"{run_id} ({value.status})", headers(value.results), rows(value.results))
        for text in repeat_lines(value.results):
            line(text)
        line(f"archived {value.path}")
        if not value.done:
            raise Exit(f"gpufleet: run archived as FAILED: {value.reason}", code=1)
        return
    fleet = select_hosts(o)
    if o.find_max:
        _find_max(request, fleet, o)
        return
    if attach and not re.match(r"^[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9_.-]+$", attach):
        raise UserError(
            f"--attach {attach!r}: expected a run id such as 20261129T101500Z-eagle3-1a2b3c"
        )
    run_id = attach or bench_control.fresh_run_id(request, fleet)
    try:
        now = report_lost_hosts_at_once
        if attach:
            results = bench_control.attach(fleet, attach, request, bench_progress(), now)
        else:
            results = bench_control.bench(fleet, request, run_id, bench_progress(), now)
    except KeyboardInterrupt:
        hint = bench_control.attach_hint(run_id, fleet.hosts)
        raise Exit(
            f"gpufleet: interrupted; the benchmark goes on on the hosts: fetch it with `{hint}`",
            code=130,
        ) from None
    print_runs(results)
    finish(results, with_tail=True)


def _find_max(request, fleet, o):
    """`inv bench --find-max`: the search per host, its answer, the exit code."""
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import bench_progress
    from gpufleet.control.bench import findmax
    from gpufleet.report.capacity import describe

    limit = o.max_load or FIND_MAX_LIMIT[o.by]
    results = findmax.find_max(
        fleet, request, o.by, o.target, limit, o.max_probes, bench_progress()
    )
    for res in results:
        if res.ok and res.value:
            record, path = res.value
            line(f"{res.host.name}: {describe(record)}; archived {path}")
    finish(results)


@RUNS.task()
def runs(c, **given):
    """List archived runs (and verify their checksums)."""
    from gpufleet.archive import store
    from gpufleet.cli.output import line, table

    o = RUNS.parse(given)
    root = o.archive
    items = [
        r
        for r in store.list_runs(root)
        if (o.host is None or r.host == o.host)
        and (o.profile is None or (r.manifest and r.manifest.profile) == o.profile)
        and (o.since is None or r.started_at >= o.since)
    ]
    rows = []
    bad = 0
    for r in items:
        levels = ",".join(str(lv.concurrency) for lv in (r.manifest.levels if r.manifest else []))
        check = "-"
        if o.verify:
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
