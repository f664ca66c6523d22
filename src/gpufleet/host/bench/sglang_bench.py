"""`--engine sglang-bench`: SGLang's own `python -m sglang.bench_serving`, per level, on the
host, with gpufleet's prompt set, parsed into the same results schema.

bench_serving is installed wherever SGLang is. Prompts travel as a ShareGPT file (every
version reads `--dataset-name sharegpt --dataset-path`); bench_serving tokenizes them with
`--tokenizer` (default: the served model's path) and shuffles them with its own seed.

Every gpufleet option is passed on or refused (control/bench/run.py refuses --duration and
non-text workloads): warm-up as `--warmup-requests`, the cache flush as `--flush-cache`,
and `--output-details` always, so each level's requests are archived as
`requests-c<N>.jsonl` like gpufleet's own and every figure recomputes from them. The
per-request speed is computed as gpufleet computes it (output tokens / e2e latency, e2e =
TTFT + the sum of ITLs), not from TPOT.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from pathlib import Path

from gpufleet.host.agent import childenv, safewrite
from gpufleet.host.bench import slo as slos
from gpufleet.host.bench import telemetry
from gpufleet.host.bench.clientapi import (
    REQUESTS_FAILED,
    BenchRun,
    LevelOutcome,
    level_tail,
    telemetry_for,
)
from gpufleet.host.bench.dialects import DIALECTS
from gpufleet.host.bench.level import RequestFields, RequestRecord
from gpufleet.host.bench.rundir import log_size
from gpufleet.host.server import keys as serverkeys
from gpufleet.records import BenchPlan, Figures, Level


def sharegpt_file(texts: list[str], path: Path) -> Path:
    data = [
        {
            "id": str(i),
            "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}],
        }
        for i, t in enumerate(texts)
    ]
    safewrite.write_atomic(path, json.dumps(data))
    return path


def command(
    plan: BenchPlan, level: Level, dataset: Path, out: Path, tokenizer: str | None
) -> list[str]:
    rate = plan.request_rate
    argv = [
        sys.executable,
        "-m",
        "sglang.bench_serving",
        "--backend",
        DIALECTS[plan.backend].bench_serving if plan.backend in DIALECTS else "sglang",
        "--base-url",
        plan.base_url,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--sharegpt-output-len",
        str(plan.output_len),
        "--num-prompts",
        str(level.num_prompts),
        "--max-concurrency",
        str(level.concurrency),
        "--request-rate",
        "inf" if not rate or math.isinf(rate) else str(rate),
        "--seed",
        str(plan.seed),
        "--warmup-requests",
        str(plan.warmup),
        "--output-details",
        "--output-file",
        str(out),
    ]
    if plan.flush_cache:
        argv.append("--flush-cache")
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    return argv


def requests(row: Figures) -> list[RequestFields]:
    """bench_serving's per-request arrays (`--output-details`) as gpufleet request records."""
    out: list[RequestFields] = []
    arrays = zip(
        row.get("input_lens") or [], row.get("output_lens") or [], row.get("ttfts") or [],
        row.get("itls") or [], row.get("errors") or [], strict=False,
    )  # fmt: skip
    for index, (prompt, output, ttft, itl, error) in enumerate(arrays):
        ok = not error and output > 0
        out.append(
            {
                "index": index, "ok": ok, "error": error or None, "ttft": ttft,
                "e2e": ttft + sum(itl) if ok else 0.0, "itl": itl,
                "prompt_tokens": prompt, "completion_tokens": output,
            }
        )  # fmt: skip
    return out


