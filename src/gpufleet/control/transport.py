"""Reach a host and run the agent there: Fabric over SSH, or a subprocess for `local`.

Both sessions expose the same `call(args, on_event)`, where `args` is one of the verb
contract's dataclasses (host/protocol.py), so every task runs identically on a laptop
rehearsal, a local GPU box and a fleet over SSH. Arguments travel on the agent's stdin.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import shlex
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.control import agentzip, bootstrap
from gpufleet.control.inventory import Host
from gpufleet.errors import HostError
from gpufleet.host.protocol import MARK, VerbArgs
from gpufleet.kinds import Kind
from gpufleet.wire import WireError

EventHandler = Callable[[dict[str, Any]], None]


def host_events(
    host_name: str, progress: Callable[[str, dict[str, Any]], None] | None
) -> EventHandler | None:
    """An agent's progress events, handed to a per-host progress printer (if any)."""
    if progress is None:
        return None
    return lambda event: progress(host_name, event)


class _LineParser:
    """A file-like sink that splits agent stdout into JSON lines as they arrive."""

    def __init__(self, on_event: EventHandler | None) -> None:
        self.on_event = on_event
        self.buffer = ""
        self.final: dict[str, Any] | None = None
        self.other: list[str] = []

    def write(self, text: str) -> int:
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            self._line(line)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.buffer:
            self._line(self.buffer)
            self.buffer = ""

    def _line(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        try:
            obj = json.loads(line)
        except ValueError:
            self.other.append(line)
            return
        if not isinstance(obj, dict) or obj.get(MARK) != 1:
            self.other.append(line)
        elif "event" in obj:
            if self.on_event:
                self.on_event(obj["event"])
        else:
            self.final = obj


MISSING = bootstrap.MISSING


def _compact(source: str) -> str:
    """The bootstrap's code without docstrings or comments: what `ps` shows on the host."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[:] = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


BOOTSTRAP = _compact(Path(bootstrap.__file__).read_text())


def _kind(value: Any) -> Kind:
    """The kind an agent answered (an older agent's unknown kind is just an error)."""
    try:
        return Kind(value)
    except ValueError:
        return Kind.ERROR


class Session:
    """Runs agent verbs on one host; subclasses provide how to execute and upload.

    One agent call is one remote command: the bootstrap checks the workdir path (creating
    what is missing, 0700), enters it and runs the agent if this version is there with the
    right hash; otherwise it answers MISSING, the agent is uploaded and the command runs
    again. (Every SSH command pays for the login shell's rc files,
    often 100 ms or more, so round trips are kept to one.)
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self._uploaded = False
        self._lock = threading.Lock()
        self.warnings: set[str] = set()  # said once per host (a python others can change)

    def _exec(
        self, script: str, stdin: str, sink: _LineParser, timeout: float | None
    ) -> tuple[int | None, str]:
        raise NotImplementedError

    def _upload(self, data: bytes, path: str) -> None:
        raise NotImplementedError

    def download(self, path: str) -> bytes:
        """The bytes of an absolute path on the host."""
        raise NotImplementedError

    def upload(self, data: bytes, path: str) -> None:
        """Write an absolute path on the host atomically (temporary name, then rename)."""
        self._upload(data, path)

    def close(self) -> None:
        pass

    @property
    def workdir(self) -> str:
        """Absolute workdir on the host (one extra round trip; calls do not need it)."""
        sink = _LineParser(None)
        code, err = self._exec(self._bootstrap("-", "-", []), "", sink, 30)
        sink.close()
        self._raise_for_workdir(code, err)
        if code != 0 or not sink.other:
            raise HostError(
                f"cannot create workdir {self.host.workdir}: {err.strip()}", Kind.WORKDIR
            )
        return sink.other[-1]

    def _bootstrap(self, agent: str, digest: str, verb: list[str]) -> str:
        """The one remote command: the isolated bootstrap checks the workdir path and the
        agent's hash before anything from the host's disk is imported (control/bootstrap.py).
        """
        argv = [self.host.python_path, "-I", "-c", BOOTSTRAP, self.host.workdir, agent, digest]
        return f"umask 077; exec {shlex.join([*argv, *verb])}"

    def _raise_for_workdir(self, code: int | None, err: str) -> None:
        lines = [ln for ln in err.strip().splitlines() if not ln.startswith(bootstrap.WARNING)]
        for warning in err.splitlines():
            if warning.startswith(bootstrap.WARNING):
                self.warnings.add(warning[len(bootstrap.WARNING) :].strip())
        if code == 90:
            raise HostError(f"{(lines or ['cannot create workdir'])[-1]}", Kind.WORKDIR)
        if code == 91:
            raise HostError(
                f"refusing to run the agent: {(lines or ['unsafe workdir'])[-1]}",
                kind=Kind.UNSAFE_WORKDIR,
            )

    def with_host(self, args: VerbArgs) -> VerbArgs:
        """Fill in what every verb needs to know about the host (name, simulation, GPU count).

        Paths are relative to the workdir, where the agent runs.
        """
        args.host = self.host.name
        gpus = self.host.gpus
        if args.expected_gpus is None:
            args.expected_gpus = gpus.count
        if gpus.simulated:
            args.sim = {
                "state_dir": "sim-gpus",
                "count": next(c for c in (gpus.sim_count, gpus.count, 8) if c is not None),
                "model": gpus.model,
                "memory_mib": gpus.memory_mib,
                "reserved_mib": gpus.reserved_mib,
                "faults": {str(i): f.model_dump(exclude_none=True) for i, f in gpus.faults.items()},
            }
        return args

    def call(
        self,
        args: VerbArgs,
        on_event: EventHandler | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Run one agent verb; return its result or raise HostError with the agent's message."""
        bundle = agentzip.build()
        script = self._bootstrap(bundle.filename, bundle.digest, [args.VERB])
        stdin = self.with_host(args).to_wire()
        for _attempt in range(2):
            sink = _LineParser(on_event)
            code, err = self._exec(script, stdin, sink, timeout)
            sink.close()
            missing = [line for line in sink.other if line.startswith(MISSING + " ")]
            if not missing:
                break
            with self._lock:
                self._upload(bundle.data, missing[-1][len(MISSING) + 1 :] + "/" + bundle.filename)
        self._raise_for_workdir(code, err)
        if sink.final is None:
            raise HostError(self._explain_failure(code, err, sink.other), kind=Kind.AGENT)
        if not sink.final.get("ok"):
            raise HostError(sink.final.get("error", "agent failed"), _kind(sink.final.get("kind")))
        result = sink.final.get("result")
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
            if exc.kind in (Kind.CONNECTION, Kind.AGENT):
                raise HostError(
                    f"lost the host while {doing} ({exc}); it keeps running there: {resume}",
                    kind=Kind.CONNECTION,
                ) from None
            raise

    def _explain_failure(self, code: int | None, err: str, other: list[str]) -> str:
        tail = (err.strip().splitlines() or other or ["no output"])[-1]
        if code == 127:
            return (
                f"python {self.host.python_path!r} not found on the host "
                f"(set `python:` for {self.host.name} in the inventory)"
            )
        if code is None or code < 0:
            return f"agent did not finish ({tail})"
        return f"agent exited with code {code}: {tail}"


class LocalSession(Session):
    """`connection: local`: the same agent and the same script, run by `sh` here."""

    def download(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def _upload(self, data: bytes, path: str) -> None:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o600)
        os.replace(tmp, target)

    def _exec(
        self, script: str, stdin: str, sink: _LineParser, timeout: float | None
    ) -> tuple[int | None, str]:
        proc = subprocess.Popen(
            ["sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # the script may not read it (MISSING)
            proc.stdin.write(stdin)
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        errors: list[str] = []
        reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
        reader.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        reader.join(timeout=5)
        return code, "".join(errors)


class _WholeInput(io.StringIO):
    """Invoke copies a non-terminal in_stream one byte per 10 ms poll: hand it all at once.

    At EOF Invoke closes the remote stdin (channel.shutdown_write), which ends the agent's
    read of its arguments.
    """

    def read(self, size: int | None = -1) -> str:
        return super().read()


class SSHSession(Session):
    """Fabric over SSH with strict host keys, a connect timeout and transient-error retries."""

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        from gpufleet.control import ssh as sshconnect

        self.conn = sshconnect.open_connection(host)

    def _upload(self, data: bytes, path: str) -> None:
        sftp = self.conn.sftp()
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        sftp.putfo(io.BytesIO(data), tmp)
        sftp.chmod(tmp, 0o600)
        sftp.posix_rename(tmp, path)

    def download(self, path: str) -> bytes:
        buffer = io.BytesIO()
        try:
            self.conn.sftp().getfo(path, buffer)
        except (OSError, EOFError) as exc:
            raise HostError(f"cannot fetch {path}: {exc}", kind=Kind.CONNECTION) from None
        return buffer.getvalue()

    def _exec(
        self, script: str, stdin: str, sink: _LineParser, timeout: float | None
    ) -> tuple[int | None, str]:
        from invoke.exceptions import CommandTimedOut

        try:
            result = self.conn.run(
                script,
                hide=True,
                warn=True,
                pty=False,
                in_stream=_WholeInput(stdin),
                out_stream=sink,
                timeout=timeout,
            )
        except CommandTimedOut:
            return None, f"timed out after {timeout}s"
        except (OSError, EOFError) as exc:
            raise HostError(f"connection lost: {exc}", kind=Kind.CONNECTION) from None
        return result.exited, result.stderr

    def close(self) -> None:
        self.conn.close()


def open_session(host: Host) -> Session:
    if host.connection == "local":
        return LocalSession(host)
    return SSHSession(host)
