"""SGLang's own client against the rehearsal server: `python -m sglang.bench_serving`.

sglang is never a dependency of gpufleet (~11 GB of CUDA wheels). Point SGLANG_PYTHON at a
throwaway venv that has it, and TOKENIZER_DIR at a folder with a sentencepiece
`tokenizer.model` plus `{"tokenizer_class":"LlamaTokenizer"}` as tokenizer_config.json
(mistral_common, an sglang dependency, ships one). Then:

    SGLANG_PYTHON=/tmp/sglvenv/bin/python TOKENIZER_DIR=/tmp/tok python benchmarks/bench_serving_compat.py

Prints bench_serving's figures for --backend sglang and sglang-oai beside the timing
model's prediction, and gpufleet's own generator on the same server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile

from _simserver import BenchServer

from gpufleet.host.bench.loadgen import Prompt, run_level
from gpufleet.host.bench.metrics import summarize

C, N, IN, OUT = 10, 40, 128, 64


def main() -> None:
    python = os.environ.get("SGLANG_PYTHON")
    tokenizer = os.environ.get("TOKENIZER_DIR")
    if not python or not tokenizer:
        sys.exit("set SGLANG_PYTHON and TOKENIZER_DIR (see the docstring)")
    predicted = C / (0.0156 + 0.00103 * C)
    server = BenchServer()
    try:
        print(f"timing model at C={C}: ~{predicted:.0f} tok/s total (decode only)")
        for backend in ("sglang", "sglang-oai"):
            out = tempfile.mktemp(suffix=".jsonl")
            cpu0 = os.times()
            proc = subprocess.run(
                [
                    python,
                    "-m",
                    "sglang.bench_serving",
                    "--backend",
                    backend,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(server.port),
                    "--dataset-name",
                    "random-ids",
                    "--tokenizer",
                    tokenizer,
                    "--num-prompts",
                    str(N),
                    "--random-input-len",
                    str(IN),
                    "--random-output-len",
                    str(OUT),
                    "--random-range-ratio",
                    "1.0",
                    "--max-concurrency",
                    str(C),
                    "--output-file",
                    out,
                ],
                capture_output=True,
                text=True,
                cwd=tempfile.gettempdir(),
            )
            cpu1 = os.times()
            if proc.returncode != 0:
                print(proc.stdout[-2000:], proc.stderr[-2000:])
                sys.exit(f"bench_serving --backend {backend} failed")
            with open(out) as fh:
                r = json.loads(fh.read().splitlines()[-1])
            cpu = (cpu1.children_user + cpu1.children_system) - (
                cpu0.children_user + cpu0.children_system
            )
            print(
                f"bench_serving --backend {backend:10s}: completed {r['completed']}/{N}, "
                f"output {r['output_throughput']:.1f} tok/s, median TTFT {r['median_ttft_ms']:.1f} ms, "
                f"median ITL {r['median_itl_ms']:.2f} ms, client CPU {cpu:.2f}s (incl. start-up)"
            )
        prompts = [Prompt(text="x " * (IN * 2), output_len=OUT) for _ in range(N)]
        s = summarize(asyncio.run(run_level(server.url, prompts, C)), "sglang")
        print(
            f"gpufleet loadgen (sglang backend)   : completed {s['completed']}/{N}, output "
            f"{s['output_throughput']:.1f} tok/s, median TTFT {s['median_ttft_ms']:.1f} ms, "
            f"median ITL {s['median_itl_ms']:.2f} ms"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
