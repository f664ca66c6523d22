"""Tool overhead in a sweep: wall time minus server load time minus benchmark time.

Runs baseline vs eagle3 (rehearsal engine, 3 s simulated load each) over real sshd, on 1
host and on 8 hosts in parallel, and splits the wall time into the servers' own load time
(process start -> ready), the benchmark levels' own durations, and the rest: gpufleet's
overhead (connections, agent calls, preflight, gpu-clean, stop, verification, fetch,
archive). Goal: overhead <= 10% of the total. Also times `inv rehearse` itself.

    python benchmarks/sweep_overhead.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from _fleet import BenchFleet

from gpufleet.archive import store
from gpufleet.archive.layout import Archive
from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.inventory.model import load_inventory
from gpufleet.control.server.host_options import LaunchOptions
from gpufleet.control.sweep import sweep_run as sw
from gpufleet.control.sweep import sweep_state as sweep_state

REPO = Path(__file__).resolve().parent.parent
LEVELS = [
    {"concurrency": 1, "num_prompts": 8},
    {"concurrency": 10, "num_prompts": 20},
    {"concurrency": 64, "num_prompts": 128},
]


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def one(n_hosts: int) -> None:
    fleet = BenchFleet(hosts=n_hosts, sshds=1, max_startups="100:30:200")
    root = Path(tempfile.mkdtemp(prefix="gpufleet-sweep-"))
    try:
        hosts = load_inventory(fleet.inventory).select(None)
        for i, h in enumerate(hosts):
            h.vars["server_port_offset"] = i
        archive = Archive(root)
        request = BenchRequest(
            concurrency=[1, 10, 64], output_len=64, archive=archive, fixed_levels=LEVELS
        )
        state = sweep_state.SweepState.new(
            archive, ["baseline", "eagle3"], [h.name for h in hosts], [1, 10, 64]
        )
        start = time.monotonic()
        sw.run(state, Fleet(hosts), request, LaunchOptions(engine="sim"), False, lambda _: None)
        wall = time.monotonic() - start
        assert state.record.status == "done", state.record
        load = bench = 0.0
        steps: dict[str, list[float]] = {}
        for profile in ("baseline", "eagle3"):
            for host in hosts:
                for step, seconds in state.cell(profile, host.name).steps_s.items():
                    steps.setdefault(step, []).append(seconds)
            loads, benches = [], []
            for host in hosts:
                run_dir = archive.run_dir(host.name, str(state.cell(profile, host.name).run_id))
                manifest = store.read_manifest(run_dir)
                srv = json.loads((run_dir / "server_state.json").read_text())
                loads.append(_ts(srv["ready_at"]) - _ts(srv["started_at"]))
                results = [
                    json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()
                ]
                benches.append(sum(r["duration"] for r in results))
                assert manifest.status == "done"
            load += max(loads)
            bench += max(benches)
        overhead = wall - load - bench
        print(
            f"{n_hosts} host(s): wall {wall:.1f}s = server load {load:.1f}s + benchmark "
            f"{bench:.1f}s + overhead {overhead:.1f}s ({overhead / wall * 100:.1f}% of total)"
        )
        print(
            "  per cell, median over hosts and profiles: "
            + ", ".join(f"{k} {statistics.median(v):.2f}s" for k, v in steps.items())
        )
    finally:
        fleet.close()


def main() -> None:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet", "rehearse", "--archive", tempfile.mkdtemp()],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    print(
        f"inv rehearse: {time.monotonic() - start:.1f}s wall (rc {out.returncode}); "
        f"{out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]}"
    )
    for n in (1, 8):
        one(n)


if __name__ == "__main__":
    main()
