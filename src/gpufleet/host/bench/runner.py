"""Run a bench plan level by level and write the run directory (on the host, detached).
Each level is measured by the level function of the plan's bench client (its entry in
host/bench/clients.py; what it is given and ends with: host/bench/clientapi.py).

Files written in the run directory:
    plan.json (input), prompts.jsonl (input), status.json (running/done/failed),
    progress.jsonl (events), results.jsonl (one line per level and repeat),
    requests-c<N>.jsonl (requests-c<N>-r<k>.jsonl for the k-th repeat, k > 1),
    metrics-c<N>.jsonl (Prometheus samples), server_info_before/after.json, sysinfo.json,
    nvml_before/after.json, server.log (the server's log, the run's slice marked)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from gpufleet.host.agent.protocol import RunStatusFile
from gpufleet.host.agent.redact import process_secrets
from gpufleet.host.bench import serverapi
from gpufleet.host.bench.clientapi import REQUESTS_FAILED, BenchRun, alive, prompt_of
from gpufleet.host.bench.clients import CLIENTS
from gpufleet.host.bench.metrics import DEFINITIONS
from gpufleet.host.bench.rundir import RunWriter, log_size, now_iso, write_server_log
from gpufleet.host.server import listener
from gpufleet.records import BenchPlan, PromptRow, ResultRow, ServerState
from gpufleet.wire import JsonDict


def _read_rows(run_dir: Path) -> list[PromptRow]:
    """prompts.jsonl: one row per prompt (control/bench/workloads.py says which shapes), checked."""
    lines = (run_dir / "prompts.jsonl").read_text().splitlines()
    return [
        PromptRow.from_wire(json.loads(line), f"prompts.jsonl:{number}")
        for number, line in enumerate(lines, 1)
        if line.strip()
    ]


def _failed_count(rows: list[ResultRow]) -> str:
    """Every failed request of the run, at every level: `24 of 24 requests failed (C=1: 8 of
    8, C=2: 8 of 8, C=4: 8 of 8)`, never the last level's count alone."""
    counts = [(r.max_concurrency, int(r.failed or 0), int(r.completed or 0)) for r in rows]
    failed = sum(f for _, f, _ in counts)
    sent = failed + sum(done for _, _, done in counts)
    levels = [f"C={c}: {f} of {f + done}" for c, f, done in counts if f]
    return f"{failed} of {sent} requests failed ({', '.join(levels)})"


def _run_levels(run: BenchRun) -> tuple[str, str | None]:
    """Every level in order, each through the level function of the plan's bench client
    (its registry entry's); a failed level fails the run, and a level that says stop (the
    server died, the client failed) ends it."""
    plan, writer, rows = run.plan, run.writer, run.rows
    client = CLIENTS[plan.engine]
    measure = client.level_function()
    status, reason = "done", None
    measured: list[ResultRow] = []  # each level's row, for the failed requests' count
    for level in plan.levels:
        before = writer.last
        c, n = level.concurrency, level.num_prompts
        refused = listener.refusal_for(run.server_state)  # the launched server, or nothing sent
        if refused:
            return "failed", refused
        run.marks.append((log_size(run.server_state), f"level C={c} begins ({n} prompts)"))
        requests = n
        if client.sessions:  # a multi-turn session is several requests
            requests = sum(prompt_of(plan, row).requests for row in rows[:n])
        start = {"level": c, "phase": "start", "total": requests, "at": now_iso()}
        writer.event({**start, "sessions": n} if requests != n else start)
        level_status, level_reason, stop = measure(run, level)
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
    if server_state is not None and alive(server_state):
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
    run = BenchRun(plan=plan, rows=rows, writer=writer, tokenizer=tokenizer,
                   server_state=server_state, marks=marks, keys=keys)  # fmt: skip
    status, reason = _run_levels(run)
    writer.json("server_info_after.json", serverapi.server_info(plan.base_url, keys, server_state))
    marks.append((log_size(server_state), f"run {plan.run_id} ends ({status})"))
    write_server_log(writer, server_state, marks, writer.secrets)
    writer.json("definitions.json", {"metrics": DEFINITIONS})
    if finish is not None:
        finish(writer)
    writer.status(status, reason=reason)
    writer.progress.close()
    return {"status": status, "reason": reason}
