"""Server state files on the host: `<workdir>/servers/<port>.json`, one per launched server.

A state file records what was launched (argv, redacted environment, profile, engine
version, log) and the identity of the process that runs it (`proc`: PID and start time),
so every later liveness test or signal can tell our server from a reused PID.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.host.agent import bounded, safewrite
from gpufleet.host.agent.procstat import ProcRef
from gpufleet.records import ServerState
from gpufleet.wire import WireError

SERVERS = Path("servers")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _state_path(port: int) -> Path:
    return SERVERS / f"{int(port)}.json"


def write_state(state: ServerState) -> None:
    safewrite.write_atomic(_state_path(state.port), state.to_json())


def _load(path: Path) -> ServerState | None:
    """A state file, checked; None when it is unreadable or not a state gpufleet wrote
    (a state it cannot read is no server of its own: preflight still finds the port taken)."""
    try:
        return ServerState.from_wire(json.loads(path.read_text()), str(path))
    except (OSError, ValueError, WireError):
        return None


def read_state(port: int) -> ServerState | None:
    return _load(_state_path(port))


def all_states() -> list[ServerState]:
    return [s for s in map(_load, sorted(SERVERS.glob("*.json"))) if s is not None]


def server_ref(state: ServerState) -> ProcRef | None:
    """The launched process's identity, or None for a state file that lacks one."""
    proc = state.proc
    if isinstance(proc, dict):
        return ProcRef.from_wire(proc)
    if state.pid_start:  # state files written before `proc` existed
        return ProcRef(int(state.pid), int(state.pid_start))
    return None


def server_alive(state: ServerState) -> bool:
    """The process gpufleet launched is still running (a reused PID does not count)."""
    ref = server_ref(state)
    return ref is not None and ref.alive()


def tail(path: str, lines: int = 40, end: int | None = None) -> list[str]:
    """The last `lines` lines of a file, or of its first `end` bytes (reads at most
    256 KiB; each line at most bounded.LOG_LINE characters, the rest cut and said)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell() if end is None else min(end, fh.tell())
            fh.seek(max(0, size - 256 * 1024))
            data = bounded.take(fh, size - fh.tell()).decode(errors="replace")
    except OSError:
        return []
    return [bounded.cut(line) for line in data.splitlines()[-lines:]]


def fresh_log(log: str) -> str:
    """`log`, or with -2, -3 ... before its suffix: the first name no launch wrote yet."""
    path, n = Path(log), 1
    while path.exists() or path.is_symlink():
        n += 1
        path = Path(log).with_stem(f"{Path(log).stem}-{n}")
    return str(path)
