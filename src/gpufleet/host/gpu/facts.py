"""GPU and host facts: NVML read until GPUs are clean, the host facts every run archives
(sysinfo), and the transport self-test (echo). gpu-clean itself is host/clean.py."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from pathlib import Path

from gpufleet.host.agent.protocol import (
    AgentError,
    EchoAnswer,
    EchoArgs,
    VerbArgs,
)
from gpufleet.host.gpu import health as gpuhealth
from gpufleet.host.gpu import nvml as nvmlread
from gpufleet.host.proc import gpuprocs as procs
from gpufleet.kinds import Kind
from gpufleet.readings import (
    GpuCheck,
    GpuFacts,
    GpuReading,
    SysInfo,
)


def check_count(gpus: list[GpuReading], expected: int | None) -> None:
    if expected is not None and len(gpus) != expected:
        raise AgentError(f"expected {expected} GPUs, NVML sees {len(gpus)}", kind=Kind.GPU_COUNT)


def annotate(gpus: list[GpuReading]) -> None:
    """Attach /proc's details to NVML's PIDs; PIDs this host cannot see are unattributed."""
    for gpu in gpus:
        for entry in gpu.processes:
            info = procs.describe_pid(entry.pid)
            entry.visible = info is not None
            if info:
                entry.user, entry.name, entry.cmdline = info.user, info.name, info.cmdline
                entry.age_s, entry.ppid = info.age_s, info.ppid


def wait_gpus_clean(
    indexes: list[int], timeout_s: float, tolerance_mib: int = 0,
    kept: frozenset[int] = frozenset(),
) -> GpuCheck:  # fmt: skip
    """Poll NVML until the given GPUs read 0 MiB (v2 used) with no process, but for the
    processes in `kept` (servers that share a GPU and run on: theirs is the memory left);
    report them."""
    nvml = nvmlread.load_pynvml()
    started = time.monotonic()

    def clean(gpu: GpuReading) -> bool:
        if gpu.is_clean(tolerance_mib):
            return True
        return bool(gpu.processes) and all(p.pid in kept for p in gpu.processes)

    while True:
        snap = [g for g in nvmlread.snapshot(nvml) if g.index in indexes]
        clean_now = all(clean(g) for g in snap)
        if clean_now or time.monotonic() - started >= timeout_s:
            break
        time.sleep(0.2)
    annotate(snap)
    return GpuCheck(clean=clean_now, gpus=snap, elapsed_s=round(time.monotonic() - started, 3))


def _versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Each distribution's version as the host python's normal start would import it: read
    from its site directories' metadata (the agent runs under -S, and imports none of it)."""
    from importlib import metadata

    from gpufleet.host.agent.trust import site_directories

    path = [*sys.path, *site_directories()]
    found: dict[str, str | None] = dict.fromkeys(names)
    for dist in metadata.distributions(path=path):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in found and found[name] is None:
            found[name] = dist.version
    return found


PACKAGES = ("sglang", "torch", "flashinfer-python", "psutil", "nvidia-ml-py", "aiohttp")


def sysinfo(args: VerbArgs) -> SysInfo:
    info = SysInfo(
        hostname=socket.gethostname(),
        kernel=platform.release(),
        python=sys.version.split()[0],
        python_executable=sys.executable,
        uid=os.geteuid(),
        packages=_versions(PACKAGES),
        simulated=bool(args.sim),
        cpu_governor=cpu_governor(),
    )
    try:
        nvml = nvmlread.load_pynvml()
    except AgentError as exc:
        info.nvml_error = str(exc)
        return info
    snap = nvmlread.snapshot(nvml)
    gpuhealth.attach(nvml, snap, remember_xids=False)
    info.driver, info.cuda = nvmlread.driver_versions(nvml)
    info.gpus = [GpuFacts.of(g) for g in snap]
    return info


def cpu_governor() -> str | None:
    """The CPU frequency governor (powersave slows the client and the server's scheduler)."""
    try:
        return Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()
    except OSError:
        return None


def echo(args: EchoArgs) -> EchoAnswer:
    """Return the payload as received, with argv and cwd: a transport self-test."""
    return {"payload": args.payload, "argv": sys.argv[1:], "cwd": os.getcwd()}
