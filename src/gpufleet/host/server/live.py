"""Servers that are up and answering: gpu-clean leaves them alone unless told otherwise;
servers that run on beside a stopped one sharing its GPUs: its stop leaves them too.

A process that serves a port answering `GET /health` with 200 is live, whoever launched
it: killing it would end someone's benchmark or production traffic. gpufleet's own servers
are found from their state files (the process group and its health URL); any other
candidate is probed on the TCP ports it listens on. Orphaned schedulers, crashed servers
and servers that stopped answering are not live: they stay stale (the seeds' case).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from gpufleet.host.agent.procstat import group_members
from gpufleet.host.gpu import facts
from gpufleet.host.proc.procfs import AccessDenied, NoSuchProcess, Process
from gpufleet.host.server import probe as health
from gpufleet.host.server.state import all_states, server_alive, server_ref
from gpufleet.kinds import ServerStatus
from gpufleet.readings import GpuCheck, LiveServerInfo

PROBE_TIMEOUT_S = 2.0
DONE = (ServerStatus.STOPPED, ServerStatus.STALE)


@dataclass
class LiveServer:
    pid: int
    port: int
    pids: set[int] = field(default_factory=set)  # the server and everything it started
    profile: str | None = None  # set for servers gpufleet launched
    shares: bool = False  # launched with share_gpus

    def info(self, gpus: list[int]) -> LiveServerInfo:
        return LiveServerInfo(self.pid, self.port, gpus, sorted(self.pids), self.profile)


def _tree(pid: int) -> set[int]:
    try:
        return {pid, *(c.pid for c in Process(pid).children(recursive=True))}
    except (NoSuchProcess, AccessDenied):
        return set()


def _listening_ports(pid: int) -> list[tuple[str, int]]:
    try:
        ports = Process(pid).listening()
    except (NoSuchProcess, AccessDenied):
        return []
    return [("127.0.0.1" if a in ("0.0.0.0", "::", "") else a, port) for a, port in ports]


def _url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/health"


def running(exclude_ports: frozenset[int] = frozenset()) -> list[LiveServer]:
    """gpufleet's servers on this host whose processes run, loading or ready (no health
    probe): what a stop's verification and a sharing launch leave holding their GPUs."""
    out = []
    for state in all_states():
        if state.port in exclude_ports or state.status in (
            ServerStatus.STOPPED,
            ServerStatus.STALE,
        ):
            continue
        if server_alive(state):
            pids = _tree(state.pid) | {m.pid for m in group_members(state.pgid)}
            out.append(LiveServer(state.pid, state.port, pids, state.profile, state.share_gpus))
    return out


def find(candidates: list[int]) -> list[LiveServer]:
    """The live servers among gpufleet's state files and the candidate processes (each
    candidate whose parent is not itself a candidate is probed on its listening ports)."""
    live: list[LiveServer] = []
    covered: set[int] = set()
    orphans: set[int] = set()  # ranks of a gpufleet server whose launcher died: stale
    for state in all_states():
        if state.status in (ServerStatus.STOPPED, ServerStatus.STALE):
            continue
        if not server_alive(state):
            ref = server_ref(state)
            if state.pgid is not None and ref is not None:  # started after it: not a reused id
                members = group_members(state.pgid)
                orphans |= {m.pid for m in members if m.start_ticks >= ref.start_ticks}
            continue
        if not health.is_ready(state.health_url, PROBE_TIMEOUT_S):
            continue
        pids = _tree(state.pid) | {m.pid for m in group_members(state.pgid)}
        live.append(LiveServer(state.pid, state.port, pids, state.profile))
        covered |= pids
    wanted = set(candidates) - covered - orphans
    for pid in sorted(wanted):
        with contextlib.suppress(NoSuchProcess, AccessDenied):
            if Process(pid).ppid() in wanted:
                continue  # its parent is probed instead (a scheduler under its launcher)
        for address, port in _listening_ports(pid):
            if health.is_ready(_url(address, port), PROBE_TIMEOUT_S):
                pids = _tree(pid)
                live.append(LiveServer(pid, port, pids))
                covered |= pids
                break
    return live


def verify_freed(indexes: list[int], timeout_s: float) -> GpuCheck:
    """The stopped servers' GPUs read 0 MiB, but for gpufleet servers that share them and
    run on (loading or ready): their memory stays, and they are named."""
    neighbours = [n for n in running() if n.pids]
    kept = frozenset(pid for n in neighbours for pid in n.pids)
    check = facts.wait_gpus_clean(indexes, timeout_s, kept=kept)
    for n in neighbours:
        on = [g.index for g in check.gpus if any(p.pid in n.pids for p in g.processes)]
        if on:
            check.kept.append(n.info(on))
    return check
