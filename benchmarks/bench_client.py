"""The load generator's cost and fidelity, against the rehearsal server on this machine.

1. Client cost: CPU microseconds per streamed token at C=64, marginal (difference of two run
   sizes, so start-up is excluded), for gpufleet, a no-op floor, and SGLang's bench_serving
   when SGLANG_PYTHON and TOKENIZER_DIR are set (see bench_serving_compat.py). Two servers:
   - equal load: a decode step every 4 ms whatever the batch (16,000 tok/s at C=64), each
     step sending every request its chunk at once, as a GPU server does. Every client gets
     the same reads, so this is the cost of handling one stream.
   - saturation: a zero-cost server, each client at its own ceiling. A client that falls
     behind finds several chunks per read and pays less per token, so this figure flatters
     the slower client; it is printed because it bounds the tokens/s of one process.
   With two cores or more the server runs on core 0 and the clients on the others.
2. Fidelity at C=64 (baseline timing model): output throughput against the engine's own
   count, TTFT and ITL against the times the server sent each chunk (/sim/trace sent_times).

    python benchmarks/bench_client.py
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import urllib.request

from _simserver import REPO, BenchServer

from gpufleet.host.bench.loadgen import Prompt, run_async, run_level
from gpufleet.host.bench.metrics import percentile, summarize

OURS = """
import asyncio, sys
from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_async, run_level
url, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
run = run_async(run_level(url, [Prompt("x " * 100, output_len=out)] * n, 64, LevelSpec(warmup=0)))
print(sum(r.completion_tokens for r in run.records))
"""

# The floor under any Python client: one uvloop protocol callback per streamed chunk that does
# nothing but notice the end of the response (kernel read + event-loop dispatch).
FLOOR = """
import asyncio, json, sys, uvloop
url, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
host, port = url.split("//")[1].split(":")
class Noop(asyncio.Protocol):
    def connection_made(self, t): self.t = t
    def data_received(self, data):
        if data.endswith(b"0\\r\\n\\r\\n"): self.done.set_result(None)
async def main():
    loop = asyncio.get_running_loop()
    body = json.dumps({"text": "x " * 100, "stream": True,
                       "sampling_params": {"max_new_tokens": out, "ignore_eos": True}}).encode()
    req = (b"POST /generate HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
           b"Content-Length: %d\\r\\n\\r\\n" % len(body)) + body
    idle = asyncio.Queue()
    for _ in range(64):
        idle.put_nowait((await loop.create_connection(Noop, host, int(port)))[1])
    async def one():
        conn = await idle.get()
        conn.done = loop.create_future()
        conn.t.write(req)
        await conn.done
        idle.put_nowait(conn)
    await asyncio.gather(*(one() for _ in range(n)))
    print(n * out)
