"""Reach a host and run the agent there: Fabric over SSH, or a subprocess for `local`.

Both sessions expose the same `call(verb, args, on_event)`, so every task runs identically
on a laptop rehearsal, a local GPU box and a fleet over SSH.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet import agentzip
from gpufleet.agent.protocol import MARK, encode_args
from gpufleet.errors import HostError
from gpufleet.inventory import Host

EventHandler = Callable[[dict[str, Any]], None]


def _workdir_shell(workdir: str) -> str:
    """Quote a workdir for sh, keeping a leading `~/` expandable."""
    if workdir == "~":
        return '"$HOME"'
    if workdir.startswith("~/"):
        return '"$HOME"/' + shlex.quote(workdir[2:])
    return shlex.quote(workdir)


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


class Session:
    """Runs agent verbs on one host; subclasses provide the three primitives."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._agent_path: str | None = None
        self._workdir: str | None = None
        self._lock = threading.Lock()

    # primitives --------------------------------------------------------------
    def _shell(self, script: str) -> tuple[int, str, str]:
        raise NotImplementedError

    def _upload(self, data: bytes, path: str) -> None:
        raise NotImplementedError

    def _exec(self, argv: list[str], sink: _LineParser, timeout: float | None) -> tuple[int, str]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    # shared logic ------------------------------------------------------------
    @property
    def workdir(self) -> str:
        self.prepare()
        assert self._workdir is not None
        return self._workdir

    def prepare(self) -> str:
        """Create the 0700 workdir and upload the agent once per content hash; return its path."""
        with self._lock:
            if self._agent_path:
                return self._agent_path
            bundle = agentzip.build()
            script = (
                f"umask 077; mkdir -p -- {_workdir_shell(self.host.workdir)} && "
                f"cd -- {_workdir_shell(self.host.workdir)} && chmod 700 . && pwd && "
                f"if [ -f {bundle.filename} ]; then echo present; else echo absent; fi"
            )
            code, out, err = self._shell(script)
            lines = out.strip().splitlines()
            if code != 0 or len(lines) < 2:
                detail = (err.strip().splitlines() or ["no output"])[-1]
                raise HostError(f"cannot create workdir {self.host.workdir}: {detail}", "workdir")
            self._workdir = lines[-2]
            path = f"{self._workdir}/{bundle.filename}"
            if lines[-1] == "absent":
                self._upload(bundle.data, path)
            self._agent_path = path
            return path

    def agent_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """Add what every verb needs to know about the host (name, simulation, GPU count)."""
        full = {"host": self.host.name, **args}
        gpus = self.host.gpus
        full.setdefault("expected_gpus", gpus.count)
        if gpus.simulated:
            full["sim"] = {
                "state_dir": f"{self.workdir}/sim-gpus",
                "count": gpus.count if gpus.count is not None else 8,
                "model": gpus.model,
                "memory_mib": gpus.memory_mib,
                "reserved_mib": gpus.reserved_mib,
            }
        return full

    def call(
        self,
        verb: str,
        args: dict[str, Any] | None = None,
        on_event: EventHandler | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Run one agent verb; return its result or raise HostError with the agent's message."""
        agent = self.prepare()
        argv = [self.host.python_path, agent, verb, encode_args(self.agent_args(args or {}))]
        sink = _LineParser(on_event)
        code, err = self._exec(argv, sink, timeout)
        sink.close()
        if sink.final is None:
            raise HostError(self._explain_failure(code, err, sink.other), kind="agent")
        if not sink.final.get("ok"):
            raise HostError(sink.final.get("error", "agent failed"), sink.final.get("kind", "error"))
        return sink.final.get("result")

    def _explain_failure(self, code: int, err: str, other: list[str]) -> str:
        tail = (err.strip().splitlines() or other or ["no output"])[-1]
        if code == 127 or "No such file or directory" in err and self.host.python in err:
            return (
                f"python {self.host.python_path!r} not found on the host "
                f"(set `python:` for {self.host.name} in the inventory)"
            )
        if code is None or code < 0:
            return f"agent did not finish ({tail})"
        return f"agent exited with code {code}: {tail}"


class LocalSession(Session):
    """`connection: local`: the same agent, as a subprocess of the control plane."""

    def _shell(self, script: str) -> tuple[int, str, str]:
        proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    def _upload(self, data: bytes, path: str) -> None:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o600)
        os.replace(tmp, target)

    def _exec(self, argv: list[str], sink: _LineParser, timeout: float | None) -> tuple[int, str]:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=False,
            )
        except FileNotFoundError:
            return 127, f"{argv[0]}: No such file or directory"
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
            code = -9
        reader.join(timeout=5)
        return code, "".join(errors)


class SSHSession(Session):
    """Fabric over SSH with strict host keys, a connect timeout and transient-error retries."""

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        from gpufleet import sshconnect

        self.conn = sshconnect.open_connection(host)

    def _shell(self, script: str) -> tuple[int, str, str]:
        result = self.conn.run(script, hide=True, warn=True, pty=False, in_stream=False)
        return result.exited, result.stdout, result.stderr

    def _upload(self, data: bytes, path: str) -> None:
        import io

        sftp = self.conn.sftp()
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        sftp.putfo(io.BytesIO(data), tmp)
        sftp.chmod(tmp, 0o600)
        sftp.posix_rename(tmp, path)

    def _exec(self, argv: list[str], sink: _LineParser, timeout: float | None) -> tuple[int, str]:
        from invoke.exceptions import CommandTimedOut

        try:
            result = self.conn.run(
                shlex.join(argv),
                hide=True,
                warn=True,
                pty=False,
                in_stream=False,
                out_stream=sink,
                timeout=timeout,
            )
        except CommandTimedOut:
            return -1, f"timed out after {timeout}s"
        except (OSError, EOFError, socket.error) as exc:
            raise HostError(f"connection lost: {exc}", kind="connection") from None
        return result.exited, result.stderr

    def close(self) -> None:
        self.conn.close()


def open_session(host: Host) -> Session:
    if host.connection == "local":
        return LocalSession(host)
    return SSHSession(host)
