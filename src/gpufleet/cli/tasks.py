"""Invoke tasks: parse arguments, call the modules that do the work, print the outcome.

Heavy modules (fabric, paramiko, pydantic, rich) are imported inside the task bodies so
`inv --list` stays fast. A user mistake exits 2 with one line; a failed host exits 1.
"""

from __future__ import annotations

import contextlib
import functools
import json as _json
from collections.abc import Callable
from typing import Any

from invoke import Collection, task
from invoke.exceptions import Exit

HOSTS_HELP = "hosts, groups or a comma list from the inventory (default: all)"
INVENTORY_HELP = "inventory file or name under hosts/ (default: $GPUFLEET_INVENTORY or rehearsal)"
FLEET_HELP = {
    "hosts": HOSTS_HELP,
    "inventory": INVENTORY_HELP,
    "forks": "hosts in parallel (default: the inventory's forks, 32)",
}


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a UserError into one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gpufleet.errors import UserError

        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            raise Exit(f"gpufleet: {exc}", code=2) from None
        except KeyboardInterrupt:
            raise Exit("gpufleet: interrupted", code=130) from None

    return wrapper


def _finish(results: list[Any], with_tail: bool = False, report: bool = True) -> None:
    """Print each failed host's line (and server log tail); exit 1 if any host failed."""
    from gpufleet.cli.output import exit_code, print_failures

    if report:
        print_failures(results, with_tail)
    code, message = exit_code(results)
    if code:
        raise Exit(message, code=code)


def _select(inventory: str | None, hosts: str | None):
    from gpufleet.control.inventory import load_inventory

    inv = load_inventory(inventory)
    selected = inv.select(hosts)
    if not selected:
        from gpufleet.errors import UserError

        raise UserError(f"{inv.source}: no hosts selected")
    return inv, selected


def _forks(inv: Any, forks: str | None) -> int:
    from gpufleet.cli.args import non_negative_int

    return non_negative_int(forks, "--forks", 0) or inv.forks


@task(
    iterable=["pattern"],
    help={
        "hosts": HOSTS_HELP,
        "inventory": INVENTORY_HELP,
        "dry-run": "list what would be killed; kill nothing",
        "all-users": "also kill GPU processes of other users",
        "timeout": "seconds to wait for every GPU to read 0 MiB (default 60)",
        "grace": "seconds between SIGTERM and SIGKILL (default 10)",
        "tolerance": "MiB of NVML v2 `used` still accepted as clean (default 0)",
        "pattern": "regex for stale server command lines (repeatable; default: SGLang family)",
        "forks": "hosts handled in parallel (default: inventory forks, 32)",
        "json": "print the per-host results as JSON",
    },
)
@user_errors
def gpu_clean(
    c,
    hosts=None,
    inventory=None,
    dry_run=False,
    all_users=False,
    timeout=None,
    grace=None,
    tolerance=None,
    pattern=None,
    forks=None,
    json=False,
):
    """Kill stale GPU processes and verify every GPU reads 0 MiB (NVML v2 used)."""
    from gpufleet.cli import gpu_output
    from gpufleet.cli.args import non_negative_int, positive_float
    from gpufleet.control import gpuclean

    options = gpuclean.CleanOptions(
        dry_run=dry_run,
        all_users=all_users,
        timeout_s=positive_float(timeout, "--timeout", 60.0),
        grace_s=positive_float(grace, "--grace", 10.0),
        tolerance_mib=non_negative_int(tolerance, "--tolerance", 0),
        patterns=list(pattern or []),
    )
    inv, selected = _select(inventory, hosts)
    results = gpuclean.clean(selected, options, _forks(inv, forks))
    if json:
        print(_json.dumps(gpu_output.clean_json(results), indent=2))
    else:
        gpu_output.print_clean(results, options)
    _finish(results)


