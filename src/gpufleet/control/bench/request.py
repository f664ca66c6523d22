"""What one benchmark asks for, as the tasks parse it (cli/bench_tasks.py) and control/bench/run.py
turns it into a host's BenchPlan. A light module: `inv --list` imports it for the defaults.

Defaults shared with the plan are the plan's own (records.BenchPlan), declared once.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import MISSING, dataclass, field
from typing import Any

from gpufleet.archive.layout import Archive
from gpufleet.errors import UserError
from gpufleet.host.bench import clients
from gpufleet.records import BenchPlan, Level, PromptRow
from gpufleet.wire import JsonDict, JsonObject

MAX_PROMPTS = 100_000  # as --num-prompts allows
PLAN = BenchPlan  # the host-side defaults (a dataclass field's default is a class attribute)


def option(default: Any = MISSING, *, help: str) -> Any:
    """A request field that is also a task option: its help is declared here, beside its
    type and default (as vLLM's arg_utils reads a config dataclass's fields);
    cli/options.py says it, with the default, in the task's help."""
    return field(default=default, metadata={"help": help})


@dataclass
class BenchRequest:
    """Everything one bench asks, as the task parsed it; its defaults are the plan's (BenchPlan),
    and it travels in a sweep's record so `--resume` runs it again. A field that is an option
    declares its help too (`option`); cli/common_options.py adds only how a value is checked."""

    concurrency: list[int] = field(
        metadata={"help": "levels, comma separated and/or repeated (e.g. 1,10,64)"}
    )
    profile: str | None = option(
        None, help="bench the running server of this profile (default: the one running)"
    )
    port: int | None = option(None, help="bench the server on this port")
    num_prompts: int | None = option(None, help="requests per level")
    duration: float | None = option(None, help="seconds per level instead of a request count")
    request_rate: float | None = option(
        None, help="Poisson arrivals per second (default: all at once, capped by C)"
    )
    request_timeout: float = option(
        PLAN.request_timeout, help="seconds one request may take, connecting included (a "
        "longer one fails as timed out); with the plan it bounds when the run's job ends",
    )  # fmt: skip
    output_len: int = option(PLAN.output_len, help="output tokens per request, ignore_eos on")
    prompts: str = option("coding", help="coding, chat, random (words), random-ids (token-exact), "
                          "a JSONL file or a ShareGPT JSON file")  # fmt: skip
    random_input_len: int = option(
        256, help="prompt length: words for --prompts random, tokens for random-ids"
    )
    random_output_len: int | None = option(None, help="random-ids: output tokens")
    random_range_ratio: float = option(
        1.0, help="random-ids: lengths uniform in [len x ratio, len]"
    )
    random_vocab: int = option(  # workloads.ID_HIGH
        30_000, help="token ids are drawn below this (random-ids, shared-prefix, traces): the "
        "model's vocabulary size when it is under 30000",
    )  # fmt: skip
    workload: str = option(PLAN.workload, help="single, multiturn[:turns=N] (sessions; C counts "
                           "sessions), shared-prefix[:groups=G,per_group=P,prefix_len=L,"
                           "question_len=Q]")  # fmt: skip
    trace: str | None = option(
        None,
        help="replay a Mooncake-format JSONL trace at its "
        "timestamps (e.g. playbooks/traces/mooncake-sample.jsonl)",
    )
    trace_speedup: float = option(1.0, help="replay the trace this many times faster")
    trace_prompts: str | None = None  # a prompt set whose texts ride the trace's arrivals
    flush_cache: bool = option(PLAN.flush_cache, help="flush the server's prefix cache before "
                               "each level (--no-flush keeps it)")  # fmt: skip
    slo: dict[str, float] = field(default_factory=dict, metadata={"help": "per-request SLO, "
                                  "e.g. ttft_ms=500,tpot_ms=50,e2e_ms=20000: goodput and "
                                  "attainment"})  # fmt: skip
    output_details: bool = option(PLAN.output_details, help="add bench_serving's per-request "
                                  "arrays (ttfts, itls, ...) to results")  # fmt: skip
    repeat: int = option(1, help="run the levels N times, in rounds, for 95% confidence intervals")
    client_procs: int | str = option(PLAN.client_procs, help="load generator processes per "
                                     "level on the host (N), or auto: from the last level's CPU "
                                     "per token")  # fmt: skip
    seed: int = option(
        PLAN.seed, help="prompt order seed (same seed = same prompts for every profile)"
    )
    # None: the profile's engine's dialect (control/server/engines.py)
    backend: str | None = option(None, help="sglang (/generate), openai (/v1/completions), "
                                 "openai-chat (any OpenAI-compatible server)")  # fmt: skip
    # the profile's engine where the caller resolved it: a sweep or tune cell's label
    # (`draft[depth=2]`) names no profile file to read it from
    server_engine: str | None = None
    warmup: int = option(PLAN.warmup, help="warm-up requests per level, excluded from figures")
    metrics: bool = True
    url: str | None = option(None, help="server URL for --client local")
    api_key_env: str | None = option(
        None,
        help="--client local: name of the environment "
        "variable holding the server's API key (sent as "
        "Authorization: Bearer; never printed or archived)",
    )
    archive: Archive = field(default_factory=Archive.at)
    command_line: list[str] = field(default_factory=lambda: list(sys.argv))
    fixed_levels: list[dict[str, int]] | None = None  # explicit requests per level
    engine: str = option(PLAN.engine, help=clients.HELP)
    tokenizer: str | None = option(None, help="tokenizer path for --engine sglang-bench")
    telemetry_interval_s: float = option(
        0.5, help="seconds between GPU power/utilisation samples (0: off)"
    )

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
    """Refuse what a backend or bench client cannot send, before any host is touched (the
    client's facts are its entry's, host/bench/clients.py)."""
    client = clients.CLIENTS[request.engine]
    said = f"--engine {client.name}"
    if not client.token_ids and any(row.prompt is None for row in rows):
        raise UserError(f"{said}: prompt set {label} needs {clients.able('token_ids')}")
    if not client.duration and request.duration:
        raise UserError(f"{said}: it has no --duration; give --num-prompts")
    if not client.processes and request.client_procs != 1:
        raise UserError(f"{said}: it is one process; --client-procs needs "
                        f"{clients.able('processes')}")  # fmt: skip
    if request.backend == "openai-chat" and any(row.input_ids is not None for row in rows):
        raise UserError(
            f"--backend openai-chat: {label} sends token ids; use --backend sglang or openai"
        )
