"""Invoke tasks: parse arguments, call the modules that do the work, print the outcome.

Heavy modules (fabric, paramiko, pydantic, rich) are imported inside the task bodies so
`inv --list` stays fast. A user mistake exits 2 with one line; a failed host exits 1.
"""

from __future__ import annotations

import functools
import json as _json
import sys
from collections.abc import Callable
from typing import Any

from invoke import Collection, task
from invoke.exceptions import Exit

HOSTS_HELP = "hosts, groups or a comma list from the inventory (default: all)"
INVENTORY_HELP = "inventory file or name under hosts/ (default: $GPUFLEET_INVENTORY or rehearsal)"


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


def _select(inventory: str | None, hosts: str | None):
    from gpufleet.inventory import load_inventory

    inv = load_inventory(inventory)
    selected = inv.select(hosts)
    if not selected:
        from gpufleet.errors import UserError

        raise UserError(f"{inv.source}: no hosts selected")
    return inv, selected


def _forks(inv: Any, forks: str | None) -> int:
    from gpufleet.cliargs import non_negative_int

    return non_negative_int(forks, "--forks", 0) or inv.forks


def _exit_for(results: list[Any]) -> None:
    from gpufleet.fanout import any_failed

    if any_failed(results):
        failed = sum(1 for r in results if not r.ok)
        raise Exit(f"gpufleet: {failed} of {len(results)} host(s) failed", code=1)


def _print_failures(results: list[Any]) -> None:
    from gpufleet.render import line

    for res in results:
        if not res.ok:
            line(f"{res.host.name}: FAILED: {res.error}", sys.stderr)


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
    from gpufleet import gpu, report_gpu
    from gpufleet.cliargs import non_negative_int, positive_float

    options = gpu.CleanOptions(
        dry_run=dry_run,
        all_users=all_users,
        timeout_s=positive_float(timeout, "--timeout", 60.0),
        grace_s=positive_float(grace, "--grace", 10.0),
        tolerance_mib=non_negative_int(tolerance, "--tolerance", 0),
        patterns=list(pattern or []),
    )
    inv, selected = _select(inventory, hosts)
    results = gpu.clean(selected, options, _forks(inv, forks))
    if json:
        print(_json.dumps(report_gpu.clean_json(results), indent=2))
    else:
        report_gpu.print_clean(results, options)
    _print_failures(results)
    _exit_for(results)


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
    from gpufleet import gpu, report_gpu

    inv, selected = _select(inventory, hosts)
    results = gpu.status(selected, _forks(inv, forks))
    if json:
        print(_json.dumps(report_gpu.status_json(results), indent=2))
    else:
        report_gpu.print_status(results)
    _print_failures(results)
    _exit_for(results)


