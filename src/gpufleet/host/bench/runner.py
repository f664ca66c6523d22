"""Run a bench plan level by level and write the run directory (on the host, detached).

Files written in the run directory:
    plan.json (input), prompts.jsonl (input), status.json (running/done/failed),
    progress.jsonl (events), results.jsonl (one line per level and repeat),
    requests-c<N>.jsonl (requests-c<N>-r<k>.jsonl for the k-th repeat, k > 1),
    metrics-c<N>.jsonl (Prometheus samples), server_info_before/after.json, sysinfo.json,
    nvml_before/after.json, server.log (the server's log, the run's slice marked)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.host.agent.protocol import RunStatusFile
from gpufleet.host.agent.redact import process_secrets
from gpufleet.host.bench import serverapi, telemetry
from gpufleet.host.bench import slo as slos
from gpufleet.host.bench.clients import CLIENTS
from gpufleet.host.bench.level import Prompt, RequestRecord, Tally, salted
from gpufleet.host.bench.loadgen import LevelHooks, LevelSpec, run_async, run_level
from gpufleet.host.bench.metrics import DEFINITIONS, summarize
from gpufleet.host.bench.rundir import (
    RunWriter,
    depth_switches,
    log_size,
    now_iso,
    write_server_log,
)
from gpufleet.host.bench.spread import auto_procs, run_spread
from gpufleet.host.gpu.nvml import load_pynvml
from gpufleet.host.server import keys as serverkeys
from gpufleet.host.server import listener
from gpufleet.host.server.state import server_alive
from gpufleet.records import BenchPlan, Figures, Level, PromptRow, ResultRow, ServerState
from gpufleet.wire import JsonDict, carried

RATE_WINDOW_S = 3.0  # the live tok/s: tokens over about this many seconds


def _server_alive(state: ServerState | None) -> bool:
    return server_alive(state) if state else True


def client_procs(plan: BenchPlan, level: Level, last: ResultRow | None) -> int:
    """How many generator processes a level gets: `--client-procs N`, or `auto` from the
    previous level's measured CPU per token and token rate (the first level: one)."""
    if plan.client_procs != "auto":
        return max(1, int(plan.client_procs))
    if last is None:
        return 1
    return auto_procs(
        last.output_throughput, last.client_cpu_cores, level.concurrency, last.max_concurrency
    )


class _LiveProgress:
    """A level's progress events: requests done, tok/s over the last few seconds (tokens
    arrive in bursts) and the time left."""

    def __init__(
        self, plan: BenchPlan, prompts: list[Prompt], concurrency: int, writer: RunWriter
    ) -> None:
        self.plan, self.concurrency, self.writer = plan, concurrency, writer
        self.total = sum(p.requests for p in prompts)
        self.recent: collections.deque[tuple[float, int]] = collections.deque(
            [(time.perf_counter(), 0)]
        )
        # With ignore_eos every request streams exactly output_len tokens, so tokens
        # received say how far the level is; counting finished requests would not (at C=64
        # the first 64 all finish together, and after the first one the estimate read
        # ~1,300 s).
        expected = sum(p.output_len * p.requests for p in prompts)
        self.expected_tokens = expected if plan.ignore_eos else 0

    def _rate(self, tokens: int) -> float:
        now = time.perf_counter()
        while len(self.recent) > 1 and now - self.recent[1][0] >= RATE_WINDOW_S:
            self.recent.popleft()
        then, before = self.recent[0]
        self.recent.append((now, tokens))
        return (tokens - before) / max(1e-6, now - then)

    def _eta(self, tally: Tally, elapsed: float) -> float | None:
        if self.plan.duration:
            return max(0.0, self.plan.duration - elapsed)
        if self.expected_tokens and tally.tokens:
            return elapsed * max(0, self.expected_tokens - tally.tokens) / tally.tokens
        done = tally.done
        return (elapsed / done) * (self.total - done) if done else None

    def __call__(self, tally: Tally, elapsed: float) -> None:
        rate = self._rate(tally.tokens)  # in-flight requests too
        eta = self._eta(tally, elapsed)
        self.writer.event(
            {
                "level": self.concurrency,
                "done": tally.done,
                "total": self.total,
                "errors": tally.errors,
                "tok_s": round(rate, 1),
                "elapsed_s": round(elapsed, 1),
                "eta_s": round(eta, 1) if eta is not None else None,
            }
        )


