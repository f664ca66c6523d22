"""What the real-engine tiers (tests/engines on CPU, tests/gpu/test_real_engine.py on the
GPU) share: the CLI run as a user types it in a site folder, and llama-server's own
numbers (its /metrics counters, its throughput gauge while it ran requests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def site_cli(site: Path, inventory: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """The CLI in the site folder, against its inventory (but for the tasks without one)."""
    chosen = [] if args[0] in ("profiles", "compare") else ["--inventory", inventory]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    env.pop("GPUFLEET_INVENTORY", None)
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args, *chosen], capture_output=True,
        text=True, timeout=timeout, cwd=site, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def server_counters(port: int) -> dict[str, float]:
    """llama-server's own /metrics counters and gauges, by name."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    pattern = r"^(llamacpp:\w+) ([\d.e+-]+)$"
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.M)}


def busy_gauge(level_metrics: Path) -> float | None:
    """The server's own generation rate over a level: the mean of its /metrics throughput
    gauge (llamacpp:predicted_tokens_seconds, archived as sglang:gen_throughput) while it
    was running requests; None where the level's samples hold none."""
    if not level_metrics.exists():
        return None
    samples = [json.loads(line) for line in level_metrics.read_text().splitlines()]
    busy = [s.get("sglang:gen_throughput") for s in samples if s.get("sglang:num_running_reqs")]
    busy = [b for b in busy if b]
    return sum(busy) / len(busy) if busy else None
