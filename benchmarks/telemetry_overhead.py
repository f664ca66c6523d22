"""Does GPU sampling disturb the load generator? Client CPU per streamed token and output
throughput at C=64 against the rehearsal server (TP 8, 8 simulated GPUs, zero-cost model:
the client and server compete for the CPU, so any disturbance shows), with the
telemetry sampler off and on (0.5 s, all 8 GPUs), alternating, median of 5 each.

    python benchmarks/telemetry_overhead.py
    GPUFLEET_REAL_NVML=1 python benchmarks/telemetry_overhead.py   # sample the real GPUs
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _simserver import BenchServer

from gpufleet.host.bench import telemetry
from gpufleet.host.bench.loadgen import Prompt, run_async, run_level
from gpufleet.host.bench.metrics import summarize
from gpufleet.host.gpu import nvml as nvmlread

C, N, OUT = 64, 256, 256


def one(url: str, sampled: bool, gpus: list[int]) -> tuple[float, float, int]:
    prompts = [Prompt(text="write a function " * 20, output_len=OUT) for _ in range(N)]
    gauge = telemetry.Sampler(nvmlread.load_pynvml(), gpus, 0.5) if sampled else None
    cpu0 = time.process_time()
    if gauge:
        with gauge:
            run = run_async(run_level(url, prompts, C))
    else:
        run = run_async(run_level(url, prompts, C))
    cpu = time.process_time() - cpu0
    s = summarize(run, "sglang")
    samples = len(gauge.rows) if gauge else 0
    return cpu / s["total_output_tokens"] * 1e6, s["output_throughput"], samples


def main() -> None:
    server = BenchServer("--tp-size", "8", "--sim-zero-cost")  # CPU-bound: the strictest case
    try:
        if os.environ.get("GPUFLEET_REAL_NVML") == "1":  # a GPU machine: real NVML calls
            gpus = list(range(nvmlread.load_pynvml().nvmlDeviceGetCount()))
        else:
            nvmlread.activate_simulation(
                {"state_dir": str(server.state), "count": 8}, "bench"
            )  # this process reads the same simulated GPUs the server draws power on
            gpus = list(range(8))
        results: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
        one(server.url, False, gpus)  # warm the server and the client
        for _ in range(5):
            for sampled in (False, True):
                results[sampled].append(one(server.url, sampled, gpus))
        for sampled, rows in results.items():
            cpu = statistics.median(r[0] for r in rows)
            tput = statistics.median(r[1] for r in rows)
            print(
                f"telemetry {'on ' if sampled else 'off'}: client CPU {cpu:.2f} us/token, "
                f"{tput:.1f} tok/s (median of 5), {rows[0][2]} GPU samples per level"
            )
        off, on = (statistics.median(r[1] for r in results[k]) for k in (False, True))
        print(f"throughput with telemetry / without: {on / off:.4f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
