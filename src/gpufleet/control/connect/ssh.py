"""`connection: ssh`: Fabric over SSH, its session, the agent as a remote command on one
channel of the task's connection, and the host's tree read over SFTP for the judge.

The connection is opened the careful way: strict host keys, timeouts, retries on
transients only. Retried (jittered exponential backoff): refused, reset, and the banner
errors sshd produces when its MaxStartups limit drops a connection. Never retried:
authentication failures, unknown or changed host keys, name resolution errors, timeouts.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import secrets
import select
import socket
import stat
from collections.abc import Callable, Generator, Iterator
from typing import Any

import paramiko
from fabric import Config, Connection
from paramiko import Channel, SSHException, Transport
from paramiko.ssh_exception import NoValidConnectionsError
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from gpufleet.control.agent import python_trust as interpreter
from gpufleet.control.agent.once import once
from gpufleet.control.connect import hostkeys
from gpufleet.control.connect.agentproc import CHUNK, AgentProcess
from gpufleet.control.connect.base import (
    LOADER_KEPT,
    LOADER_KEPT_EXIT,
    PIECE,
    Session,
    clean_start,
)
from gpufleet.control.inventory.connections import SshSettings
from gpufleet.control.inventory.model import Host
from gpufleet.errors import HostError
from gpufleet.kinds import Kind

AHEAD = 8 << 20  # a fetch's bytes asked of the host at once: the most it holds
SFTP_READ = 32768  # one SFTP read request (paramiko's and OpenSSH's size)

# paramiko logs every failed handshake with a traceback; gpufleet reports them itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

TRANSIENT_MESSAGES = (
    "Error reading SSH protocol banner",
    "Connection reset",
    "No existing session",
)


def is_transient(exc: BaseException) -> bool:
    """Whether a connect error is worth another try (refused, reset, sshd's MaxStartups banner
    errors), never for keys or authentication."""
    if isinstance(exc, (paramiko.AuthenticationException, paramiko.BadHostKeyException, HostError)):
        return False
    if isinstance(exc, (NoValidConnectionsError, ConnectionRefusedError, ConnectionResetError)):
        return True
    if isinstance(exc, EOFError):
        return True
    return isinstance(exc, paramiko.SSHException) and any(m in str(exc) for m in TRANSIENT_MESSAGES)


def _describe(exc: BaseException, host: SshSettings, conn: Connection) -> HostError:
    where = f"{conn.user}@{conn.host}:{conn.port}"
    name = hostkeys.known_host_name(conn.host, conn.port)
    if isinstance(exc, HostError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostError(hostkeys.describe_bad_key(exc, name, host.known_hosts), kind=Kind.HOST_KEY)
    if isinstance(exc, paramiko.AuthenticationException):
        key = f" with {host.identity_file}" if host.identity_file else ""
        return HostError(f"authentication failed for {where}{key}: {exc}", kind=Kind.AUTH)
    if isinstance(exc, socket.gaierror):
        return HostError(f"cannot resolve {conn.host}: {exc.strerror}", kind=Kind.UNREACHABLE)
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return HostError(
            f"cannot connect to {where}: timed out after {host.connect_timeout:g}s",
            kind=Kind.UNREACHABLE,
        )
    if isinstance(exc, (NoValidConnectionsError, ConnectionRefusedError)):
        return HostError(f"cannot connect to {where}: connection refused", kind=Kind.UNREACHABLE)
    return HostError(f"cannot connect to {where}: {exc}", kind=Kind.UNREACHABLE)


def _strict_on_every_hop(conn: Connection, host: SshSettings) -> None:
    """The host's key policy on the host and on every jump host before it: Fabric builds
    ProxyJump gateways (from `proxy_jump` or ~/.ssh/config) with an auto-add key policy, which
    would trust any bastion's key."""
    hop: object = conn
    while isinstance(hop, Connection):
        hostkeys.configure(hop.client, host.host_key_policy, host.known_hosts)
        hop = hop.gateway


@once
def _ssh_files() -> paramiko.SSHConfig:
    """~/.ssh/config and /etc/ssh/ssh_config as Fabric reads them, parsed once per process
    (by one of the fan-out's threads: `once`)."""
    return Config().base_ssh_config


