"""What one agent session costs on a host (issue 50): wall time and CPU (user + system, the
agent and every process it ran) from the remote command to the answer of one verb.

Each session is what a task does on a host: the host python judged (the first session only
in a process; later sessions of a task reuse the verdict), the bootstrap's walk of the
workdir and of the directories later imports read from, the agent from the zip, one `echo`
and one `status` on a simulated 8-GPU host (NVML and the process table read). Sessions run
over `connection: local`, so SSH's own cost is left out. Run it on two commits to compare:

    python benchmarks/agent_start.py [PYTHON] [SESSIONS]   # default: the tests' host venv, 10
"""

from __future__ import annotations

import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _fleet import host_python

from gpufleet.control.connect.pool import open_session
from gpufleet.control.inventory.model import load_inventory
from gpufleet.host.agent.protocol import EchoArgs, StatusArgs


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    python = sys.argv[1] if len(sys.argv) > 1 else host_python()
    sessions = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    root = Path(tempfile.mkdtemp(prefix="gpufleet-agent-start-"))
    inventory = root / "local.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {"h": {
        "connection": "local", "python": python, "workdir": str(root / "work"),
        "gpus": {"count": 8, "simulated": True}}}}))  # fmt: skip
    [host] = load_inventory(inventory).select("all")
    walls, cpus = [], []
    for _ in range(sessions + 1):  # the first uploads the agent: not counted
        started, cpu = time.perf_counter(), _cpu()
        session = open_session(host)
        session.call(EchoArgs(payload={}))
        session.call(StatusArgs())
        session.close()
        walls.append(time.perf_counter() - started)
        cpus.append(_cpu() - cpu)
    walls, cpus = walls[1:], cpus[1:]
    print(f"python: {python}")
    print(f"sessions: {sessions} (echo + status each, connection: local)")
    print(f"wall per session: median {statistics.median(walls) * 1e3:.0f} ms "
          f"(range {min(walls) * 1e3:.0f}-{max(walls) * 1e3:.0f})")  # fmt: skip
    print(f"agent CPU per session (user+sys, with its children): median "
          f"{statistics.median(cpus) * 1e3:.0f} ms (range {min(cpus) * 1e3:.0f}-"
          f"{max(cpus) * 1e3:.0f})")  # fmt: skip


if __name__ == "__main__":
    main()
