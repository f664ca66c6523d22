"""gpufleet's load generator against SGLang's own bench_serving, every backend, on baseline
and EAGLE-3 rehearsal servers, with the server's own clock as the referee for TTFT.

For each server (baseline; EAGLE-3: several tokens per chunk) and backend (sglang /
sglang-oai / sglang-oai-chat in bench_serving's names) and level (C=1, 10, 64), both
clients send the same shape of load (256-token prompts, 128 output tokens, ignore_eos),
one after the other. Printed: output throughput, median TPOT, median ITL, median TTFT for
each client and the ratio gpufleet / bench_serving, plus the median TTFT the *server*
measured for each client's requests (first chunk written minus request arrival, from
/sim/traces), which says whose TTFT is right, and the prompt length the server counted
(bench_serving's chat and OpenAI paths send the random ids decoded to text, which the
rehearsal tokenizer counts at 4 characters per token).

sglang is never a gpufleet dependency: point SGLANG_PYTHON at a throwaway venv with
sglang 0.5.23 and TOKENIZER_DIR at a sentencepiece tokenizer (see bench_serving_compat.py):

    SGLANG_PYTHON=/tmp/sgl/bin/python TOKENIZER_DIR=/tmp/tok python benchmarks/bench_serving_parity.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from _simserver import BenchServer

from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_async, run_level
from gpufleet.host.bench.metrics import summarize

IN, OUT = 256, 128
LEVELS = ((1, 6), (10, 40), (64, 128))
BACKENDS = (("sglang", "sglang"), ("openai", "sglang-oai"), ("openai-chat", "sglang-oai-chat"))
KEYS = ("output_throughput", "median_tpot_ms", "median_itl_ms", "median_ttft_ms")


def server_side(url: str, since: float) -> tuple[float, float]:
    """(median TTFT, median prompt tokens) of the requests that arrived since `since`, by
    the server's own clock and count."""
    with urllib.request.urlopen(f"{url}/sim/traces?since={since}", timeout=30) as resp:
        traces = json.loads(resp.read())
    firsts = [(t["sent_times"][0] - t["arrived"]) * 1000 for t in traces if t["sent_times"]]
    tokens = [t["prompt_tokens"] for t in traces]
    if not firsts:
        return float("nan"), float("nan")
    return statistics.median(firsts), statistics.median(tokens)


def bench_serving(python: str, tok: str, url: str, backend: str, c: int, n: int) -> dict:
    out = tempfile.mktemp(suffix=".jsonl")
    proc = subprocess.run(
        [
            python, "-m", "sglang.bench_serving", "--backend", backend, "--base-url", url,
            "--dataset-name", "random-ids", "--tokenizer", tok, "--num-prompts", str(n),
            "--random-input-len", str(IN), "--random-output-len", str(OUT),
            "--random-range-ratio", "1.0", "--max-concurrency", str(c), "--output-file", out,
        ],
        capture_output=True, text=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"bench_serving {backend} C={c} failed: {proc.stderr[-1500:]}")
    with open(out) as fh:
        return json.loads(fh.read().splitlines()[-1])


def gpufleet(url: str, backend: str, c: int, n: int) -> dict:
    import random

    rng = random.Random(0)
    if backend == "openai-chat":  # chat takes text: 4 characters per rehearsal token
        prompts = [Prompt("abc " * IN, output_len=OUT) for _ in range(n)]
    else:
        prompts = [
            Prompt(input_ids=[rng.randrange(100, 30000) for _ in range(IN)], output_len=OUT)
            for _ in range(n)
        ]
    return summarize(run_async(run_level(url, prompts, c, LevelSpec(backend=backend))), backend)


def main() -> None:
    python, tok = os.environ.get("SGLANG_PYTHON"), os.environ.get("TOKENIZER_DIR")
    if not python or not tok:
        sys.exit("set SGLANG_PYTHON and TOKENIZER_DIR (see the docstring)")
    servers = (
        ("baseline", ()),
        ("eagle3", ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                    "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16",
                    "--max-running-requests", "128")),
    )  # fmt: skip
    print(f"{'server':8} {'backend':11} {'C':>3}  " + "  ".join(f"{k:>24}" for k in KEYS)
          + "  server-side TTFT and prompt tokens (gpufleet / bench_serving)")  # fmt: skip
    for name, flags in servers:
        server = BenchServer(*flags)
        try:
            for ours, theirs in BACKENDS:
                for c, n in LEVELS:
                    t0 = time.time()
                    g = gpufleet(server.url, ours, c, n)
                    srv_g, tok_g = server_side(server.url, t0)
                    t1 = time.time()
                    b = bench_serving(python, tok, server.url, theirs, c, n)
                    srv_b, tok_b = server_side(server.url, t1)
                    cells = [f"{g[k]:8.2f} {b[k]:8.2f} {g[k] / b[k]:5.3f}" for k in KEYS]
                    print(f"{name:8} {ours:11} {c:3d}  " + "  ".join(cells)
                          + f"  {srv_g:.1f} / {srv_b:.1f} ms, prompt {tok_g:.0f} / {tok_b:.0f} tok",
                          flush=True)  # fmt: skip
        finally:
            server.stop()


if __name__ == "__main__":
    main()
