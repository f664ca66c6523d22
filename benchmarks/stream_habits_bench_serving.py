"""SGLang 0.5.23's own bench_serving against every stream habit (issue 79's closing figures).

Starts the fake streaming server of the test tier (tests/habits_app.py) and runs
`python -m sglang.bench_serving` against each usage habit with the same token timing as
benchmarks/stream_habits.py (80 tokens, 4 a chunk, a chunk every 80 ms, 4 requests at
once), for the `sglang-oai` (OpenAI completions) and `sglang` (/generate) backends; prints
bench_serving's output tokens, TPOT p50, ITL p50 and output tok/s beside the true figures
(the server's own send times). Exits non-zero when bench_serving fails to run.

sglang is never a gpufleet dependency: point SGLANG_PYTHON at a throwaway venv with
sglang==0.5.23 and TOKENIZER_DIR at a sentencepiece tokenizer (bench_serving_compat.py):

    SGLANG_PYTHON=/tmp/sglvenv/bin/python TOKENIZER_DIR=/tmp/tok python benchmarks/stream_habits_bench_serving.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import habits_app
from gpufleet.sim.sshd import free_port

TOKENS, PER_CHUNK, PERIOD_MS, REQUESTS = 80, 4, 80, 4
KEYS = ("total_output_tokens", "median_tpot_ms", "median_itl_ms", "output_throughput")
BACKENDS = ("sglang-oai", "sglang")


def _truth(url: str) -> dict[str, list[tuple[float, int]]]:
    with urllib.request.urlopen(url + "/truth", timeout=10) as answer:
        return json.loads(answer.read())


def _bench_serving(python: str, tokenizer: str, url: str, backend: str, seed: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="habits-bs-")) / "out.jsonl"
    cmd = [python, "-m", "sglang.bench_serving", "--backend", backend, "--base-url", url,
           "--model", "habits", "--tokenizer", tokenizer, "--dataset-name", "random-ids",
           "--random-input-len", "16", "--random-output-len", str(TOKENS),
           "--random-range-ratio", "1", "--num-prompts", str(REQUESTS), "--max-concurrency",
           str(REQUESTS), "--warmup-requests", "0", "--seed", str(seed), "--disable-tqdm",
           "--output-file", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not out.exists():
        if "out of bounds for axis 0 with size 0" in done.stderr:  # its metrics of no request
            raise RuntimeError("every request failed (bench_serving then crashes on no figures)")
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["?"]
        raise RuntimeError(f"bench_serving exited {done.returncode}: {last[0][:300]}")
    return json.loads(out.read_text().splitlines()[-1])


def main() -> int:
    python = os.environ.get("SGLANG_PYTHON")
    tokenizer = os.environ.get("TOKENIZER_DIR")
    if not python or not tokenizer:
        print("set SGLANG_PYTHON (a venv with sglang==0.5.23) and TOKENIZER_DIR", file=sys.stderr)
        return 2
    port = free_port()
    server = habits_app.start(port)
    base = f"http://127.0.0.1:{port}"
    rows, bad = [], 0
    try:
        for seed, (habit, backend) in enumerate(
            [(h, b) for h in habits_app.HABITS for b in BACKENDS], start=1
        ):
            before = _truth(base)
            try:
                result = _bench_serving(
                    python, tokenizer, f"{base}/h/{habit}/{PER_CHUNK}/{PERIOD_MS}", backend, seed
                )
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"{habit} {backend}: FAILED {exc}", flush=True)
                bad += 1
                continue
            after = _truth(base)
            sent = [v[len(before.get(k, [])) :] for k, v in after.items()]
            sent = [s for s in sent if s]
            true = habits_app.true_figures(sent)
            true["output_throughput"] = true["total_output_tokens"] / result["duration"]
            rows.append((habit, backend, result, true))
            print(f"{habit} {backend}: ran", flush=True)
    finally:
        server.terminate()
        server.wait(10)
    print(f"bench_serving 0.5.23: {TOKENS} tokens, {PER_CHUNK} a chunk every {PERIOD_MS} ms, "
          f"{REQUESTS} requests; bench_serving / true")  # fmt: skip
    print("habit     backend    | tokens      | TPOT p50 ms   | ITL p50 ms    | tok/s")
    for habit, backend, result, true in rows:
        cells = " | ".join(f"{result.get(k, float('nan')):>5.1f} / {true[k]:<5.1f}" for k in KEYS)
        print(f"{habit:9} {backend:10} | {cells}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
