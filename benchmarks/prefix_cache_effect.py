"""The rehearsal engine's prefix cache, seen through `--workload multiturn` (5 turns): per-turn
prompt size, cache hit rate and TTFT, in three cases:

- flushed: the cache emptied before the level (gpufleet's default, `/flush_cache`);
- not flushed: the same level run a second time without flushing (`--no-flush` after an
  earlier level): even turn 1 finds its conversation cached;
- no cache: the server runs with `--disable-radix-cache`.

    .venv/bin/python benchmarks/prefix_cache_effect.py [SESSIONS] [C]
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from gpufleet.control.bench.run import BenchRequest, build_plan
from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_async, run_level
from gpufleet.host.bench.metrics import summarize
from helpers import SimServer

TURNS = 5


def _flush(url: str) -> None:
    request = urllib.request.Request(url + "/flush_cache", method="POST")
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200


def _show(label: str, run, sessions: int, c: int) -> None:
    s = summarize(run, "sglang")
    print(
        f"{label}: {sessions} sessions x {TURNS} turns at C={c}, {run.duration:.1f} s, "
        f"hit rate {s['cache_hit_rate']:.1%}, median TTFT {s['median_ttft_ms']:.1f} ms"
    )
    for t in s["per_turn"]:
        print(
            f"  turn {t['turn']}: prompt {t['mean_prompt_tokens']:.0f} tok, "
            f"cached {t['cache_hit_rate']:.1%}, median TTFT {t['median_ttft_ms']:.1f} ms"
        )


def main() -> None:
    sessions = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    c = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    request = BenchRequest([c], num_prompts=sessions, workload=f"multiturn:turns={TURNS}")
    plan, body = build_plan(request, "cache-effect")
    rows = [json.loads(line) for line in body.decode().splitlines()]
    prompts = [Prompt(plan.system_prompt, output_len=64, turns=r["turns"]) for r in rows]
    with tempfile.TemporaryDirectory() as tmp:
        server = SimServer(Path(tmp) / "gpus")
        server.wait_ready()
        _flush(server.url)
        _show(
            "flushed",
            run_async(run_level(server.url, prompts, c, LevelSpec(warmup=0))),
            sessions,
            c,
        )
        _show(
            "not flushed",
            run_async(run_level(server.url, prompts, c, LevelSpec(warmup=0))),
            sessions,
            c,
        )
        server.stop()
    with tempfile.TemporaryDirectory() as tmp:
        server = SimServer(Path(tmp) / "gpus", "--disable-radix-cache")
        server.wait_ready()
        _show(
            "no cache",
            run_async(run_level(server.url, prompts, c, LevelSpec(warmup=0))),
            sessions,
            c,
        )
        server.stop()


if __name__ == "__main__":
    main()
