"""Whose socket listens on a server's port: the server gpufleet launched, or someone else.

Another local user may bind the port of a server that is still loading, answer /health at
once and be measured in its place, or be sent the server's API key (issue 80). So before
wait-ready says ready, before a bench starts, before each of its levels and before any
request that carries the server's key, the one rule here runs: every socket in LISTEN
state on the port (/proc/net/tcp and tcp6, this network namespace) must be held by the
launched process tree (the server's PID, its descendants and its process group), found
by the socket's inode among the tree's descriptors. Otherwise the caller refuses in one
line naming the port, the foreign PID and its user, and sends nothing. No listener at all
is no refusal: nothing would be sent to anyone. Standard library only: this module ships.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Iterator

from gpufleet.host.agent import bounded
from gpufleet.host.agent.procstat import all_stats
from gpufleet.host.proc import procfs
from gpufleet.records import ServerState

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def listening_inodes(port: int, tables: Iterable[str] = TABLES) -> set[str]:
    """The inodes of the sockets in LISTEN state on `port`, any address (read a line at a
    time: a busy host's table is large, never held whole)."""
    found = set()
    for table in tables:
        for fields in _rows(table):
            if len(fields) > 9 and fields[3] == LISTEN and _port(fields[1]) == int(port):
                found.add(fields[9])
    return found


def _port(local: str) -> int | None:
    try:
        return int(local.rsplit(":", 1)[1], 16)
    except (IndexError, ValueError):
        return None


def _rows(table: str) -> Iterator[list[str]]:
    try:
        with open(table, "rb") as fh:
            fh.readline(bounded.PROC_LINE)  # the header
            for line in bounded.lines(fh, bounded.PROC_LINE):
                yield line.decode(errors="replace").split()
    except OSError:
        return


def tree(pid: int, pgid: int) -> set[int]:
    """The launched server's processes: its PID, every descendant, its process group."""
    stats = [s for s in all_stats() if s.running]
    kids: dict[int, list[int]] = {}
    for stat in stats:
        kids.setdefault(stat.ppid, []).append(stat.pid)
    members = {s.pid for s in stats if s.pgid == pgid} | {pid}
    frontier = list(members)
    while frontier:
        for kid in kids.get(frontier.pop(), []):
            if kid not in members:
                members.add(kid)
                frontier.append(kid)
    return members


def socket_inodes(pid: int) -> set[str] | None:
    """The socket inodes among a process's descriptors; None where /proc will not say."""
    try:
        return procfs.socket_inodes(pid)
    except FileNotFoundError:
        return set()
    except PermissionError:
        return None


def holder(inodes: set[str], skip: set[int]) -> int | None:
    """The lowest PID outside `skip` holding one of `inodes`; None where none readable does."""
    for stat in sorted(all_stats(), key=lambda s: s.pid):
        if stat.pid not in skip and inodes & (socket_inodes(stat.pid) or set()):
            return stat.pid
    return None


def _user_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in bounded.lines(fh, bounded.PROC_LINE):
                if line.startswith(b"Uid:"):
                    uid = int(line.split()[1])
                    try:
                        return f"user {pwd.getpwuid(uid).pw_name}"
                    except KeyError:
                        return f"uid {uid}"
    except (OSError, ValueError, IndexError):
        pass
    return "user unknown"


# a runner that runs as the run_as user cannot read the descriptors of a server that runs
# as root: root checks the listener when it starts the run and hands the runner the
# inodes it found the server's, in this variable (host/bench/bench_verbs.py)
SOCKETS_ENV = "GPUFLEET_SERVER_SOCKETS"


def _held(pid: int, pgid: int, known: Iterable[str]) -> tuple[set[int], set[str]]:
    """The tree's processes and the socket inodes they hold (with those known to be theirs)."""
    ours = tree(pid, pgid)
    held = set(known)
    for member in ours:
        held |= socket_inodes(member) or set()
    return ours, held


def refusal(
    port: int, pid: int, pgid: int, known: Iterable[str] = (), tables: Iterable[str] = TABLES
) -> str | None:
    """None where every listener on `port` belongs to the tree of `pid` (or nobody
    listens); else the one line that says whose socket it is, and that nothing was sent."""
    listening = listening_inodes(port, tables)
    if not listening:
        return None
    ours, held = _held(pid, pgid, known)
    foreign = listening - held
    if not foreign:
        return None
    who = holder(foreign, ours)
    whose = f"pid {who} ({_user_of(who)})" if who is not None else "a process of another user"
    return (
        f"port {port} is listened on by {whose}, not by the server gpufleet launched "
        f"(pid {pid}): refused, nothing sent to it"
    )


def refusal_for(state: ServerState | None) -> str | None:
    """`refusal` for a launched server's state (None: no state, a server gpufleet did not
    launch, benched on purpose with --url: the manifest says so)."""
    if state is None:
        return None
    known = [x for x in os.environ.get(SOCKETS_ENV, "").split(",") if x]
    return refusal(state.port, state.pid, state.pgid or state.pid, known)


def sockets_of(state: ServerState) -> str:
    """The inodes of the server's own listeners on its port, as SOCKETS_ENV carries them."""
    listening = listening_inodes(state.port)
    _, held = _held(state.pid, state.pgid or state.pid, ())
    return ",".join(sorted(listening & held))