async def _level(
    plan: BenchPlan, prompts: list[Prompt], level: Level, writer: RunWriter,
    *, keys: dict[str, str], procs: int = 1,
) -> tuple[Any, list[serverapi.MetricSample]]:  # fmt: skip
    progress = _LiveProgress(plan, prompts, level.concurrency, writer)
    samples: list[serverapi.MetricSample] = []
    stop = asyncio.Event()
    sampler = None
    if plan.metrics_url:
        sampler = asyncio.create_task(
            serverapi.sample_metrics(plan.metrics_url, samples, stop, keys, plan.metric_names)
        )
    generate = run_level if procs == 1 else functools.partial(run_spread, procs)
    spec = carried(  # the plan's fields the level sends with, by name
        LevelSpec,
        plan,
        request_rate=plan.request_rate or float("inf"),
        headers=serverkeys.headers(keys),
    )
    flush = (lambda: serverapi.flush_cache(plan.base_url, keys)) if plan.flush_cache else None
    hooks = LevelHooks(on_progress=progress, after_warmup=flush)
    run = await generate(plan.base_url, prompts, level.concurrency, spec=spec, hooks=hooks)
    stop.set()
    if sampler:
        await sampler
    return run, samples


# where a level's reason counts its failed requests: _run_levels counts them over the run
REQUESTS_FAILED = "{failed requests}"


def _sglang_bench_level(
    plan: BenchPlan, level: Level, texts: list[str], writer: RunWriter,
    *, tokenizer: str | None, server_state: ServerState | None, keys: dict[str, str],
) -> tuple[str, str | None]:  # fmt: skip
    """One level through SGLang's own bench_serving; same results schema."""
    from gpufleet.host.bench import sglang_bench

    c = level.concurrency
    gauge = _telemetry(plan, server_state, writer, level)
    try:
        with gauge or contextlib.nullcontext():
            row = sglang_bench.run_level(plan, level, texts, writer.dir,
                                         tokenizer=tokenizer, keys=keys)  # fmt: skip
    except (RuntimeError, OSError, ValueError) as exc:
        return "failed", f"level C={c}: {exc}"
    records = sglang_bench.requests(row)
    writer.lines(f"requests-{level.tag}.jsonl", records)
    row.update(slos.goodput([RequestRecord(**r) for r in records], row["duration"], plan.slo or {}))
    if not plan.output_details:  # the arrays live in requests-c<N>.jsonl
        for key in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts"):
            row.pop(key, None)
        row["errors"] = row["error_messages"]
    row.update(dataset_name=plan.prompt_set, tag=plan.profile, seed=plan.seed,
               output_len=plan.output_len)  # fmt: skip
    checked, alive = _level_tail(row, level, writer, gauge, server_state)
    if not alive:
        return "failed", f"the server process exited during level C={c}"
    if checked.failed:
        return "failed", f"{REQUESTS_FAILED} (sglang.bench_serving)"
    return "done", None


def _read_rows(run_dir: Path) -> list[PromptRow]:
    """prompts.jsonl: one row per prompt (control/bench/workloads.py says which shapes), checked."""
    lines = (run_dir / "prompts.jsonl").read_text().splitlines()
    return [
        PromptRow.from_wire(json.loads(line), f"prompts.jsonl:{number}")
        for number, line in enumerate(lines, 1)
        if line.strip()
    ]


def _prompt(plan: BenchPlan, row: PromptRow) -> Prompt:
    return Prompt(
        text=row.prompt if row.prompt is not None else plan.system_prompt,
        output_len=row.output_len if row.output_len is not None else plan.output_len,
        input_ids=row.input_ids,
        at=row.at,
        turns=row.turns,
    )


def _accept_length(reported: float | None, run: Any) -> float | None:
    """SGLang's average speculative acceptance length from /server_info, when it has one;
    else the level's requests' own (their tokens over their verify steps, pooled: from
    llama.cpp's per-response timings), so a drafting engine without SGLang's endpoint does
    not read like one that never drafts."""
    if reported is not None:
        return reported
    drafted = [r for r in run.records if r.ok and r.spec_verify_ct]
    steps = sum(r.spec_verify_ct for r in drafted)
    return sum(r.completion_tokens for r in drafted) / steps if steps else None


def _summary(
    plan: BenchPlan,
    run: Any,
    samples: list[serverapi.MetricSample],
    flushed: bool | None,
    keys: dict[str, str],
) -> Figures:
    """One results.jsonl row: bench_serving's figures plus Prometheus maxima and means."""
    info = serverapi.server_info(plan.base_url, keys)
    summary = summarize(
        run,
        plan.backend,
        {
            "dataset_name": plan.prompt_set,
            "tag": plan.profile,
            "seed": plan.seed,
            "output_len": plan.output_len,
            **random_lengths(plan),
            "accept_length": _accept_length(serverapi.accept_length(info), run),
            "server_info": info,
            "started_at": datetime.fromtimestamp(run.started_at, UTC).isoformat(),
            "warmup_errors": run.warmup_errors,
            "cache_flushed": flushed,
            "prompts_salted": plan.salt_prompts or None,
        },
        slo=plan.slo,
        with_details=bool(plan.output_details),
    )
    for key in serverapi.PROM_KEYS:
        vals = [s[key] for s in samples if key in s]
        if vals:
            summary[f"prom_{key.split(':')[1]}_max"] = max(vals)
            summary[f"prom_{key.split(':')[1]}_mean"] = sum(vals) / len(vals)
    return summary


