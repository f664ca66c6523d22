"""Processes read from /proc, as the agent needs them: the part of psutil it used, without it.

The agent runs as root on the system interpreter in isolated mode (`-I -S`, issue 50), so it
imports nothing from a venv or site directory: psutil was the one package it imported there
for process listing (gpu-clean, status, the GPU holders' details, live servers' ports). Each
`Process` is a PID with the start time it had when it was looked up (host/agent/procstat.py):
a signal goes to that process or to nobody, never to a reused PID. Linux only; standard
library only: this module ships.
"""

from __future__ import annotations

import os
import pwd
import signal
import socket
from collections.abc import Iterator

from gpufleet.host.agent import bounded
from gpufleet.host.agent.procstat import ProcStat, all_stats, read_stat

COMM_LENGTH = 15  # the kernel keeps 15 bytes of a process's name (TASK_COMM_LEN - 1)
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
STATES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped",
          "t": "tracing-stop", "Z": "zombie", "X": "dead", "x": "dead", "K": "wake-kill",
          "W": "waking", "I": "idle", "P": "parked"}  # fmt: skip


class NoSuchProcess(Exception):
    """The process is gone, or its PID now belongs to another process."""


class AccessDenied(Exception):
    """/proc will not say (another user's process, hidepid)."""


def _boot_time() -> float:
    with open("/proc/stat", "rb") as fh:
        for line in bounded.lines(fh, bounded.PROC_LINE):
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError("/proc/stat has no btime")


class Process:
    """One process as /proc shows it, pinned to its start time."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else int(pid)
        stat = read_stat(self.pid)
        if stat is None:
            raise NoSuchProcess(self.pid)
        self.start_ticks = stat.start_ticks

    def __repr__(self) -> str:
        return f"Process(pid={self.pid})"

    def _stat(self) -> ProcStat:
        stat = read_stat(self.pid)
        if stat is None or stat.start_ticks != self.start_ticks:
            raise NoSuchProcess(self.pid)
        return stat

    def _read(self, name: str) -> bytes:
        try:
            with open(f"/proc/{self.pid}/{name}", "rb") as fh:
                data = bounded.take(fh, bounded.PROC_FILE)  # a longer cmdline: its start
        except FileNotFoundError:
            raise NoSuchProcess(self.pid) from None
        except PermissionError:
            raise AccessDenied(self.pid) from None
        self._stat()  # read from the same process, not one that took its PID meanwhile
        return data

    def ppid(self) -> int:
        return self._stat().ppid

    def status(self) -> str:
        """psutil's words for the kernel's state letter (`zombie`, `sleeping`, ...)."""
        letter = self._stat().state
        return STATES.get(letter, letter)

    def cmdline(self) -> list[str]:
        """argv as psutil splits it: on NULs, or on spaces where a title was written over
        argv (setproctitle: `sglang::scheduler_TP0`)."""
        data = self._read("cmdline").decode(errors="replace")
        if not data:
            return []
        sep = "\0" if data.endswith("\0") else " "
        words = data[: -1 if data.endswith(sep) else None].split(sep)
        if sep == "\0" and len(words) == 1 and " " in data:
            words = data[:-1].split(" ")
        return words

    def name(self) -> str:
        """The kernel's name; where it was cut at 15 bytes, argv[0]'s base name it starts."""
        comm = self._read("comm").decode(errors="replace").rstrip("\n")
        if len(comm) >= COMM_LENGTH:
            try:
                words = self.cmdline()
            except AccessDenied:
                return comm
            if words:
                base = os.path.basename(words[0])
                if base.startswith(comm):
                    return base
        return comm

    def uid(self) -> int:
        """The real uid (the `Uid:` line's first field)."""
        for line in self._read("status").decode(errors="replace").splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
        raise AccessDenied(self.pid)

    def username(self) -> str:
        uid = self.uid()
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return str(uid)

    def create_time(self) -> float:
        """Seconds since the epoch the process started (boot time + its start ticks)."""
        return _boot_time() + self.start_ticks / os.sysconf("SC_CLK_TCK")

    def children(self, recursive: bool = False) -> list[Process]:
        stats = [s for s in all_stats() if s.running or s.state == "Z"]
        kids: dict[int, list[int]] = {}
        for stat in stats:
            kids.setdefault(stat.ppid, []).append(stat.pid)
        out: list[Process] = []
        frontier = [self.pid]
        while frontier:
            pid = frontier.pop(0)
            for child in sorted(kids.get(pid, [])):
                try:
                    out.append(Process(child))
                except NoSuchProcess:
                    continue
                if recursive:
                    frontier.append(child)
        return out

    def parents(self) -> list[Process]:
        out: list[Process] = []
        pid = self.ppid()
        while pid > 0:
            try:
                parent = Process(pid)
            except NoSuchProcess:
                break
            out.append(parent)
            pid = parent.ppid()
        return out

    def send_signal(self, sig: int) -> None:
        """Signal this very process (NoSuchProcess where its PID was reused or freed)."""
        self._stat()
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            raise NoSuchProcess(self.pid) from None

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def listening(self) -> list[tuple[str, int]]:
        """(address, port) of the TCP sockets this process listens on, from its own network
        namespace's tables and its descriptors."""
        try:
            inodes = socket_inodes(self.pid)
        except FileNotFoundError:
            raise NoSuchProcess(self.pid) from None
        except PermissionError:
            raise AccessDenied(self.pid) from None
        out = []
        for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
            for address, port, inode in _listeners(f"/proc/{self.pid}/net/{table}", family):
                if inode in inodes:
                    out.append((address, port))
        return out


def _address(hex_address: str, family: int) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, words)


def _listeners(table: str, family: int) -> Iterator[tuple[str, int, str]]:
    """The LISTEN rows of a /proc/net table, read a line at a time (a busy host's is large)."""
    try:
        with open(table, "rb") as fh:
            fh.readline(bounded.PROC_LINE)  # the header
            for line in bounded.lines(fh, bounded.PROC_LINE):
                fields = line.decode(errors="replace").split()
                if len(fields) < 10 or fields[3] != LISTEN:
                    continue
                address, port = fields[1].split(":")
                yield _address(address, family), int(port, 16), fields[9]
    except OSError:
        return


def process_iter() -> Iterator[Process]:
    """Every process this PID namespace shows (those gone while listing are skipped)."""
    for stat in all_stats():
        try:
            yield Process(stat.pid)
        except NoSuchProcess:
            continue


def socket_inodes(pid: int) -> set[str]:
    """The socket inodes among a process's descriptors (FileNotFoundError: no such
    process; PermissionError: another user's): the one reader the listener rule
    (host/server/listener.py) and `Process.listening` share."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out
