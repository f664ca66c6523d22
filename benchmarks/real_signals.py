"""Issue 34/35's signals on a real GPU host (run on the lent H200, as root): the XID ledger's
boot id and verdicts through real NVML and the real kernel log, the telemetry sampler's child
process reading real NVML (rows per second, no thread in the client), and the bootstrap's
walk of every directory under a real torch venv's sys.path.

    python benchmarks/real_signals.py [PYTHON]   # PYTHON: the interpreter to walk
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")


def main() -> None:
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    from gpufleet.host.bench import telemetry
    from gpufleet.host.gpu import health as gpuhealth
    from gpufleet.host.gpu import nvml as nvmlread

    os.chdir(tempfile.mkdtemp(prefix="gpufleet-signals-"))  # the ledger lives in the workdir
    nvml = nvmlread.load_pynvml()
    readings = nvmlread.snapshot(nvml)
    started = time.perf_counter()
    gpuhealth.attach(nvml, readings, remember_xids=True)
    print(json.dumps({
        "boot_id": gpuhealth._boot_id(nvml),
        "kernel_log_readable": gpuhealth._kernel_log(nvml) is not None,
        "verdicts": {g.index: [g.health.verdict, g.health.reasons, g.health.xids,
                               g.health.fatal_xids] for g in readings},
        "health_read_ms": round((time.perf_counter() - started) * 1000, 1),
        "ledger": json.loads(gpuhealth.XID_LEDGER.read_text()) if gpuhealth.XID_LEDGER.exists()
        else None,
    }))  # fmt: skip
    threads = threading.active_count()
    gpus = [g.index for g in readings]
    with telemetry.Sampler(nvml, gpus, 0.1) as gauge:
        during = threading.active_count()
        time.sleep(3.0)
    rounds = len({r["round"] for r in gauge.rows})
    print(json.dumps({"sampler_rounds_in_3s_at_0.1s": rounds, "rows": len(gauge.rows),
                      "threads_before": threads, "threads_during": during,
                      "power_w": [r["power_w"] for r in gauge.rows[:2]]}))  # fmt: skip
    code = (
        "import os, sys, time; sys.path.insert(0, sys.argv[1]); "
        "from gpufleet.control.agent import bootstrap; "
        "t = time.perf_counter(); bootstrap.module_directories(0); "
        "roots = {p for p in sys.path if os.path.isdir(p)}; "
        "n = len({d for r in roots for d, _, _ in os.walk(r)}); "
        "print(time.perf_counter() - t, n)"
    )
    walks = []
    for _ in range(5):
        out = subprocess.run([python, "-I", "-c", code, SRC], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-2000:])
            break
        seconds, count = out.stdout.split()
        walks.append(float(seconds))
    if walks:
        print(json.dumps({"python": python, "bootstrap_walk_ms_median": round(
            sorted(walks)[len(walks) // 2] * 1000, 1), "walks_ms": [round(w * 1000, 1)
            for w in walks], "directories": int(count)}))  # fmt: skip


if __name__ == "__main__":
    main()