uvloop.run(main())
"""


EQUAL_LOAD = ("--sim-decode-base-ms", "4", "--sim-decode-per-req-ms", "0")
EQUAL_LOAD += ("--sim-prefill-per-token-us", "0")
SATURATION = ("--sim-zero-cost",)
CORES = os.sched_getaffinity(0)
SERVER_CORES = {min(CORES)} if len(CORES) > 1 else None
CLIENT_CORES = CORES - SERVER_CORES if SERVER_CORES else CORES


def child_cpu(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        preexec_fn=lambda: os.sched_setaffinity(0, CLIENT_CORES),
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), out.stdout


REPEATS = 3  # single marginal measurements vary by +-15% on 2 shared cores: take the median


def median_of(measure) -> tuple[float, float, float]:
    """(median, min, max) of REPEATS runs of `measure()`."""
    values = sorted(measure() for _ in range(REPEATS))
    return values[len(values) // 2], values[0], values[-1]


def ours_cost(url: str, script: str = OURS) -> float:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
    )
    cpu = []
    for n in (64, 1024):
        seconds, stdout = child_cpu([sys.executable, "-c", script, url, str(n), "256"], env)
        cpu.append((seconds, int(stdout.strip())))
    return (cpu[1][0] - cpu[0][0]) / (cpu[1][1] - cpu[0][1]) * 1e6


def sglang_available() -> bool:
    return bool(os.environ.get("SGLANG_PYTHON") and os.environ.get("TOKENIZER_DIR"))


def sglang_cost(port: int) -> float:
    python, tokenizer = os.environ["SGLANG_PYTHON"], os.environ["TOKENIZER_DIR"]
    cpu = []
    for n in (64, 1024):
        out = tempfile.mktemp(suffix=".jsonl")
        seconds, _ = child_cpu(
            [
                python,
                "-m",
                "sglang.bench_serving",
                "--backend",
                "sglang",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--dataset-name",
                "random-ids",
                "--tokenizer",
                tokenizer,
                "--num-prompts",
                str(n),
                "--random-input-len",
                "100",
                "--random-output-len",
                "256",
                "--random-range-ratio",
                "1.0",
                "--max-concurrency",
                "64",
                "--warmup-requests",
                "0",
                "--output-file",
                out,
            ]
        )
        with open(out) as fh:
            tokens = json.loads(fh.read().splitlines()[-1])["total_output_tokens"]
        cpu.append((seconds, tokens))
    return (cpu[1][0] - cpu[0][0]) / (cpu[1][1] - cpu[0][1]) * 1e6


def fidelity(url: str) -> None:
    prompts = [Prompt("def f(x): return x\n" * 10, output_len=64) for _ in range(128)]
    run = run_async(run_level(url, prompts, 64))
    s = summarize(run, "sglang")
    ttft_err, itl_err, first, last, tokens = [], [], [], [], 0
    for rec in run.records:
        with urllib.request.urlopen(f"{url}/sim/trace/{rec.rid}", timeout=5) as r:
            truth = json.loads(r.read())
        emits = truth["sent_times"]  # when each chunk left the server
        tokens += truth["completion_tokens"]
        first.append(truth["arrived"])
        last.append(emits[-1])
        ttft_err.append(abs(rec.ttft - (emits[0] - rec.start_wall)))
        gaps = [b - a for a, b in itertools.pairwise(emits)]
        itl_err += [abs(a - b) for a, b in zip(rec.itl, gaps, strict=True)]
    engine_tps = tokens / (max(last) - min(first))
    print(
        f"fidelity C=64, 128 requests x 64 tokens: client {s['output_throughput']:.1f} tok/s "
        f"vs engine {engine_tps:.1f} tok/s ({(s['output_throughput'] / engine_tps - 1) * 100:+.2f}%); "
        f"client tokens {s['total_output_tokens']} vs engine {tokens}"
    )
    print(
        f"  TTFT error vs ground truth: p50 {percentile(ttft_err, 50) * 1e3:.3f} ms, "
        f"p99 {percentile(ttft_err, 99) * 1e3:.3f} ms; ITL error: p50 "
        f"{percentile(itl_err, 50) * 1e3:.3f} ms, p99 {percentile(itl_err, 99) * 1e3:.3f} ms "
        f"({len(itl_err)} gaps)"
    )


def client_costs(server_flags: tuple[str, ...], label: str) -> None:
    server = BenchServer(*server_flags, cores=SERVER_CORES)
    try:
        ours, lo, hi = median_of(lambda: ours_cost(server.url))
        print(
            f"client cost at C=64, {label}, median of {REPEATS}: gpufleet {ours:.1f} us "
            f"CPU per streamed token (range {lo:.1f}-{hi:.1f})"
        )
        floor, lo, hi = median_of(lambda: ours_cost(server.url, FLOOR))
        print(
            f"  floor (no-op uvloop protocol): {floor:.1f} us per token (range {lo:.1f}-{hi:.1f})"
        )
        if sglang_available():
            theirs, lo, hi = median_of(lambda: sglang_cost(server.port))
            print(
                f"  sglang.bench_serving: {theirs:.1f} us per token (range {lo:.1f}-{hi:.1f}) "
                f"-> gpufleet is {ours / theirs:.2f}x"
            )
        else:
            print("  (set SGLANG_PYTHON and TOKENIZER_DIR to measure sglang.bench_serving too)")
    finally:
        server.stop()


def main() -> None:
    print(f"server on cores {sorted(SERVER_CORES or CORES)}, clients on {sorted(CLIENT_CORES)}")
    client_costs(EQUAL_LOAD, "equal load (a step every 4 ms)")
    client_costs(SATURATION, "saturation (zero-cost server)")
    server = BenchServer()
    try:
        fidelity(server.url)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