@task(help={"hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "forks": "hosts in parallel"})
@user_errors
def sysinfo(c, hosts=None, inventory=None, forks=None):
    """Driver, CUDA, GPU names and UUIDs, Python and package versions per host (JSON)."""
    from gpufleet.fanout import run_on_hosts

    inv, selected = _select(inventory, hosts)
    results = run_on_hosts(selected, lambda s: s.call("sysinfo", {}), forks=_forks(inv, forks))
    out = {r.host.name: (r.value if r.ok else {"error": r.error}) for r in results}
    print(_json.dumps(out, indent=2))
    _exit_for(results)


@task(help={"inventory": INVENTORY_HELP})
@user_errors
def hosts(c, inventory=None):
    """List the inventory's hosts and groups."""
    from gpufleet.inventory import load_inventory
    from gpufleet.render import table

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


def _progress_printer() -> Any:
    """Per-host progress lines: each phase change, warnings, and the last log line."""
    from gpufleet.render import line

    last: dict[str, str] = {}

    def show(host: str, event: dict[str, Any]) -> None:
        if "warning" in event:
            line(f"{host}: warning: {event['warning']}")
        elif "line" in event:
            line(f"{host}| {event['line']}")
        elif event.get("phase") == "started":
            line(f"{host}: started pid {event['pid']}, log {event['log']}")
        elif "phase" in event and event["phase"] != last.get(host):
            last[host] = event["phase"]
            tail = f"  | {event['last_line']}" if event.get("last_line") else ""
            line(f"{host}: {event['phase']} ({event['elapsed_s']:.1f}s){tail}")

    return show


def _print_failures_with_tail(results: list[Any]) -> None:
    from gpufleet.render import line

    for res in results:
        if not res.ok:
            line(f"{res.host.name}: FAILED: {res.error}", sys.stderr)
            if res.tail:
                line(
                    f"--- {res.host.name}: last {len(res.tail)} lines of the server log ---",
                    sys.stderr,
                )
                for text in res.tail:
                    line(f"{res.host.name}| {text}", sys.stderr)


@task
@user_errors
def profiles(c):
    """List the server profiles in playbooks/ (resolved through `extends`)."""
    from gpufleet.errors import UserError
    from gpufleet.playbook import list_profiles
    from gpufleet.render import table

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

    from gpufleet import server
    from gpufleet.cliargs import positive_float
    from gpufleet.errors import UserError
    from gpufleet.playbook import build_specs, load_profile, redact_env
    from gpufleet.render import line

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
    options = server.LaunchOptions(
        replace=replace,
        clean=clean,
        engine=engine,
        skip_flag_check=skip_flag_check,
        timeout_s=positive_float(timeout, "--timeout", 0) or None,
    )
    results = server.launch(selected, prof, options, _forks(inv, forks), _progress_printer())
    for res in results:
        if res.ok:
            st = res.value["state"]
            line(
                f"{res.host.name}: READY {st['profile']} pid {st['pid']} port {st['port']} "
                f"in {res.value['elapsed_s']:.1f}s ({st['engine']} {st['engine_version']})"
            )
    _print_failures_with_tail(results)
    _exit_for(results)


@task(
    help={
        "hosts": HOSTS_HELP,
        "inventory": INVENTORY_HELP,
        "forks": "hosts in parallel",
        "profile": "take the port from this profile",
        "port": "server port (default 30000)",
        "timeout": "seconds to wait for health",
    }
)
@user_errors
def wait(c, hosts=None, inventory=None, profile=None, port=None, timeout=None, forks=None):
    """Resume waiting for launched servers to become healthy (after a dropped connection)."""
    from gpufleet import server
    from gpufleet.cliargs import non_negative_int, positive_float
    from gpufleet.playbook import load_profile
    from gpufleet.render import line

    port_number = non_negative_int(port, "--port", 0) or (
        load_profile(profile).port if profile else 30000
    )
    inv, selected = _select(inventory, hosts)
    results = server.wait(
        selected,
        port_number,
        positive_float(timeout, "--timeout", 1800),
        _forks(inv, forks),
        _progress_printer(),
    )
    for res in results:
        if res.ok:
            line(f"{res.host.name}: READY port {port_number} ({res.value['elapsed_s']:.1f}s)")
    _print_failures_with_tail(results)
    _exit_for(results)


@task(
    help={
        "hosts": HOSTS_HELP,
        "inventory": INVENTORY_HELP,
        "forks": "hosts in parallel",
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
    from gpufleet import server
    from gpufleet.cliargs import non_negative_int, positive_float
    from gpufleet.render import line

    inv, selected = _select(inventory, hosts)
    results = server.stop(
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
            if not res.value["stopped"]:
                line(f"{res.host.name}: no running server to stop")
            verify = res.value.get("verify")
            if verify:
                line(
                    f"{res.host.name}: GPUs {','.join(str(g['index']) for g in verify['gpus'])} "
                    f"verified clean in {verify['elapsed_s']:.2f}s"
                )
    _print_failures(results)
    _exit_for(results)


@task(
    help={
        "hosts": HOSTS_HELP,
        "inventory": INVENTORY_HELP,
        "forks": "hosts in parallel",
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
    from gpufleet import server
    from gpufleet.cliargs import non_negative_int
    from gpufleet.render import line

    inv, selected = _select(inventory, hosts)
    count = non_negative_int(lines, "--lines", 40)
    results = server.logs(
        selected,
        profile,
        non_negative_int(port, "--port", 0) or None,
        count,
        follow,
        _forks(inv, forks),
        _progress_printer() if follow else None,
    )
    for res in results:
        if res.ok and not follow:
            line(f"--- {res.host.name}: {res.value['log']} ---")
            for text in res.value["lines"]:
                line(f"{res.host.name}| {text}")
    _print_failures(results)
    _exit_for(results)


ns = Collection(gpu_clean, status, sysinfo, hosts, profiles, launch, wait, stop, logs)
