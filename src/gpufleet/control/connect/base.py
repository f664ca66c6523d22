"""The session every connector shares: judge the host's interpreter, start the one serving
agent (bootstrapped, uploaded when missing) and call verbs on it.

Each connector (local.py, ssh.py, srun.py) supplies how to start a process, move a file
and read the host's tree; all expose the same `call(args, on_event)`, where `args` is one
of the verb contract's dataclasses (host/agent/protocol.py), so every task runs identically
on a laptop rehearsal, a local GPU box, a fleet over SSH and a Slurm job. Arguments travel
on the agent's stdin, one line per verb, to the one agent a session keeps running
(control/connect/agentproc.py).
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from gpufleet.control.agent import bootstrap
from gpufleet.control.agent import bundle as agentzip
from gpufleet.control.agent import python_trust as interpreter
from gpufleet.control.connect import taskid
from gpufleet.control.connect.agentproc import (
    EOF,
    FINAL,
    SILENT,
    TIMEOUT,
    AgentProcess,
    EventHandler,
    LineParser,
)
from gpufleet.control.connect.cancel import CancelToken
from gpufleet.control.inventory import connections
from gpufleet.control.inventory.model import Host
from gpufleet.errors import HostError
from gpufleet.host.agent import heartbeat, loginenv
from gpufleet.host.agent.protocol import SERVE, ProgressEvent, VerbArgs
from gpufleet.kinds import Kind
from gpufleet.wire import WireError

Progress = Callable[[str, ProgressEvent], None]  # (host name, event): a per-host printer
PIECE = 1 << 20  # the most of a downloaded file held at once


class Sink(Protocol):
    """Where a downloaded file's pieces go, one at a time (the archive's Incoming)."""

    def write(self, piece: bytes, /) -> object:
        """Take the next piece of the file, in order."""
        ...


def host_events(host_name: str, progress: Progress | None) -> EventHandler | None:
    """An agent's progress events, handed to a per-host progress printer (if any)."""
    if progress is None:
        return None
    return lambda event: progress(host_name, event)


MISSING = bootstrap.MISSING
START_TIMEOUT_S = 60.0  # bootstrap, hash check and imports; a login shell's rc files too


def _kind(value: Any) -> Kind:
    """The kind an agent answered (an older agent's unknown kind is just an error)."""
    try:
        return Kind(value)
    except ValueError:
        return Kind.ERROR


@dataclass(frozen=True)
class ResumableCall:
    """What a long host call is doing, how to pick it up after a dropped connection, and
    how long one call may take (None: the verb's own)."""

    doing: str
    resume: str
    timeout: float | None = None