def parse(line: str, level: Level, plan: BenchPlan) -> Figures:
    """One bench_serving JSONL line -> gpufleet's results row (bench_serving keys kept);
    per-request figures from its per-request arrays, as gpufleet computes them."""
    import statistics

    row = json.loads(line, parse_constant=lambda name: float(name.replace("Infinity", "inf")))
    completed = int(row.get("completed", 0))
    records = requests(row)
    ok = [r for r in records if r["ok"]]
    speeds = [r["completion_tokens"] / r["e2e"] for r in ok if r["e2e"] > 0]
    decoding = [
        (r["completion_tokens"] - 1) / (r["e2e"] - r["ttft"])
        for r in ok
        if r["completion_tokens"] > 1 and r["e2e"] > r["ttft"]
    ]
    rate = row.get("request_rate")
    row.update(
        max_concurrency=level.concurrency,
        failed=max(0, level.num_prompts - completed),
        engine="sglang-bench",
        accept_length=row.get("accept_length"),
        request_rate=rate if isinstance(rate, int | float) and math.isfinite(rate) else "inf",
        median_per_request_output_tps=statistics.median(speeds) if speeds else None,
        mean_per_request_output_tps=statistics.fmean(speeds) if speeds else None,
        median_per_request_decode_tps=statistics.median(decoding) if decoding else None,
        error_messages=sorted({r["error"] for r in records if r["error"]})[:20],
    )
    return row


def run_level(
    plan: BenchPlan,
    level: Level,
    texts: list[str],
    run_dir: Path,
    *,
    tokenizer: str | None,
    keys: dict[str, str] | None = None,
) -> Figures:
    """One level through bench_serving; the server's key in OPENAI_API_KEY, which it sends
    as `Authorization: Bearer` (its documented way: never on its command line)."""
    from datetime import UTC, datetime

    env = childenv.child_env()
    bearer = serverkeys.headers(keys or {}).get("Authorization")
    if bearer:
        env["OPENAI_API_KEY"] = bearer.removeprefix("Bearer ")

    started_at = datetime.now(UTC).isoformat()
    c = level.concurrency
    run_dir = run_dir.resolve()  # bench_serving runs with the run directory as cwd
    dataset = sharegpt_file(texts[: level.num_prompts], run_dir / f".sharegpt-c{c}.json")
    out = run_dir / f"bench_serving-c{c}.jsonl"
    log = run_dir / f"bench_serving-c{c}.log"
    with safewrite.open_fresh(log) as fh:
        proc = subprocess.run(
            command(plan, level, dataset, out, tokenizer),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=run_dir,
            env=env,
        )
    dataset.unlink(missing_ok=True)
    lines = out.read_text().splitlines() if out.exists() else []
    if proc.returncode != 0 or not lines:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        raise RuntimeError(f"sglang.bench_serving exited {proc.returncode}: {' | '.join(tail)}")
    return {**parse(lines[-1], level, plan), "started_at": started_at}


def bench_level(run: BenchRun, level: Level) -> LevelOutcome:
    """One level through SGLang's own bench_serving, as the bench client `sglang-bench`
    (host/bench/clients.py); the same results schema as gpufleet's own."""
    plan, writer, state = run.plan, run.writer, run.server_state
    c = level.concurrency
    texts = [row.prompt or "" for row in run.rows]
    gauge = telemetry_for(run, level)
    try:
        with gauge or contextlib.nullcontext():
            row = run_level(plan, level, texts, writer.dir, tokenizer=run.tokenizer, keys=run.keys)
    except (RuntimeError, OSError, ValueError) as exc:
        outcome = LevelOutcome("failed", f"level C={c}: {exc}", True)
    else:
        outcome = _recorded(run, level, row, gauge)
    run.marks.append((log_size(state), f"level C={c} ends"))
    return outcome


def _recorded(
    run: BenchRun, level: Level, row: Figures, gauge: telemetry.Sampler | None
) -> LevelOutcome:
    """bench_serving's row and its requests written as gpufleet's own levels are."""
    plan, c = run.plan, level.concurrency
    records = requests(row)
    run.writer.lines(f"requests-{level.tag}.jsonl", records)
    row.update(slos.goodput([RequestRecord(**r) for r in records], row["duration"], plan.slo or {}))
    if not plan.output_details:  # the arrays live in requests-c<N>.jsonl
        for key in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts"):
            row.pop(key, None)
        row["errors"] = row["error_messages"]
    row.update(dataset_name=plan.prompt_set, tag=plan.profile, seed=plan.seed,
               output_len=plan.output_len)  # fmt: skip
    checked, alive = level_tail(row, level, run, gauge)
    if not alive:
        return LevelOutcome("failed", f"the server process exited during level C={c}", True)
    if checked.failed:
        return LevelOutcome("failed", f"{REQUESTS_FAILED} (sglang.bench_serving)", True)
    return LevelOutcome("done", None, False)