def _own_config() -> Config:
    """A Fabric configuration of one connection's own, its SSH files' rules copied from
    the parse above. Never one shared by the fan-out's threads: Fabric's Config is mutable
    (even its clone() re-reads the SSH files into the source, appending their rules again),
    and one shared by every connection failed a host under load with `AttributeError: No
    attribute or config key found for 'gateway'` (docs/RELIABILITY.md)."""
    return Config(ssh_config=copy.deepcopy(_ssh_files()))


def open_connection(host: SshSettings, attempts: int = 8) -> Connection:
    """A connected Fabric Connection with strict host keys on every hop, retried on transient
    errors only; a failure is one HostError naming the cause."""
    connect_kwargs: dict[str, float | bool | list[str]] = {  # Paramiko's connect keywords
        "banner_timeout": max(host.connect_timeout, 15.0),
        "auth_timeout": max(host.connect_timeout, 15.0),
        "allow_agent": True,
    }
    if host.identity_file:
        connect_kwargs["key_filename"] = [os.path.expanduser(host.identity_file)]
        connect_kwargs["look_for_keys"] = False
        connect_kwargs["allow_agent"] = False
    gateway = None
    if host.proxy_jump:
        gateway = Connection(
            host.proxy_jump,
            config=_own_config(),
            connect_timeout=host.connect_timeout,
            connect_kwargs=connect_kwargs,
        )
    conn = Connection(
        host.address,
        config=_own_config(),
        user=host.user,
        port=host.port,
        connect_timeout=host.connect_timeout,
        connect_kwargs=connect_kwargs,
        gateway=gateway,
    )
    _strict_on_every_hop(conn, host)

    @retry(
        retry=retry_if_exception(is_transient),
        wait=wait_random_exponential(multiplier=0.2, max=2.0),
        stop=stop_after_attempt(attempts) | stop_after_delay(60),
        reraise=True,
    )
    def _open() -> None:
        if conn.client.get_transport() is not None:
            conn.client.close()
        conn.open()

    try:
        _open()
    except Exception as exc:
        conn.close()
        raise _describe(exc, host, conn) from None
    return conn


def _cut_is_oserror(method: Callable[..., Any]) -> Callable[..., Any]:
    """An SftpTree read whose connection ends raises OSError, as a local read would: the
    trust rule's callers say "cannot read the host python's tree" (a FileNotFoundError, an
    answer, passes through untouched)."""

    @functools.wraps(method)
    def read(*args: Any) -> Any:
        try:
            return method(*args)
        except (EOFError, SSHException) as exc:
            raise ConnectionError(f"connection lost: {str(exc) or type(exc).__name__}") from None

    return read


class SftpTree:
    """A host's filesystem over SFTP: nothing runs there, sshd's sftp-server only reads."""

    def __init__(self, sftp: Any) -> None:
        self.sftp = sftp

    @_cut_is_oserror
    def lstat(self, path: str) -> Any:
        """The entry's own attributes over SFTP."""
        return self.sftp.lstat(path)

    @_cut_is_oserror
    def readlink(self, path: str) -> str:
        """Where a link points, over SFTP."""
        return self.sftp.readlink(path) or ""

    @_cut_is_oserror
    def listdir(self, path: str) -> list[tuple[str, Any]]:
        """A directory's entries with their attributes, over SFTP."""
        return [(a.filename, a) for a in self.sftp.listdir_attr(path)]

    @_cut_is_oserror
    def read(self, path: str, limit: int) -> bytes:
        """At most `limit` bytes of a file, over SFTP."""
        with self.sftp.open(path, "rb") as fh:
            return fh.read(limit)

    @_cut_is_oserror
    def home(self) -> str:
        """The SFTP server's start directory (the login's home)."""
        return self.sftp.normalize(".")


