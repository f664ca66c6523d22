"""Tasks about benchmarks: bench (start, attach) and the archive listing, runs."""

from __future__ import annotations

from invoke.exceptions import Exit

from gpufleet.cli.common import (
    FLEET_HELP,
    WORKLOAD_HELP,
    apply_workload,
    finish,
    forks_for,
    select_hosts,
    task,
    user_errors,
)


@task(
    iterable=["concurrency"],
    help={
        "concurrency": "levels, comma separated and/or repeated (e.g. 1,10,64)",
        "profile": "bench the running server of this profile (default: the one running)",
        "port": "bench the server on this port",
        "num-prompts": "requests per level (default max(10, 4 x C))",
        "duration": "seconds per level instead of a request count",
        "request-rate": "Poisson arrivals per second (default: all at once, capped by C)",
        "output-len": "output tokens per request, ignore_eos on (default 256)",
        "prompts": "coding (default), chat, random (words), random-ids (token-exact), a JSONL "
        "file or a ShareGPT JSON file",
        **WORKLOAD_HELP,
        "seed": "prompt order seed (same seed = same prompts for every profile)",
        "backend": "sglang (/generate), openai (/v1/completions), openai-chat",
        "warmup": "warm-up requests per level, excluded from figures (default 1)",
        "client": "host (default: the generator runs on the GPU host) or local",
        "url": "server URL for --client local",
        "api-key-env": "--client local: name of the environment variable holding the "
        "server's API key (sent as Authorization: Bearer; never printed or archived)",
        "attach": "re-attach to RUN_ID on the hosts and fetch it",
        "engine": "gpufleet (default) or sglang-bench: SGLang's own bench_serving on the host",
        "tokenizer": "tokenizer path for --engine sglang-bench (default: the served model)",
        "archive": "archive root (default: logs/ or $GPUFLEET_ARCHIVE)",
        "telemetry-interval": "seconds between GPU power/utilisation samples (default 0.5; 0: off)",
        "output-details": "add bench_serving's per-request arrays (ttfts, itls, ...) to results",
        "repeat": "run the levels N times, in rounds, for 95% confidence intervals (default 1)",
        "find-max": "search the highest load that holds --slo (each probe archived)",
        "by": "--find-max searches concurrency (default; --concurrency = where to start) or "
        "request-rate",
        "target": "--find-max: share of requests that must meet the SLO (default 0.99)",
        "max-load": "--find-max: highest load to try (default 1024 / 1000 req/s)",
        "max-probes": "--find-max: at most this many runs per host (default 12)",
        **FLEET_HELP,
    },
)
@user_errors
def bench(
    c,
    concurrency=None,
    profile=None,
    port=None,
    num_prompts=None,
    duration=None,
    request_rate=None,
    output_len=None,
    prompts="coding",
    seed=None,
    backend="sglang",
    warmup=None,
    client="host",
    url=None,
    api_key_env=None,
    attach=None,
    engine="gpufleet",
    tokenizer=None,
    archive=None,
    telemetry_interval=None,
    workload=None,
    trace=None,
    trace_speedup=None,
    random_input_len=None,
    random_output_len=None,
    random_range_ratio=None,
    slo=None,
    flush=True,
    output_details=False,
    repeat=None,
    find_max=False,
    by="concurrency",
    target=None,
    max_load=None,
    max_probes=None,
    hosts=None,
    inventory=None,
    forks=None,
):
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

    if client not in ("host", "local"):
        raise UserError(f"--client {client!r}: expected host or local")
    request = _bench_request(
        concurrency, profile, port, num_prompts, duration, request_rate, output_len, prompts,
        seed, backend, warmup, url, archive, engine, tokenizer, attach or find_max,
        telemetry_interval,
    )  # fmt: skip
    apply_workload(
        request, workload, trace, trace_speedup, random_input_len, random_output_len,
        random_range_ratio, slo, flush,
    )  # fmt: skip
    request.output_details = bool(output_details)
    from gpufleet.cli.args import positive_int

    request.repeat = positive_int(repeat, "--repeat", 1)
    if client == "local" and find_max:
        raise UserError("--find-max runs on the hosts: drop --client local")
    if api_key_env and client != "local":
        raise UserError("--api-key-env is for --client local (on the hosts the key is read "
                        "from the launched server)")  # fmt: skip
    if client == "local":
        request.api_key_env = api_key_env
        run_id, value = bench_control.bench_local(request, bench_progress())
        table(f"{run_id} ({value.status})", headers(value.results), rows(value.results))
        for text in repeat_lines(value.results):
            line(text)
        line(f"archived {value.path}")
        if not value.done:
            raise Exit(f"gpufleet: run archived as FAILED: {value.reason}", code=1)
        return
    inv, selected = select_hosts(inventory, hosts)
    if find_max:
        _find_max(request, selected, inv, forks, by, target, max_load, max_probes)
        return
    if attach and not re.match(r"^[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9_.-]+$", attach):
        raise UserError(
            f"--attach {attach!r}: expected a run id such as 20261129T101500Z-eagle3-1a2b3c"
        )
    run_id = attach or bench_control.make_run_id(request, [h.name for h in selected])
    try:
        now = report_lost_hosts_at_once
        if attach:
            results = bench_control.attach(
                selected, attach, request, forks_for(inv, forks), bench_progress(), now
            )
        else:
            results = bench_control.bench(
                selected, request, run_id, forks_for(inv, forks), bench_progress(), now
            )
    except KeyboardInterrupt:
        hint = bench_control.attach_hint(run_id, selected)
        raise Exit(
            f"gpufleet: interrupted; the benchmark goes on on the hosts: fetch it with `{hint}`",
            code=130,
        ) from None
    print_runs(results)
    finish(results, with_tail=True)


