"""Tasks about GPUs and hosts: gpu-clean, status, sysinfo, hosts."""

from __future__ import annotations

import json as _json

from gpufleet.cli.common import (
    HOSTS_HELP,
    INVENTORY_HELP,
    finish,
    forks_for,
    select_hosts,
    task,
    user_errors,
)
from gpufleet.cli.options import clean_options

CLEAN = clean_options()


@CLEAN.task()
def gpu_clean(c, **given):
    """Kill stale GPU processes and verify every GPU reads 0 MiB (NVML v2 used)."""
    from gpufleet.cli import gpu_output
    from gpufleet.control import gpuclean

    o = CLEAN.parse(given)
    options = gpuclean.CleanOptions(**CLEAN.request_fields(o))
    gpuclean.check_patterns(options.patterns)
    inv, selected = select_hosts(o["inventory"], o["hosts"])
    results = gpuclean.clean(selected, options, forks_for(inv, o["forks"]))
    if o["json"]:
        print(_json.dumps(gpu_output.clean_json(results), indent=2))
    else:
        gpu_output.print_clean(results, options)
    finish(results)


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

    inv, selected = select_hosts(inventory, hosts)
    results = gpuclean.status(selected, forks_for(inv, forks))
    if json:
        print(_json.dumps(gpu_output.status_json(results), indent=2))
    else:
        gpu_output.print_status(results)
    finish(results)


@task(help={"hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "forks": "hosts in parallel"})
@user_errors
def sysinfo(c, hosts=None, inventory=None, forks=None):
    """Driver, CUDA, GPU names and UUIDs, Python and package versions per host (JSON)."""
    from gpufleet.control.fanout import run_on_hosts
    from gpufleet.host.protocol import SysinfoArgs

    inv, selected = select_hosts(inventory, hosts)
    results = run_on_hosts(selected, lambda s: s.call(SysinfoArgs()), forks=forks_for(inv, forks))
    out = {
        r.host.name: (r.value.to_wire() if r.ok and r.value is not None else {"error": r.error})
        for r in results
    }
    print(_json.dumps(out, indent=2))
    finish(results, report=False)


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
