"""GPU verdicts from the agent's NVML snapshots: what "clean" means, and what holds a GPU."""

from __future__ import annotations

from gpufleet.readings import CleanAnswer, GpuReading


def gpu_verdict(gpu: GpuReading, tolerance_mib: int = 0) -> str:
    """`clean`, or what still holds the GPU (unattributed memory is named, never "fixed")."""
    hidden = [p for p in gpu.processes if not p.visible]
    if hidden:
        mib = sum(p.used_mib for p in hidden)
        pids = ",".join(str(p.pid) for p in hidden)
        return f"unattributed {mib} MiB (PID {pids} not visible on this host)"
    if not gpu.is_clean(tolerance_mib):
        pids = ",".join(str(p.pid) for p in gpu.processes) or "none listed"
        return f"busy {gpu.used_mib} MiB (PIDs {pids})"
    return "clean"


def dirty_gpus(gpus: list[GpuReading], tolerance_mib: int = 0) -> list[str]:
    """`GPU i: <verdict>` for every GPU that is not clean."""
    return [
        f"GPU {g.index}: {gpu_verdict(g, tolerance_mib)}"
        for g in gpus
        if gpu_verdict(g, tolerance_mib) != "clean"
    ]


def verdict_reason(result: CleanAnswer) -> str:
    """One line on why a gpu-clean answer is not clean."""
    dirty = dirty_gpus(result.gpus)
    survived = [str(k.pid) for k in result.killed if k.survived]
    parts = dirty[:3] + ([f"... {len(dirty) - 3} more"] if len(dirty) > 3 else [])
    if survived:
        parts.append(f"PIDs {','.join(survived)} survived SIGKILL")
    return "not clean after cleanup: " + "; ".join(parts or ["unknown reason"])


def killed_by_gpu(result: CleanAnswer) -> dict[int, list[int]]:
    """GPU index -> PIDs killed that held memory on it (from the snapshot before killing)."""
    killed = {k.pid for k in result.killed if k.killed}
    return {gpu.index: [p.pid for p in gpu.processes if p.pid in killed] for gpu in result.before}
