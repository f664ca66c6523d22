"""Report size and generation time (a rehearsal-sized sweep and a 20-run x 10-level archive),
and page load time in headless Chromium. Prints figures; asserts nothing.

    python benchmarks/report_figures.py [ARCHIVE_WITH_A_REHEARSAL_SWEEP]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from browser import CHROMIUM, visit
from gpufleet.archive import store
from gpufleet.archive.kept import Manifest
from gpufleet.archive.layout import Archive
from gpufleet.report import select


def _synthetic(root: Path, runs: int, levels: int) -> list[str]:
    """`runs` runs of alternating profiles on one host, `levels` concurrency levels each."""
    ids = []
    for i in range(runs):
        profile = f"p{i}"
        rows = []
        for j in range(levels):
            c = 2**j
            rows.append({
                "max_concurrency": c, "output_throughput": 60.0 * c / (1 + j * 0.3 + i * 0.01),
                "median_per_request_output_tps": 60.0 / (1 + j * 0.3), "median_ttft_ms": 20.0 * c,
                "p99_ttft_ms": 30.0 * c, "median_itl_ms": 16.0 + j, "p99_itl_ms": 25.0 + j,
                "completed": 10, "failed": 0, "level_status": "ok",
            })  # fmt: skip
        run_id = f"20261129T1{i:05d}Z-{profile}"
        files = {"results.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()}
        manifest = {
            "run_id": run_id, "host": "h0", "profile": profile, "status": "done",
            "started_at": run_id,
            "plan": {"run_id": run_id, "levels": [], "output_len": 256, "backend": "sglang"},
            "prompt_set": {"prompts_sha256": "x"}, "server": {"argv": ["python"]},
            "host_facts": {"gpus": [{"name": "NVIDIA H200", "uuid": f"GPU-{i}"}]},
            "levels": [
                {"concurrency": r["max_concurrency"], "output_throughput": r["output_throughput"]}
                for r in rows
            ],
        }  # fmt: skip
        store.write_run(Archive(root), "h0", run_id, files, Manifest.from_wire(manifest))
        ids.append(run_id)
    return ids


def _measure(name: str, make) -> None:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        data, out_dir = make()
        page = select.write_report(data, out_dir)
        times.append(time.perf_counter() - started)
    loads = [visit(page).load_s for _ in range(3)] if CHROMIUM else []
    load = f"{statistics.median(loads) * 1000:.0f} ms" if loads else "no chromium"
    print(
        f"{name}: {page.stat().st_size / 1024:.1f} KiB, generated in "
        f"{statistics.median(times) * 1000:.0f} ms (median of 5, archive read included), "
        f"loads in {load} (median of 3, headless Chromium)"
    )


def main() -> None:
    if len(sys.argv) > 1:
        archive = Archive(Path(sys.argv[1]))
        state = select.sweep_state_path(archive, None)
        _measure(
            f"sweep {state.stem}",
            lambda: (select.report_for_sweep(archive, state), archive.compare_dir(state.stem)),
        )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ids = _synthetic(root, 20, 10)
        _measure(
            "20 runs x 10 levels",
            lambda: (select.report_for_runs(Archive(root), ids), Archive(root).compare_dir("20")),
        )


if __name__ == "__main__":
    main()
