"""The verb contract between the control plane and the host agent, declared once.

Each verb has one arguments dataclass here. The control plane builds it and sends it as one
JSON line on the agent's **stdin** (never in argv: `/proc/PID/cmdline` is readable by
every user of the host, and a launch spec carries the server's environment). The agent
reads that line, checks every field against the declared types (`from_wire`) and hands
the verb a typed object. Answers go back on stdout as JSON lines: progress events, then
one final line (`emit_result` / `emit_error`). A verb's `ANSWER` names its answer's record
(readings.py), which the control plane checks with `from_wire`; the answers read as plain
JSON are the `*Answer` TypedDicts below.

Standard library only: this module ships in the zipapp.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from gpufleet.host.agent import heartbeat
from gpufleet.host.agent.redact import scrub_known_tree
from gpufleet.kinds import Kind
from gpufleet.readings import (
    CleanAnswer,
    LaunchAnswer,
    StatusAnswer,
    StopAnswer,
    SysInfo,
    WaitReadyAnswer,
)
from gpufleet.records import HEALTH_TIMEOUT_S, BenchPlan, LaunchSpec
from gpufleet.wire import JsonDict, Record, WireError, check

MARK = "gpufleet_agent"
SERVE = "serve"  # `agent.pyz serve`: one `VERB ARGS` line per call until stdin ends
# `agent.pyz keeper JOB`: a Slurm job's step keeper (host/proc/stepkeeper.py), which says
# one of these two lines on stdout once it runs, or finds one running
KEEPER = "keeper"
KEEPER_READY = "gpufleet-keeper ready"
KEEPER_ALREADY = "gpufleet-keeper already running"


def keeper_error_file(job: str) -> str:
    """The keeper step's stderr, relative to the workdir, written on the node by slurmstepd
    (`srun --error`): where Slurm says why it ended the step (`*** STEP 7.1 ON n2 CANCELLED
    AT ... ***`). In the workdir itself, which exists before the keeper does."""
    return f"slurm-keeper-{job}.err"


class AgentError(Exception):
    """A failure the agent reports as `{"ok": false, "kind": ..., "error": ...}`."""

    def __init__(self, message: str, kind: Kind = Kind.ERROR) -> None:
        super().__init__(message)
        self.kind = kind


# -- arguments ----------------------------------------------------------------------------
GpuFault = dict[str, bool | int | float | str | list[int] | list[str]]
"""NVML readings injected into one simulated GPU, by field (sim/nvml_sim.py reads them by name):
`{"persistence": false, "xids": [79]}`; control/inventory/model.SimFault declares them."""


class SimGpus(TypedDict):
    """A rehearsal host's simulated GPUs as the control plane sends them; the agent writes
    them to the state directory's gpus.json (sim/gpustate.py)."""

    state_dir: str
    count: int
    model: str
    memory_mib: int
    reserved_mib: int
    faults: dict[str, GpuFault]  # GPU index (as a string) -> its faults
    boot_id: str | None


# what each of gpufleet's steps is called in `squeue -s` (issue 69: a keeper step "N.3 sh"
# stayed there unexplained); docs/INVENTORIES.md says what each one is
STEP_NAMES = {
    "shell": "gpufleet-files",  # the node's shell that moves files (the control's)
    "agent": "gpufleet-agent",  # the task's agent: ends with the task
    "keeper": "gpufleet-keeper",  # holds the job's steps where Slurm tracks them by cgroup
    "server": "gpufleet-server",  # a launched server: ends with the job or `inv stop`
    "bench": "gpufleet-bench",  # a bench runner: ends with its run
}


class Owner(TypedDict):
    """The control plane's task a verb comes from: who holds the host while it changes it
    (host/agent/ownership.py), said in another task's refusal."""

    id: str  # the task's identity: its control host, pid and start (one per task)
    task: str  # `inv sweep`
    control: str  # the machine the task runs on
    pid: int  # the task's process there
    since: str  # when it started (UTC, ISO 8601)


