"""A simulated NVML with pynvml's API (the subset gpufleet and SGLang tooling use).

Importable as `pynvml` on simulated hosts (see `shim/`). Semantics follow real NVML on an
H200 (docs/FACTS.md, "NVML"): v1 `used` includes the driver's reserved memory, v2 `used` does not;
processes are listed with `usedGpuMemory` in bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from gpufleet.sim import gpustate, power

MIB = 1024 * 1024
nvmlMemory_v1 = 0x1000018
nvmlMemory_v2 = 0x2000028
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_LIBRARY_NOT_FOUND = 12

_initialized = 0


class NVMLError(Exception):
    _messages: ClassVar[dict[int, str]] = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    }

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._messages.get(self.value, f"Unknown Error {self.value}")


class NVMLError_Uninitialized(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_UNINITIALIZED)


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_INVALID_ARGUMENT)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


@dataclass
class _Handle:
    index: int


@dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass
class c_nvmlMemory_v2_t:
    version: int
    total: int
    reserved: int
    free: int
    used: int


@dataclass
class c_nvmlProcessInfo_t:
    pid: int
    usedGpuMemory: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


def _topology() -> gpustate.Topology:
    if not _initialized:
        raise NVMLError_Uninitialized()
    return gpustate.read_topology()


def nvmlInit() -> None:
    global _initialized
    try:
        gpustate.read_topology()
    except (RuntimeError, OSError, ValueError):
        raise NVMLError_LibraryNotFound() from None
    _initialized += 1


nvmlInitWithFlags = lambda flags=0: nvmlInit()  # noqa: E731


def nvmlShutdown() -> None:
    global _initialized
    if not _initialized:
        raise NVMLError_Uninitialized()
    _initialized -= 1


def nvmlSystemGetDriverVersion() -> str:
    return str(_topology()["driver"])


def nvmlSystemGetCudaDriverVersion() -> int:
    return int(_topology()["cuda"])


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion


def nvmlDeviceGetCount() -> int:
    return int(_topology()["count"])


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError_InvalidArgument()
    return _Handle(index)


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    return handle.index


def nvmlDeviceGetName(handle: _Handle) -> str:
    return str(_topology()["model"])


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return "GPU-" + _topology()["uuids"][handle.index]


def _used_bytes(index: int) -> int:
    return sum(a["mib"] for a in gpustate.live_allocations() if a["gpu"] == index) * MIB


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None):
    topo = _topology()
    total = topo["memory_mib"] * MIB
    reserved = topo["reserved_mib"] * MIB
    used = _used_bytes(handle.index)
    if version == nvmlMemory_v2:
        return c_nvmlMemory_v2_t(nvmlMemory_v2, total, reserved, total - reserved - used, used)
    return c_nvmlMemory_t(total=total, free=total - reserved - used, used=used + reserved)


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    _topology()
    by_pid: dict[int, int] = {}
    for alloc in gpustate.live_allocations():
        if alloc["gpu"] == handle.index:
            by_pid[alloc["pid"]] = by_pid.get(alloc["pid"], 0) + alloc["mib"] * MIB
    return [c_nvmlProcessInfo_t(pid, used) for pid, used in sorted(by_pid.items())]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetGraphicsRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    _topology()
    return []


# -- power, energy, load (sim/power.py publishes what the rehearsal server's work draws) --
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
_STALE_S = 1.0  # no fresh activity: the server is idle (or gone)


@dataclass
class c_nvmlUtilization_t:
    gpu: int
    memory: int


def _activity(index: int) -> gpustate.Activity:
    data = gpustate.read_activity(index)
    fresh = data and time.time() - data.get("t", 0) <= _STALE_S
    return data if fresh else {"extra_j": data.get("extra_j", 0.0) if data else 0.0}


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    """Milliwatts, as NVML: idle, or what the server's last steps drew."""
    _topology()
    return int(_activity(handle.index).get("power_w", power.IDLE_W) * 1000)


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
    """Millijoules since the simulated driver loaded: idle power all along plus the energy
    the server's work drew above idle. Never decreases."""
    _topology()
    idle_j = power.IDLE_W * (time.time() - gpustate.energy_epoch())
    return int((idle_j + _activity(handle.index).get("extra_j", 0.0)) * 1000)


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> c_nvmlUtilization_t:
    _topology()
    data = _activity(handle.index)
    return c_nvmlUtilization_t(int(data.get("sm_util", 0)), int(data.get("mem_util", 0)))


def nvmlDeviceGetClockInfo(handle: _Handle, clock_type: int) -> int:
    _topology()
    return 1980 if _activity(handle.index).get("sm_util", 0) else 345


