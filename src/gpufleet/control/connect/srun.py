"""`connection: srun`: reach a node through Slurm where SSH to compute nodes is closed.

The agent runs as a job step of the host's `slurm_job` on that node (`srun --jobid J
--overlap -w NODE -N1 -n1`), answering the same verbs over the step's stdin and stdout,
after the same bootstrap and hash check as over SSH. What SFTP does there is done by a
second step, a `/bin/sh` of the node's own: it answers the trust rule's reads (lstat,
readlink, listdir, read) with root's programs (stat, find, head, base64) before the host
python runs, and moves the agent into place. The agent's bytes reach the job's nodes by
`sbcast` (Slurm's own broadcast: no shared filesystem assumed), once per job.

A server (and a bench runner) launched this way is a job step of its own, held by an srun
the agent detaches (host/proc/jobstep.py): it outlives the agent's step and ends with the
job. Under `proctrack/cgroup` Slurm would end that srun with the agent's step, and the
server with it: there a step keeper, a step held by an srun of this machine, starts them
instead (`hold_steps`, host/proc/stepkeeper.py). When the agent's
step is lost, `owner_ended` asks Slurm whether the job still runs, so a failure line offers
`--attach` only while there is something to attach to.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import itertools
import os
import re
import secrets
import select
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from gpufleet.control.agent import bundle as agentzip
from gpufleet.control.agent import python_trust as interpreter
from gpufleet.control.connect import keeper
from gpufleet.control.connect.agentproc import AgentProcess
from gpufleet.control.connect.base import PIECE, Session
from gpufleet.control.connect.local import LocalAgent
from gpufleet.control.inventory import slurm
from gpufleet.control.inventory.connections import SrunSettings
from gpufleet.control.inventory.model import Host
from gpufleet.control.inventory.slurm import step_env
from gpufleet.errors import HostError, UserError
from gpufleet.host.agent import protocol
from gpufleet.kinds import Kind

T = TypeVar("T")
SHELL_TIMEOUT_S = 30.0
LOST_WAIT_S = 5.0  # for srun to say why a step ended and exit
# srun's words when slurmctld does not answer (down, restarting, failing over): a new step
# cannot start, but the job and what runs in it are fine; try again, for a bounded time
CONTROLLER_DOWN = re.compile(
    r"Unable to contact slurm controller|Socket timed out on send/recv|"
    r"Zero Bytes were transmitted or received|backup controller in standby"
)
# a controller back on its saved state refuses steps for a moment, until the nodes have
# registered again ("Memory required by task is not available" was seen)
STEP_REFUSED = re.compile(r"Unable to create step|Unable to confirm allocation")
NOT_REGISTERED = re.compile(r"Memory required by task is not available")
CONTROLLER_WAIT_ENV = "GPUFLEET_SLURMCTLD_WAIT_S"
GAVE_UP = "slurmctld did not answer for"
CONTROLLER_WAIT_S = 90.0
_DONE = b"__gpufleet_done"
_DONE_LINE = re.compile(rb"\n__gpufleet_done (\d+)\n")
_TYPES = {"f": stat.S_IFREG, "d": stat.S_IFDIR, "l": stat.S_IFLNK, "c": stat.S_IFCHR,
          "b": stat.S_IFBLK, "p": stat.S_IFIFO, "s": stat.S_IFSOCK}  # fmt: skip


def step_argv(slurm: SrunSettings, role: str) -> list[str]:
    """The start of every srun this host's steps use: one task on its node, inside its
    job beside whatever runs there, with a clean environment (as an SSH login has),
    named for what it does (`role`: protocol.STEP_NAMES)."""
    return ["srun", f"--jobid={slurm.job}", "--overlap", f"--nodelist={slurm.node}",
            "-N1", "-n1", "--unbuffered", "--quiet", "--export=NONE",
            f"--job-name={protocol.STEP_NAMES[role]}"]  # fmt: skip


def _available(stream: IO[bytes] | None) -> bytes:
    """What a pipe holds now, without waiting for more (the writer may still run)."""
    if stream is None:
        return b""
    out = b""
    while select.select([stream], [], [], 0)[0]:
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            break
        out += chunk
    return out


@dataclass(frozen=True)
class Attributes:
    """What the trust rule reads of an lstat (as os.stat_result and SFTP's attributes)."""

    st_mode: int
    st_uid: int
    st_gid: int
    st_size: int


class NodeShell:
    """A `/bin/sh` step on the node, asked one command at a time: its output and status.

    Only root's programs answer (PATH is /usr/bin:/bin), and nothing of the host python's
    tree runs before the trust rule has judged it."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.slurm = SrunSettings.of(host)
        try:
            self.proc = subprocess.Popen(
                [*step_argv(self.slurm, "shell"), "/bin/sh"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=step_env(),
            )  # fmt: skip
        except FileNotFoundError:
            raise HostError("connection srun needs Slurm's `srun` on this machine (not found)",
                            Kind.CONNECTION) from None  # fmt: skip
        self._buffer = b""
        self._lock = threading.Lock()
        self.asked = 0
        code, _ = self.ask("export PATH=/usr/bin:/bin LC_ALL=C; umask 077")
        if code != 0:
            raise HostError(self._lost("the node's shell did not start"), Kind.CONNECTION)

    def _lost(self, what: str) -> str:
        """The failure in one line with srun's own last word. The step's stdout can end
        before srun has written its message and exited: wait for the exit (bounded), then
        read what stderr holds (the message was lost that way in 3 of 5 tries)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=LOST_WAIT_S)
        err = _available(self.proc.stderr)
        tail = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        job, node = self.slurm.job, self.slurm.node
        return f"{what} (srun into job {job} on {node}: {tail})"

    def ask(self, command: str, timeout: float = SHELL_TIMEOUT_S) -> tuple[int, bytes]:
        """(exit status, stdout) of one command in the node's shell."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.asked += 1
            try:
                # the answer leaves in one write: as several small ones (the command's,
                # then the status line), Nagle's algorithm between srun and the step
                # holds each answer ~40 ms
                self.proc.stdin.write(
                    f"o=$({{ {command}\n}} 2>/dev/null </dev/null); s=$?; "
                    f"printf '%s\\n{_DONE.decode()} %s\\n' \"$o\" $s\n".encode()
                )
                self.proc.stdin.flush()
            except OSError:
                raise HostError(self._lost("the node's shell is gone"), Kind.CONNECTION) from None
            fd = self.proc.stdout.fileno()
            deadline = time.monotonic() + timeout
            while (found := _DONE_LINE.search(self._buffer)) is None:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([fd], [], [], max(0.0, left))
                if not ready:
                    raise HostError(f"the node's shell did not answer in {timeout:g}s",
                                    Kind.CONNECTION)  # fmt: skip
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise HostError(self._lost("the node's shell ended"), Kind.CONNECTION)
                self._buffer += chunk
            out, self._buffer = self._buffer[: found.start()], self._buffer[found.end() :]
            return int(found.group(1)), out

    @property
    def alive(self) -> bool:
        """The step's shell is still running."""
        return self.proc.poll() is None

    def close(self) -> None:
        """End the shell's step (killed after 10 s)."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ShellTree:
    """The node's filesystem as the trust rule reads it, through its own stat and find."""

    def __init__(self, shell: NodeShell) -> None:
        self.shell = shell

    def _ask(self, command: str, path: str) -> bytes:
        code, out = self.shell.ask(command)
        if code != 0:
            raise FileNotFoundError(errno.ENOENT, "not found or not readable", path)
        return out

    def lstat(self, path: str) -> Attributes:
        """The entry's mode, owner, group and size, by `stat` on the node."""
        q = shlex.quote(path)
        mode, uid, gid, size = self._ask(f"stat -c '%f %u %g %s' -- {q}", path).split()
        return Attributes(int(mode, 16), int(uid), int(gid), int(size))

    def readlink(self, path: str) -> str:
        """Where a link on the node points."""
        q = shlex.quote(path)
        return self._ask(f"test -L {q} && readlink -- {q}", path).decode().strip()

    def listdir(self, path: str) -> list[tuple[str, Any]]:
        """A directory's entries on the node with their attributes, by one `find`."""
        q = shlex.quote(path)
        out = self._ask(
            f"test -d {q} && find {q}/ -mindepth 1 -maxdepth 1 -printf '%f\\0%y %m %U %G %s\\0'"
            " | base64 -w0", path,
        )  # fmt: skip
        fields = base64.b64decode(out.strip()).split(b"\0")
        entries = []
        for name, attrs in zip(fields[0::2], fields[1::2], strict=False):
            kind, mode, uid, gid, size = attrs.decode().split()
            st_mode = _TYPES.get(kind, 0) | int(mode, 8)
            entries.append((name.decode(errors="surrogateescape"),
                            Attributes(st_mode, int(uid), int(gid), int(size))))  # fmt: skip
        return entries

    def read(self, path: str, limit: int) -> bytes:
        """At most `limit` bytes of a regular file on the node (never through a link)."""
        q = shlex.quote(path)
        out = self._ask(f"test ! -L {q} && test -f {q} && head -c {int(limit)} -- {q} | base64 -w0",
                        path)  # fmt: skip
        return base64.b64decode(out.strip())

    def who(self) -> tuple[int, str]:
        """The uid the steps run as, and its home directory."""
        code, out = self.shell.ask('printf "%s %s" "$(id -u)" ~')
        uid, _, home = out.decode().strip().partition(" ")
        if code != 0 or not uid.isdigit():
            raise HostError("the node's shell cannot say who it is", Kind.CONNECTION)
        return int(uid), home