@dataclass
class VerbArgs:
    """What every verb receives: the host's identity, added by the control plane's Session."""

    VERB: ClassVar[str] = ""
    ANSWER: ClassVar[type[Record] | None] = None  # the result's declared type, when it has one

    host: str = ""
    expected_gpus: int | None = None
    sim: SimGpus | None = None  # the simulated GPU topology on rehearsal hosts
    # a node reached through Slurm (connection: srun): its job and its name there; what the
    # agent starts to run on (a server, a bench runner) is a step of that job
    slurm_job: str | None = None
    slurm_node: str | None = None
    # the inventory's run_as: the user servers and probes run as (host/agent/runas.py)
    run_as: str | None = None
    owner: Owner | None = None  # the task this call comes from

    def changes_host(self) -> bool:
        """Whether the verb changes what runs on the host: it must hold the host first."""
        return False

    def to_wire(self) -> str:
        """One JSON line for the agent's stdin."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")) + "\n"

    @classmethod
    def from_wire(cls, data: Any) -> typing.Self:
        """Check a decoded JSON object against the declared fields; AgentError if it fails."""
        if not isinstance(data, dict):
            raise AgentError(f"{cls.VERB}: arguments must be a JSON object", kind=Kind.BAD_INPUT)
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise AgentError(f"{cls.VERB}: unknown argument(s) {unknown}", kind=Kind.BAD_INPUT)
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                try:
                    values[f.name] = check(data[f.name], hints[f.name], f"{cls.VERB}.{f.name}")
                except WireError as exc:
                    raise AgentError(str(exc), kind=Kind.BAD_INPUT) from None
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise AgentError(f"{cls.VERB}: missing argument {f.name!r}", kind=Kind.BAD_INPUT)
        return cls(**values)


@dataclass
class EchoArgs(VerbArgs):
    """Transport self-test: the agent answers with what it received."""

    VERB: ClassVar[str] = "echo"
    payload: JsonDict = field(default_factory=dict)  # any JSON object, echoed back


@dataclass
class SysinfoArgs(VerbArgs):
    VERB: ClassVar[str] = "sysinfo"
    ANSWER: ClassVar[type[Record] | None] = SysInfo


@dataclass
class CleanArgs(VerbArgs):
    VERB: ClassVar[str] = "clean"
    ANSWER: ClassVar[type[Record] | None] = CleanAnswer
    dry_run: bool = False
    all_users: bool = False
    all_tenants: bool = False  # other PID namespaces, container cgroups, display servers
    timeout_s: float = 60.0
    grace_s: float = 10.0
    tolerance_mib: int = 0
    patterns: list[str] | None = None
    include_running: bool = False  # also kill servers whose /health answers 200
    clear_xids: list[int] | None = None  # GPUs an operator reset: their fatal XIDs cleared
    clear_reason: str = ""
    cleared_by: str = ""

    def changes_host(self) -> bool:
        return not self.dry_run


@dataclass
class StatusArgs(VerbArgs):
    VERB: ClassVar[str] = "status"
    ANSWER: ClassVar[type[Record] | None] = StatusAnswer
    patterns: list[str] | None = None
    servers_only: bool = False  # gpufleet's servers alone: no NVML read, no process scan


@dataclass
class LaunchArgs(VerbArgs):
    VERB: ClassVar[str] = "launch"
    ANSWER: ClassVar[type[Record] | None] = LaunchAnswer
    spec: LaunchSpec | None = None  # built by control/server/profiles.py (required)
    replace: bool = False
    grace_s: float = 15.0
    skip_flag_check: bool = False
    skip_gpu_check: bool = False
    dry_run: bool = False  # preflight only: the argv that would run (renames applied)
    allow_unhealthy: bool = False  # launch on a GPU the health check calls bad (recorded)
    status_hint: str = ""  # the pasteable `inv status` line for this host (from the control)

    def changes_host(self) -> bool:
        return not self.dry_run


@dataclass
class WaitReadyArgs(VerbArgs):
    VERB: ClassVar[str] = "wait-ready"
    ANSWER: ClassVar[type[Record] | None] = WaitReadyAnswer
    port: int = 30000
    timeout_s: float = HEALTH_TIMEOUT_S  # in all slices together; then the launch failed
    poll_s: float = 0.2
    health: bool = True  # False on non-zero node ranks: they serve no HTTP
    slice_s: float | None = None  # answer "waiting" after this long; the caller asks again
    elapsed_before_s: float = 0.0  # time already waited in earlier slices (for progress)


@dataclass
class StopArgs(VerbArgs):
    VERB: ClassVar[str] = "stop"
    ANSWER: ClassVar[type[Record] | None] = StopAnswer
    profile: str | None = None
    port: int | None = None
    grace_s: float = 15.0
    timeout_s: float = 60.0
    verify: bool = True

    def changes_host(self) -> bool:
        return True


@dataclass
class LogsArgs(VerbArgs):
    VERB: ClassVar[str] = "logs"
    profile: str | None = None
    port: int | None = None
    lines: int = 40
    follow: bool = False
    follow_s: float = 86400.0


@dataclass
class BenchStartArgs(VerbArgs):
    VERB: ClassVar[str] = "bench-start"
    plan: BenchPlan | None = None  # control.bench.build_plan's plan (required)
    prompts_file: str = ""

    def changes_host(self) -> bool:
        return True


@dataclass
class BenchRunArgs(VerbArgs):
    """Sent by bench-start to the detached runner it spawns, never by the control plane."""

    VERB: ClassVar[str] = "bench-run"
    run_id: str = ""


@dataclass
class BenchWatchArgs(VerbArgs):
    VERB: ClassVar[str] = "bench-watch"
    run_id: str = ""
    timeout_s: float = 7 * 86400.0  # then answer "watching"; call again from `offset`
    offset: int = 0  # bytes of progress.jsonl already streamed


CONTRACT: dict[str, type[VerbArgs]] = {
    cls.VERB: cls
    for cls in (
        EchoArgs,
        SysinfoArgs,
        CleanArgs,
        StatusArgs,
        LaunchArgs,
        WaitReadyArgs,
        StopArgs,
        LogsArgs,
        BenchStartArgs,
        BenchRunArgs,
        BenchWatchArgs,
    )
}


# -- answers (the final line's `result`) --------------------------------------------------
class BenchStartAnswer(TypedDict):
    run_id: str
    run_dir: str
    pid: int
    base_url: str
    profile: str | None
    slots: int | None  # requests the server serves at once (its engine's flags), if known
    engine: str | None


class EchoAnswer(TypedDict):
    """echo's answer: the payload as received, and the agent's argv and directory."""

    payload: JsonDict
    argv: list[str]
    cwd: str


class LogsAnswer(TypedDict):
    """A server's log: its path and last lines (none after --follow streamed them)."""

    log: str
    lines: list[str]


