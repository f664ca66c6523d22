"""What one benchmark asks for, as the tasks parse it (cli/bench_tasks.py) and control/bench/run.py
turns it into a host's BenchPlan. A light module: `inv --list` imports it for the defaults.

Defaults shared with the plan are the plan's own (records.BenchPlan), declared once.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

from gpufleet.archive.layout import Archive
from gpufleet.errors import UserError
from gpufleet.records import BenchPlan, Level, PromptRow
from gpufleet.wire import JsonDict, JsonObject

MAX_PROMPTS = 100_000  # as --num-prompts allows
PLAN = BenchPlan  # the host-side defaults (a dataclass field's default is a class attribute)


@dataclass
class BenchRequest:
    """Everything one bench asks, as the task parsed it; its defaults are the plan's (BenchPlan),
    and it travels in a sweep's record so `--resume` runs it again."""

    concurrency: list[int]
    profile: str | None = None
    port: int | None = None
    num_prompts: int | None = None
    duration: float | None = None
    request_rate: float | None = None
    output_len: int = PLAN.output_len
    prompts: str = "coding"
    random_input_len: int = 256
    random_output_len: int | None = None  # random-ids: default output_len
    random_range_ratio: float = 1.0  # random-ids: lengths uniform in [len x ratio, len]
    random_vocab: int = 30_000  # token ids are drawn below this (workloads.ID_HIGH)
    workload: str = PLAN.workload  # single, multiturn[:turns=N], shared-prefix[:...]
    trace: str | None = None  # a Mooncake-format JSONL replayed at its timestamps
    trace_speedup: float = 1.0
    trace_prompts: str | None = None  # a prompt set whose texts ride the trace's arrivals
    flush_cache: bool = PLAN.flush_cache  # empty the server's prefix cache before each level
    slo: dict[str, float] = field(default_factory=dict)  # per-request bounds, ms (host/bench/slo)
    output_details: bool = (
        PLAN.output_details
    )  # bench_serving's per-request arrays in results.jsonl
    repeat: int = 1  # every level this many times, in rounds (1,10,64, 1,10,64, ...)
    client_procs: int | str = PLAN.client_procs  # generator processes per level, or "auto"
    seed: int = PLAN.seed
    backend: str | None = None  # None: the profile's engine's dialect (control/server/engines.py)
    # the profile's engine where the caller resolved it: a sweep or tune cell's label
    # (`draft[depth=2]`) names no profile file to read it from
    server_engine: str | None = None
    warmup: int = PLAN.warmup
    metrics: bool = True
    url: str | None = None
    api_key_env: str | None = None  # --client local: the variable holding the server's key
    archive: Archive = field(default_factory=Archive.at)
    command_line: list[str] = field(default_factory=lambda: list(sys.argv))
    fixed_levels: list[dict[str, int]] | None = None  # explicit requests per level
    engine: str = PLAN.engine  # or sglang-bench: SGLang's own bench_serving on the host
    tokenizer: str | None = None  # for sglang-bench (default: the served model's path)
    telemetry_interval_s: float = 0.5  # GPU sampling during each level; 0 = off

    def to_json(self) -> JsonDict:
        """As a sweep's record keeps it, so `--resume` runs what the sweep was started with
        (the archive is where the record lies; the API key's variable name is kept, never
        its value)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "archive"}  # fmt: skip

    @classmethod
    def from_json(cls, data: JsonObject, archive: Archive) -> BenchRequest:  # as archived
        """The request a record kept (fields this version does not know are left out)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"archive"}
        return cls(archive=archive, **{k: v for k, v in data.items() if k in known})

    def levels(self, available: int | None = None) -> list[Level]:
        """Requests (sessions for multiturn) per level; `available` caps them (a trace)."""
        if self.fixed_levels:
            return [Level(**level) for level in self.fixed_levels]
        if available is not None:
            count = min(self.num_prompts or available, available)
            return [Level(c, count) for c in self.concurrency]
        return [
            Level(c, self.num_prompts or default_num_prompts(c, self.duration))
            for c in self.concurrency
        ]


def default_num_prompts(concurrency: int, duration: float | None) -> int:
    """Enough requests for each slot to cycle a few times; with --duration, enough to last."""
    if duration:
        return min(max(100, 200 * concurrency), MAX_PROMPTS)
    return min(max(10, 4 * concurrency), MAX_PROMPTS)


def check_combination(request: BenchRequest, rows: list[PromptRow], label: str) -> None:
    """Refuse what a backend or engine cannot send, before any host is touched."""
    if request.engine == "sglang-bench":
        if any(row.prompt is None for row in rows):
            raise UserError(f"--engine sglang-bench: prompt set {label} needs --engine gpufleet")
        if request.duration:
            raise UserError(
                "--engine sglang-bench: bench_serving has no --duration; give --num-prompts"
            )
        if request.client_procs != 1:
            raise UserError(
                "--engine sglang-bench: bench_serving is one process; --client-procs needs "
                "--engine gpufleet"
            )
    if request.backend == "openai-chat" and any(row.input_ids is not None for row in rows):
        raise UserError(
            f"--backend openai-chat: {label} sends token ids; use --backend sglang or openai"
        )
