"""TTFT against the server's own clock, with 95% intervals: what each client adds on top of
the TTFT the server measured for that client's own requests (first chunk written minus
request arrival, /sim/traces), gpufleet against SGLang's bench_serving 0.5.23, on the
baseline rehearsal server, REPEATS times per level, the clients' order alternating.

Why intervals: single runs of 6-128 requests moved the TTFT ratio between 0.90 and 1.28.
Why "added": the two clients send different prompts (bench_serving's random-ids reach the
server as ~375 tokens of text, gpufleet's as 256 ids), so their raw TTFTs differ by the
extra prefill; the difference to the server's own clock is each client's own share.

    SGLANG_PYTHON=/tmp/sgl/bin/python TOKENIZER_DIR=/tmp/tok python benchmarks/ttft_intervals.py
"""

from __future__ import annotations

import os
import sys
import time

from _simserver import BenchServer
from bench_serving_parity import bench_serving, gpufleet, server_side

from gpufleet.report.stats import mean_ci

REPEATS = 5
LEVELS = ((1, 6), (10, 40))


def main() -> None:
    python, tok = os.environ.get("SGLANG_PYTHON"), os.environ.get("TOKENIZER_DIR")
    if not python or not tok:
        sys.exit("set SGLANG_PYTHON and TOKENIZER_DIR (see bench_serving_parity.py)")
    server = BenchServer()
    try:
        print(f"baseline rehearsal server, sglang backend, {REPEATS} repeats per level; "
              "mean [95% CI]")  # fmt: skip
        for c, n in LEVELS:
            added: dict[str, list[float]] = {"gpufleet": [], "bench_serving": []}
            ratio = []
            for r in range(REPEATS):
                order = (
                    ("gpufleet", "bench_serving") if r % 2 == 0 else ("bench_serving", "gpufleet")
                )
                ttft = {}
                for client in order:
                    since = time.time()
                    if client == "gpufleet":
                        row = gpufleet(server.url, "sglang", c, n)
                    else:
                        row = bench_serving(python, tok, server.url, "sglang", c, n)
                    own, _ = server_side(server.url, since)
                    ttft[client] = row["median_ttft_ms"]
                    added[client].append(row["median_ttft_ms"] - own)
                ratio.append(ttft["gpufleet"] / ttft["bench_serving"])
            parts = []
            for client, values in added.items():
                mean, low, high = mean_ci(values)
                parts.append(f"{client} adds {mean:.2f} ms [{low:.2f}, {high:.2f}]")
            mean, low, high = mean_ci(ratio)
            print(f"C={c}: " + "; ".join(parts)
                  + f"; TTFT ratio gpufleet / bench_serving {mean:.2f} [{low:.2f}, {high:.2f}]",
                  flush=True)  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    main()
