"""Records that cross a boundary (SSH, a file on the host, the archive), each with one
declared type that both sides import: the launch spec, the bench plan and its levels, the
server state file, the per-level result row. The verb arguments in host/agent/protocol.py and the
archive's own records (archive/kept.py) are checked the same way (gpufleet/wire.py).

Defaults are declared once, here. Standard library only: this module ships.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from gpufleet.wire import JsonDict, JsonObject, Record

HEALTH_TIMEOUT_S = 1800.0  # a big model's load, CUDA graphs and warm-up: the default wait


FlagValue = bool | int | float | str | list[bool | int | float | str] | None
"""A server flag's value in a profile or a grid point (`tp-size: 8`, `enable-x: true`; false
or null drops the flag)."""


class RandomLengths(TypedDict):
    """A random-ids prompt set's lengths, as bench_serving's random_* keys report them."""

    input_len: int
    output_len: int
    range_ratio: float


class RenameSpec(TypedDict):
    """control/server/engines.Rename as it travels: a flag the engine renamed."""

    old: str
    new: list[str]  # the words that replace the old flag (a value it took follows)
    takes_value: bool
    why: str


class TurnFigures(TypedDict):
    """One turn of a level's multi-turn sessions (results' `per_turn`, shown by compare)."""

    turn: int  # from 1
    completed: int
    failed: int
    mean_prompt_tokens: float
    cache_hit_rate: float  # cached / prompt tokens of the turn's finished requests
    mean_ttft_ms: float
    median_ttft_ms: float


Figure = (
    float | int | str | bool | None
    | list[str] | list[int] | list[float] | list[list[float]] | list[TurnFigures]
    | dict[str, float] | JsonObject  # the SLO; the server's /server_info as it answered
)  # fmt: skip
"""A value of a results row: a figure, a count, a verdict or note, the error messages or
GPUs sampled, per-request details (--output-details), the turns, the SLO. Figures is a row
(or part of one) in the making, which ResultRow checks key by key when the level is
written."""
Figures = dict[str, Figure]


@dataclass
class Level(Record):
    """One load level of a run: C requests in flight, this many prompts, which repeat."""

    concurrency: int
    num_prompts: int
    repeat: int = 1

    @property
    def tag(self) -> str:
        """How the level's files are named: c64, or c64-r2 for its second repeat."""
        return f"c{self.concurrency}" if self.repeat == 1 else f"c{self.concurrency}-r{self.repeat}"


@dataclass
class BenchPlan(Record):
    """What a benchmark run does, built on the control machine (control/bench/run.py), sent
    with bench-start, written as the run's plan.json and read by the runner."""

    run_id: str
    levels: list[Level]
    backend: str = "sglang"  # sglang (/generate), openai, openai-chat
    engine: str = "gpufleet"  # or sglang-bench (SGLang's own bench_serving)
    # the server cannot empty its prefix cache (no /flush_cache: llama.cpp's, vLLM's): each
    # level's text prompts start with a tag of their own, so no level reuses another's
    salt_prompts: bool = False
    output_len: int = 256
    profile: str | None = None
    port: int | None = None
    base_url: str | None = None  # --url, or set on the host from the server's state
    server_port: int | None = None  # set on the host: the server benched
    metrics_url: str | None = None  # set on the host when /metrics is sampled
    # the engine's /metrics gauge names -> the names results keep (control/server/engines.py)
    metric_names: dict[str, str] = field(default_factory=dict)
    tokenizer: str | None = None
    request_rate: float | None = None  # Poisson arrivals per second; None: all at once
    duration: float | None = None  # seconds per level instead of a request count
    request_timeout: float = 3600.0  # seconds one request may take, connecting included
    warmup: int = 1
    seed: int = 0
    ignore_eos: bool = True
    metrics: bool = True
    telemetry_interval_s: float | None = None
    flush_cache: bool = True
    slo: dict[str, float] = field(default_factory=dict)
    output_details: bool = False
    prompt_set: str = ""
    workload: str = "single"
    prompt_set_sha256: str | None = None
    prompts_sha256: str | None = None
    system_prompt: str | None = None  # multi-turn sessions share it
    random: RandomLengths | None = None  # random-ids lengths
    model: str = ""
    client_procs: int | str = 1  # generator processes per level, or "auto" (host/bench/spread)