class SSHAgent(AgentProcess):
    """The agent as one exec channel of an open SSH transport."""

    def __init__(self, transport: Transport, script: str) -> None:
        super().__init__()
        self.transport = transport
        self.chan: Channel = transport.open_session(timeout=30)
        self.chan.exec_command(script)

    def send(self, text: str) -> None:
        """Write to the channel's stdin."""
        self.chan.sendall(text.encode())

    def close_stdin(self) -> None:
        """Half-close the channel: no more verbs."""
        with contextlib.suppress(OSError, EOFError):
            self.chan.shutdown_write()

    def kill(self) -> None:
        """Close the channel (sshd hangs up the agent)."""
        self.chan.close()

    @property
    def lost(self) -> bool:
        """The SSH transport under the channel is gone."""
        return not self.transport.is_active()

    def _drain_stderr(self) -> None:
        while self.chan.recv_stderr_ready():
            self._stderr += self.chan.recv_stderr(CHUNK)

    def _read(self, timeout: float) -> bytes | None:
        self._drain_stderr()
        if not self.chan.recv_ready() and not self.chan.closed:
            select.select([self.chan], [], [], timeout)
            self._drain_stderr()
            if not self.chan.recv_ready() and not self.chan.eof_received:
                return None if not self.chan.closed else b""
        data = self.chan.recv(CHUNK)
        if not data:
            self._drain_stderr()
        return data

    def exit_code(self) -> int | None:
        """The remote command's exit code (None if it is not known within 10 s)."""
        if not self.chan.status_event.wait(timeout=10):
            return None
        self._drain_stderr()
        code = self.chan.exit_status
        return None if code < 0 else code


STALL_S = 60  # the longest a fetch waits for one answer of the SFTP server
CUT = (OSError, EOFError, SSHException)  # what paramiko raises as a connection ends


def _sftp_pieces(path: str, fh: paramiko.SFTPFile, want: int) -> Generator[bytes, None, None]:
    """An open file's pieces: a window of AHEAD bytes asked at once (SFTP's 32 KiB
    requests, pipelined as `getfo` does, which asks the whole file ahead and holds what
    comes: a run's size in memory), each answer given on as a piece; past the size it had
    when opened, read on one request at a time (a file that grows) until its end or
    `want`. A window of one 1 MiB piece fetched 25 MiB/s over loopback, 8 MiB 77 (getfo
    91 in the same run: benchmarks/fetch_speed.py)."""
    opened = fh.stat()
    if not stat.S_ISREG(opened.st_mode or 0):
        raise HostError(f"cannot fetch {path}: not a regular file", Kind.UNTRUSTED)
    size, at = min(opened.st_size or 0, want), 0
    while at < size:
        end = min(at + AHEAD, size)
        for piece in fh.readv([(o, min(SFTP_READ, end - o)) for o in range(at, end, SFTP_READ)]):
            if not piece:
                return
            at += len(piece)
            yield piece
    while at < want and (piece := fh.read(min(PIECE, want - at))):
        at += len(piece)
        yield piece


@contextlib.contextmanager
def over_sftp(doing: str) -> Iterator[None]:
    """An SFTP transfer that fails is the host's connection failing, said in one line: a
    connection cut mid-transfer raises SSHException ("Server connection dropped") or
    OSError ("Socket is closed"), which were internal errors, and a finished run's download
    cut that way was recorded FAILED instead of left for --resume to fetch (issue 51)."""
    try:
        yield
    except CUT as exc:
        why = str(exc) or type(exc).__name__
        raise HostError(f"{doing}: {why}", kind=Kind.CONNECTION) from None