# -- health (issue 25): an H200's healthy readings (docs/REFERENCE: the lent H200), with the
# faults the inventory or a test injects (gpus.json "faults": {"<index>": {field: value}}) --
NVML_ERROR_NOT_SUPPORTED = 3
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
CLOCK_EVENT_BITS = {
    "idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80,
}  # fmt: skip
NVMLError._messages[NVML_ERROR_NOT_SUPPORTED] = "Not Supported"


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


def _fault(handle: _Handle, name: str, default: Any) -> Any:
    faults = _topology().get("faults") or {}
    return (faults.get(str(handle.index)) or {}).get(name, default)


def nvmlDeviceGetPersistenceMode(handle: _Handle) -> int:
    return int(bool(_fault(handle, "persistence", True)))


def nvmlDeviceGetComputeMode(handle: _Handle) -> int:
    mode = _fault(handle, "compute_mode", "default")
    return {"default": 0, "prohibited": 2, "exclusive_process": 3}[mode]


def nvmlDeviceGetMigMode(handle: _Handle) -> list[int]:
    current = bool(_fault(handle, "mig", False))
    return [int(current), int(_fault(handle, "mig_pending", current))]


def nvmlDeviceGetEccMode(handle: _Handle) -> list[int]:
    current = bool(_fault(handle, "ecc", True))
    return [int(current), int(_fault(handle, "ecc_pending", current))]


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    return int(_fault(handle, "ecc_uncorrected", 0)) if error_type == 1 else 0


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    pending = int(bool(_fault(handle, "remap_pending", False)))
    failed = int(bool(_fault(handle, "remap_failed", False)))
    return (0, pending, pending, failed)


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    _topology()
    raise NVMLError_NotSupported()  # Hopper remaps rows instead, as on the real H200


def nvmlDeviceGetPowerManagementLimit(handle: _Handle) -> int:
    return int(_fault(handle, "power_limit_w", 700) * 1000)


nvmlDeviceGetEnforcedPowerLimit = nvmlDeviceGetPowerManagementLimit


def nvmlDeviceGetPowerManagementDefaultLimit(handle: _Handle) -> int:
    _topology()
    return 700_000


def nvmlDeviceGetApplicationsClock(handle: _Handle, clock_type: int) -> int:
    return int(_fault(handle, "sm_clock_app_mhz", 1980))


def nvmlDeviceGetDefaultApplicationsClock(handle: _Handle, clock_type: int) -> int:
    _topology()
    return 1980


def nvmlDeviceGetMaxClockInfo(handle: _Handle, clock_type: int) -> int:
    _topology()
    return 1980


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    busy = _activity(handle.index).get("sm_util", 0)
    bits = 0 if busy else CLOCK_EVENT_BITS["idle"]
    for name in _fault(handle, "clock_events", []):
        bits |= CLOCK_EVENT_BITS[name]
    return bits


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    default = int(30 + 0.06 * nvmlDeviceGetPowerUsage(handle) / 1000)
    return int(_fault(handle, "temperature_c", default))


def nvmlDeviceGetCurrPcieLinkGeneration(handle: _Handle) -> int:
    return int(_fault(handle, "pcie_gen", 5))


def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
    _topology()
    return 5


nvmlDeviceGetGpuMaxPcieLinkGeneration = nvmlDeviceGetMaxPcieLinkGeneration


def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
    return int(_fault(handle, "pcie_width", 16))


def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
    _topology()
    return 16


def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
    """An 8-GPU board has 18 links per GPU; a single GPU has none (Not Supported, as on the
    lent H200)."""
    if int(_topology()["count"]) < 2:
        raise NVMLError_NotSupported()
    if not 0 <= link < NVML_NVLINK_MAX_LINKS:
        raise NVMLError_InvalidArgument()
    return 0 if link in _fault(handle, "nvlink_down", []) else 1


@dataclass
class nvmlPciInfo_t:
    busId: str


def nvmlDeviceGetPciInfo(handle: _Handle) -> nvmlPciInfo_t:
    _topology()
    return nvmlPciInfo_t(bus_id(handle.index))


def bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def gpufleet_boot_id() -> str:
    """The simulated host's boot id (`boot_id` in its topology): changing it is a reboot."""
    return str(_topology().get("boot_id", "simulated-boot-1"))


def gpufleet_kernel_log() -> list[str]:
    """The simulated host's kernel log: an `xid` fault is the NVRM line a real driver writes
    (host/gpu/health.py reads this instead of dmesg on a simulated host)."""
    faults = _topology().get("faults") or {}
    lines = []
    for index, fault in sorted(faults.items()):
        for k, xid in enumerate(fault.get("xids", [])):  # the k-th a second later
            lines.append(
                f"[{100 + k:>5}.000000] NVRM: Xid (PCI:{bus_id(int(index))[4:]}): {xid}, "
                "pid=4242, name=python3, simulated"
            )
    return lines