@dataclass
class LaunchSpec(Record):
    """What one host will run: built on the control side from a profile
    (control/server/profiles.py), sent with launch, executed by the agent (host/server/verbs.py)."""

    profile: str
    engine: str  # control/server/engines.py: sglang, sim, llamacpp, vllm or custom
    argv: list[str]
    env: dict[str, str]
    host: str  # the address the server binds
    port: int
    health_host: str
    health_path: str
    model_path: str
    check_model_path: bool
    gpus: list[int]  # as the server's CUDA counts them; the agent makes them NVML's
    log: str  # relative to the workdir
    health_timeout: float = HEALTH_TIMEOUT_S
    node_rank: int = 0
    nnodes: int = 1
    warnings: list[str] = field(default_factory=list)
    resolved_profile: JsonDict = field(default_factory=dict)  # Profile's, env redacted
    files: dict[str, str] = field(default_factory=dict)  # stored name -> content (host/files)
    secret_env: list[str] = field(default_factory=list)  # the profile's declared secret names
    # the engine's probes and facts (control/server/engines.py fills them; the agent runs them):
    version_argv: list[str] = field(default_factory=list)  # prints its version
    help_argv: list[str] = field(default_factory=list)  # + --help lists its flags
    flags_from: int = 0  # argv[flags_from:] are checked against that list
    version: str | None = None  # known without asking (the rehearsal engine: this gpufleet)
    version_missing: str = ""  # the refusal where version_argv prints nothing
    renames: list[RenameSpec] = field(default_factory=list)
    takes_config: bool = False  # `--config FILE` where its --help lists it (SGLang 0.5.16+)
    slots: int | None = None  # requests the server serves at once, where its flags say
    needs_gpu: bool = True  # False: a CPU engine (llama.cpp's server) runs without GPUs
    gpus_pinned: bool = False  # the profile named its GPUs: the server sees only those
    # the server puts work on every GPU it sees (llama.cpp's layer and row split): the agent
    # lists them in `gpus` where it can count them (host/server/placement.py)
    gpus_every: bool = False
    share_gpus: bool = False  # may run beside other gpufleet servers that share too
    # what root loads the model from: judged before launch (host/server/models.py)
    model_paths: list[str] = field(default_factory=list)
    model_code: bool = False  # the server runs the model's own Python (remote code)
    model_paths_known: bool = True  # model_paths are all it loads (a custom command: no)
    model_trust: str = "refuse"  # the host's python_trust: warn runs it, said


@dataclass
class ServerState(Record):
    """`<workdir>/servers/<port>.json`: what was launched and what became of it. Written
    by host/server/verbs.py, read by every verb that finds a server, copied into each run as
    server_state.json (the manifest's `server` comes from it). Secrets already redacted."""

    pid: int
    port: int
    profile: str
    engine: str
    health_url: str
    log: str  # absolute path of the server's log
    started_at: str
    status: str = "starting"  # kinds.ServerStatus
    pgid: int | None = None  # the server's own process group (setsid)
    proc: dict[str, int] | None = None  # procstat.ProcRef: pid and start time
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    engine_version: str | None = None
    log_offset: int = 0
    user: str | None = None  # who the server runs as (run_as, else the agent's user)
    gpus: list[int] = field(default_factory=list)  # NVML's indexes
    share_gpus: bool = False  # launched to share its GPUs with other gpufleet servers
    resolved_profile: JsonDict | None = None  # Profile's, env redacted
    flag_renames: list[str] = field(default_factory=list)
    key_file: str | None = None  # the server's secret flags (0600), read by gpufleet's client
    secrets_in_argv: bool = False  # the engine had no --config: its key shows in `ps`
    node_rank: int = 0
    ready_at: str | None = None
    failure: str | None = None
    failed_at: str | None = None
    stopped_at: str | None = None
    stop_signal: str | None = None
    pid_start: int | None = None  # state files written before `proc` existed
    gpu_health: list[str] = field(default_factory=list)  # "GPU 3: warn: ..." at launch
    allowed_unhealthy: bool = False  # launched with --allow-unhealthy
    slots: int | None = None  # requests it serves at once, as its engine's flags say
    slurm_job: str | None = None  # the job it is a step of: it ends with that job

    def update(self, **fields: Any) -> None:
        """Set fields by name (an unknown name is a bug: AttributeError)."""
        for name, value in fields.items():
            if not hasattr(self, name):
                raise AttributeError(f"ServerState has no field {name!r}")
            setattr(self, name, value)