class SSHSession(Session):
    """Fabric over SSH with strict host keys, a connect timeout and transient-error retries."""

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.ssh = SshSettings.of(host)
        self.conn = open_connection(self.ssh)

    def _tree(self) -> tuple[interpreter.TreeReader, int, str]:
        with over_sftp("cannot read the host's filesystem"):
            tree = SftpTree(self.conn.sftp())
            return tree, self._uid(), tree.home()

    def _uid(self) -> int:
        """The connecting user's uid, asked of the host (`id -u`), never inferred: an SFTP
        server configured with another start directory (`internal-sftp -d`) would make the
        directory's owner the user the trust rule trusts (issue 50)."""
        transport = self.conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostError("connection lost", kind=Kind.CONNECTION)
        try:
            chan = transport.open_session(timeout=30)
            # `id` too runs in an empty environment: the login's LD_PRELOAD would load into it
            # as root, and LD_SHOW_AUXV alone turns its answer into something else
            chan.settimeout(30)  # every read below is bounded: a login never hangs a task
            chan.set_combine_stderr(True)  # a refusal of the login's (LOADER_KEPT) is said
            chan.exec_command(clean_start("id -u"))
            out = b""
            while len(out) < 1 << 16:  # all of it: a login may print before the command
                data = chan.recv(4096)
                if not data:
                    break
                out += data
            answered = chan.status_event.wait(timeout=10)
            code = chan.exit_status if answered else -1
            chan.close()
        except TimeoutError:
            asked = f"ssh {self.ssh.login()} true"
            raise HostError(
                f"the host did not answer `id -u` within 30 s (does `{asked}` return?)",
                Kind.CONNECTION,
            ) from None
        except CUT as exc:
            raise HostError(f"connection lost: {exc}", kind=Kind.CONNECTION) from None
        # the last line: a login may print before the command runs (a banner, an rc's echo)
        text = (out.decode(errors="replace").strip().splitlines() or [""])[-1].strip()
        if code == LOADER_KEPT_EXIT and text.startswith(LOADER_KEPT):
            raise HostError(text, Kind.UNTRUSTED)
        if code != 0 or not text.isdigit():
            raise HostError(f"the host cannot say who it is (`id -u`: {text[:60]!r})",
                            Kind.CONNECTION)  # fmt: skip
        return int(text)

    def _upload(self, data: bytes, path: str) -> None:
        """A fresh temporary (SFTP's create-exclusive: never through a planted link), 0600
        before a byte is in it, renamed over the name."""
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        with over_sftp(f"cannot upload {path}"):
            sftp = self.conn.sftp()
            with sftp.open(tmp, "wbx") as fh:
                fh.chmod(0o600)
                fh.set_pipelined(True)
                fh.write(data)
            sftp.posix_rename(tmp, path)

    def _pieces(self, path: str, want: int) -> Generator[bytes, None, None]:
        """A regular file of the host over SFTP, a piece at a time (`_sftp_pieces`). Only
        a regular file is opened (a pipe's open blocks the SFTP server for good), and no
        answer is waited for past STALL_S (a pipe swapped in after the look, a stopped
        server): the SFTP channel is then dropped, the fetch refused in one line. A
        failure is a connection error naming the path."""
        with over_sftp(f"cannot fetch {path}"):
            sftp = self.conn.sftp()
            channel = sftp.get_channel()
            if not stat.S_ISREG(sftp.lstat(path).st_mode or 0):
                raise HostError(f"cannot fetch {path}: not a regular file (a link, a pipe, "
                                "a device...)", Kind.UNTRUSTED)  # fmt: skip
            channel.settimeout(STALL_S)
            try:
                fh = sftp.open(path, "rb")
                try:
                    yield from _sftp_pieces(path, fh, want)
                except TimeoutError:
                    sftp.close()  # a request left unanswered: the channel is of no more use
                    raise
                finally:
                    with contextlib.suppress(*CUT):  # at once where the channel was closed
                        fh.close()
            except TimeoutError:
                sftp.close()
                self.conn._sftp = None  # Fabric opens a fresh one on the next call
                raise HostError(f"cannot fetch {path}: the host's SFTP server answered nothing "
                                f"for {STALL_S} s (a pipe, a stopped server?)",
                                Kind.CONNECTION) from None  # fmt: skip
            finally:
                if not channel.closed:
                    channel.settimeout(None)

    def _start(self, script: str) -> AgentProcess:
        transport = self.conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostError("connection lost", kind=Kind.CONNECTION)
        try:
            return SSHAgent(transport, script)
        except CUT as exc:
            raise HostError(f"connection lost: {exc}", kind=Kind.CONNECTION) from None

    @property
    def alive(self) -> bool:
        """The SSH transport is still up."""
        transport = self.conn.client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        """Close the agent (if the connection still lets us) and the connection."""
        if self.alive:
            super().close()
        self.conn.close()
