"""`connection: srun` beside SSH (issue 39): the same agent verbs to the same simulated
hosts, through a real Slurm (three slurmds on this machine) and through a real loopback
sshd.

- a session's start (the host python judged, the agent started), first call and close:
  wall and control-plane CPU, median of 5;
- one `echo` call on a started session: wall (median of 200) and CPU per call (a session
  of 40 calls less one of none, over 40);
- `inv gpu-clean` on 3 hosts, the whole CLI: wall and CPU with its children (srun runs
  here, on the control machine, so its CPU is the control plane's), median of 5.

CPU is this process's plus its waited children's (`srun`), from getrusage.

    python benchmarks/srun_vs_ssh.py
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _fleet import BenchFleet

from gpufleet.control.connect.pool import open_session
from gpufleet.control.inventory.model import load_inventory
from gpufleet.host.agent.protocol import EchoArgs
from gpufleet.sim.slurm_cluster import LocalSlurm

CALLS = 200


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e3:.1f} ms"


def _srun_inventory(fleet: BenchFleet, job: str, nodes: list[str]) -> Path:
    data = yaml.safe_load(fleet.inventory.read_text())
    data["defaults"] = {"connection": "srun", "slurm_job": job,
                        "python": data["defaults"]["python"], "gpus": data["defaults"]["gpus"]}  # fmt: skip
    for name, node in zip(sorted(data["hosts"]), nodes, strict=True):
        fields = data["hosts"][name]
        data["hosts"][name] = {"address": node, "workdir": fields["workdir"]}
    path = fleet.root / "srun.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _session(host, calls: int, walls: list[float]) -> tuple[float, float]:
    """(wall, CPU) of a session's start, its first call, `calls` more and its close; CPU
    with the children it waited for (srun's processes end with the session)."""
    cpu, t = _cpu(), time.perf_counter()
    session = open_session(host)
    session.call(EchoArgs(payload={"n": 0}))
    started = time.perf_counter() - t
    for i in range(calls):
        t0 = time.perf_counter()
        session.call(EchoArgs(payload={"n": i}))
        walls.append(time.perf_counter() - t0)
    session.close()
    return started, _cpu() - cpu


def _sessions(inventory: Path, label: str) -> None:
    [host] = load_inventory(inventory).select("h00")
    starts, start_cpu, calls, call_cpu = [], [], [], []
    many = CALLS // 5
    for _ in range(5):
        wall, one = _session(host, 0, [])
        _, more = _session(host, many, calls)
        starts.append(wall)
        start_cpu.append(one)
        call_cpu.append((more - one) / many)
    print(f"{label}: session start + first call + close {_ms(starts)} wall, {_ms(start_cpu)} "
          f"CPU; per echo call {_ms(calls)} wall (p90 {statistics.quantiles(calls, n=10)[-1] * 1e3:.1f}"
          f" ms), {statistics.median(call_cpu) * 1e3:.2f} ms CPU")  # fmt: skip


def _task(inventory: Path, label: str) -> None:
    walls, cpus = [], []
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "gpufleet", "gpu-clean", "--inventory", str(inventory)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if out.returncode != 0:
            raise SystemExit(f"{label} gpu-clean failed: {out.stderr}")
    print(f"{label}: inv gpu-clean on 3 hosts {statistics.median(walls):.2f} s wall, "
          f"{statistics.median(cpus):.2f} s CPU (CLI and its children)")  # fmt: skip


def main() -> None:
    fleet = BenchFleet(3)
    cluster = LocalSlurm(Path(tempfile.mkdtemp(prefix="gpufleet-slurm-"))).start()
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        job = cluster.submit("-N3")
        cluster.wait_running(job)
        srun = _srun_inventory(fleet, job, cluster.node_names)
        print(f"{os.cpu_count()} cores; Slurm {cluster.run('sinfo', '-V').strip()}, "
              f"{len(cluster.node_names)} slurmds; 1 loopback sshd")  # fmt: skip
        for inventory, label in ((fleet.inventory, "ssh "), (srun, "srun")):
            _task(inventory, label)  # first: uploads the agent (sbcast for srun)
            _sessions(inventory, label)
            _task(inventory, label)
    finally:
        cluster.stop()
        fleet.close()


if __name__ == "__main__":
    main()