class RunStatusFile(TypedDict, total=False):
    """A run's status.json: written by its runner (or by bench-run when the runner
    crashed, by bench-watch when it died), read by bench-watch."""

    status: str  # starting | running | done | failed
    at: str  # ISO time it was written
    pid: int  # the runner's, while running
    reason: str | None  # why it failed
    tail: list[str]  # the runner log's last lines, when the runner died


class RunFile(TypedDict):
    """One file of a finished run, for the control plane to download."""

    name: str
    size: int


class BenchWatchAnswer(TypedDict):
    status: str  # done | failed | watching
    reason: str | None
    files: list[RunFile]
    run_dir: str
    tail: list[str] | None
    offset: int


class ProgressEvent(TypedDict, total=False):
    """A progress line of a streaming verb, or one the control plane adds; every key is
    optional because each kind carries its own (cli/progress.py prints them all)."""

    # wait-ready, and the control plane's start of a launch or bench run
    phase: str  # loading | ready | running | started; a bench level's start | end; finished
    elapsed_s: float
    last_line: str | None  # the server log's last line
    pid: int
    log: str
    run_id: str
    base_url: str
    warning: str
    note: str
    line: str  # logs --follow: one line of the server log
    # bench-watch: a level's start, progress every second or so, and end
    level: int  # its concurrency
    total: int  # requests in the level
    sessions: int  # multi-turn sessions, when they are fewer than the requests
    at: str  # ISO time the level began
    done: int
    errors: int
    tok_s: float
    eta_s: float | None
    completed: int
    failed: int
    output_throughput: float
    status: str  # finished: how the run ended (done | failed), before the watch answers


class Hello(TypedDict):
    """A serving agent's first line: where it runs, so later calls can find it."""

    workdir: str
    pid: int


class FinalLine(TypedDict, total=False):
    """A verb's last line: its answer (`ok` and `result`) or its failure (`kind`, `error`)."""

    ok: bool
    result: Any  # the verb's answer as JSON; the control plane reads it with ANSWER.from_wire
    kind: str  # a Kind, on failure
    error: str


# -- the wire -----------------------------------------------------------------------------
def read_args(verb: str, stream: typing.TextIO) -> VerbArgs:
    """The verb's typed arguments from the first line of `stream` (the agent's stdin)."""
    line = stream.readline()
    try:
        data = json.loads(line) if line.strip() else {}
    except ValueError as exc:
        raise AgentError(f"{verb}: arguments are not JSON ({exc})", kind=Kind.BAD_INPUT) from None
    return CONTRACT[verb].from_wire(data)


def write_line(obj: JsonDict) -> None:
    """One JSON line to the control plane, scrubbed like the archive: the values of the
    servers' keys and secret-looking ones (a crash tail echoing `api_key='...'`) hidden,
    in the answer's strings before it is serialised (no value can break the line)."""
    line = json.dumps(scrub_known_tree(obj)) + "\n"
    heartbeat.write(line)


def emit_event(event: ProgressEvent) -> None:
    """A progress line for streaming verbs (wait-ready, bench-watch, logs --follow)."""
    write_line({MARK: 1, "event": event})


def emit_result(result: Any) -> None:
    final: FinalLine = {"ok": True, "result": _plain(result)}
    write_line({MARK: 1, **final})


def _plain(value: Any) -> Any:
    """Records as their JSON objects, anywhere in the answer."""
    if isinstance(value, Record):
        return value.to_wire()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def emit_error(message: str, kind: Kind = Kind.ERROR) -> None:
    final: FinalLine = {"ok": False, "kind": kind, "error": message}
    write_line({MARK: 1, **final})
