"""Calibration of the rehearsal server against the seeds, measured over real HTTP.

Targets (seeds): baseline ~60 tok/s per request at C=1 and ~780 tok/s total at C=64;
EAGLE-3 ~80 tok/s per request at C=1 and ~350 tok/s total at C=64. Also the server's own
ceiling with a zero-cost timing model: streamed tokens per second of server CPU (one core).

    python benchmarks/sim_calibration.py
"""

from __future__ import annotations

import asyncio

from _simserver import BenchServer

from gpufleet.host.bench.loadgen import Prompt, run_level
from gpufleet.host.bench.metrics import summarize

PROFILES = {
    "baseline": [],
    "eagle3": [  # playbooks/eagle3.yaml's speculation: steps 3, topk 4, 16 draft tokens
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "4",
        "--speculative-num-draft-tokens",
        "16",
        "--max-running-requests",
        "64",
    ],
}


def level(url: str, concurrency: int, prompts: int, output_len: int) -> dict:
    ps = [Prompt(text="def f(x): return x" * 8, output_len=output_len) for _ in range(prompts)]
    run = asyncio.run(run_level(url, ps, concurrency))
    return summarize(run, "sglang")


def main() -> None:
    print("profile   C   total tok/s  per-request tok/s (median)  TTFT p50 ms  ITL p50 ms  failed")
    for name, flags in PROFILES.items():
        server = BenchServer(*flags)
        try:
            for c in (1, 10, 64):
                s = level(server.url, c, max(8, 2 * c), 64)
                print(
                    f"{name:8s} {c:3d}  {s['output_throughput']:11.1f}  "
                    f"{s['median_per_request_output_tps']:26.1f}  {s['median_ttft_ms']:11.1f}  "
                    f"{s['median_itl_ms']:10.2f}  {s['failed']:6d}"
                )
        finally:
            server.stop()
    print("targets: baseline C=1 ~60/req, C=64 ~780 total; eagle3 C=1 ~80/req, C=64 ~350 total")

    server = BenchServer("--sim-zero-cost")
    try:
        level(server.url, 8, 8, 16)
        cpu0 = server.cpu_seconds()
        s = level(server.url, 64, 256, 512)
        cpu = server.cpu_seconds() - cpu0
        tokens = s["total_output_tokens"]
        print(
            f"server ceiling (zero-cost model, C=64, {tokens} tokens): "
            f"{tokens / cpu:,.0f} streamed tok per server CPU-second; "
            f"{s['output_throughput']:,.0f} tok/s wall with the client on the same 2 cores"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
