"""Helpers for tests/gpu: NVML readings, recorded figures, processes holding GPU memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

FIGURES = Path(os.environ.get("GPUFLEET_GPU_FIGURES", "/tmp/gpufleet-gpu-figures.json"))


def nvidia_driver() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def gpu_count() -> int:
    """NVML's GPU count; 0 where NVML does not answer (the tiers are skipped there)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count
    except Exception:
        return 0


def held_mib() -> dict[int, dict[int, int]]:
    """PID -> {GPU index -> MiB it holds there}, over every GPU, as NVML reads them."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out: dict[int, dict[int, int]] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                out.setdefault(p.pid, {})[i] = (p.usedGpuMemory or 0) // 2**20
        return out
    finally:
        pynvml.nvmlShutdown()


def record(key: str, value) -> None:
    """Keep a measured figure for docs/GPU-VALIDATION.md."""
    data = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    data[key] = value
    FIGURES.write_text(json.dumps(data, indent=2))


def nvml_memory() -> list[dict]:
    import pynvml

    pynvml.nvmlInit()
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        out.append(
            {
                "v1_used_mib": v1.used // 2**20,
                "v2_used_mib": v2.used // 2**20,
                "v2_reserved_mib": v2.reserved // 2**20,
                "pids": [p.pid for p in procs],
            }
        )
    pynvml.nvmlShutdown()
    return out


HOLDER = r"""
import os, subprocess, sys, time, torch
mode, mib = sys.argv[1], int(sys.argv[2])
x = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
if mode == "freed":
    del x
    torch.cuda.empty_cache()
pids = [os.getpid()]
if mode == "parent":
    child = subprocess.Popen([sys.executable, __file__, "leaf", str(mib // 2)], stdout=subprocess.PIPE, text=True)
    pids += [int(p) for p in child.stdout.readline().split()[1:]]
print("ready", *pids, flush=True)
time.sleep(3600)
"""


@pytest.fixture
def gpu_host(tmp_path):
    """An inventory for this machine (connection: local) and a way to start GPU holders."""
    import pynvml

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    inventory = tmp_path / "local.yaml"

    def write(expected: int = count) -> Path:
        inventory.write_text(
            yaml.safe_dump(
                {
                    "hosts": {
                        "local": {
                            "connection": "local",
                            "python": sys.executable,
                            "workdir": str(tmp_path / "work"),
                            "gpus": {"count": expected},
                        }
                    }
                }
            )
        )
        return inventory

    write()
    # Readable by the second user too (pytest's tmp_path is 0700).
    shared = Path(tempfile.mkdtemp(prefix="gpufleet-gpu-"))
    shared.chmod(0o755)
    script = shared / "holder.py"
    script.write_text(HOLDER)
    script.chmod(0o644)
    started: list[subprocess.Popen] = []

    def hold(mode: str, mib: int, user: int | None = None, session: bool = False):
        def demote():
            if user is not None:
                os.setgid(user)
                os.setuid(user)

        proc = subprocess.Popen(
            [sys.executable, str(script), mode, str(mib)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=session,
            preexec_fn=demote if user is not None else None,
        )
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", f"holder {mode} failed to start"
        started.append(proc)
        return proc, [int(p) for p in line[1:]]

    class Host:
        pass

    h = Host()
    h.inventory = inventory
    h.count = count
    h.write = write
    h.hold = hold
    h.script = script
    yield h
    for proc in started:
        proc.kill()
        proc.wait()
    time.sleep(0.5)
