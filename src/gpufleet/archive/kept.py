"""Records the archive keeps under `logs/` and every reader gets back, typed: the run
manifest, the sweep state, the tune record and the find-max record (archive/layout.py says
where each lives).

Each carries a `schema` version. A reader gets the record through `load`, which upgrades
an older version it knows and refuses, in one line, a newer one or one that does not match
its type (a hand-edited or truncated file): UserError names the file and the field.
The control plane, the archive and the report import this module; the host agent does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict, TypeVar

from gpufleet.engine_facts import AdaptiveSlot
from gpufleet.errors import UserError
from gpufleet.kinds import CellStatus, SweepStatus
from gpufleet.readings import GpuFacts
from gpufleet.records import BenchPlan, FlagValue
from gpufleet.wire import JsonDict, JsonObject, Record, WireError

R = TypeVar("R", bound="Archived")
# the most of a record file read (a sweep of 128 hosts x hundreds of cells is a few MiB): a
# record that is larger, or a link to an endless file (/dev/zero), is refused, not read
RECORD_BYTES = 64 << 20


class Archived(Record):
    """A record stored as a JSON file: versioned, read back checked."""

    SCHEMA = 1
    NOUN = "record"  # what the one-line refusal calls it
    WRITTEN = "written"

    @classmethod
    def load(cls: type[R], path: Path, data: Any | None = None) -> R:
        """The record in `path` (or its already-decoded `data`), checked and upgraded."""
        what = f"{path}"
        try:
            if data is None:
                with open(path, "rb") as fh:
                    raw = fh.read(RECORD_BYTES + 1)
                if len(raw) > RECORD_BYTES:
                    raise ValueError(f"over {RECORD_BYTES >> 20} MiB: not read")
                data = json.loads(raw)
        except (OSError, ValueError) as exc:
            raise UserError(f"{what}: unreadable ({exc})") from None
        if not isinstance(data, dict):
            raise UserError(f"{what}: expected a JSON object")
        schema = data.get("schema", 1)
        if not isinstance(schema, int) or schema > cls.SCHEMA:
            raise UserError(
                f"{what}: {cls.WRITTEN} by a newer gpufleet ({cls.NOUN} schema {schema!r}); this "
                f"version reads schema {cls.SCHEMA} and older: upgrade gpufleet to read it"
            )
        try:
            return cls.from_wire(cls.upgrade(dict(data), schema), cls.__name__)
        except WireError as exc:
            raise UserError(f"{what}: not a gpufleet {cls.NOUN} ({exc})") from None

    @classmethod
    def upgrade(cls, data: JsonObject, schema: int) -> JsonObject:  # an older schema's file
        """Bring an older schema's fields to this one (schema 1 is every record so far)."""
        data["schema"] = cls.SCHEMA
        return data


# -- a run --------------------------------------------------------------------------------
@dataclass
class ServerFacts(Record):
    """What was launched, from the host's state file (never from playbooks/ as it is now)."""

    argv: list[str] | None = None
    env: dict[str, str] | None = None
    engine: str | None = None
    engine_version: str | None = None
    port: int | None = None
    profile: str | None = None
    log: str | None = None
    started_at: str | None = None
    flag_renames: list[str] | None = None
    secrets_in_argv: bool | None = None
    gpus: list[int] | None = None  # the GPUs the server ran on
    gpu_health: list[str] | None = None  # each GPU's health verdict at launch
    allowed_unhealthy: bool | None = None  # launched with --allow-unhealthy
    slots: int | None = None  # requests it served at once, as its engine's adapter read them


@dataclass
class HostFacts(Record):
    """The host's software and GPUs when the run began (the agent's sysinfo)."""

    driver: str | None = None
    cuda: str | None = None
    gpus: list[GpuFacts] | None = None
    packages: dict[str, str | None] | None = None
    hostname: str | None = None
    simulated: bool | None = None
    kernel: str | None = None
    cpu_governor: str | None = None


@dataclass
class PromptSetRef(Record):
    name: str | None = None
    sha256: str | None = None
    prompts_sha256: str | None = None
    seed: int | None = None


@dataclass
class LevelOutcome(Record):
    """One level in a line: what `inv runs` and a failed run's summary show."""

    concurrency: int
    output_throughput: float
    status: str | None = None
    repeat: int = 1


@dataclass
class Superseded(Record):
    at: str
    note: str


@dataclass
class Manifest(Archived):
    """`logs/<host>/<run-id>/manifest.json`: what a run was and the sha256 of every file."""

    NOUN = "manifest"
    WRITTEN = "archived"

    run_id: str
    host: str
    status: str  # kinds.RunStatus
    schema: int = 1
    plan: BenchPlan | None = None  # None: the host never wrote plan.json
    profile: str | None = None
    reason: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    archived_at: str | None = None
    gpufleet_version: str | None = None
    command_line: list[str] = field(default_factory=list)
    server: ServerFacts = field(default_factory=ServerFacts)
    server_origin: str | None = None  # who launched the server measured (manifest.origin)
    resolved_profile: JsonDict | None = None  # control/server/profiles.Profile's
    host_facts: HostFacts = field(default_factory=HostFacts)
    prompt_set: PromptSetRef = field(default_factory=PromptSetRef)
    levels: list[LevelOutcome] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256
    superseded: Superseded | None = None