class Session:
    """Runs agent verbs on one host; subclasses say how to start a command and upload.

    The first call starts one agent there (`agent.pyz serve`) that answers every verb of
    the task, one `VERB ARGS` line each, over one SSH connection: no new remote command,
    login shell or Python per verb. The bootstrap checks the workdir path (creating what
    is missing, 0700) and the agent's hash before anything from the host's disk runs; if
    this version is not there it answers MISSING, the agent is uploaded and it starts
    again. A timed-out or broken agent is dropped and the next call starts a fresh one.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self._lock = threading.Lock()
        self._agent: AgentProcess | None = None
        self._workdir: str | None = None
        self.agent_starts = 0  # how many agents this session started (tests, benchmarks)
        self.warnings: set[str] = set()  # said once per host (a python others can change)
        self.python: interpreter.Verdict | None = None  # the host python, as judged

    def _tree(self) -> tuple[interpreter.TreeReader, int, str]:
        """The host's filesystem as the trust rule reads it, the connecting uid, home."""
        raise NotImplementedError

    def _judged_python(self) -> str:
        """The host python's executable, once its whole tree passed the trust rule: judged
        from outside, before it runs (a `python_trust: warn` host runs it, warned first)."""
        if self.python is None:
            fs, uid, home = self._tree()
            try:
                verdict = interpreter.judge_python(self.host.python_path, uid, fs, home)
            except OSError as exc:
                why = f"cannot read the host python's tree: {exc}"
                raise HostError(why, Kind.CONNECTION) from None
            if verdict.problems:
                more = len(verdict.problems) - 1
                first = verdict.problems[0] + (f" (and {more} more)" if more else "")
                if self.host.python_trust != "warn":
                    raise HostError(f"refusing to run the host python: {first}", Kind.UNTRUSTED)
                self.warnings.add(f"running an untrusted python (python_trust: warn): {first}")
            self.python = verdict
        return self.python.executable

    def _start(self, script: str) -> AgentProcess:
        raise NotImplementedError

    def _upload(self, data: bytes, path: str) -> None:
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        """The way to the host still works (a pooled session is reused only then)."""
        return True

    def hold_steps(self) -> None:
        """Make sure a server or run the agent starts will outlive the task (a Slurm step
        keeper, where the connection needs one); nothing to do over SSH."""

    def download_to(self, path: str, dest: Sink, limit: int) -> int:
        """Stream a regular file of the host (an absolute path, never through a link) into
        `dest` as it comes, a piece of at most PIECE bytes at a time: nothing of it is
        held whole. Reading stops once more than `limit` bytes came (a file that grew, or
        a host that sends more than it said); the bytes received, which the caller judges
        against `limit`. Every connection streams its own way (`_pieces`); none reads a
        file whole."""
        received = 0
        pieces = self._pieces(path, limit + 1)
        try:
            for piece in pieces:
                dest.write(piece)
                received += len(piece)
                if received > limit:
                    break
        finally:
            pieces.close()  # the host's file is closed here, read to the end or not
        return received

    def _pieces(self, path: str, want: int) -> Generator[bytes, None, None]:
        """The file's bytes in pieces of at most PIECE, in order, to its end or until
        `want` bytes came (a little more is harmless; the caller stops there)."""
        raise NotImplementedError

    def upload(self, data: bytes, path: str) -> None:
        """Write an absolute path on the host atomically (temporary name, then rename)."""
        self._upload(data, path)

    def close(self) -> None:
        """End the serving agent (it exits when its stdin ends)."""
        agent, self._agent = self._agent, None
        if agent is not None:
            agent.finish()

    @property
    def workdir(self) -> str:
        """Absolute workdir on the host, as the serving agent said when it started."""
        self._serving_agent()
        assert self._workdir is not None
        return self._workdir

    def _bootstrap(self, agent: str, digest: str, verb: list[str]) -> str:
        """The one remote command: the isolated bootstrap checks the workdir path and the
        agent's hash before anything from the host's disk is imported (control/agent/bootstrap.py).
        """
        python = self._judged_python()
        trust_mode = self.host.python_trust
        argv = [
            python,
            "-I",
            "-S",  # no site: no .pth runs, nothing of a venv is imported by root's agent
            "-c",
            agentzip.bootstrap_source(),
            self.host.workdir,
            agent,
            digest,
            trust_mode,
        ]
        return clean_start(shlex.join([*argv, *verb]))

    def _raise_for_workdir(self, code: int | None, err: str) -> None:
        lines = err.strip().splitlines()
        if code == 90:
            raise HostError(f"{(lines or ['cannot create workdir'])[-1]}", Kind.WORKDIR)
        if code == 91:
            raise HostError(
                f"refusing to run the agent: {(lines or ['unsafe workdir'])[-1]}",
                kind=Kind.UNSAFE_WORKDIR,
            )

    def _serving_agent(self) -> AgentProcess:
        """The task's agent on this host, started (and uploaded first if missing) on need."""
        if self._agent is not None:
            return self._agent
        bundle = agentzip.build()
        script = self._bootstrap(bundle.filename, bundle.digest, [SERVE])
        for _attempt in range(2):
            agent = self._start(script)
            self.agent_starts += 1
            sink = LineParser(None)
            deadline = time.monotonic() + START_TIMEOUT_S
            outcome = agent.pump(sink, deadline, lambda sink=sink: sink.hello is not None)
            if sink.hello is not None:
                for line in agent.stderr_text().splitlines():  # said once per host
                    if line.startswith(bootstrap.WARNING):
                        self.warnings.add(line[len(bootstrap.WARNING) :].strip())
                self._agent, self._workdir = agent, str(sink.hello["workdir"])
                return agent
            missing = [line for line in sink.other if line.startswith(MISSING + " ")]
            if outcome == EOF and missing:
                agent.exit_code()
                with self._lock:
                    self._upload(
                        bundle.data, missing[-1][len(MISSING) + 1 :] + "/" + bundle.filename
                    )
                continue
            break
        if outcome == TIMEOUT:
            agent.kill()
            raise HostError(f"the agent did not start within {START_TIMEOUT_S:g}s", kind=Kind.AGENT)
        self._fail_lost(agent)
        code, err = agent.exit_code(), agent.stderr_text()
        self._raise_for_workdir(code, err)
        raise self._agent_lost(self._explain_failure(code, err, sink.other))

    def _agent_lost(self, failure: str) -> HostError:
        """The error for an agent that ended without its answer, at its start or in any verb:
        where the host's Slurm job ended, that is why (scancel during a launch's own verb
        read only `agent exited with code 143`), and nothing keeps running to resume."""
        ended = self.owner_ended()
        if ended:
            return HostError(f"{failure}: {ended}", kind=Kind.JOB_ENDED)
        return HostError(failure, kind=Kind.AGENT)

    def _fail_lost(self, agent: AgentProcess) -> None:
        if agent.lost:
            raise HostError("connection lost", kind=Kind.CONNECTION)

    def with_host(self, args: VerbArgs) -> VerbArgs:
        """Fill in what every verb needs to know about the host (name, simulation, GPU count).

        Paths are relative to the workdir, where the agent runs.
        """
        args.host = self.host.name
        args.run_as = self.host.run_as
        args.owner = taskid.task_owner()  # the host is this task's while it changes it
        gpus = self.host.gpus
        if args.expected_gpus is None:
            args.expected_gpus = gpus.count
        for name, value in connections.settings_of(self.host).verb_fields().items():
            setattr(args, name, value)  # the connection's own (srun: its job step)
        if gpus.simulated:
            args.sim = {
                "state_dir": "sim-gpus",
                "count": next(c for c in (gpus.sim_count, gpus.count, 8) if c is not None),
                "model": gpus.model,
                "memory_mib": gpus.memory_mib,
                "reserved_mib": gpus.reserved_mib,
                "faults": {str(i): f.model_dump(exclude_none=True) for i, f in gpus.faults.items()},
                "boot_id": gpus.boot_id,
            }
        return args

    def call(
        self,
        args: VerbArgs,
        on_event: EventHandler | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Run one agent verb; return its result or raise HostError with the agent's message."""
        agent = self._serving_agent()
        sink = LineParser(on_event or self._said_once)  # no listener: warnings said once
        try:
            agent.send(f"{args.VERB} {self.with_host(args).to_wire()}")
        except (OSError, EOFError):
            pass  # the agent is gone: said below, from what it left
        deadline = None if timeout is None else time.monotonic() + timeout
        done = lambda: sink.final is not None or sink.unreadable is not None  # noqa: E731
        outcome = agent.pump(sink, deadline, done, heartbeat.SILENT_S)
        if outcome != FINAL or sink.final is None:
            self._agent = None  # a fresh agent for the next call
            if outcome != EOF:
                agent.kill()
            if outcome == TIMEOUT:
                raise HostError(
                    f"agent did not finish `{args.VERB}` (timed out after {timeout:g}s)",
                    kind=Kind.AGENT,
                )
            if outcome in (SILENT, FINAL):
                raise HostError(self._unanswered(args.VERB, sink.unreadable), kind=Kind.AGENT)
            self._fail_lost(agent)
            code, err = agent.exit_code(), agent.stderr_text()
            raise self._agent_lost(self._explain_failure(code, err, sink.other))
        final = sink.final
        assert final is not None
        if not final.get("ok"):
            raise HostError(final.get("error", "agent failed"), _kind(final.get("kind")))
        result = final.get("result")
        answer = type(args).ANSWER
        if answer is None:
            return result
        try:
            return answer.from_wire(result, args.VERB)
        except WireError as exc:  # the agent's hash matched: a bug, said with its field
            raise HostError(f"the agent's answer does not match: {exc}", kind=Kind.AGENT) from None

    def call_resumable(
        self,
        args: VerbArgs,
        on_event: EventHandler | None,
        timeout: float | None,
        doing: str,
        resume: str,
    ) -> Any:
        """`call` for long verbs whose work goes on on the host if the connection drops:
        a lost connection becomes one line saying what keeps running and how to resume."""
        try:
            return self.call(args, on_event=on_event, timeout=timeout)
        except HostError as exc:
            if exc.kind == Kind.JOB_ENDED:  # the agent's loss, said with its job's end
                raise HostError(f"lost the host while {doing} ({exc})", kind=exc.kind) from None
            if exc.kind not in (Kind.CONNECTION, Kind.AGENT):
                raise
            ended = self.owner_ended()
            if ended:  # nothing keeps running: no hint that cannot work
                raise HostError(f"lost the host while {doing} ({exc}): {ended}",
                                kind=Kind.JOB_ENDED) from None  # fmt: skip
            raise HostError(
                f"lost the host while {doing} ({exc}); it keeps running there: {resume}",
                kind=Kind.CONNECTION,
            ) from None

    def call_in_slices(
        self,
        args: VerbArgs,
        on_event: EventHandler | None,
        call: ResumableCall,
        cancel: CancelToken | None,
        carry_on: Callable[[Any], bool],
    ) -> Any:
        """A long resumable verb (waiting for health, watching a benchmark) called again
        and again while `carry_on(answer)` says it has not ended, which also moves `args`
        on (an offset, the time already waited); between calls a stop asked through
        `cancel` raises Cancelled. The verb itself runs in slices (its args say how long)
        only when a token is given."""
        while True:
            answer = self.call_resumable(args, on_event, call.timeout, call.doing, call.resume)
            if not carry_on(answer):
                return answer
            cancel.check(call.doing)  # type: ignore[union-attr]

    def _said_once(self, event: ProgressEvent) -> None:
        """A warning of a verb nobody listens to (a gpu-clean's take-over), said once."""
        if "warning" in event:
            self.warnings.add(str(event["warning"]))

    def _unanswered(self, verb: str, unreadable: str | None) -> str:
        """The one line for a verb whose answer cannot come: unreadable, or nothing at all
        (not even the agent's heartbeat) for the silence limit."""
        if unreadable is not None:
            shown = unreadable[:120].encode("unicode_escape").decode("ascii")
            return f"the agent's answer to `{verb}` is unreadable ({shown!r})"
        return (
            f"no word from the agent in `{verb}` for "
            f"{heartbeat.SILENT_S:g}s (stopped, hung, or the host is unreachable)"
        )

    def owner_ended(self) -> str | None:
        """Why nothing the agent started can still run on the host (its owner ended), or
        None: over SSH a server and a run outlive the connection."""
        return None

    def _explain_failure(self, code: int | None, err: str, other: list[str]) -> str:
        lines = err.strip().splitlines()
        tail = (lines or other or ["no output"])[-1]
        if code == 127:
            return (
                f"python {self.host.python_path!r} not found on the host "
                f"(set `python:` for {self.host.name} in the inventory)"
            )
        if code == LOADER_KEPT_EXIT and tail.startswith(LOADER_KEPT):
            return tail.strip()
        if code is None or code < 0:
            return f"agent did not finish ({tail})"
        return f"agent exited with code {code}: {tail}"


CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
LOADER_KEPT_EXIT = 97
LOADER_KEPT = (
    "the login keeps loader variables its shell cannot unset (readonly, in its rc or "
    "profile): gpufleet executes nothing while they are set; make them writable there "
    "(no readonly, no declare -r): "
)


def clean_start(command: str) -> str:
    """The remote command around the agent's: the login shell (any POSIX shell: sshd's,
    srun's `sh -c`) unsets every variable the loader or a library acts on with its `unset`
    builtin, so no program it executes loads what the login exported; the agent then runs
    in an empty environment (`env -i`, a fixed PATH, HOME and locale) and gets the login's
    variables only as text (its `export -p`, a builtin), for the allow-list its children
    start from (host/agent/loginenv.py)."""
    names = loginenv.LOADER_VARIABLES
    had = "".join(f"${{{n}+{n} }}" for n in names)
    # one at a time, through `command` (a special builtin's error would end a POSIX shell
    # before it could say why); a variable the login made readonly survives `unset`, and
    # the loader would act on it in the first program executed (`env`, as root): refused
    # here, in one line naming it, before anything is executed (issue 68.1)
    return (
        f'{loginenv.LOGIN_UNSET}="{had}"; for n in {" ".join(names)}; do '
        'command unset "$n" 2>/dev/null; done; '
        f'left="{had}"; if [ -n "$left" ]; then echo "{LOADER_KEPT}$left" >&2; '
        f"exit {LOADER_KEPT_EXIT}; fi; umask 077; "
        f'exec /usr/bin/env -i PATH={CLEAN_PATH} LANG=C.UTF-8 HOME="$HOME" '
        f'{loginenv.LOGIN_ENV}="$(export -p)" {loginenv.LOGIN_UNSET}="${loginenv.LOGIN_UNSET}" '
        f"{command}"
    )
