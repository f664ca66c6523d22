"""Real OpenSSH sshd "hosts" on loopback, for rehearsing (and testing) the SSH path.

Each LoopbackSshd is one sshd process on 127.0.0.1:PORT, with its own host key; a shared
client key is authorized. Recipe in docs/FACTS.md (sshd by absolute path, /run/sshd).
Not part of the host agent: it runs on the control machine.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")


def sshd_path() -> str | None:
    for path in SSHD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return None


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


PORT_SLICE_ENV = "GPUFLEET_PORT_SLICE"
OFFSET_ROOM = 100  # a host's servers sit up to this far above its profile's port


def _port_slice() -> tuple[int, int]:
    """($GPUFLEET_PORT_SLICE as "i/n") this process's share of the port range: rehearsals
    (or test workers) side by side on one machine each take ports from their own slice, so
    one never binds a port another has just picked. (0, 1) when unset or malformed."""
    index, _, count = os.environ.get(PORT_SLICE_ENV, "").partition("/")
    if index.isdigit() and count.isdigit() and int(index) < int(count):
        return int(index), int(count)
    return 0, 1


_HANDED_OUT: set[int] = set()  # block starts this process gave out, until release_ports()


def free_port() -> int:
    """A free loopback port below the ephemeral range, the start of a block of
    OFFSET_ROOM + 1 ports (a host's servers sit at its profile's port + the host's offset).

    Every port of the block is free when it is handed out, and no two blocks this process
    hands out overlap until release_ports(): an sshd's port never lands where a host's
    server will bind, nor a server left by an earlier test. An ephemeral port can be taken
    as the source port of any outgoing connection (the many SSH connections of a test run)
    between this call and the server's bind, hence below that range.
    """
    lo, _ = _ephemeral_range()
    bottom, top = max(1024, lo - 12000), max(1025 + OFFSET_ROOM, lo - 1000)
    index, count = _port_slice()
    width = (top - bottom) // count
    start = bottom + index * width
    candidates = list(range(start, max(start + 1, start + width - OFFSET_ROOM)))
    random.shuffle(candidates)
    for port in candidates:
        if any(abs(port - other) <= OFFSET_ROOM for other in _HANDED_OUT):
            continue
        if all(_bindable(p) for p in range(port, port + OFFSET_ROOM + 1)):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(
        f"no free block of {OFFSET_ROOM + 1} loopback ports in {start}-{start + width - 1} "
        f"(${PORT_SLICE_ENV}={index}/{count}): {len(_HANDED_OUT)} handed out, the rest taken"
    )


def release_ports() -> None:
    """Forget the blocks handed out so far: their owner (a test, a rehearsal) has ended
    and stopped what bound them."""
    _HANDED_OUT.clear()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _with_setenv(options: list[str], assignment: str | None) -> list[str]:
    """`options` with `assignment` (NAME=value) added to their SetEnv, unless they set NAME
    themselves: sshd keeps only the first SetEnv it is given, so it goes into that one."""
    if assignment is None:
        return options
    name = assignment.split("=", 1)[0]
    for i, option in enumerate(options):
        if option.startswith("SetEnv="):
            if re.search(rf"(^|[\s\"']){re.escape(name)}=", option.removeprefix("SetEnv=")):
                return options
            return [*options[:i], f"{option} {assignment}", *options[i + 1 :]]
    return [*options, f"SetEnv={assignment}"]


def keygen(path: Path) -> None:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@dataclass
class LoopbackSshd:
    directory: Path
    client_key: Path
    port: int = 0
    max_startups: str | None = "200:30:400"
    extra_options: list[str] = field(default_factory=list)
    sftp_start: str | None = None  # internal-sftp's start directory (-d); default: the home
    log_level: str = "ERROR"
    # run under this command (e.g. `unshare -m --propagation private`: its own mount
    # namespace, so a test can change what its sessions see and nothing else), which execs
    # sshd or, as strace does, runs it as its child
    wrapper: list[str] = field(default_factory=list)
    # Whether a session's login shell runs its rc file. bash sources ~/.bashrc for every
    # command sshd runs at shell level 1; a simulated host's login is not this machine's
    # operator's, whose rc (pyenv init on the CI machine: 0.1 CPU-s and ~60 processes per
    # channel, two channels per task) cost the suite ~110 of its 1,040 CPU-s. Off: the
    # session starts at shell level 2 (SetEnv SHLVL=1), where bash reads no rc file.
    login_rc: bool = False
    proc: subprocess.Popen | None = None

    @property
    def host_key(self) -> Path:
        return self.directory / "host_key"

    def known_hosts_line(self) -> str:
        key = (self.directory / "host_key.pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {key[0]} {key[1]}\n"

    def start(self, timeout: float = 10.0) -> LoopbackSshd:
        binary = sshd_path()
        if binary is None:
            raise RuntimeError("sshd not found: apt-get install -y openssh-server")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        keygen(self.host_key)
        authorized = self.directory / "authorized_keys"
        shutil.copy(f"{self.client_key}.pub", authorized)
        self.port = self.port or free_port()
        options = [
            f"Port={self.port}",
            "ListenAddress=127.0.0.1",
            f"HostKey={self.host_key}",
            f"PidFile={self.directory / 'sshd.pid'}",
            f"AuthorizedKeysFile={authorized}",
            "PermitRootLogin=prohibit-password",
            "PasswordAuthentication=no",
            "KbdInteractiveAuthentication=no",
            "UsePAM=no",
            "StrictModes=no",
            "Subsystem=sftp internal-sftp" + (f" -d {self.sftp_start}" if self.sftp_start else ""),
            f"LogLevel={self.log_level}",
        ]
        if self.max_startups:
            options.append(f"MaxStartups={self.max_startups}")
        options += _with_setenv(self.extra_options, None if self.login_rc else "SHLVL=1")
        argv = [*self.wrapper, binary, "-D", "-e", "-f", "/dev/null"]
        for opt in options:
            argv += ["-o", opt]
        log = open(self.directory / "sshd.log", "ab")  # noqa: SIM115 (owned by the process)
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.directory / 'sshd.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on port {self.port}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self._stop_child_listener():
            # the wrapper's program has ended; what it still follows are sessions' processes,
            # which outlive the listener anyway: the wrapper goes now
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2)
            self.proc.kill()
            self.proc.wait()
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _stop_child_listener(self) -> bool:
        """Stop the listener where a wrapper runs it as its child (strace, which ignores
        SIGTERM while it runs a program); whether it did. The pid file names the listener;
        its command line must still name this sshd's port, or the pid is another process's."""
        assert self.proc is not None
        try:
            pid = int((self.directory / "sshd.pid").read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return False
        # sshd retitles its listener (`sshd: /usr/sbin/sshd -D ... [listener]`): its words
        # are then one string, separated by spaces instead of NULs
        words = cmdline.replace(b"\0", b" ").split()
        if pid == self.proc.pid or f"Port={self.port}".encode() not in words:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        return True