# -- a sweep ------------------------------------------------------------------------------
@dataclass
class Cell(Record):
    """One cell (a profile or grid point) on one host: where it got to."""

    status: str = CellStatus.PENDING  # kinds.CellStatus
    run_id: str | None = None
    path: str | None = None
    error: str | None = None
    steps_s: dict[str, float] = field(default_factory=dict)  # clean, launch, bench, stop


class ArmFields(TypedDict):
    """A sweep cell's server as the record keeps it (control/sweep/cells.ArmSpec.to_json):
    key and label, profile, the grid point's flags, the repeat, what a tune adds."""

    key: str  # the report reads the key and the label of every arm
    label: str
    profile: str
    overrides: NotRequired[dict[str, FlagValue]]  # always written; read with defaults
    repeat: NotRequired[int]
    remove: NotRequired[list[str]]
    files: NotRequired[dict[str, str]]
    env: NotRequired[dict[str, str]]


@dataclass
class SweepRecord(Archived):
    """`logs/sweeps/<sweep-id>.json`: the sweep's cells and how far each got (--resume
    reads it)."""

    NOUN = "sweep state"

    sweep_id: str
    profiles: list[str]
    hosts: list[str]
    concurrency: list[int]
    cells: dict[str, dict[str, Cell]]  # cell key -> host -> cell
    schema: int = 1
    kind: str = "sweep"  # sweep, tune, tune-verify
    arms: list[ArmFields] | None = None  # None: one per profile
    created_at: str | None = None
    status: str = SweepStatus.RUNNING  # kinds.SweepStatus
    durations_s: dict[str, float] = field(default_factory=dict)  # cell key -> seconds
    request: JsonDict | None = None  # control/bench/request.BenchRequest.to_json: --resume runs it


# -- a host's GPU health ---------------------------------------------------------------
@dataclass
class HealthRecord(Archived):
    """`logs/health/<host>.json`: each GPU's health verdict at the host's last gpu-clean
    (`--hosts healthy` skips a host with a bad GPU)."""

    NOUN = "health record"

    host: str
    at: str
    gpus: list[str]  # "GPU 3: bad: power limit 350 W, below its default 700 W"
    schema: int = 1

    @property
    def bad(self) -> list[str]:
        return [g for g in self.gpus if ": bad:" in g]


# -- tune and find-max --------------------------------------------------------------------
class ChoiceFields(TypedDict):
    """control/tune/table.Choice as the record keeps it: the depth chosen at one level."""

    concurrency: int
    depth: int
    why: str


class TuneCheck(TypedDict):
    """A tune's verification or load step on one host: the sweep that measured it, its rows
    or phases (control/tune/verify.VerdictRow, control/tune/step.Phase, as JSON) and the
    sentence said of it."""

    sweep_id: str
    sentence: str
    rows: NotRequired[list[JsonDict]]  # verify: control/tune/verify.VerdictRow's
    shortfalls: NotRequired[list[str]]  # verify: levels the tuned server fell short at
    phases: NotRequired[list[JsonDict]]  # step: control/tune/step.Phase's
    burst_sweep_id: NotRequired[str | None]  # step
    trace_sweep_id: NotRequired[str | None]  # step: the replay of --verify-trace
    headline: NotRequired[list[str]]  # step: each shape's headline (control/tune/headline.py)


@dataclass
class TuneRecord(Archived):
    """`logs/tunes/<tune-id>.json`: what was measured, chosen, written and verified."""

    NOUN = "tune record"

    tune_id: str
    profile: str
    depths: list[int]
    concurrency: list[int]
    min_request_speed: float | None
    sweep_state: str
    measured: dict[str, dict[str, dict[str, float | str]]]  # depth -> C -> figures (basis: words)
    choices: list[ChoiceFields]  # one per batch range
    table: dict[str, AdaptiveSlot]  # SGLang's adaptive config as written
    ranges: list[str]
    notes: list[str]
    config: str
    tuned_profile: str
    launches: int
    schema: int = 1
    verify: dict[str, TuneCheck] = field(default_factory=dict)  # host -> its verification
    step: dict[str, TuneCheck] = field(default_factory=dict)  # host -> its load step


@dataclass
class ProbeRecord(Record):
    load: float
    attainment: float
    run_id: str
    status: str


@dataclass
class FindMaxRecord(Archived):
    """`logs/findmax/<host>/<stamp>-<profile>.json`: the highest load that held an SLO."""

    NOUN = "find-max record"

    host: str
    by: str  # concurrency or request-rate
    target: float
    limit: float
    at: str
    schema: int = 1
    profile: str | None = None
    slo: dict[str, float] = field(default_factory=dict)
    holds_up_to: float | None = None
    fails_from: float | None = None
    probes: list[ProbeRecord] = field(default_factory=list)
