"""On a machine with an NVIDIA GPU: gpu-clean wall time with N real GPU-holding processes.

Starts N torch processes (1 GiB each, one CUDA context each) on GPU 0, runs the real CLI
(`gpufleet gpu-clean`, connection: local), and prints the time from start to verified clean
and NVML v1/v2 readings before and after. Run: python benchmarks/gpu_clean_real.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pynvml
import yaml

HOLDER = (
    "import sys, time, torch; x = torch.empty(1024 * 2**20, dtype=torch.uint8, device='cuda'); "
    "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(3600)"
)


def reading() -> str:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h).used // 2**20
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    procs = len(pynvml.nvmlDeviceGetComputeRunningProcesses(h))
    pynvml.nvmlShutdown()
    return f"v1 used {v1} MiB, v2 used {v2.used // 2**20} MiB, reserved {v2.reserved // 2**20} MiB, {procs} processes"


def main() -> None:
    root = Path(tempfile.mkdtemp())
    inventory = root / "local.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "local": {
                        "connection": "local",
                        "python": sys.executable,
                        "workdir": str(root / "work"),
                    }
                }
            }
        )
    )
    print(f"idle: {reading()}")
    for n in (1, 4, 8, 16):
        procs = [
            subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
            for _ in range(n)
        ]
        for p in procs:
            p.stdout.readline()
        held = reading()
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "gpufleet", "gpu-clean", "--inventory", str(inventory)],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        for p in procs:
            p.wait()
        verdict = "verified clean" if "verified clean" in out.stdout else "NOT CLEAN"
        print(
            f"N={n:2d}: gpu-clean {wall:.2f}s -> {verdict} (rc {out.returncode}); "
            f"held: {held}; after: {reading()}"
        )


if __name__ == "__main__":
    main()
