"""What a bench client's level function is given and what every one ends with: the runner
(host/bench/runner.py) calls the function its registry entry names (host/bench/clients.py)
once per level with the run (`BenchRun`) and the level, and gets back a `LevelOutcome`.
A client measures the level its own way, then ends with `level_tail`, so every client's
results.jsonl row, telemetry and progress event are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from gpufleet.host.bench import telemetry
from gpufleet.host.bench.level import Prompt
from gpufleet.host.bench.rundir import RunWriter
from gpufleet.host.gpu.nvml import load_pynvml
from gpufleet.host.server.state import server_alive
from gpufleet.records import BenchPlan, Figures, Level, PromptRow, ResultRow, ServerState

# where a level's reason counts its failed requests: the runner counts them over the run
REQUESTS_FAILED = "{failed requests}"


@dataclass(kw_only=True)
class BenchRun:
    """The run a level belongs to: its plan and prompt rows, where it writes, the
    tokenizer (the plan's, else the served model's), the launched server's state (None for
    a server gpufleet did not launch), the server log's marks (offset, what) and the
    server's secret flags (sent in headers, scrubbed from every file)."""

    plan: BenchPlan
    rows: list[PromptRow]
    writer: RunWriter
    tokenizer: str | None
    server_state: ServerState | None
    marks: list[tuple[int | None, str]]
    keys: dict[str, str]


class LevelOutcome(NamedTuple):
    status: str  # done or failed
    reason: str | None  # why it failed (REQUESTS_FAILED where the runner counts them)
    stop: bool  # no level after this one (the server died, the client itself failed)


LevelFunction = Callable[[BenchRun, Level], LevelOutcome]


def alive(state: ServerState | None) -> bool:
    """Whether the launched server still runs (a server not launched: assumed so)."""
    return server_alive(state) if state else True


def prompt_of(plan: BenchPlan, row: PromptRow) -> Prompt:
    """A prompt row as the generator sends it, the plan's defaults filled in."""
    return Prompt(
        text=row.prompt if row.prompt is not None else plan.system_prompt,
        output_len=row.output_len if row.output_len is not None else plan.output_len,
        input_ids=row.input_ids,
        at=row.at,
        turns=row.turns,
    )


def telemetry_for(run: BenchRun, level: Level) -> telemetry.Sampler | None:
    """A sampler of the server's GPUs, or None (no server state, no NVML, or turned off);
    its child's readings spool in the run's directory (root writes nowhere else)."""
    interval, state = run.plan.telemetry_interval_s, run.server_state
    if not interval or not state or not state.gpus:
        return None
    spool = run.writer.dir / f".telemetry-c{level.concurrency}-r{level.repeat}.spool"
    try:
        return telemetry.Sampler(load_pynvml(), list(state.gpus), interval, spool)
    except Exception:  # no NVML here (AgentError or a driver error): no telemetry, run goes on
        return None


def level_tail(
    figures: Figures, level: Level, run: BenchRun, gauge: telemetry.Sampler | None
) -> tuple[ResultRow, bool]:
    """What every client's level ends with: the GPU telemetry, the repeat, the level's
    status, its results.jsonl row checked against ResultRow, the progress event; (the row,
    whether the server is still alive)."""
    writer = run.writer
    if gauge is not None:
        writer.lines(f"telemetry-{level.tag}.jsonl", gauge.rows)
        figures.update(telemetry.summarize(gauge.rows, int(figures.get("total_output_tokens", 0))))
    still = alive(run.server_state)
    figures["repeat"] = level.repeat
    figures["level_status"] = "ok" if figures["failed"] == 0 and still else "failed"
    row = writer.result(figures, level)
    end = {"level": level.concurrency, "phase": "end", "completed": row.completed}
    writer.event(
        {**end, "failed": row.failed, "output_throughput": round(row.output_throughput, 1)}
    )
    return row, still
