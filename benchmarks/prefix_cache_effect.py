"""The rehearsal engine's prefix cache, seen through `--workload multiturn`: per-turn prompt
size, cache hit rate and TTFT with the cache and with `--disable-radix-cache`.

    .venv/bin/python benchmarks/prefix_cache_effect.py [SESSIONS] [C]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from gpufleet.control.bench import BenchRequest, build_plan
from gpufleet.host.bench.loadgen import Prompt, run_async, run_level
from gpufleet.host.bench.metrics import summarize
from helpers import SimServer


def main() -> None:
    sessions = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    c = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    request = BenchRequest([c], num_prompts=sessions, workload="multiturn:turns=4")
    plan, body = build_plan(request, "cache-effect")
    import json

    rows = [json.loads(line) for line in body.decode().splitlines()]
    prompts = [Prompt(plan["system_prompt"], output_len=64, turns=r["turns"]) for r in rows]
    for label, flags in (
        ("prefix cache", ()),
        ("--disable-radix-cache", ("--disable-radix-cache",)),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            server = SimServer(Path(tmp) / "gpus", *flags)
            server.wait_ready()
            run = run_async(run_level(server.url, prompts, c, warmup=0))
            server.stop()
        s = summarize(run, "sglang")
        print(
            f"{label}: {sessions} sessions x 4 turns at C={c}, {run.duration:.1f} s, "
            f"hit rate {s['cache_hit_rate']:.1%}, median TTFT {s['median_ttft_ms']:.1f} ms"
        )
        for t in s["per_turn"]:
            print(
                f"  turn {t['turn']}: prompt {t['mean_prompt_tokens']:.0f} tok, "
                f"cached {t['cache_hit_rate']:.1%}, median TTFT {t['median_ttft_ms']:.1f} ms"
            )


if __name__ == "__main__":
    main()
