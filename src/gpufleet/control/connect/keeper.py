"""The control plane's part of a Slurm job's step keeper (host/proc/stepkeeper.py): the
srun that holds its step, started on this machine and left running in its own session, as
the step must outlive this task. Used where Slurm tracks steps by cgroup."""

from __future__ import annotations

import subprocess
import tempfile
import time

from gpufleet.control.inventory.slurm import step_env
from gpufleet.errors import HostError
from gpufleet.host.agent import protocol
from gpufleet.kinds import Kind

# the srun holding each keeper's step: it runs on after this process, as the step must
_KEEPER_HOLDERS: list[subprocess.Popen] = []
START_TIMEOUT_S = 60.0


def start(argv: list[str], job: str, node: str) -> None:
    """Start the job's step keeper on the host's node, held by an srun of this machine in
    its own session (it outlives this task and ends when the job ends or it is killed);
    returns once the keeper says it runs, or one already ran. HostError with srun's own
    words where the step did not start."""
    with tempfile.TemporaryFile() as said:
        holder = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL,
            stdout=said, stderr=subprocess.STDOUT, env=step_env(), start_new_session=True,
        )  # fmt: skip
        _KEEPER_HOLDERS.append(holder)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            said.seek(0)
            text = said.read().decode(errors="replace")
            if protocol.KEEPER_READY in text or protocol.KEEPER_ALREADY in text:
                return
            if holder.poll() is not None:
                last = (text.strip().splitlines() or [f"exit {holder.returncode}"])[-1]
                raise HostError(f"cannot start the step keeper of Slurm job {job} "
                                f"on {node}: {last}", Kind.CONNECTION)  # fmt: skip
            time.sleep(0.1)
        holder.kill()
        raise HostError(f"the step keeper of Slurm job {job} did not start on "
                        f"{node} within {START_TIMEOUT_S:g} s", Kind.CONNECTION)  # fmt: skip
