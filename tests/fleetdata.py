"""Archives of many hosts with known figures, written through the archive's own writer
(checksummed, atomic), for the fleet, history and metrics tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from gpufleet.archive import store
from gpufleet.archive.kept import Manifest
from gpufleet.archive.layout import Archive


def level_row(c: int, throughput: float, spread: float = 0.02, completed: int = 40) -> dict:
    """One results.jsonl line: the throughput and a per-request e2e spread of `spread`."""
    e2e = 1000.0 * c * 256 / throughput
    return {
        "max_concurrency": c,
        "completed": completed,
        "failed": 0,
        "level_status": "ok",
        "output_throughput": throughput,
        "request_throughput": throughput / 256,
        "median_per_request_output_tps": throughput / c,
        "median_ttft_ms": 20.0 + c,
        "p99_ttft_ms": 30.0 + c,
        "median_tpot_ms": 1000 * c / throughput,
        "median_itl_ms": 1000 * c / throughput,
        "p99_itl_ms": 1500 * c / throughput,
        "mean_e2e_latency_ms": e2e,
        "median_e2e_latency_ms": e2e,
        "std_e2e_latency_ms": e2e * spread,
        "joules_per_output_token": 1.5,
    }


def write_run(
    root: Path,
    host: str,
    run_id: str,
    figures: dict[int, float],
    profile: str = "baseline",
    started: str = "2026-11-01T00:00:00+00:00",
    engine_version: str = "0.5.23",
    power_limit_w: float = 700.0,
    prompts: str = "p" * 64,
    gpu: str = "NVIDIA H200",
    status: str = "done",
    overrides: dict[int, dict] | None = None,
) -> Path:
    rows = [level_row(c, v) | (overrides or {}).get(c, {}) for c, v in figures.items()]
    files = {"results.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()}
    # the rest of what a finished run holds (store.REQUIRED_FILES), so it verifies
    files |= {"plan.json": b"{}\n", "status.json": b"{}\n", "summary.csv": b"\n"}
    manifest = {
        "run_id": run_id,
        "host": host,
        "profile": profile,
        "status": status,
        "started_at": started,
        "server": {"engine": "sglang", "engine_version": engine_version, "gpus": [0, 1]},
        "host_facts": {
            "driver": "580.95.05",
            "gpus": [
                {
                    "index": i,
                    "name": gpu,
                    "power_limit_w": power_limit_w,
                    "sm_clock_app_mhz": 1980,
                    "ecc": True,
                    "health": "ok",
                }
                for i in range(2)
            ],
        },
        "prompt_set": {"name": "coding", "prompts_sha256": prompts},
        "levels": [{"concurrency": c, "output_throughput": v} for c, v in figures.items()],
    }
    return store.write_run(Archive(root), host, run_id, files, Manifest.from_wire(manifest))


def fleet_archive(
    root: Path, hosts: int, slow: dict[str, float] | None = None, noise: float = 0.01,
    seed: int = 0, levels: tuple[int, ...] = (1, 10, 64), day: int = 1, **run: object,
) -> list[str]:  # fmt: skip
    """One run per host at each level (a round on November `day`), stock figures with
    `noise` relative jitter; hosts in `slow` get that factor. Returns the host names."""
    rng = random.Random(seed)
    base = {1: 60.0, 10: 380.0, 64: 780.0}
    names = [f"gpu{i:02d}" for i in range(hosts)]
    for name in names:
        factor = (slow or {}).get(name, 1.0)
        figures = {c: base.get(c, 100.0) * factor * (1 + rng.uniform(-noise, noise))
                   for c in levels}  # fmt: skip
        extra = dict(run)
        if name in (slow or {}):
            extra.setdefault("power_limit_w", 500.0)
        extra.setdefault("started", f"2026-11-{day:02d}T00:00:00+00:00")
        run_id = f"202611{day:02d}T000000Z-baseline-{name}"
        write_run(root, name, run_id, figures, **extra)  # type: ignore[arg-type]
    return names


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file of the archive but the index, with size and mtime: nothing else changed."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and "index" not in p.relative_to(root).parts[:1]
    }