def random_lengths(plan: BenchPlan) -> Figures:
    """bench_serving's random_* keys: the lengths of a random-ids set, else None."""
    random = plan.random
    return {
        "random_input_len": random["input_len"] if random else None,
        "random_output_len": random["output_len"] if random else None,
        "random_range_ratio": random["range_ratio"] if random else None,
    }


def _telemetry(
    plan: BenchPlan, state: ServerState | None, writer: RunWriter, level: Level
) -> telemetry.Sampler | None:
    """A sampler of the server's GPUs, or None (no server state, no NVML, or turned off);
    its child's readings spool in the run's directory (root writes nowhere else)."""
    interval = plan.telemetry_interval_s
    if not interval or not state or not state.gpus:
        return None
    spool = writer.dir / f".telemetry-c{level.concurrency}-r{level.repeat}.spool"
    try:
        return telemetry.Sampler(load_pynvml(), list(state.gpus), interval, spool)
    except Exception:  # no NVML here (AgentError or a driver error): no telemetry, run goes on
        return None


def _level_tail(
    figures: Figures,
    level: Level,
    writer: RunWriter,
    gauge: telemetry.Sampler | None,
    server_state: ServerState | None,
) -> tuple[ResultRow, bool]:
    """What both level runners (gpufleet's generator, SGLang's bench_serving) end with: the
    GPU telemetry, the repeat, the level's status, its results.jsonl row checked against
    ResultRow, the progress event; (the row, whether the server is still alive)."""
    if gauge is not None:
        writer.lines(f"telemetry-{level.tag}.jsonl", gauge.rows)
        figures.update(telemetry.summarize(gauge.rows, int(figures.get("total_output_tokens", 0))))
    alive = _server_alive(server_state)
    figures["repeat"] = level.repeat
    figures["level_status"] = "ok" if figures["failed"] == 0 and alive else "failed"
    row = writer.result(figures, level)
    end = {"level": level.concurrency, "phase": "end", "completed": row.completed}
    writer.event(
        {**end, "failed": row.failed, "output_throughput": round(row.output_throughput, 1)}
    )
    return row, alive


def _gpufleet_level(
    plan: BenchPlan, level: Level, rows: list[PromptRow], writer: RunWriter,
    *, server_state: ServerState | None, marks: list[tuple[int | None, str]], keys: dict[str, str],
) -> tuple[str, str | None, bool]:  # fmt: skip
    """Run one level with gpufleet's generator and write its files: (status, reason, stop)."""
    c = level.concurrency
    prompts = [_prompt(plan, row) for row in rows[: level.num_prompts]]
    if plan.salt_prompts:
        prompts = salted(prompts, f"[{plan.run_id[-6:]} {level.tag}] ")
    gauge = _telemetry(plan, server_state, writer, level)
    try:
        with gauge or contextlib.nullcontext():
            procs = client_procs(plan, level, writer.last)
            run, samples = run_async(_level(plan, prompts, level, writer, keys=keys, procs=procs))
    except Exception as exc:  # the generator itself failed: keep what we know
        return "failed", f"level C={c}: load generator error: {exc!r}", True
    begun = marks[-1][0]
    marks.append((log_size(server_state), f"level C={c} ends"))
    refused = listener.refusal_for(server_state)  # its /server_info carries the key
    if refused:
        return "failed", refused, True
    summary = _summary(plan, run, samples, run.after_warmup, keys)
    if (summary.get("server_info") or {}).get("speculative_adaptive"):
        summary["depth_switches"] = depth_switches(server_state, begun, marks[-1][0])
    if samples:
        writer.lines(f"metrics-{level.tag}.jsonl", samples)
    writer.lines(f"requests-{level.tag}.jsonl", [r.to_json() for r in run.records])
    row, alive = _level_tail(summary, level, writer, gauge, server_state)
    if not alive:
        return "failed", f"the server process exited during level C={c}", True
    if row.failed:
        return "failed", f"{REQUESTS_FAILED}: first at C={c}: {row.error_messages[:1]}", False
    return "done", None, False


