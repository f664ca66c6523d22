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


ns = Collection(gpu_clean, status, sysinfo, hosts)
