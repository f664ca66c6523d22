"""gpufleet's figures beside the true ones for every stream habit (issue 79).

Starts the fake streaming server of the test tier (tests/habits_app.py, under uvicorn) and,
for each usage habit, runs gpufleet's client against the same token timing (80 tokens, 4 a
chunk, a chunk every 80 ms, 4 requests at once), with and without the model's tokenizer on
the host; prints gpufleet's output tokens, TPOT p50, ITL p50 and output tok/s beside the
server's own (the times it sent each chunk), the count's source and its note. Then every
dialect against every way a stream can end. Exits non-zero when a level failed to run or a
knowable figure is more than 1% off.

    python benchmarks/stream_habits.py          # this checkout
    PYTHONPATH=OLD/src python benchmarks/stream_habits.py   # another (older) checkout
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import habits_app
from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_level
from gpufleet.host.bench.metrics import summarize
from gpufleet.sim.sshd import free_port

TOKENS, PER_CHUNK, PERIOD_MS, REQUESTS = 80, 4, 80, 4
KEYS = ("total_output_tokens", "median_tpot_ms", "median_itl_ms", "output_throughput")
COUNTS_TOKENS = "tokenizer" in {f.name for f in dataclasses.fields(LevelSpec)}
CASES = [(b, h, t) for t in (True, False) for b in ("openai", "sglang") for h in habits_app.HABITS
         if b == "openai" or h in ("perchunk", "none", "double")]  # fmt: skip


def _spec(backend: str, tokenizer: Path | None) -> LevelSpec:
    extra = {"tokenizer": str(tokenizer) if tokenizer else None} if COUNTS_TOKENS else {}
    return LevelSpec(backend=backend, warmup=0, request_timeout=30, **extra)


async def _levels(url: str, tokenizer: Path) -> list:
    async def one(backend: str, habit: str, with_tok: bool):
        prompts = [Prompt(f"{backend}-{habit}-{with_tok} {i}", output_len=TOKENS)
                   for i in range(REQUESTS)]  # fmt: skip
        spec = _spec(backend, tokenizer if with_tok else None)
        return await run_level(f"{url}/h/{habit}/{PER_CHUNK}/{PERIOD_MS}", prompts, REQUESTS, spec)

    return await asyncio.gather(*(one(*case) for case in CASES))


async def _endings(url: str) -> dict:
    names = ("sglang", "openai", "openai-chat")

    async def one(backend: str, ending: str):
        prompts = [Prompt(f"{backend} {ending} {i}", output_len=20) for i in range(2)]
        return await run_level(f"{url}/e/{ending}", prompts, 2, _spec(backend, None))

    cases = [(b, e) for b in names for e in habits_app.ENDINGS]
    runs = await asyncio.gather(*(one(*c) for c in cases), return_exceptions=True)
    return dict(zip(cases, runs, strict=True))


def _fmt(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def main() -> int:
    tokenizer = habits_app.word_tokenizer(Path(tempfile.mkdtemp(prefix="habits-model-")))
    port = free_port()
    server = habits_app.start(port)
    url = f"http://127.0.0.1:{port}"
    try:
        runs = asyncio.run(_levels(url, tokenizer))
        truth = habits_app.measured_truth(url)
        endings = asyncio.run(_endings(url))
    finally:
        server.terminate()
        server.wait(10)
    bad = 0
    print(f"{TOKENS} tokens, {PER_CHUNK} a chunk every {PERIOD_MS} ms, {REQUESTS} requests; "
          "gpufleet / true")  # fmt: skip
    print("dialect  habit     tokenizer | tokens     | TPOT p50 ms | ITL p50 ms  | tok/s"
          "         | source, ITL basis: note")  # fmt: skip
    for (backend, habit, with_tok), run in zip(CASES, runs, strict=True):
        row = summarize(run, backend)
        failed = [r.error for r in run.records if not r.ok]
        sent = [truth[f"{backend}-{habit}-{with_tok} {i}"] for i in range(REQUESTS)]
        true = habits_app.true_figures(sent)
        true["output_throughput"] = true["total_output_tokens"] / row["duration"]
        cells = " | ".join(f"{_fmt(row[k]):>5} / {_fmt(true[k]):<5}" for k in KEYS)
        note = row.get("output_tokens_note") or ""
        source = f"{row.get('output_tokens_source', '-')}, {row.get('itl_basis', '-')}"
        print(
            f"{backend:8} {habit:9} {'yes' if with_tok else 'no':9} | {cells} | {source}"
            f"{': ' + note if note else ''}{'  FAILED: ' + str(failed[:1]) if failed else ''}"
        )
        bad += bool(failed)
        knowable = row.get("itl_basis") == "token"
        if knowable and any(abs(row[k] / true[k] - 1) > 0.01 for k in KEYS):
            bad += 1
    print("\nendings (dialect x ending: ok, or the error)")
    for (backend, ending), run in endings.items():
        if isinstance(run, BaseException):
            print(f"{backend:12} {ending:15} generator error: {run!r}")
            bad += 1
            continue
        r = run.records[0]
        said = "ok" if r.ok else f"failed: {r.error}"
        print(f"{backend:12} {ending:15} {said} ({r.completion_tokens} tokens)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