@task(
    help={
        "hosts": HOSTS_HELP,
        "inventory": INVENTORY_HELP,
        "forks": "hosts handled in parallel",
        "json": "print JSON",
    }
)
@user_errors
def status(c, hosts=None, inventory=None, forks=None, json=False):
    """Read-only: GPUs, GPU processes and stale server processes per host."""
    from gpufleet.cli import gpu_output
    from gpufleet.control import gpuclean

    inv, selected = _select(inventory, hosts)
    results = gpuclean.status(selected, _forks(inv, forks))
    if json:
        print(_json.dumps(gpu_output.status_json(results), indent=2))
    else:
        gpu_output.print_status(results)
    _finish(results)


@task(help={"hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "forks": "hosts in parallel"})
@user_errors
def sysinfo(c, hosts=None, inventory=None, forks=None):
    """Driver, CUDA, GPU names and UUIDs, Python and package versions per host (JSON)."""
    from gpufleet.control.fanout import run_on_hosts
    from gpufleet.host.protocol import SysinfoArgs

    inv, selected = _select(inventory, hosts)
    results = run_on_hosts(selected, lambda s: s.call(SysinfoArgs()), forks=_forks(inv, forks))
    out = {r.host.name: (r.value if r.ok else {"error": r.error}) for r in results}
    print(_json.dumps(out, indent=2))
    _finish(results, report=False)


@task(help={"inventory": INVENTORY_HELP})
@user_errors
def hosts(c, inventory=None):
    """List the inventory's hosts and groups."""
    from gpufleet.cli.output import table
    from gpufleet.control.inventory import load_inventory

    inv = load_inventory(inventory)
    rows = []
    for h in inv.hosts.values():
        target = (
            "local" if h.connection == "local" else f"{h.user or ''}@{h.address}:{h.port or 22}"
        )
        groups = ",".join(g for g, m in inv.groups.items() if h.name in inv._expand(g, ()))
        gpus = f"{h.gpus.count if h.gpus.count is not None else '?'}"
        rows.append([h.name, target, gpus + (" (sim)" if h.gpus.simulated else ""), groups])
    table(inv.source, ["host", "target", "gpus", "groups"], rows)


@task
@user_errors
def profiles(c):
    """List the server profiles in playbooks/ (resolved through `extends`)."""
    from gpufleet.cli.output import table
    from gpufleet.control.playbook import list_profiles
    from gpufleet.errors import UserError

    rows = []
    for item in list_profiles():
        if isinstance(item, UserError):
            rows.append(["?", "-", "-", "-", f"INVALID: {item}"])
            continue
        spec = item.speculative_algorithm or "-"
        rows.append([item.name, item.engine, item.model_path, spec, item.description])
    table("playbooks/", ["profile", "engine", "model", "speculative", "description"], rows)


@task(
    help={
        "profile": "profile name under playbooks/ (or a YAML path)",
        "hosts": HOSTS_HELP,
        "inventory": INVENTORY_HELP,
        "dry-run": "print the exact argv and environment per host; start nothing",
        "replace": "stop a server already running on the port first",
        "clean": "run gpu-clean on the hosts first",
        "engine": "override the engine (e.g. sim to rehearse a profile)",
        "timeout": "seconds to wait for health (default: the profile's health_timeout)",
        "skip-flag-check": "do not check flags against the engine's --help on the host",
        "forks": "hosts handled in parallel",
    }
)
@user_errors
def launch(
    c,
    profile,
    hosts=None,
    inventory=None,
    dry_run=False,
    replace=False,
    clean=False,
    engine=None,
    timeout=None,
    skip_flag_check=False,
    forks=None,
):
    """Start the profile's server detached on each host and wait until /health answers 200."""
    import shlex

    from gpufleet.cli.args import positive_float
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import launch_progress
    from gpufleet.control import lifecycle
    from gpufleet.control.playbook import build_specs, load_profile
    from gpufleet.errors import UserError
    from gpufleet.host.redact import redact_env

    if engine not in (None, "sglang", "sim", "custom"):
        raise UserError(f"--engine {engine!r}: expected sglang, sim or custom")
    prof = load_profile(profile)
    inv, selected = _select(inventory, hosts)
    if dry_run:
        for host, spec in build_specs(prof, selected, engine):
            line(f"{host.name}: engine {spec.engine}, node rank {spec.node_rank}/{spec.nnodes}")
            line(f"{host.name}: argv: {shlex.join(spec.argv)}")
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(spec.env).items())
            line(f"{host.name}: env: {env or '-'}")
            line(f"{host.name}: log: <workdir>/{spec.log}")
            for warning in spec.warnings:
                line(f"{host.name}: warning: {warning}")
        line("dry run: nothing started")
        return
    options = lifecycle.LaunchOptions(
        replace=replace,
        clean=clean,
        engine=engine,
        skip_flag_check=skip_flag_check,
        timeout_s=positive_float(timeout, "--timeout", 0) or None,
    )
    results = lifecycle.launch(selected, prof, options, _forks(inv, forks), launch_progress())
    for res in results:
        if res.ok:
            st = res.value["state"]
            line(
                f"{res.host.name}: READY {st['profile']} pid {st['pid']} port {st['port']} "
                f"in {res.value['elapsed_s']:.1f}s ({st['engine']} {st['engine_version']})"
            )
    _finish(results, with_tail=True)


@task(
    help={
        **FLEET_HELP,
        "profile": "take the port from this profile",
        "port": "server port (default 30000)",
        "timeout": "seconds to wait for health",
    }
)
@user_errors
def wait(c, hosts=None, inventory=None, profile=None, port=None, timeout=None, forks=None):
    """Resume waiting for launched servers to become healthy (after a dropped connection)."""
    from gpufleet.cli.args import non_negative_int, positive_float
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import launch_progress
    from gpufleet.control import lifecycle
    from gpufleet.control.playbook import load_profile

    port_number = non_negative_int(port, "--port", 0) or (
        load_profile(profile).port if profile else 30000
    )
    inv, selected = _select(inventory, hosts)
    results = lifecycle.wait(
        selected,
        port_number,
        positive_float(timeout, "--timeout", 1800),
        _forks(inv, forks),
        launch_progress(),
    )
    for res in results:
        if res.ok:
            line(f"{res.host.name}: READY port {port_number} ({res.value['elapsed_s']:.1f}s)")
    _finish(results, with_tail=True)


@task(
    help={
        **FLEET_HELP,
        "profile": "only servers of this profile",
        "port": "only the server on this port",
        "grace": "seconds between SIGTERM and SIGKILL (default 15)",
        "timeout": "seconds to wait for the GPUs to read 0 MiB (default 60)",
    }
)
@user_errors
def stop(
    c, hosts=None, inventory=None, profile=None, port=None, grace=None, timeout=None, forks=None
):
    """Stop launched servers (process group: SIGTERM, grace, SIGKILL) and verify GPUs clean."""
    from gpufleet.cli.args import non_negative_int, positive_float
    from gpufleet.cli.output import line
    from gpufleet.control import lifecycle

    inv, selected = _select(inventory, hosts)
    results = lifecycle.stop(
        selected,
        profile,
        non_negative_int(port, "--port", 0) or None,
        positive_float(grace, "--grace", 15.0),
        positive_float(timeout, "--timeout", 60.0),
        _forks(inv, forks),
    )
    for res in results:
        if res.ok:
            for s in res.value["stopped"]:
                line(
                    f"{res.host.name}: stopped {s['profile']} pid {s['pid']} port {s['port']} "
                    f"({s['signal']})"
                )
            for refusal in res.value.get("refused", []):
                line(f"{res.host.name}: {refusal}")
            if not res.value["stopped"] and not res.value.get("refused"):
                line(f"{res.host.name}: no running server to stop")
            verify = res.value.get("verify")
            if verify:
                line(
                    f"{res.host.name}: GPUs {','.join(str(g['index']) for g in verify['gpus'])} "
                    f"verified clean in {verify['elapsed_s']:.2f}s"
                )
    _finish(results)


@task(
    help={
        **FLEET_HELP,
        "profile": "the latest server of this profile",
        "port": "the server on this port",
        "lines": "how many lines (default 40)",
        "follow": "keep printing new lines (Ctrl-C ends)",
    }
)
@user_errors
def logs(
    c, hosts=None, inventory=None, profile=None, port=None, lines=None, follow=False, forks=None
):
    """Show the tail of the remote server log (optionally follow it)."""
    from gpufleet.cli.args import non_negative_int
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import launch_progress
    from gpufleet.control import lifecycle

    inv, selected = _select(inventory, hosts)
    count = non_negative_int(lines, "--lines", 40)
    results = lifecycle.logs(
        selected,
        profile,
        non_negative_int(port, "--port", 0) or None,
        count,
        follow,
        _forks(inv, forks),
        launch_progress() if follow else None,
    )
    for res in results:
        if res.ok and not follow:
            line(f"--- {res.host.name}: {res.value['log']} ---")
            for text in res.value["lines"]:
                line(f"{res.host.name}| {text}")
    _finish(results)


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
        "prompts": "coding (default), chat, random, a JSONL file or a ShareGPT JSON file",
        "seed": "prompt order seed (same seed = same prompts for every profile)",
        "backend": "sglang (/generate), openai (/v1/completions), openai-chat",
        "warmup": "warm-up requests per level, excluded from figures (default 1)",
        "client": "host (default: the generator runs on the GPU host) or local",
        "url": "server URL for --client local",
        "attach": "re-attach to RUN_ID on the hosts and fetch it",
        "engine": "gpufleet (default) or sglang-bench: SGLang's own bench_serving on the host",
        "tokenizer": "tokenizer path for --engine sglang-bench (default: the served model)",
        "archive": "archive root (default: logs/ or $GPUFLEET_ARCHIVE)",
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
    attach=None,
    engine="gpufleet",
    tokenizer=None,
    archive=None,
    hosts=None,
    inventory=None,
    forks=None,
):
    """Run the load sweep against the launched server and archive it per host."""
    from gpufleet.cli.output import line, print_runs, table
    from gpufleet.cli.progress import bench_progress
    from gpufleet.control import bench as bench_control
    from gpufleet.errors import UserError
    from gpufleet.report.tables import headers, rows

    if client not in ("host", "local"):
        raise UserError(f"--client {client!r}: expected host or local")
    request = _bench_request(
        concurrency, profile, port, num_prompts, duration, request_rate, output_len, prompts,
        seed, backend, warmup, url, archive, engine, tokenizer, attach,
    )  # fmt: skip
    if client == "local":
        run_id, value = bench_control.bench_local(request, bench_progress())
        table(f"{run_id} ({value['status']})", headers(), rows(value["results"]))
        line(f"archived {value['path']}")
        if value["status"] != "done":
            raise Exit(f"gpufleet: run archived as FAILED: {value['reason']}", code=1)
        return
    inv, selected = _select(inventory, hosts)
    run_id = attach or bench_control.make_run_id(request, [h.name for h in selected])
    try:
        if attach:
            results = bench_control.attach(
                selected, attach, request, _forks(inv, forks), bench_progress()
            )
        else:
            results = bench_control.bench(
                selected, request, run_id, _forks(inv, forks), bench_progress()
            )
    except KeyboardInterrupt:
        hint = bench_control.attach_hint(run_id, selected)
        raise Exit(
            f"gpufleet: interrupted; the benchmark goes on on the hosts: fetch it with `{hint}`",
            code=130,
        ) from None
    print_runs(results)
    _finish(results, with_tail=True)


