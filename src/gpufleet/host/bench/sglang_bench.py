"""`--engine sglang-bench`: SGLang's own `python -m sglang.bench_serving`, per level, on the
host, with gpufleet's prompt set, parsed into the same results schema.

bench_serving is installed wherever SGLang is. Prompts travel as a ShareGPT file (every
version reads `--dataset-name sharegpt --dataset-path`); bench_serving tokenizes them with
`--tokenizer` (default: the served model's path) and shuffles them with its own seed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

BACKENDS = {"sglang": "sglang", "openai": "sglang-oai", "openai-chat": "sglang-oai-chat"}


def sharegpt_file(texts: list[str], path: Path) -> Path:
    data = [
        {
            "id": str(i),
            "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}],
        }
        for i, t in enumerate(texts)
    ]
    path.write_text(json.dumps(data))
    return path


def command(
    plan: dict[str, Any], level: dict[str, Any], dataset: Path, out: Path, tokenizer: str | None
) -> list[str]:
    rate = plan.get("request_rate")
    argv = [
        sys.executable,
        "-m",
        "sglang.bench_serving",
        "--backend",
        BACKENDS.get(plan["backend"], "sglang"),
        "--base-url",
        plan["base_url"],
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--sharegpt-output-len",
        str(plan["output_len"]),
        "--num-prompts",
        str(level["num_prompts"]),
        "--max-concurrency",
        str(level["concurrency"]),
        "--request-rate",
        "inf" if not rate or math.isinf(rate) else str(rate),
        "--seed",
        str(plan.get("seed", 0)),
        "--output-file",
        str(out),
    ]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    return argv


def parse(line: str, level: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """One bench_serving JSONL line -> gpufleet's results row (bench_serving keys kept)."""
    row = json.loads(line)
    completed = int(row.get("completed", 0))
    row.update(
        max_concurrency=level["concurrency"],
        failed=max(0, level["num_prompts"] - completed),
        engine="sglang-bench",
        accept_length=row.get("accept_length"),
        median_per_request_output_tps=None,
        errors=[],
    )
    # bench_serving reports no per-request speed: derive it from its median TPOT
    tpot = row.get("median_tpot_ms")
    if tpot:
        row["median_per_request_output_tps"] = 1000.0 / tpot
    return row


def run_level(
    plan: dict[str, Any],
    level: dict[str, Any],
    texts: list[str],
    run_dir: Path,
    tokenizer: str | None,
) -> dict[str, Any]:
    from datetime import UTC, datetime

    started_at = datetime.now(UTC).isoformat()
    c = level["concurrency"]
    run_dir = run_dir.resolve()  # bench_serving runs with the run directory as cwd
    dataset = sharegpt_file(texts[: level["num_prompts"]], run_dir / f".sharegpt-c{c}.json")
    out = run_dir / f"bench_serving-c{c}.jsonl"
    log = run_dir / f"bench_serving-c{c}.log"
    with open(log, "wb") as fh:
        proc = subprocess.run(
            command(plan, level, dataset, out, tokenizer),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=run_dir,
        )
    dataset.unlink(missing_ok=True)
    lines = out.read_text().splitlines() if out.exists() else []
    if proc.returncode != 0 or not lines:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        raise RuntimeError(f"sglang.bench_serving exited {proc.returncode}: {' | '.join(tail)}")
    return {**parse(lines[-1], level, plan), "started_at": started_at}