class SrunAgent(LocalAgent):
    """The agent as a job step: ended by SIGTERM to srun, which Slurm passes to the step
    (a SIGKILLed srun would leave the step running until Slurm noticed)."""

    def kill(self) -> None:
        """SIGTERM the step (srun passes it on to the agent), then kill it."""
        with contextlib.suppress(OSError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            super().kill()


# one sbcast per (job, agent) for every session of this process: Slurm copies the file to
# each node of the job at once, under a name nobody can guess
_broadcast_lock = threading.Lock()
_broadcast: dict[tuple[str, str], str] = {}


def broadcast(job: str, data: bytes, again: bool = False) -> str:
    """The path on every node of `job` where these bytes now lie (sbcast, once; `again`:
    a fresh copy, the last one being gone)."""
    key = (job, hashlib.sha256(data).hexdigest())
    with _broadcast_lock:
        if key in _broadcast and not again:
            return _broadcast[key]
        dest = f"/tmp/gpufleet-{key[1][:12]}-{secrets.token_hex(8)}.pyz"
        with tempfile.NamedTemporaryFile(prefix="gpufleet-agent-", suffix=".pyz") as tmp:
            tmp.write(data)
            tmp.flush()
            done = subprocess.run(
                ["sbcast", "--force", f"--jobid={job}", tmp.name, dest], capture_output=True,
                text=True, timeout=120, check=False, env=step_env(),
            )  # fmt: skip
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise HostError(f"sbcast of the agent to job {job} failed: {tail}", Kind.CONNECTION)
        _broadcast[key] = dest
        return dest


class SrunSession(Session):
    """Runs agent verbs on one node of a Slurm job, as job steps (no SSH)."""

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.slurm = SrunSettings.of(host)
        self._shell: NodeShell | None = None

    @property
    def shell(self) -> NodeShell:
        """The node's shell step, started again if it ended."""
        if self._shell is None or not self._shell.alive:
            self._shell = self._while_controller_down(lambda: NodeShell(self.host))
        return self._shell

    def _while_controller_down(self, start: Callable[[], T]) -> T:
        """`start` a step; while srun says slurmctld does not answer, again after 2, 4, 8,
        16 s ... for all of $GPUFLEET_SLURMCTLD_WAIT_S (90 s: the last wait is cut short so
        a try falls at the limit), each wait said on stderr, and the outcome said with the
        task's warnings or in the failure's one line."""
        limit = float(os.environ.get(CONTROLLER_WAIT_ENV) or CONTROLLER_WAIT_S)
        began, delay, tries = time.monotonic(), 2.0, 1
        while True:
            try:
                started = start()
            except HostError as exc:
                waited = time.monotonic() - began
                if GAVE_UP in str(exc):  # an inner step's wait already ran out: said once
                    raise
                # a controller back a moment ago refuses steps for want of memory until the
                # nodes register: tried again on the first try too (a pasted --attach right
                # after slurmctld returned met it, issue 69); other refusals only once the
                # controller was seen down (a job that ended refuses steps for good)
                if not (CONTROLLER_DOWN.search(str(exc)) or NOT_REGISTERED.search(str(exc))
                        or (tries > 1 and STEP_REFUSED.search(str(exc)))):  # fmt: skip
                    raise
                if waited >= limit:  # the last try came at the limit, not a wait before it
                    said = f"{tries} {'try' if tries == 1 else 'tries'}"
                    raise HostError(f"{exc}; {GAVE_UP} {waited:.0f} s "
                                    f"({said}, ${CONTROLLER_WAIT_ENV}={limit:g})",
                                    exc.kind) from None  # fmt: skip
                pause = min(delay, limit - waited)
                print(
                    f"{self.host.name}: slurmctld does not answer; trying again in "
                    f"{pause:.3g} s (for up to {limit:g} s)",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(pause)
                delay, tries = min(delay * 2, 16.0), tries + 1
                continue
            if tries > 1:
                self.warnings.add(
                    f"slurmctld did not answer at first: the step started at "
                    f"try {tries}, after {time.monotonic() - began:.0f} s"
                )
            return started

    def _tree(self) -> tuple[interpreter.TreeReader, int, str]:
        tree = ShellTree(self.shell)
        uid, home = tree.who()
        return tree, uid, home

    def _serving_agent(self) -> AgentProcess:
        """The agent, started; the node's shell then ends (it judged and uploaded; a later
        download starts another): one srun here per host, not two, while the task runs."""
        agent = self._while_controller_down(super()._serving_agent)
        if self._shell is not None:
            self._shell.close()
            self._shell = None
        return agent

    def _start(self, script: str) -> AgentProcess:
        try:
            return SrunAgent(
                script, [*step_argv(self.slurm, "agent"), "/bin/sh", "-c", script], step_env()
            )
        except FileNotFoundError:
            raise HostError("connection srun needs Slurm's `srun` on this machine (not found)",
                            Kind.CONNECTION) from None  # fmt: skip

    def _upload(self, data: bytes, path: str) -> None:
        """sbcast to the job's nodes (once), then copied into place on this node under a
        fresh name and renamed over `path` (never written through a planted link); the
        broadcast copy is removed. Where nodes share /tmp another node may have removed it
        first: broadcast again, once."""
        q = shlex.quote
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        for again in (False, True):
            source = broadcast(self.slurm.job, data, again)
            code, _ = self.shell.ask(
                f"cp -- {q(source)} {q(tmp)} && mv -f -- {q(tmp)} {q(path)} && rm -f -- {q(source)}"
            )
            if code == 0:
                return
        raise HostError(f"cannot put the agent at {path} on {self.slurm.node}",
                        Kind.CONNECTION)  # fmt: skip

    def _pieces(self, path: str, want: int) -> Generator[bytes, None, None]:
        """A regular file of the node, read through the shell (no SFTP on a compute node),
        one piece per question (`dd` of one PIECE block, never through a link), until a
        short piece (its end) or `want` bytes."""
        q, at = shlex.quote(path), 0
        for block in itertools.count():
            code, out = self.shell.ask(
                f"test ! -L {q} && test -f {q} && dd if={q} bs={PIECE} skip={block} count=1 "
                "iflag=fullblock,nofollow status=none | base64 -w0", timeout=120
            )  # fmt: skip
            if code != 0:
                raise HostError(f"cannot fetch {path}: not a regular file", kind=Kind.CONNECTION)
            piece = base64.b64decode(out.strip())
            at += len(piece)
            if piece:
                yield piece
            if len(piece) < PIECE or at >= want:
                return

    def hold_steps(self) -> None:
        """Where this Slurm ends a step's every process with the step (proctrack/cgroup),
        see that the job's step keeper runs on the node: servers and runs started there
        outlive the agent's step and end with the job (host/proc/stepkeeper.py)."""
        try:
            needed = slurm.needs_step_keeper(slurm.config())
        except UserError as exc:
            raise HostError(str(exc), Kind.CONNECTION) from None
        if needed:
            self._serving_agent()  # the agent is on the node, uploaded where missing
            bundle = agentzip.build()
            job = self.slurm.job
            script = self._bootstrap(bundle.filename, bundle.digest, [protocol.KEEPER, job])
            said = f"{self.workdir}/{protocol.keeper_error_file(job)}"  # Slurm's words on the node
            argv = [*step_argv(self.slurm, "keeper"), f"--error={said}", "--open-mode=append",
                    "/bin/sh", "-c", script]  # fmt: skip
            self._while_controller_down(lambda: keeper.start(argv, job, self.slurm.node))

    def owner_ended(self) -> str | None:
        """Why the node's server and runs ended: the job they were steps of is no longer
        running (they end with it, host/proc/jobstep.py); None while it runs, or where
        slurmctld cannot say."""
        job = self.slurm.job
        try:
            how = slurm.job_end(job)
        except UserError:
            return None
        if how is None:
            return None
        return (f"Slurm job {job} {how}: the server and the run on {self.slurm.node} "
                "ended with it; run again in a running job")  # fmt: skip

    @property
    def alive(self) -> bool:
        """The agent's step is still running."""
        agent = self._agent
        return not isinstance(agent, SrunAgent) or agent.proc.poll() is None

    def close(self) -> None:
        """Close the agent and the node's shell."""
        super().close()
        if self._shell is not None:
            self._shell.close()
            self._shell = None