def _find_max(request, selected, inv, forks, by, target, max_load, max_probes):
    """`inv bench --find-max`: the search per host, its answer, the exit code."""
    from gpufleet.cli.args import positive_float, positive_int
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import bench_progress
    from gpufleet.control import findmax
    from gpufleet.report.capacity import describe

    share = positive_float(target, "--target", 0.99)
    default_limit = 1024 if by == "concurrency" else 1000
    results = findmax.find_max(
        selected, request, by, share,
        positive_float(max_load, "--max-load", default_limit),
        positive_int(max_probes, "--max-probes", 12),
        forks_for(inv, forks), bench_progress(),
    )  # fmt: skip
    for res in results:
        if res.ok and res.value:
            record, path = res.value
            line(f"{res.host.name}: {describe(record)}; archived {path}")
    finish(results)


def _bench_request(
    concurrency, profile, port, num_prompts, duration, request_rate, output_len, prompts,
    seed, backend, warmup, url, archive, engine, tokenizer, attach, telemetry_interval=None,
):  # fmt: skip
    """`inv bench` options checked and turned into one BenchRequest."""
    from pathlib import Path

    from gpufleet.archive.layout import DEFAULT_ROOT
    from gpufleet.cli.args import int_list, non_negative_int, positive_float, positive_int
    from gpufleet.control.bench import BenchRequest
    from gpufleet.errors import UserError

    levels = int_list(concurrency, "--concurrency")
    if not levels and not attach:
        raise UserError("--concurrency is required (e.g. --concurrency 1,10,64)")
    return BenchRequest(
        concurrency=levels,
        profile=profile,
        port=non_negative_int(port, "--port", 0) or None,
        num_prompts=non_negative_int(num_prompts, "--num-prompts", 0) or None,
        duration=positive_float(duration, "--duration", 0) or None,
        request_rate=positive_float(request_rate, "--request-rate", 0) or None,
        output_len=positive_int(output_len, "--output-len", 256),
        prompts=prompts,
        seed=non_negative_int(seed, "--seed", 0),
        backend=backend,
        warmup=non_negative_int(warmup, "--warmup", 1),
        url=url,
        archive_root=Path(archive) if archive else DEFAULT_ROOT,
        engine=engine,
        tokenizer=tokenizer,
        telemetry_interval_s=_interval(telemetry_interval),
    )


def _interval(value):
    """--telemetry-interval: seconds (0 turns sampling off)."""
    from gpufleet.cli.args import positive_float

    if value is not None and str(value).strip() in ("0", "0.0"):
        return 0.0
    return positive_float(value, "--telemetry-interval", 0.5)


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
