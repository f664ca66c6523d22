"""This task's identity on the hosts it changes (host/agent/ownership.py): one for all of
its sessions, another for any other task, with the words another task's refusal says."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

from gpufleet.host.agent.protocol import Owner

_STARTED = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
_task_name = ["gpufleet"]


def name(task: str) -> None:
    """How other tasks' refusals name this one (`inv sweep`)."""
    _task_name[0] = task


def task_owner() -> Owner:
    """This task as the hosts it changes know it (host/agent/ownership.py): one identity
    for all its sessions, another for any other task."""
    control = socket.gethostname()
    return {"id": f"{control}:{os.getpid()}:{_STARTED}", "task": _task_name[0],
            "control": control, "pid": os.getpid(), "since": _STARTED}  # fmt: skip