def _failed_count(rows: list[ResultRow]) -> str:
    """Every failed request of the run, at every level: `24 of 24 requests failed (C=1: 8 of
    8, C=2: 8 of 8, C=4: 8 of 8)`, never the last level's count alone."""
    counts = [(r.max_concurrency, int(r.failed or 0), int(r.completed or 0)) for r in rows]
    failed = sum(f for _, f, _ in counts)
    sent = failed + sum(done for _, _, done in counts)
    levels = [f"C={c}: {f} of {f + done}" for c, f, done in counts if f]
    return f"{failed} of {sent} requests failed ({', '.join(levels)})"


def _run_levels(
    plan: BenchPlan,
    rows: list[PromptRow],
    writer: RunWriter,
    tokenizer: str | None,  # bench_serving's: the plan's, else the served model's
    *,
    server_state: ServerState | None,
    marks: list[tuple[int | None, str]],
    keys: dict[str, str],
) -> tuple[str, str | None]:
    """Every level in order, each through its engine; a failed level fails the run, and a
    level that says stop (the server died, the generator failed) ends it."""
    status, reason = "done", None
    measured: list[ResultRow] = []  # each level's row, for the failed requests' count
    for level in plan.levels:
        before = writer.last
        c, n = level.concurrency, level.num_prompts
        refused = listener.refusal_for(server_state)  # the launched server, or nothing sent
        if refused:
            return "failed", refused
        marks.append((log_size(server_state), f"level C={c} begins ({n} prompts)"))
        requests = n
        client = CLIENTS[plan.engine]
        if client.sessions:  # a multi-turn session is several requests
            requests = sum(_prompt(plan, row).requests for row in rows[:n])
        start = {"level": c, "phase": "start", "total": requests, "at": now_iso()}
        writer.event({**start, "sessions": n} if requests != n else start)
        if client.external:  # SGLang's bench_serving, a program per level
            texts = [row.prompt or "" for row in rows]
            level_status, level_reason = _sglang_bench_level(
                plan, level, texts, writer,
                tokenizer=tokenizer, server_state=server_state, keys=keys,
            )  # fmt: skip
            marks.append((log_size(server_state), f"level C={c} ends"))
            stop = level_status == "failed"
        else:
            level_status, level_reason, stop = _gpufleet_level(
                plan, level, rows, writer, server_state=server_state, marks=marks, keys=keys
            )
        if writer.last is not before and writer.last is not None:
            measured.append(writer.last)
        if level_status == "failed" and (reason is None or stop):  # the first, or the end
            status, reason = level_status, level_reason
        if stop:
            break
    if reason and REQUESTS_FAILED in reason:
        reason = reason.replace(REQUESTS_FAILED, _failed_count(measured), 1)
    return status, reason


def run_plan(
    run_dir: Path,
    server_state: ServerState | None = None,
    host_facts: JsonDict | None = None,  # file name -> its JSON content
    finish: Callable[[RunWriter], None] | None = None,
    keys: dict[str, str] | None = None,
) -> RunStatusFile:
    """Execute plan.json in `run_dir`; always ends with status.json done or failed.

    `keys` are the server's secret flags (its API key): sent in Authorization headers,
    scrubbed from every file the run writes, never written themselves.

    `finish` writes the last files (e.g. the NVML snapshot after the run) before the run is
    marked done, so a watcher that fetches on done never misses them.
    """
    writer = RunWriter(run_dir)
    if server_state is not None and _server_alive(server_state):
        writer.secrets = process_secrets(server_state.pid)
    keys = keys or {}
    writer.secrets = sorted({*writer.secrets, *keys.values()}, key=len, reverse=True)
    plan = BenchPlan.from_wire(json.loads((run_dir / "plan.json").read_text()), "plan.json")
    rows = _read_rows(run_dir)
    writer.status("running", pid=os.getpid())
    for name, data in (host_facts or {}).items():
        writer.json(name, data)
    if server_state:
        writer.json("server_state.json", server_state.to_wire())
    before = serverapi.server_info(plan.base_url, keys, server_state)
    writer.json("server_info_before.json", before)
    marks: list[tuple[int | None, str]] = [(log_size(server_state), f"run {plan.run_id} begins")]
    tokenizer = plan.tokenizer or serverapi.tokenizer(before)
    plan.tokenizer = tokenizer  # the generator counts tokens with it where the server did not
    status, reason = _run_levels(plan, rows, writer, tokenizer,
                                 server_state=server_state, marks=marks, keys=keys)  # fmt: skip
    writer.json("server_info_after.json", serverapi.server_info(plan.base_url, keys, server_state))
    marks.append((log_size(server_state), f"run {plan.run_id} ends ({status})"))
    write_server_log(writer, server_state, marks, writer.secrets)
    writer.json("definitions.json", {"metrics": DEFINITIONS})
    if finish is not None:
        finish(writer)
    writer.status(status, reason=reason)
    writer.progress.close()
    return {"status": status, "reason": reason}