@dataclass
class PromptRow(Record):
    """One line of a run's prompts.jsonl: what one request (or one multi-turn session)
    sends. Built on the control machine (control/bench/workloads.py, control/bench/run.py), uploaded
    with the plan, read by the runner. Exactly one of `prompt`, `input_ids` or `turns`; a
    field left out is absent from the file (the prompt set's digest stays what it was)."""

    prompt: str | None = None  # text (the prompt sets)
    input_ids: list[int] | None = None  # token ids (random-ids, shared-prefix, traces)
    turns: list[str] | None = None  # a multi-turn session's user messages
    output_len: int | None = None  # this request's own output length (else the plan's)
    at: float | None = None  # a trace's send time, seconds after the level starts

    def to_wire(self) -> JsonDict:
        return {k: v for k, v in super().to_wire().items() if v is not None}


F = float | None  # a figure a level may not have (no successful request, another engine)


@dataclass
class ResultRow(Record):
    """One line of results.jsonl: one level (one repeat) of a run, bench_serving's keys and
    meanings plus gpufleet's own. Written by the host's runner (host/bench/), read back by
    the control plane (tune, find-max) and the report (through the metric catalogue).

    Open: a level measured by SGLang's own bench_serving (`--engine sglang-bench`) carries
    that version's other keys, kept in `extra` and written back as they came.
    """

    OPEN: ClassVar[bool] = True
    # bench_serving 0.5.23 writes these even when null (tests/fixtures/...-result-keys.json):
    # a parser written for its file finds them in gpufleet's too
    BENCH_SERVING: ClassVar[frozenset[str]] = frozenset(
        {"accept_length", "tag", "dataset_name", "random_input_len", "random_output_len",
         "random_range_ratio", "server_info", "request_rate", "backend", "duration"}
    )  # fmt: skip

    max_concurrency: int
    completed: int
    failed: int
    output_throughput: float
    backend: str | None = None
    engine: str | None = None  # sglang-bench when bench_serving measured the level
    level_status: str | None = None  # ok | failed
    repeat: int = 1
    started_at: str | None = None
    request_rate: float | str | None = None  # "inf": all at once (JSON has no Infinity)
    duration: F = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: F = None
    input_throughput: F = None
    total_throughput: F = None
    concurrency: F = None  # bench_serving's: mean requests in flight
    mean_per_request_output_tps: F = None
    median_per_request_output_tps: F = None
    p10_per_request_output_tps: F = None
    median_per_request_decode_tps: F = None  # (output tokens - 1) / (e2e - ttft)
    mean_ttft_ms: F = None
    median_ttft_ms: F = None
    std_ttft_ms: F = None
    p90_ttft_ms: F = None
    p95_ttft_ms: F = None
    p99_ttft_ms: F = None
    mean_tpot_ms: F = None
    median_tpot_ms: F = None
    std_tpot_ms: F = None
    p90_tpot_ms: F = None
    p95_tpot_ms: F = None
    p99_tpot_ms: F = None
    mean_itl_ms: F = None
    median_itl_ms: F = None
    std_itl_ms: F = None
    p90_itl_ms: F = None
    p95_itl_ms: F = None
    p99_itl_ms: F = None
    mean_e2e_latency_ms: F = None
    median_e2e_latency_ms: F = None
    std_e2e_latency_ms: F = None
    p90_e2e_latency_ms: F = None
    p95_e2e_latency_ms: F = None
    p99_e2e_latency_ms: F = None
    max_output_tokens_per_s: F = None
    max_concurrent_requests: int | None = None
    error_messages: list[str] = field(default_factory=list)
    total_cached_tokens: int | None = None
    cache_hit_rate: F = None
    per_turn: list[TurnFigures] | None = None  # multi-turn sessions, turn by turn
    accept_length: F = None  # SGLang's average speculative acceptance (server_info)
    # each request's own: completion tokens / its spec_verify_ct (host/bench/metrics.py)
    p10_request_accept_length: F = None
    median_request_accept_length: F = None
    p90_request_accept_length: F = None
    depth_switches: int | None = None  # draft-depth changes the server logged in the level
    server_info: JsonObject | None = None  # SGLang's /server_info, as it answered
    dataset_name: str | None = None
    tag: str | None = None
    seed: int | None = None
    output_len: int | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: F = None
    warmup_errors: list[str] = field(default_factory=list)  # failed warm-up requests
    cache_flushed: bool | None = None
    prompts_salted: bool | None = None  # each text prompt began with the level's own tag
    # --slo (host/bench/slo.py)
    slo: dict[str, float] | None = None
    slo_attainment: F = None
    good_requests: int | None = None
    goodput_request_throughput: F = None
    goodput_output_throughput: F = None
    # GPU telemetry (host/bench/telemetry.py)
    gpu_energy_j: F = None
    gpu_energy_source: str | None = None
    gpu_energy_integrated_j: F = None
    gpu_power_avg_w: F = None
    gpu_power_peak_w: F = None
    gpu_util_avg: F = None
    gpus_sampled: list[int] | None = None
    output_tokens_per_joule: F = None
    joules_per_output_token: F = None
    # the server's Prometheus gauges over the level (host/bench/serverapi.PROM_KEYS)
    prom_num_running_reqs_max: F = None
    prom_num_running_reqs_mean: F = None
    prom_num_queue_reqs_max: F = None
    prom_num_queue_reqs_mean: F = None
    prom_gen_throughput_max: F = None
    prom_gen_throughput_mean: F = None
    prom_token_usage_max: F = None
    prom_token_usage_mean: F = None
    prom_spec_accept_length_max: F = None
    prom_spec_accept_length_mean: F = None
    # the client certifies itself (host/bench/clientcert.py): None when it kept up
    client_bound: str | None = None  # the client set the pace
    client_late: str | None = None  # its timers fired late: TTFT and ITL may read high
    client_procs: int | None = None  # generator processes (--client-procs)
    client_cpu_cores: F = None  # the generator processes' CPU over the level, in cores
    client_dispatch_lag_p50_ms: F = None  # from when a request was due to when it went out
    client_dispatch_lag_p99_ms: F = None
    client_idle_slot_share: F = None  # mean dispatch lag / mean E2E: load the client withheld
    client_loop_lag_p99_ms: F = None  # how late a 5 ms timer fired
    client_loop_lag_max_ms: F = None
    # open loop under a concurrency cap: arrival to a free slot, apart from the latencies
    mean_queue_wait_ms: F = None
    median_queue_wait_ms: F = None
    std_queue_wait_ms: F = None
    p90_queue_wait_ms: F = None
    p95_queue_wait_ms: F = None
    p99_queue_wait_ms: F = None
    offered_request_rate: F = None  # the level's arrivals per second (open loop)
    achieved_request_rate: F = None  # its sends per second: below 95% of offered, overloaded
    completed_request_rate: F = None  # its answers per second over the same window: likewise
    queue_at_last_arrival: int | None = None  # arrived, not yet answered, at the last arrival
    overloaded: bool | None = None
    overload_unjudged: str | None = None  # why its answers could not say (a short level)
    # where the output token counts came from (host/bench/tokencount.py): usage, tokenizer
    # or chunks; whether ITL is per token or per chunk; the sources' disagreements
    output_tokens_source: str | None = None
    itl_basis: str | None = None
    output_tokens_note: str | None = None
    # the steady window: full load, ramp-up and drain left out (host/bench/steady.py)
    steady_note: str | None = None  # why a level has no steady window
    steady_duration: F = None
    steady_requests: int | None = None
    steady_output_throughput: F = None
    steady_median_ttft_ms: F = None
    steady_median_tpot_ms: F = None
    steady_median_per_request_output_tps: F = None
    extra: JsonObject = field(default_factory=dict)  # bench_serving's other keys
    given: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    @classmethod
    def from_wire(cls, data: Any, where: str = "") -> ResultRow:
        row = super().from_wire(data, where)
        row.given = frozenset(data)  # a null the writer meant (cache_flushed: None) stays
        return row

    def to_wire(self) -> JsonDict:
        """As results.jsonl has it: a figure the level does not have is absent, not null,
        unless the writer gave it as null or bench_serving always writes it."""
        keep = self.given | self.BENCH_SERVING
        wire = super().to_wire()
        wire.pop("given", None)
        declared = {k: v for k, v in wire.items() if v is not None or k in keep}
        return {**declared, **self.extra}

    def get(self, key: str, default: Any = None) -> Any:
        """A figure by its results.jsonl name, for code driven by the metric catalogue."""
        if key in self.extra:
            return self.extra[key]
        value = getattr(self, key, None) if key != "extra" else None
        return default if value is None else value
