"""The simulated GPUs of one host: a directory the simulated NVML reads.

Layout of `$GPUFLEET_SIM_STATE`:
    gpus.json                 topology: count, model, memory, reserved, driver
    alloc/<pid>.<gpu>.json    one allocation: pid, its start time, gpu index, MiB
    procs/<pid>.json          a process that lives on this simulated host (see join_host)

An allocation counts only while its process is alive (same PID *and* same start time,
not a zombie), so killing a process really frees its "GPU memory". `foreign` allocations
stand for processes NVML reports but this host cannot see (another container): they
count until removed, like real unattributed memory.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from gpufleet.host.agent.procstat import ProcRef

# a name for annotations only: importing the protocol cost every simulated process's start
# 20 ms (each SGLang-like holder: nine per 8-GPU rehearsal server)
if TYPE_CHECKING:
    from gpufleet.host.agent.protocol import GpuFault

STATE_ENV = "GPUFLEET_SIM_STATE"


class Topology(TypedDict):
    """gpus.json: the simulated GPUs, one host's."""

    count: int
    model: str
    memory_mib: int
    reserved_mib: int
    driver: str
    cuda: int
    uuids: list[str]
    faults: dict[str, GpuFault]  # GPU index (as a string) -> its faults
    boot_id: str


class Allocation(TypedDict):
    """alloc/<pid>.<gpu>.json: memory a process holds on one GPU."""

    pid: int
    started: float | None  # the process's start time; None for a foreign allocation
    gpu: int
    mib: int
    foreign: bool


class Activity(TypedDict, total=False):
    """activity/<gpu>.json: what a simulated server's work did to the GPU lately."""

    t: float  # when it was written (older than sim/nvml_sim's window: idle)
    extra_j: float  # energy above idle since the driver loaded
    power_w: float
    sm_util: int
    mem_util: int


def state_dir(path: str | os.PathLike[str] | None = None) -> Path:
    raw = path or os.environ.get(STATE_ENV)
    if not raw:
        raise RuntimeError(f"{STATE_ENV} is not set: no simulated GPUs on this host")
    return Path(raw)


def _write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def ensure_topology(
    path: str | os.PathLike[str],
    *,
    count: int,
    model: str = "NVIDIA H200",
    memory_mib: int = 143771,
    reserved_mib: int = 615,
    host: str = "sim",
    faults: dict[str, GpuFault] | None = None,
    boot_id: str | None = None,
) -> Topology:
    """Create or update gpus.json; allocations already registered are kept."""
    root = Path(path)
    topo: Topology = {
        "count": count,
        "model": model,
        "memory_mib": memory_mib,
        "reserved_mib": reserved_mib,
        "driver": "580.95.05",
        "cuda": 13000,
        "uuids": [str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{host}/gpu{i}")) for i in range(count)],
        "faults": faults or {},  # index -> health faults the simulated NVML reports (issue 25)
        "boot_id": boot_id or "simulated-boot-1",  # a new one is a reboot (host/gpu/health.py)
    }
    current = root / "gpus.json"
    try:
        if json.loads(current.read_text()) == topo:
            return topo
    except (OSError, ValueError):
        pass
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_json_atomic(current, topo)
    return topo


def read_topology(path: str | os.PathLike[str] | None = None) -> Topology:
    return json.loads((state_dir(path) / "gpus.json").read_text())


def _start_time(pid: int) -> float | None:
    """Process start time in clock ticks since boot; None for a gone or zombie process."""
    ref = ProcRef.capture(pid)
    return None if ref is None else float(ref.start_ticks)


def host_pid() -> int:
    """This process's PID as the host sees it, which is what NVML reports: inside a PID
    namespace (a container) os.getpid() is the namespace's own number, /proc/self (of
    the host's procfs) still names the host's."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


def register(
    gpu: int,
    mib: int,
    pid: int | None = None,
    path: str | os.PathLike[str] | None = None,
    *,
    foreign: bool = False,
) -> Path:
    """Record that `pid` (default: this process) holds `mib` MiB on GPU `gpu`."""
    pid = host_pid() if pid is None else pid
    started = None if foreign else _start_time(pid)
    if not foreign and started is None:
        raise ProcessLookupError(f"no live process {pid} to hold simulated GPU memory")
    record: Allocation = {
        "pid": pid,
        "started": started,
        "gpu": gpu,
        "mib": int(mib),
        "foreign": foreign,
    }
    if not foreign:
        join_host(pid, path)
    target = state_dir(path) / "alloc" / f"{pid}.{gpu}.json"
    _write_json_atomic(target, record)
    return target


def release(pid: int | None = None, path: str | os.PathLike[str] | None = None) -> None:
    pid = host_pid() if pid is None else pid
    for file in (state_dir(path) / "alloc").glob(f"{pid}.*.json"):
        file.unlink(missing_ok=True)


def live_allocations(path: str | os.PathLike[str] | None = None) -> list[Allocation]:
    """Allocations whose process is alive; stale files of dead processes are swept."""
    out: list[Allocation] = []
    alloc_dir = state_dir(path) / "alloc"
    for file in sorted(alloc_dir.glob("*.json")):
        try:
            record = json.loads(file.read_text())
        except (OSError, ValueError):
            continue
        if record.get("foreign"):
            out.append(record)
            continue
        if _start_time(record["pid"]) == record["started"]:
            out.append(record)
        else:
            file.unlink(missing_ok=True)
    return out


def join_host(pid: int | None = None, path: str | os.PathLike[str] | None = None) -> None:
    """Declare that `pid` (default: this process) runs on this simulated host.

    Several simulated hosts can share one machine; gpu-clean's search for stale servers by
    command line must only see its own host's processes. (The environment cannot tell:
    setproctitle, which SGLang uses, overwrites /proc/PID/environ.)
    """
    pid = host_pid() if pid is None else pid
    started = _start_time(pid)
    if started is None:
        raise ProcessLookupError(f"no live process {pid}")
    _write_json_atomic(state_dir(path) / "procs" / f"{pid}.json", {"pid": pid, "started": started})


def host_pids(path: str | os.PathLike[str] | None = None) -> set[int]:
    """Live processes that joined this simulated host; stale entries are swept."""
    out = set()
    for file in (state_dir(path) / "procs").glob("*.json"):
        try:
            record = json.loads(file.read_text())
        except (OSError, ValueError):
            continue
        if _start_time(record["pid"]) == record["started"]:
            out.add(record["pid"])
        else:
            file.unlink(missing_ok=True)
    return out


def write_activity(gpu: int, data: Activity, path: str | os.PathLike[str] | None = None) -> None:
    """What a simulated server's work does to GPU `gpu` (power, energy above idle, load)."""
    _write_json_atomic(state_dir(path) / "activity" / f"{gpu}.json", data)


def read_activity(gpu: int, path: str | os.PathLike[str] | None = None) -> Activity:
    try:
        return json.loads((state_dir(path) / "activity" / f"{gpu}.json").read_text())
    except (OSError, ValueError):
        return {}


def energy_epoch(path: str | os.PathLike[str] | None = None) -> float:
    """When the simulated driver "loaded": the energy counter counts idle power from here."""
    file = state_dir(path) / "energy_epoch"
    try:
        return float(file.read_text())
    except (OSError, ValueError):
        _write_json_atomic(file, time.time())
        return float(file.read_text())
