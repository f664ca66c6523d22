"""A process that must end with its Slurm job runs as a job step of its own (issue 51).

A server the agent started in its own session outlived the job that owned it: under
`proctrack/linuxproc` Slurm follows a step's processes by their parents, and a process whose
parent has exited belongs to no step. So on a node reached through Slurm, the server (and
the bench runner) is started by `srun --jobid J --overlap` as a step of the same job: its
process is slurmstepd's child, and when the job ends (scancel, time limit, preemption,
node failure) Slurm ends the step and everything under it, as it ends every step.

The `srun` that holds the step is detached from the agent (its parent is init at once),
so the agent's own step ending does not end it; the step's task writes its PID to a file
and `exec`s the program, so the process gpufleet signals, checks and records is the
program itself, with its own process group, as without Slurm. Killing the holding `srun`
ends the step too (measured on Slurm 22.05: SIGTERM and SIGKILL alike).

Standard library only (and the agent's login environment): this module ships.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpufleet.host.agent.loginenv import login_environment
from gpufleet.host.agent.protocol import STEP_NAMES
from gpufleet.host.proc import stepkeeper

# `$0` is the PID file, `$@` the program: the task's PID is the program's after the exec
_RECORD_AND_EXEC = 'echo $$ >"$0.tmp" && mv -f "$0.tmp" "$0" && exec "$@"'
START_TIMEOUT_S = 60.0
# what slurmstepd writes to the step's stderr when Slurm ends it (cancel, time limit, ...)
_ENDED = re.compile(r"\*\*\* (?:STEP|JOB) [\w.]+ ON \S+ CANCELLED AT .*?\*\*\*")


class StepNotStarted(RuntimeError):
    """srun did not start the step (its message is in the log)."""


@dataclass(frozen=True)
class JobStep:
    """Where a held process runs: the Slurm job and the node (its name in Slurm)."""

    job: str
    node: str
    name: str = STEP_NAMES["server"]  # what `squeue -s` calls the step

    @classmethod
    def of(cls, job: str | None, node: str | None, role: str = "server") -> JobStep | None:
        """The step a verb's process runs in, where the host is a node of a Slurm job;
        `role` (a key of STEP_NAMES) names it."""
        return cls(job, node, STEP_NAMES[role]) if job and node else None

    def argv(self, program: list[str], pid_file: Path) -> list[str]:
        """srun for one task on this node inside the job, beside whatever else runs there,
        taking the environment it is given (the program's own, already allow-listed)."""
        srun = shutil.which("srun", path=os.environ.get("PATH")) or "srun"
        return [srun, f"--jobid={self.job}", "--overlap", f"--nodelist={self.node}", "-N1",
                "-n1", "--export=ALL", "--quiet", f"--job-name={self.name}", "--", "/bin/sh",
                "-c", _RECORD_AND_EXEC,
                str(pid_file), *program]  # fmt: skip


def srun_env(env: dict[str, str]) -> dict[str, str]:
    """The program's environment for srun: no SLURM_* of the agent's own step (they would
    steer srun), the cluster's configuration file where the login named one."""
    clean = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    slurm_conf = login_environment()[0].get("SLURM_CONF")
    if slurm_conf:
        clean["SLURM_CONF"] = slurm_conf
    return clean


def spawn(
    step: JobStep,
    program: list[str],
    env: dict[str, str],
    out: IO[bytes],
    *,
    log: Path,
    pid_file: Path,
    stdin_file: Path | None = None,
    timeout: float = START_TIMEOUT_S,
) -> int:
    """Start `program` as a step of the job, its stdin read from `stdin_file`; its PID once
    it runs. Where the job's step keeper runs on this node (proctrack/cgroup: the control
    plane started it), the keeper starts it inside its own step (host/proc/stepkeeper.py).
    Else the holding srun is started in the background by a shell that exits at once, so
    its parent is init, not this agent, whose own step may end first."""
    if stepkeeper.running(step.job) is not None:
        try:
            return stepkeeper.request(step.job, program, env, log, pid_file=pid_file,
                                      stdin_file=stdin_file, timeout=timeout)  # fmt: skip
        except RuntimeError as exc:
            raise StepNotStarted(str(exc)) from None
    pid_file.unlink(missing_ok=True)
    holder_file = pid_file.with_name(pid_file.name + ".srun")
    holder = 'in=$1; shift; "$@" <"$in" & echo $! >"$0"'
    subprocess.run(
        ["/bin/sh", "-c", holder, str(holder_file), str(stdin_file or os.devnull),
         *step.argv(program, pid_file)],
        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
        start_new_session=True, close_fds=True, check=True,
    )  # fmt: skip
    return _wait_for_pid(pid_file, int(holder_file.read_text()), timeout)


def _wait_for_pid(pid_file: Path, holder: int, timeout: float) -> int:
    """The task's PID from its file; StepNotStarted as soon as the holding srun has ended
    without one (a job that ended, a node not in it: srun's own line is in the log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            pass
        if not _running(holder):
            time.sleep(0.1)  # the task may have written it as srun ended
            if not pid_file.exists():
                raise StepNotStarted("srun ended before the job step started")
        time.sleep(0.05)
    raise StepNotStarted(f"srun did not start the job step within {timeout:g} s")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def why_ended(log_lines: list[str]) -> str | None:
    """Slurm's own line saying it ended the step (`*** STEP 12.3 ON n2 CANCELLED AT ...
    DUE TO TIME LIMIT ***`), the last in the log; None where Slurm wrote none."""
    found = [m.group(0) for line in log_lines for m in _ENDED.finditer(line)]
    return found[-1] if found else None
