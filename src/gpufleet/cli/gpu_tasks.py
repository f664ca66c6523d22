"""Tasks about GPUs and hosts: gpu-clean, status, sysinfo, hosts."""

from __future__ import annotations

import json as _json

from gpufleet.cli.args import gpu_indexes, patterns
from gpufleet.cli.common import finish, select_hosts
from gpufleet.cli.common_options import (
    DAY,
    count,
    fleet_options,
    positive_float,
)
from gpufleet.cli.options import Option, OptionSet, switch
from gpufleet.control.server.host_options import CleanOptions

CLEAN = OptionSet(
    CleanOptions,
    dry_run=Option("list what would be killed; kill nothing", flag_default=False, default=False,
                   short="n"),
    all_users=Option("also kill GPU processes of other users", flag_default=False, default=False),
    all_tenants=Option("also kill processes of other tenants: other PID namespaces and "
                       "container cgroups (Docker, Kubernetes, Slurm, LXC, Podman), display "
                       "servers", flag_default=False, default=False),
    timeout=Option("seconds to wait for every GPU to read 0 MiB", positive_float,
                   field="timeout_s", most=7 * DAY),
    grace=Option("seconds between SIGTERM and SIGKILL", positive_float, field="grace_s",
                 most=3600),
    tolerance=Option("MiB of NVML v2 `used` still accepted as clean", count,
                     field="tolerance_mib", most=10_000_000),
    pattern=Option("regex for a stale server's program, title or Python module, never a "
                   "whole command line (repeatable; default: every engine's own processes, "
                   "as control/server/engines.py names them)",
                   patterns, field="patterns", iterable=True,
                   default=None),
    include_running=Option("also kill servers that answer /health 200 (left alone by default)",
                           flag_default=False, default=False),
    clear_xid=Option("GPU indexes (e.g. 3 or 0,3) you have reset (nvidia-smi -r -i N): their "
                     "fatal XIDs stop refusing launches; needs --reason, logged on the host",
                     gpu_indexes, field="clear_xids", iterable=True, default=None, most=1024),
    reason=Option("why the XIDs are cleared (with --clear-xid), kept in the host's log",
                  field="clear_reason"),
    json=switch("print the per-host results as JSON"),
) | fleet_options(CleanOptions)  # fmt: skip

STATUS = OptionSet(json=switch("print JSON")) | fleet_options()
SYSINFO = fleet_options()
HOSTS = fleet_options().only("inventory")


@CLEAN.task()
def gpu_clean(c, **given):
    """Kill stale GPU processes and verify every GPU reads 0 MiB (NVML v2 used)."""
    from gpufleet.cli import gpu_output
    from gpufleet.control.server import gpuclean

    o = CLEAN.parse(given)
    options = CLEAN.request(o)
    gpuclean.check_patterns(options.patterns)
    fleet = select_hosts(o)
    results = gpuclean.clean(fleet, options)
    if o.json:
        print(_json.dumps(gpu_output.per_host_json(results), indent=2))
    else:
        gpu_output.print_clean(results, options)
    finish(results)


@STATUS.task()
def status(c, **given):
    """Read-only: GPUs, GPU processes and stale server processes per host."""
    from gpufleet.cli import gpu_output
    from gpufleet.control.server import gpuclean

    o = STATUS.parse(given)
    fleet = select_hosts(o)
    results = gpuclean.status(fleet)
    if o.json:
        print(_json.dumps(gpu_output.per_host_json(results), indent=2))
    else:
        gpu_output.print_status(results)
    finish(results)


@SYSINFO.task()
def sysinfo(c, **given):
    """Driver, CUDA, GPU names and UUIDs, Python and package versions per host (JSON)."""
    from gpufleet.host.agent.protocol import SysinfoArgs

    fleet = select_hosts(SYSINFO.parse(given))
    results = fleet.call(SysinfoArgs())
    out = {
        r.host.name: (r.value.to_wire() if r.ok and r.value is not None else {"error": r.error})
        for r in results
    }
    print(_json.dumps(out, indent=2))
    finish(results, report=False)


@HOSTS.task()
def hosts(c, **given):
    """List the inventory's hosts and groups."""
    from gpufleet.cli.output import table
    from gpufleet.control.inventory.model import load_inventory

    inv = load_inventory(HOSTS.parse(given).inventory)
    rows = []
    for h in inv.hosts.values():
        target = h.settings.describe() if h.settings else h.connection  # the connection says
        groups = ",".join(g for g, m in inv.groups.items() if h.name in inv._expand(g, ()))
        gpus = f"{h.gpus.count if h.gpus.count is not None else '?'}"
        rows.append([h.name, target, gpus + (" (sim)" if h.gpus.simulated else ""), groups])
    table(inv.source, ["host", "target", "gpus", "groups"], rows)
    for node, why in inv.skipped.items():
        print(f"skipped {node}: {why}")
