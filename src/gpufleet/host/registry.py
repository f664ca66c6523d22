"""The agent's verb registry: each verb of the contract (host/agent/protocol.py) to its function.

To add a verb: declare its arguments dataclass (and answer) in protocol.py and list it in
CONTRACT, write the function in the module of its world (gpu/facts, clean, server/verbs,
server/running, bench/bench_verbs), register it here, and call it from the control plane with
`session.call(TheArgs(...))`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.host import clean as gpuclean
from gpufleet.host.agent.protocol import CONTRACT, StatusArgs
from gpufleet.host.bench import bench_verbs as bench
from gpufleet.host.gpu import facts as gpus
from gpufleet.host.server import running
from gpufleet.host.server import verbs as lifecycle
from gpufleet.readings import StatusAnswer


def status(args: StatusArgs) -> StatusAnswer:
    """Read-only: GPUs, their processes, stale-looking processes and gpufleet's servers (or,
    `servers_only`, the servers alone: what `inv bench` asks to name a run)."""
    if args.servers_only:
        return StatusAnswer(gpus=[], servers=running.servers())
    snap, stale = gpuclean.stale_processes(args)
    return StatusAnswer(gpus=snap, stale=stale, servers=running.servers())


VERBS: dict[str, Callable[[Any], Any]] = {
    "echo": gpus.echo,
    "sysinfo": gpus.sysinfo,
    "clean": gpuclean.clean,
    "status": status,
    "launch": lifecycle.launch,
    "wait-ready": lifecycle.wait_ready,
    "stop": running.stop,
    "logs": running.logs,
    "bench-start": bench.bench_start,
    "bench-run": bench.bench_run,
    "bench-watch": bench.bench_watch,
}
assert set(VERBS) == set(CONTRACT), "every verb of the contract has exactly one function"
