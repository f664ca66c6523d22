"""Read GPU state through NVML: real pynvml, or the simulated one on rehearsal hosts.

"Reads 0 MiB" means NVML v2 `used` (v1 includes ~615 MiB driver reservation on an
idle H200 and would never pass) plus an empty process list.
"""

from __future__ import annotations

from typing import Any

from gpufleet.host.agent import simulation
from gpufleet.host.agent.protocol import AgentError, SimGpus
from gpufleet.kinds import Kind
from gpufleet.readings import GpuProcess, GpuReading

MIB = 1024 * 1024


def activate_simulation(sim: SimGpus, host: str) -> None:
    """Make `import pynvml` read the simulated GPUs (the rehearsal engine, through the
    agent's seam: host/agent/simulation.py)."""
    simulation.provider().activate(sim, host)


def load_pynvml() -> Any:
    try:
        import pynvml  # the zip brings it (control/agent/bundle.py: VENDORED)
    except ImportError:  # only where gpufleet runs outside its zip without nvidia-ml-py
        raise AgentError("nvidia-ml-py is missing (import pynvml failed)",
                         kind=Kind.MISSING_PACKAGE) from None  # fmt: skip
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise AgentError("no NVIDIA driver (NVML library not found)", kind=Kind.NO_DRIVER) from None
    except pynvml.NVMLError as exc:
        raise AgentError(f"NVML failed to initialise: {exc}", kind=Kind.NO_DRIVER) from None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _processes(nvml: Any, handle: Any) -> dict[int, int]:
    """PID -> bytes from the compute and graphics lists (a PID may appear in both)."""
    out: dict[int, int] = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            entries = getattr(nvml, getter)(handle)
        except nvml.NVMLError:
            continue
        for entry in entries:
            used = entry.usedGpuMemory
            used = 0 if used is None or used >= 2**63 else int(used)
            out[int(entry.pid)] = max(out.get(int(entry.pid), 0), used)
    return out


def uuids(nvml: Any) -> list[str]:
    """Every GPU's UUID, by NVML index (what CUDA_VISIBLE_DEVICES may name a GPU by)."""
    count = nvml.nvmlDeviceGetCount()
    return [_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]


def snapshot(nvml: Any) -> list[GpuReading]:
    """One reading per GPU: index, uuid, name, v1/v2 memory in MiB, processes."""
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        v1 = nvml.nvmlDeviceGetMemoryInfo(handle)
        v2 = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        procs = _processes(nvml, handle)
        gpus.append(
            GpuReading(
                index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                name=_text(nvml.nvmlDeviceGetName(handle)),
                total_mib=round(v2.total / MIB),
                used_mib=round(v2.used / MIB),
                reserved_mib=round(v2.reserved / MIB),
                v1_used_mib=round(v1.used / MIB),
                processes=[GpuProcess(pid, round(used / MIB)) for pid, used in procs.items()],
            )
        )
    return gpus


def driver_versions(nvml: Any) -> tuple[str, str | None]:
    """(driver, CUDA version the driver supports, as 13.0)."""
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    try:
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
    except (nvml.NVMLError, AttributeError):
        return driver, None
    return driver, f"{cuda // 1000}.{cuda % 1000 // 10}"
