"""Process identity from /proc, the one place gpufleet parses `/proc/PID/stat`.

A bare PID is not an identity: after a crash, a reboot or a long pause the number may
belong to another process. `ProcRef` pairs the PID with its start time (clock ticks since
boot), captured when the process was launched or listed; every liveness test and every
signal goes through it, so a reused PID is never mistaken for the process gpufleet meant.
Standard library only: the simulated NVML uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GONE_STATES = ("Z", "X")  # zombie or dead: holds no memory, answers nothing


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat gpufleet needs."""

    pid: int
    state: str
    ppid: int
    pgid: int
    start_ticks: int
    session: int = 0  # the session's leader's PID

    @property
    def running(self) -> bool:
        return self.state not in GONE_STATES


def read_stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat parsed (the command name may hold spaces and parentheses), or None."""
    try:
        raw = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(
        pid=int(pid),
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        start_ticks=int(fields[19]),
        session=int(fields[3]),
    )


def all_stats() -> list[ProcStat]:
    """Every process this PID namespace shows (those that vanish while reading are skipped)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None:
                out.append(stat)
    return out


@dataclass(frozen=True)
class ProcRef:
    """A process as it was when gpufleet saw it: PID plus start time."""

    pid: int
    start_ticks: int

    @classmethod
    def capture(cls, pid: int) -> ProcRef | None:
        """The identity of a running process now, or None if it is gone or a zombie."""
        stat = read_stat(pid)
        if stat is None or not stat.running:
            return None
        return cls(stat.pid, stat.start_ticks)

    def alive(self) -> bool:
        """Still running, and still the same process (not a reused PID)."""
        stat = read_stat(self.pid)
        return stat is not None and stat.running and stat.start_ticks == self.start_ticks

    def reused(self) -> bool:
        """The PID now belongs to a different running process."""
        stat = read_stat(self.pid)
        return stat is not None and stat.running and stat.start_ticks != self.start_ticks

    def to_wire(self) -> dict[str, int]:
        return {"pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_wire(cls, data: dict[str, int]) -> ProcRef:
        return cls(int(data["pid"]), int(data["start_ticks"]))


def group_members(pgid: int) -> list[ProcStat]:
    """Running members of a process group (zombies excluded: they hold nothing)."""
    return [s for s in all_stats() if s.pgid == pgid and s.running]


def command_name(pid: int) -> str:
    """What a PID runs now (argv[0]'s base name, else the kernel's comm), for messages."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as fh:
            argv = fh.read(4096).split(b"\0")  # argv[0] is all a message names
        if argv and argv[0]:
            return Path(argv[0].decode(errors="replace")).name
        return Path(f"/proc/{int(pid)}/comm").read_text().strip()
    except OSError:
        return "?"
