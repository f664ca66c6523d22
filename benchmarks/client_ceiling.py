"""The load generator's ceiling: the most streamed tokens/s it sustains while its dispatch lag
p99 stays <= 1 ms and its ITL error p99 (client gaps against the server's own send times)
stays <= 1 ms, with one process and with `--client-procs auto` (host/bench/spread.py).

The server costs next to nothing (benchmarks/_zeroserver.py: SGLang's stream format, several
processes on one port, each request paced at PACE_MS per token), so the offered rate is
C x 1000 / PACE_MS tokens/s and what limits the level is the client. An absolute figure
holds only for the machine it ran on (the README names it).

run: python benchmarks/client_ceiling.py [--levels 16,32,...] [--servers N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpufleet.host.bench.loadgen import Prompt, run_async, run_level
from gpufleet.host.bench.metrics import percentile, summarize
from gpufleet.host.bench.spread import auto_procs, run_spread
from gpufleet.sim.sshd import free_port

HERE = Path(__file__).resolve().parent
PACE_MS = 2.0
OUTPUT_LEN = 200  # 0.4 s a request at the pace
BOUND_MS = 1.0


def itl_error_p99(records: list, traces: Path, sample: int = 300) -> float:
    """p99 of |client gap - server gap| over up to `sample` requests, ms."""
    errors = []
    for record in records[:sample]:
        path = traces / f"{record.rid}.json"
        if not record.ok or not path.exists():
            continue
        sent = json.loads(path.read_text())
        gaps = [b - a for a, b in itertools.pairwise(sent)]
        errors += [abs(a - b) for a, b in zip(record.itl, gaps, strict=False)]
    return percentile(errors, 99) * 1000 if errors else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="16,32,64,128,256,512,1024")
    parser.add_argument("--servers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--modes", default="1,auto", help="1, auto, or a fixed count per run")
    options = parser.parse_args()
    port = free_port()
    traces = Path(tempfile.mkdtemp(prefix="gpufleet-ceiling-"))
    argv = [sys.executable, str(HERE / "_zeroserver.py"), str(port), str(PACE_MS), str(traces)]
    servers = [subprocess.Popen(argv) for _ in range(options.servers)]
    time.sleep(1.0)
    url = f"http://127.0.0.1:{port}"
    print(f"machine: {os.cpu_count()} CPUs; {options.servers} server processes; "
          f"{1000 / PACE_MS:.0f} tok/s per request offered")  # fmt: skip
    print(
        "mode   C      procs  offered tok/s  steady tok/s  client cores  dispatch p99 ms"
        "  loop p99 ms  ITL err p99 ms  within bounds"
    )
    ceilings: dict[str, float] = {}  # dispatch lag and ITL error within bounds
    itl_only: dict[str, float] = {}  # ITL error within bounds
    try:
        for mode in options.modes.split(","):
            last = None
            for c in [int(x) for x in options.levels.split(",")]:
                procs = 1 if mode == "auto" else int(mode)
                if mode == "auto" and last is not None:
                    procs = auto_procs(last["output_throughput"], last["client_cpu_cores"], c,
                                       last["max_concurrency"])  # fmt: skip
                prompts = [Prompt("x", output_len=OUTPUT_LEN) for _ in range(3 * c)]
                level = (run_level(url, prompts, c) if procs == 1
                         else run_spread(procs, url, prompts, c))  # fmt: skip
                run = run_async(level)
                row = summarize(run, "sglang")
                error = itl_error_p99(run.records, traces)
                offered = c * 1000 / PACE_MS
                steady = row.get("steady_output_throughput", 0.0)
                ok = (row["client_dispatch_lag_p99_ms"] <= BOUND_MS and error <= BOUND_MS
                      and steady >= 0.9 * offered and row["failed"] == 0)  # fmt: skip
                if ok:
                    ceilings[mode] = max(ceilings.get(mode, 0.0), steady)
                if error <= BOUND_MS and steady >= 0.9 * offered and row["failed"] == 0:
                    itl_only[mode] = max(itl_only.get(mode, 0.0), steady)
                print(f"{mode:5s}  {c:5d}  {procs:5d}  {offered:13.0f}  "
                      f"{steady:9.0f}  {row['client_cpu_cores']:12.2f}  "
                      f"{row['client_dispatch_lag_p99_ms']:15.2f}  "
                      f"{row['client_loop_lag_p99_ms']:11.2f}  {error:14.2f}  {ok}", flush=True)  # fmt: skip
                if procs > 1:  # each share's own p99s: is one process the laggard?
                    shares = {}
                    for r in run.records:
                        shares.setdefault((r.index % c) % procs, []).append(r)
                    print("       per share: " + "; ".join(
                        f"{k}: lag {percentile([r.dispatch_lag for r in rs], 99) * 1000:.1f} ms,"
                        f" ITL err {itl_error_p99(rs, traces):.2f} ms"
                        for k, rs in sorted(shares.items())), flush=True)  # fmt: skip
                last = row
                for f in traces.iterdir():
                    f.unlink()
    finally:
        for server in servers:
            server.kill()
    for label, found in (("dispatch lag and ITL error", ceilings), ("ITL error", itl_only)):
        one, many = found.get("1", 0.0), found.get("auto", 0.0)
        ratio = f"{many / one:.1f}x" if one else "n/a"
        print(
            f"ceiling with {label} p99 <= {BOUND_MS:g} ms: one process {one:,.0f} tok/s; "
            f"--client-procs auto {many:,.0f} tok/s ({ratio})"
        )


if __name__ == "__main__":
    main()
