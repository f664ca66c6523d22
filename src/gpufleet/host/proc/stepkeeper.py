"""Under `proctrack/cgroup` a server is started by a step keeper: one per job and node.

Slurm's cgroup tracker ends every process of a step when the step ends, whatever its
parents: the `srun` the agent detaches to hold a server's own step (host/proc/jobstep.py)
is itself a process of the agent's step, and dies with it, and the server's step with it
(measured on Slurm 22.05 with cgroup v1). What a step's processes can rely on is the step.
So the control plane starts, once per job and node, a step whose task is this keeper
(`agent.pyz keeper JOB`), held by an `srun` on the control machine (control/connect/srun.py):
the agent hands it what to start (a request file), and the keeper starts it as its own
child, inside the keeper's step. Every such process ends when the job ends (cancel, time
limit, preemption, node failure), as the step does; and when that `srun` is killed.

The keeper holds an exclusive lock on its folder, so a second one (a second launch) says
so and exits. Requests are read only when they are this user's own files, never through a
link. Standard library only: this module ships in the agent.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import TypedDict

from gpufleet.host.agent import safewrite
from gpufleet.host.agent.procstat import ProcRef
from gpufleet.host.agent.protocol import KEEPER_ALREADY, KEEPER_READY, keeper_error_file

STEPS = Path("steps")  # under the workdir: one folder per job
POLL_S = 0.2  # a request waits at most this long; idle, the keeper uses 0.1% of a core
START_TIMEOUT_S = 30.0


def folder(job: str) -> Path:
    return STEPS / f"job-{job}"


def error_file(job: str) -> Path:
    return Path(keeper_error_file(job))


def running(job: str) -> ProcRef | None:
    """The keeper of this job on this node, if one runs (a reused PID does not count)."""
    if not (folder(job) / "keeper.json").exists():  # no folder made for asking
        return None
    data = safewrite.read_own(folder(job) / "keeper.json")
    if not data:
        return None
    with contextlib.suppress(ValueError, KeyError, TypeError):
        ref = ProcRef.from_wire(json.loads(data))
        return ref if ref.alive() else None
    return None


class Request(TypedDict):
    """What the agent asks the keeper to start (a JSON file in the keeper's folder)."""

    argv: list[str]
    env: dict[str, str]
    log: str
    pid_file: str
    stdin: str


def request(
    job: str, program: list[str], env: dict[str, str], log: Path, *, pid_file: Path,
    stdin_file: Path | None, timeout: float = START_TIMEOUT_S,
) -> int:  # fmt: skip
    """Have the job's keeper start `program`; its PID once it runs. RuntimeError, with the
    keeper's reason, where it could not."""
    failed = pid_file.with_name(pid_file.name + ".failed")
    pid_file.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    name = f"{time.time_ns()}-{secrets.token_hex(4)}.request"
    wire: Request = {"argv": program, "env": env, "log": str(log.absolute()),
            "pid_file": str(pid_file.absolute()),
            "stdin": str(stdin_file.absolute()) if stdin_file else os.devnull}  # fmt: skip
    safewrite.write_atomic(folder(job) / name, json.dumps(wire))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int(pid_file.read_text().strip())
        if failed.exists():
            raise RuntimeError(failed.read_text().strip())
        if running(job) is None:
            raise RuntimeError(f"the step keeper of Slurm job {job} is not running")
        time.sleep(0.05)
    raise RuntimeError(f"the step keeper of Slurm job {job} did not start it within {timeout:g} s")


def _start(wire: Request, children: list[subprocess.Popen]) -> None:
    pid_file = Path(wire["pid_file"])
    try:
        with safewrite.open_append(wire["log"]) as out, open(wire["stdin"], "rb") as stdin:
            child = subprocess.Popen(
                wire["argv"], stdin=stdin, stdout=out, stderr=subprocess.STDOUT,
                env=wire["env"], start_new_session=True, close_fds=True,
            )  # fmt: skip
    except (OSError, KeyError, TypeError, ValueError) as exc:
        safewrite.write_atomic(pid_file.with_name(pid_file.name + ".failed"), f"{exc}\n")
        return
    children.append(child)
    safewrite.write_atomic(pid_file, f"{child.pid}\n")


def _take_requests(here: Path) -> list[Request]:
    """The pending requests, oldest first, each removed as it is read: this user's own
    regular files only (anything else is removed unread)."""
    taken = []
    for path in sorted(here.glob("*.request")):
        try:
            data = safewrite.read_own(path)
            taken.append(json.loads(data or b"null"))
        except Exception as exc:  # a bad request never ends the keeper
            print(f"keeper: {path.name} refused: {exc}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            path.unlink()
    return [t for t in taken if isinstance(t, dict)]


def serve(job: str) -> int:
    """The keeper's life: start what is asked, reap what ends, until Slurm ends the step."""
    here = safewrite.own_dir(folder(job))
    lock = safewrite.open_lock(here / "keeper.lock")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(KEEPER_ALREADY, flush=True)
        return 0
    me = ProcRef.capture(os.getpid())
    assert me is not None
    safewrite.write_atomic(here / "keeper.json", json.dumps(me.to_wire()))
    print(KEEPER_READY, flush=True)
    children: list[subprocess.Popen] = []
    while True:
        for wire in _take_requests(here):
            _start(wire, children)
        children = [c for c in children if c.poll() is None]
        time.sleep(POLL_S)
