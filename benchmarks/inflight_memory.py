"""Memory of one level follows the requests in flight, not the total: 20,000 prompts at C=4
against a zero-cost rehearsal server; prints the peak number of asyncio tasks and the RSS
growth of the load generator during the level.

    .venv/bin/python benchmarks/inflight_memory.py [N] [C]
"""

from __future__ import annotations

import asyncio
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_level
from helpers import SimServer


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    c = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    with tempfile.TemporaryDirectory() as tmp:
        server = SimServer(Path(tmp) / "gpus", "--sim-zero-cost")
        server.wait_ready()
        peak = {"tasks": 0}

        async def level() -> None:
            async def watch() -> None:
                while True:
                    peak["tasks"] = max(peak["tasks"], len(asyncio.all_tasks()))
                    await asyncio.sleep(0.01)

            watcher = asyncio.create_task(watch())
            run = await run_level(
                server.url, [Prompt("x", output_len=2)] * n, c, LevelSpec(warmup=0)
            )
            watcher.cancel()
            print(f"completed {sum(r.ok for r in run.records)} of {n} in {run.duration:.1f} s")

        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        asyncio.run(level())
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        server.stop()
    print(
        f"C={c}: peak asyncio tasks {peak['tasks']}, peak RSS growth {(after - before) / 1024:.1f} MiB"
    )


if __name__ == "__main__":
    main()
