"""Tasks about benchmarks: bench (start, attach) and the archive listing, runs."""

from __future__ import annotations

from invoke.exceptions import Exit

from gpufleet.cli.args import choice, interval, nonzero
from gpufleet.cli.common import finish, select_hosts
from gpufleet.cli.common_options import (
    CONCURRENCY_REQUIRED,
    PORT_MAX,
    archive_option,
    count,
    fleet_options,
    positive_float,
    positive_int,
    request_options,
)
from gpufleet.cli.options import Option, OptionSet, Rule, switch
from gpufleet.control.bench.request import BenchRequest
from gpufleet.host.bench.clients import NAMES as BENCH_CLIENTS

FIND_MAX_LIMIT = {"concurrency": 1024, "request-rate": 1000}  # highest load --find-max tries

BENCH = (
    request_options()
    | OptionSet(
        BenchRequest,
        Rule(lambda o: not (o.concurrency or o.attach or o.find_max),
             CONCURRENCY_REQUIRED.message),
        Rule(lambda o: o.client == "local" and o.find_max,
             "--find-max runs on the hosts: drop --client local"),
        Rule(lambda o: o.api_key_env and o.client != "local",
             "--api-key-env is for --client local (on the hosts the key is read from the "
             "launched server)"),
        profile=Option(short="p"),
        port=Option(check=nonzero(count), most=PORT_MAX),
        warmup=Option(check=count, most=1000),
        client=Option("host (the generator runs on the GPU host) or local",
                      choice("host", "local"), default="host", to_request=False),
        url=Option(),
        api_key_env=Option(),
        attach=Option("re-attach to RUN_ID on the hosts and fetch it", default=None,
                      to_request=False),
        engine=Option(check=choice(*BENCH_CLIENTS)),
        tokenizer=Option(default_text="the served model"),
        telemetry_interval=Option(check=interval, field="telemetry_interval_s", most=60),
        output_details=Option(flag_default=False, default=False),
        find_max=switch("search the highest load that holds --slo (each probe archived)"),
        by=Option("--find-max searches concurrency (--concurrency = where to start) or "
                  "request-rate", choice(*FIND_MAX_LIMIT), default="concurrency",
                  to_request=False),
        target=Option("--find-max: share of requests that must meet the SLO", positive_float,
                      default=0.99, most=1, to_request=False,
                      expected="a share above 0 and at most 1, such as 0.99"),
        max_load=Option("--find-max: highest load to try", positive_float, default=None,
                        default_text=" / ".join(f"{v} for {k}" for k, v in
                                                FIND_MAX_LIMIT.items()),
                        most=1_000_000, to_request=False,
                        expected="a load (concurrency or requests per second), such as 256"),
        max_probes=Option("--find-max: at most this many runs per host", positive_int,
                          default=12, most=100, to_request=False),
    )
    | fleet_options(BenchRequest)
)  # fmt: skip

RUNS = OptionSet(
    host=Option("only runs of this host"),
    profile=Option("only runs of this profile", short="p"),
    since=Option("only runs started on or after this date (YYYY-MM-DD)"),
    verify=switch("check every archived file against the manifest's sha256"),
    reindex=switch(
        "rebuild the fleet index from the run files (inv fleet, history, metrics "
        "read it) and say what it cost"
    ),
    archive=archive_option(),
)


@BENCH.task()
def bench(c, **given):
    """Run the load sweep against the launched server and archive it per host."""
    import re

    from gpufleet.cli.output import print_run, print_runs, report_lost_hosts_at_once
    from gpufleet.cli.progress import bench_progress
    from gpufleet.control.bench import run as bench_control
    from gpufleet.errors import UserError

    o = BENCH.parse(given)
    request = BENCH.request(o)
    attach = o.attach
    if o.client == "local":
        _, value = bench_control.bench_local(request, bench_progress())
        print_run(value)
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
        hint = bench_control.attach_hint(run_id, fleet.hosts, request.archive)
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
        fleet,
        request,
        o.by,
        o.target,
        limit=limit,
        max_probes=o.max_probes,
        progress=bench_progress(),
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
    if o.reindex:
        _reindex(root)
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


def _reindex(root):
    """`inv runs --reindex`: the index rebuilt from the run files, with its cost per run."""
    import time

    from gpufleet.cli.output import line
    from gpufleet.fleet.index import open_index

    began = time.perf_counter()
    with open_index(root, rebuild=True) as index:
        count = len(index.runs(rows=False))
        for note in index.notes:
            line(f"note: {note}")
    took = time.perf_counter() - began
    per_run = f", {took / count * 1000:.2f} ms a run" if count else ""
    line(f"index: {root.index_path}: {count} runs in {took:.2f} s{per_run}")
