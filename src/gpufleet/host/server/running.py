"""The verbs on a server already launched (host/server/verbs.py launches it): stop, list
(the status verb's servers) and logs. Every signal first checks that the process group is
still the server that was launched (host/agent/procstat.py), so a stale state file never
kills a stranger; a server whose Slurm step ended says Slurm's own line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from datetime import UTC, datetime

from gpufleet.host.agent.procstat import command_name, group_members
from gpufleet.host.agent.protocol import (
    AgentError,
    LogsAnswer,
    LogsArgs,
    StopArgs,
    emit_event,
)
from gpufleet.host.agent.redact import (
    process_secrets,
    remember,
)
from gpufleet.host.proc import jobstep, stepkeeper
from gpufleet.host.server import live, logscan
from gpufleet.host.server import probe as health
from gpufleet.host.server.state import (
    all_states,
    now_iso,
    server_alive,
    server_ref,
    tail,
    write_state,
)
from gpufleet.kinds import Kind, ServerStatus
from gpufleet.readings import (
    ServerSummary,
    StopAnswer,
    StoppedServer,
)
from gpufleet.records import ServerState


# -- stop, list, logs -----------------------------------------------------------------
class StaleState(Exception):
    """The state file's process group now belongs to someone else: nothing may be signalled."""


def _group_is_ours(state: ServerState) -> bool:
    """Whether the saved process group still runs what gpufleet launched.

    True while the leader is our process, or while the leader is gone but its group lives
    on (the kernel hands out no PID that a live group still uses as its id: the members are
    our server's orphans). False when the group is empty. StaleState when the PID now
    belongs to another process.
    """
    ref = server_ref(state)
    if ref is None:
        return False
    if ref.alive():
        return True
    if ref.reused():
        raise StaleState(
            f"server state for port {state.port} is stale: pid {ref.pid} is now "
            f"`{command_name(ref.pid)}`; state cleared, nothing killed"
        )
    return bool(group_members(state.pgid))


def _signal_group(pgid: int, sig: signal.Signals, wait_s: float) -> bool:
    """Signal the group; wait until no member runs. True if it emptied in time."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
    deadline = time.monotonic() + wait_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_members(pgid)


def stop_server(state: ServerState, grace_s: float) -> str:
    """SIGTERM the server's group, SIGKILL after the grace; which signal ended it.

    Raises StaleState (after marking the state file) when the PID was reused.
    """
    try:
        ours = _group_is_ours(state)
    except StaleState:
        state.update(
            status=ServerStatus.STALE, stopped_at=now_iso(), stop_signal="none (stale state)"
        )
        write_state(state)
        raise
    signal_used = "none (already gone)"
    if ours:
        signal_used = "SIGTERM"
        if not _signal_group(state.pgid, signal.SIGTERM, grace_s):
            signal_used = "SIGKILL"
            _signal_group(state.pgid, signal.SIGKILL, 5)
    state.update(status=ServerStatus.STOPPED, stopped_at=now_iso(), stop_signal=signal_used)
    write_state(state)
    return signal_used


def stop(args: StopArgs) -> StopAnswer:
    states = [s for s in all_states() if args.profile in (None, s.profile)]
    if args.port is not None:
        states = [s for s in states if s.port == args.port]
    stopped = []
    refused = []
    used_gpus: set[int] = set()
    for state in states:
        if state.status in (ServerStatus.STOPPED, ServerStatus.STALE):
            continue
        try:
            how = stop_server(state, args.grace_s)
        except StaleState as exc:
            refused.append(str(exc))
            continue
        stopped.append(StoppedServer(state.port, state.profile, state.pid, how))
        used_gpus.update(state.gpus)
    verify = None
    if used_gpus and args.verify:
        verify = live.verify_freed(sorted(used_gpus), args.timeout_s)
    return StopAnswer(stopped=stopped, refused=refused, verify=verify)


def _why_job_ended(state: ServerState) -> str | None:
    """Slurm's own line for the step that held the server: in the server's log (a step of
    its own), else in the stderr of the job's step keeper that started it."""
    keeper = stepkeeper.error_file(str(state.slurm_job))
    return jobstep.why_ended(tail(state.log, 20)) or jobstep.why_ended(tail(str(keeper), 20))


def servers() -> list[ServerSummary]:
    """gpufleet's servers on this host that have not been stopped, with health and uptime."""
    out = []
    up = (ServerStatus.STARTING, ServerStatus.READY, ServerStatus.RUNNING)
    for state in all_states():
        alive = server_alive(state)
        if state.status in (ServerStatus.STOPPED, ServerStatus.STALE) and not alive:
            continue
        uptime = None
        if alive:
            started = datetime.fromisoformat(state.started_at.replace("Z", "+00:00"))
            uptime = round((datetime.now(UTC) - started).total_seconds(), 1)
        dead = not alive and state.status in up  # it was up; its process is gone
        ended = _why_job_ended(state) if dead and state.slurm_job else None
        out.append(
            ServerSummary(
                profile=state.profile, pid=state.pid, port=state.port,
                status=ServerStatus.DEAD if dead else state.status,
                started_at=state.started_at, engine=state.engine, log=state.log, alive=alive,
                health=health.probe(state.health_url) if alive else "down",
                engine_version=state.engine_version, uptime_s=uptime, ended=ended,
            )
        )  # fmt: skip
    return out


def logs(args: LogsArgs) -> LogsAnswer:
    states = all_states()
    if args.port is not None:
        states = [s for s in states if s.port == args.port]
    if args.profile:
        states = [s for s in states if s.profile == args.profile]
    if not states:
        raise AgentError("no server launched by gpufleet matches", kind=Kind.NO_SERVER)
    state = max(states, key=lambda s: s.started_at)
    remember(process_secrets(state.pid) if server_alive(state) else [])
    if not args.follow:
        return {"log": state.log, "lines": tail(state.log, args.lines)}
    with open(state.log, "rb") as fh:
        # the tail ends where following begins: a line written in between is not lost
        offset = os.fstat(fh.fileno()).st_size
        for line in tail(state.log, args.lines, end=offset):
            emit_event({"line": line})
        deadline = time.monotonic() + args.follow_s
        while time.monotonic() < deadline:
            lines, offset = logscan.follow(fh, offset)
            for line in lines:
                emit_event({"line": line})
            if not lines:
                time.sleep(0.2)
    return {"log": state.log, "lines": []}
