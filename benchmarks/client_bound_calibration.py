"""Calibrate the client-bound mark (host/bench/clientcert.py): starved and unstarved clients,
alternating, N runs each, at C=1, 64 and the highest level the rehearsal sustains, with
telemetry on (as `inv bench` runs by default).

Unstarved: the load generator alone on one core (the rehearsal server on the others).
Starved: the same core shared with two busy loops (the generator gets about a third of it).
Each run prints its figures; the end prints, per level and condition, the median figures and
how many runs each candidate bound marks, so the bounds are chosen from data.

    python benchmarks/client_bound_calibration.py [--runs 10] [--levels 1,64,256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

OUTPUT_LEN = 32
HOG = "import os,sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile 1: pass"


def one_run(url: str, state: str, concurrency: int, prompts: int) -> dict:
    """In the pinned child: one level with the telemetry sampler on; the client's figures."""
    from gpufleet.host.bench import clientcert, telemetry
    from gpufleet.host.bench.loadgen import Prompt, run_async, run_level
    from gpufleet.host.bench.metrics import summarize
    from gpufleet.host.gpu import nvml as nvmlread

    nvmlread.activate_simulation({"state_dir": state, "count": 8}, "calibration")
    texts = [Prompt(text=f"calibrate {i} " * 30, output_len=OUTPUT_LEN) for i in range(prompts)]
    with telemetry.Sampler(nvmlread.load_pynvml(), [0], 0.5):
        run = run_async(run_level(url, texts, concurrency))
    s = summarize(run, "sglang")
    return {
        "tok_s": s["output_throughput"],
        "ttft_p50_ms": s["median_ttft_ms"],
        "itl_p50_ms": s["median_itl_ms"],
        "dispatch_p99_ms": s.get("client_dispatch_lag_p99_ms"),
        "idle_share": s.get("client_idle_slot_share"),
        "loop_p99_ms": s.get("client_loop_lag_p99_ms"),
        "cpu_cores": s.get("client_cpu_cores"),
        "mark": s.get("client_bound"),
        "late": s.get("client_late"),
        "bounds": {"loop_ms": clientcert.LOOP_LAG_BOUND_MS},
    }


def spawn(args: list[str], core: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args], preexec_fn=lambda: os.sched_setaffinity(0, {core})
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--levels", default="1,64,256")
    parser.add_argument("--one", nargs=4, metavar=("URL", "STATE", "C", "N"))
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--report", help="print the table of a saved --json file and stop")
    options = parser.parse_args()
    if options.report:
        report(json.loads(Path(options.report).read_text()))
        return
    if options.one:
        url, state, c, n = options.one
        print(json.dumps(one_run(url, state, int(c), int(n))), flush=True)
        return

    from _simserver import BenchServer

    cores = sorted(os.sched_getaffinity(0))
    client_core, server_cores = cores[0], set(cores[1:]) or {cores[0]}
    server = BenchServer("--tp-size", "1", cores=server_cores)
    results: list[dict] = []
    try:
        for c in (int(x) for x in options.levels.split(",")):
            n = max(8, 2 * c)  # two waves: long enough for a p99 of the loop's lag
            for k in range(options.runs):
                for starved in (False, True):
                    hogs = [spawn(["-c", HOG, str(client_core)], client_core)
                            for _ in range(2 if starved else 0)]  # fmt: skip
                    try:
                        out = subprocess.run(
                            [sys.executable, __file__, "--one", server.url, str(server.state),
                             str(c), str(n)],
                            capture_output=True, text=True, check=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, {client_core}),
                        )  # fmt: skip
                    finally:
                        for hog in hogs:
                            hog.kill()
                            hog.wait()
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    row.update(c=c, starved=starved, run=k, cores=len(cores))
                    results.append(row)
                    print(json.dumps(row), flush=True)
                    if options.json:  # kept as it grows: a cut-short run still reports
                        Path(options.json).write_text(json.dumps(results, indent=1))
    finally:
        server.stop()
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))
    report(results)


def marks(row: dict) -> tuple[bool, bool]:
    """(client_bound, client_late) under today's bounds, from a run's figures."""
    from gpufleet.host.bench import clientcert

    bound = clientcert.verdict(row["cpu_cores"] or 0, row["idle_share"] or 0,
                               row["dispatch_p99_ms"] or 0)  # fmt: skip
    return bound is not None, clientcert.late(row["loop_p99_ms"] or 0) is not None


def report(results: list[dict]) -> None:
    """Per level and condition: median figures, and the marks under today's bounds (an
    unstarved run marked is a false mark; a starved run left unmarked is a missed one)."""
    print(f"\n{results[0]['cores']} cores; medians per level and condition")
    keys = ("tok_s", "ttft_p50_ms", "itl_p50_ms", "dispatch_p99_ms", "idle_share",
            "loop_p99_ms", "cpu_cores")  # fmt: skip
    for c in sorted({r["c"] for r in results}):
        for starved in (False, True):
            rows = [r for r in results if r["c"] == c and r["starved"] == starved]
            med = {k: statistics.median(r[k] or 0 for r in rows) for k in keys}
            bound = sum(marks(r)[0] for r in rows)
            late = sum(marks(r)[1] for r in rows)
            wrong = late if not starved else len(rows) - late
            name = "starved  " if starved else "unstarved"
            what = "missed" if starved else "false"
            print(f"C={c:<4} {name} " + " ".join(f"{k}={v:.4g}" for k, v in med.items())
                  + f" | client_bound {bound}/{len(rows)}, client_late {late}/{len(rows)}"
                  f" ({what} {wrong})")  # fmt: skip


if __name__ == "__main__":
    main()