def _bench_request(
    concurrency, profile, port, num_prompts, duration, request_rate, output_len, prompts,
    seed, backend, warmup, url, archive, engine, tokenizer, attach,
):  # fmt: skip
    """`inv bench` options checked and turned into one BenchRequest."""
    from pathlib import Path

    from gpufleet.archive.store import DEFAULT_ROOT
    from gpufleet.cli.args import int_list, non_negative_int, positive_float
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
        output_len=non_negative_int(output_len, "--output-len", 256) or 256,
        prompts=prompts,
        seed=non_negative_int(seed, "--seed", 0),
        backend=backend,
        warmup=non_negative_int(warmup, "--warmup", 1),
        url=url,
        archive_root=Path(archive) if archive else DEFAULT_ROOT,
        engine=engine,
        tokenizer=tokenizer,
    )


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
    from gpufleet.cli.output import line, table

    root = Path(archive) if archive else store.DEFAULT_ROOT
    items = [
        r
        for r in store.list_runs(root)
        if (host is None or r.get("host") == host)
        and (profile is None or r.get("profile") == profile)
        and (since is None or (r.get("started_at") or "") >= since)
    ]
    rows = []
    bad = 0
    for r in items:
        levels = ",".join(str(lv["concurrency"]) for lv in r.get("levels", []))
        check = "-"
        if verify:
            problems = store.verify(Path(r["path"]))
            check = "ok" if not problems else "; ".join(problems[:3])
            bad += bool(problems)
        rows.append(
            [
                r.get("host"),
                r.get("run_id"),
                r.get("profile"),
                (r.get("started_at") or "")[:19],
                levels,
                store.status_label(r),
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


@task(
    positional=["first", "second"],
    iterable=["more"],
    help={
        "first": "reference: a run id or a profile name (its latest run per host)",
        "second": "run id or profile to compare with the reference",
        "more": "more runs or profiles to overlay (repeatable)",
        "format": "table (default), md, csv or json",
        "hosts": "only these hosts (comma list)",
        "archive": "archive root (default: logs/ or $GPUFLEET_ARCHIVE)",
        "no-plots": "do not write PNG plots",
        "wide": "every metric in the terminal table (default: the headline columns)",
    },
)
@user_errors
def compare(
    c,
    first,
    second,
    more=None,
    format="table",
    hosts=None,
    archive=None,
    no_plots=False,
    wide=False,
):
    """Per-concurrency table, crossover, plots and report.html: inv compare baseline eagle3."""
    from pathlib import Path

    from gpufleet.archive import select
    from gpufleet.archive.store import DEFAULT_ROOT
    from gpufleet.errors import UserError
    from gpufleet.report.compare import safe_name

    names = [n for n in (first, second, *(more or [])) if n]
    if len(names) < 2:
        raise UserError("compare needs two or more run ids or profile names (e.g. baseline eagle3)")
    if format not in ("table", "md", "csv", "json"):
        raise UserError(f"--format {format!r}: expected table, md, csv or json")
    root = Path(archive) if archive else DEFAULT_ROOT
    data = select.report_for_runs(root, names, hosts.split(",") if hosts else None)
    out_dir = root / "compare" / safe_name("-vs-".join(names))
    _show_compare(data, format, out_dir, plots=not no_plots, wide=wide)


def _show_compare(
    data: Any, fmt: str, out_dir: Any, plots: bool = True, wide: bool = False
) -> None:
    """Print the comparison; write its plots and report.html (paths printed unless json)."""
    from gpufleet.cli.output import line, print_compare
    from gpufleet.report import html
    from gpufleet.report.plots import write_all

    print_compare(data.per_host, fmt, wide)
    written = write_all(data.per_host, out_dir) if plots else []
    page = html.write(data, out_dir)
    if fmt != "json":
        if written:
            line("plots: " + ", ".join(str(p) for p in written))
        line(f"report: {page}")


def _sweep_request(concurrency, num_prompts, output_len, prompts, seed, archive):
    from pathlib import Path

    from gpufleet.archive.store import DEFAULT_ROOT
    from gpufleet.cli.args import int_list, non_negative_int
    from gpufleet.control import bench as bench_control
    from gpufleet.errors import UserError

    levels = int_list(concurrency, "--concurrency")
    if not levels:
        raise UserError("--concurrency is required (e.g. --concurrency 1,10,64)")
    return bench_control.BenchRequest(
        concurrency=levels,
        num_prompts=non_negative_int(num_prompts, "--num-prompts", 0) or None,
        output_len=non_negative_int(output_len, "--output-len", 256) or 256,
        prompts=prompts,
        seed=non_negative_int(seed, "--seed", 0),
        archive_root=Path(archive) if archive else DEFAULT_ROOT,
    )


def _resume_command(base: list[str], options: dict[str, Any]) -> Callable[[Any, Any], str]:
    """Build the pasteable `--resume` line: the same options, inventory and hosts."""
    import shlex

    def command(inv: Any, hosts: list[str]) -> str:
        words = list(base)
        for flag, value in options.items():
            if value not in (None, False, ""):
                words += [flag] if value is True else [flag, str(value)]
        words += ["--inventory", inv.source, "--hosts", ",".join(hosts), "--resume"]
        return shlex.join(words)

    return command


@contextlib.contextmanager
def _ctrl_c_stops(cancel: Any, hint: Callable[[], str]):
    """First Ctrl-C: nothing new starts, the cells in flight stop cleanly (see sweep.py).
    Second Ctrl-C: exit at once; what runs on the hosts goes on and --resume finishes it."""
    import os
    import signal
    import sys

    from gpufleet.cli.output import line

    def on_sigint(signum: int, frame: Any) -> None:
        if not cancel.requested:
            cancel.request()
            line("gpufleet: stopping: no new cell starts, cells in flight stop cleanly "
                 "(Ctrl-C again to abort now)", sys.stderr)  # fmt: skip
            return
        line(f"gpufleet: aborted; finish the sweep with `{hint()}`", sys.stderr)
        os._exit(130)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _do_sweep(
    profile_names, request, hosts, inventory, resume, dry_run, fail_fast, engine, forks,
    resume_command, fmt="table",
):  # fmt: skip
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import bench_progress, launch_progress
    from gpufleet.control import sweep
    from gpufleet.control.cancel import CancelToken

    sweep.check_profiles(profile_names)  # a bad profile fails before anything starts
    inv, selected = _select(inventory, hosts)
    if dry_run:
        for text in sweep.plan_lines(profile_names, selected, request, engine):
            line(text)
        line("dry run: nothing started")
        return None
    state = sweep.open_state(
        request.archive_root, profile_names, selected, request.concurrency, resume
    )
    if resume:
        line(f"resuming sweep {state.data['sweep_id']} ({state.data['status']})")
    cancel = CancelToken()
    hint = lambda: resume_command(inv, state.data["hosts"])  # noqa: E731
    with _ctrl_c_stops(cancel, hint):
        state = sweep.run(
            state, sweep.hosts_of(state, selected), request, engine, fail_fast,
            _forks(inv, forks), line, launch_progress(), bench_progress(), cancel,
        )  # fmt: skip
        data = sweep.report_input(state, request.archive_root)
        if data.per_host or data.failures:
            _show_compare(data, fmt, request.archive_root / "compare" / state.data["sweep_id"])
        line(f"sweep {state.data['sweep_id']}: {state.data['status']} (state: {state.path})")
    if state.data["status"] == "interrupted":
        raise Exit(f"gpufleet: interrupted; finish the sweep with `{hint()}`", code=130)
    if state.data["status"] != "done":
        raise Exit(f"gpufleet: some sweep cells failed (see above); retry them with `{hint()}`", 1)
    return state


SWEEP_HELP = {
    "profiles": "comma-separated profiles, the first is the reference (e.g. baseline,eagle3)",
    "concurrency": "levels, comma separated and/or repeated",
    "num-prompts": "requests per level (default max(10, 4 x C))",
    "output-len": "output tokens per request (default 256)",
    "prompts": "coding (default), chat, random, or a file",
    "seed": "prompt order seed",
    "resume": "finish the latest sweep of these profiles (re-attach, re-run failed cells)",
    "dry-run": "print the plan; start nothing",
    "fail-fast": "stop at the first failed cell",
    "engine": "override the engine (sim to rehearse)",
    "archive": "archive root",
    "hosts": HOSTS_HELP,
    "inventory": INVENTORY_HELP,
    "forks": "hosts in parallel",
}


@task(iterable=["concurrency"], help=SWEEP_HELP)
@user_errors
def sweep(
    c,
    profiles,
    concurrency=None,
    num_prompts=None,
    output_len=None,
    prompts="coding",
    seed=None,
    resume=False,
    dry_run=False,
    fail_fast=False,
    engine=None,
    archive=None,
    hosts=None,
    inventory=None,
    forks=None,
):
    """For each profile on all hosts: gpu-clean, launch, bench, stop, verify; then compare."""
    request = _sweep_request(concurrency, num_prompts, output_len, prompts, seed, archive)
    names = [p.strip() for p in profiles.split(",") if p.strip()]
    options = {
        "--profiles": profiles,
        "--concurrency": ",".join(map(str, request.concurrency)),
        "--num-prompts": num_prompts,
        "--output-len": output_len,
        "--prompts": prompts if prompts != "coding" else None,
        "--seed": seed,
        "--fail-fast": fail_fast,
        "--engine": engine,
        "--archive": archive,
        "--forks": forks,
    }
    command = _resume_command(["inv", "sweep"], options)
    _do_sweep(names, request, hosts, inventory, resume, dry_run, fail_fast, engine, forks, command)


REHEARSAL_LEVELS = [
    {"concurrency": 1, "num_prompts": 8},
    {"concurrency": 10, "num_prompts": 20},
    {"concurrency": 64, "num_prompts": 128},
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
    """The seeds' experiment on simulated 8-GPU hosts: baseline vs eagle3 at C=1,10,64."""
    import time

    from gpufleet.cli.output import line

    start = time.monotonic()
    request = _sweep_request(["1,10,64"], None, "64", "coding", "0", archive)
    request.fixed_levels = REHEARSAL_LEVELS
    command = _resume_command(["inv", "rehearse"], {"--archive": archive})
    profiles = ["baseline", "eagle3"]
    _do_sweep(profiles, request, hosts, inventory, resume, False, False, "sim", None, command)
    line(f"rehearsal finished in {time.monotonic() - start:.0f}s")


@task(
    help={
        "sweep": "a sweep id (the name of logs/sweeps/<id>.json)",
        "runs": "run ids or profiles, comma separated (a profile: its latest successful run)",
        "latest": "the newest sweep",
        "hosts": "only these hosts (comma list)",
        "archive": "archive root (default: logs/ or $GPUFLEET_ARCHIVE)",
    },
)
@user_errors
def report(c, sweep=None, runs=None, latest=False, hosts=None, archive=None):
    """Write one self-contained report.html (a sweep, or runs side by side); print its path.

    `inv report --latest`, `inv report --sweep ID`, `inv report --runs baseline,eagle3`.
    """
    from pathlib import Path

    from gpufleet.archive import select
    from gpufleet.archive.store import DEFAULT_ROOT
    from gpufleet.cli.output import line
    from gpufleet.errors import UserError
    from gpufleet.report import html
    from gpufleet.report.compare import safe_name

    root = Path(archive) if archive else DEFAULT_ROOT
    if sum(bool(x) for x in (sweep, runs, latest)) != 1:
        raise UserError("report needs exactly one of --latest, --sweep ID or --runs A,B")
    if runs:
        names = [n.strip() for n in runs.split(",") if n.strip()]
        data = select.report_for_runs(root, names, hosts.split(",") if hosts else None)
        out_dir = root / "compare" / safe_name("-vs-".join(names))
    else:
        state_path = select.sweep_state_path(root, sweep)
        data = select.report_for_sweep(root, state_path)
        out_dir = root / "compare" / state_path.stem
    line(f"report: {html.write(data, out_dir)}")


ns = Collection(
    gpu_clean,
    status,
    sysinfo,
    hosts,
    profiles,
    launch,
    wait,
    stop,
    logs,
    bench,
    runs,
    compare,
    sweep,
    rehearse,
    report,
)
