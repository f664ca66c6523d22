"""Servers that are up and answering: gpu-clean leaves them alone unless told otherwise.

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
from gpufleet.host.proc.procfs import AccessDenied, NoSuchProcess, Process
from gpufleet.host.server import probe as health
from gpufleet.host.server.state import all_states, server_alive, server_ref
from gpufleet.kinds import ServerStatus
from gpufleet.readings import LiveServerInfo

PROBE_TIMEOUT_S = 2.0


@dataclass
class LiveServer:
    pid: int
    port: int
    pids: set[int] = field(default_factory=set)  # the server and everything it started
    profile: str | None = None  # set for servers gpufleet launched

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
