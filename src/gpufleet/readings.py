"""What the agent reads off a host and answers with, typed for both sides: GPUs as NVML
sees them (and the processes holding them), processes as psutil sees them, and the answers of
the verbs built on them (gpu-clean, status, stop). The host agent builds these records; the
control plane gets them back from `Session.call` checked (a verb's ANSWER) and the report
reads them by attribute. Standard library only: this module ships.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.records import ServerState
from gpufleet.wire import Record


@dataclass
class ProcessInfo(Record):
    """One process as psutil sees it (its command line with secret values hidden)."""

    pid: int
    user: str = "?"
    uid: int = -1
    name: str = "?"
    cmdline: list[str] = field(default_factory=list)
    ppid: int | None = None
    age_s: float | None = None
    status: str | None = None
    reason: str | None = None  # why gpu-clean left it alone


@dataclass
class GpuProcess(Record):
    """A PID NVML lists on a GPU, with what this host can see of it."""

    pid: int
    used_mib: int
    visible: bool = True  # False: another PID namespace (a container) holds it
    gpu: int | None = None  # the GPU's index, in gpu-clean's unattributed list
    user: str | None = None
    name: str | None = None
    cmdline: list[str] | None = None
    age_s: float | None = None
    ppid: int | None = None


@dataclass
class FatalXid(Record):
    """An XID after which the GPU is unfit until reset (host/gpu/health.py: FATAL_XIDS), as
    the host's ledger keeps it: the GPU's bus, the XID, its kernel log line, when first read."""

    bus: str | None
    xid: int
    line: str
    first_seen: str


@dataclass
class GpuHealth(Record):
    """What makes an empty GPU unfit to measure on, read through NVML (and the kernel log for
    XIDs). A field the GPU or driver does not support is None ("n/a"), never an error.
    `verdict` is ok, warn or bad, with `reasons` in words (host/gpu/health.py judges)."""

    verdict: str = "ok"
    reasons: list[str] = field(default_factory=list)
    persistence: bool | None = None
    compute_mode: str | None = None  # default, exclusive_process, prohibited
    mig: bool | None = None
    mig_pending: bool | None = None
    ecc: bool | None = None
    ecc_pending: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    retired_pages_pending: bool | None = None  # before Hopper (Hopper remaps rows)
    power_limit_w: float | None = None
    power_default_w: float | None = None
    sm_clock_app_mhz: int | None = None
    sm_clock_default_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    clock_events: list[str] | None = None  # throttle reasons at the time of the read
    temperature_c: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None  # the most the GPU and its slot support
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlinks_up: int | None = None
    nvlinks_down: list[int] | None = None
    xids: list[int] | None = None  # XID errors in the kernel log since the last check
    # fatal XIDs still in force (bus, xid, line, first_seen): cleared by a reboot or an operator
    fatal_xids: list[FatalXid] | None = None
    # fatal XIDs on a bus NVML no longer lists (XID 79: a GPU fell off the bus): the host's,
    # so every GPU of it carries them
    missing_xids: list[FatalXid] | None = None
    read_ms: float | None = None


@dataclass
class GpuReading(Record):
    """One GPU's memory through NVML: v2 `used` (v1 counts the driver's reservation, about
    615 MiB on an idle H200, and would never read 0) and the processes on it."""

    index: int
    uuid: str
    name: str
    total_mib: int
    used_mib: int
    reserved_mib: int
    v1_used_mib: int
    processes: list[GpuProcess] = field(default_factory=list)
    health: GpuHealth | None = None

    def is_clean(self, tolerance_mib: int = 0) -> bool:
        return self.used_mib <= tolerance_mib and not self.processes


@dataclass
class KilledProcess(Record):
    pid: int
    name: str
    user: str
    cmdline: list[str]
    signal: str  # SIGTERM, SIGKILL after Ns, exited by itself
    killed: bool  # False: it was gone before gpufleet signalled it
    survived: bool = False  # still there after SIGKILL


@dataclass
class LiveServerInfo(Record):
    """A server answering /health 200 that gpu-clean left running."""

    pid: int
    port: int
    gpus: list[int]
    pids: list[int]
    profile: str | None = None  # set for servers gpufleet launched


@dataclass
class CleanAnswer(Record):
    """gpu-clean on one host: NVML before and after, what was killed or left, the verdict."""

    before: list[GpuReading]
    gpus: list[GpuReading]  # after (on a dry run: before)
    clean: bool
    elapsed_s: float
    refused: list[ProcessInfo] = field(default_factory=list)
    unattributed: list[GpuProcess] = field(default_factory=list)
    live: list[LiveServerInfo] = field(default_factory=list)
    killed: list[KilledProcess] = field(default_factory=list)
    would_kill: list[ProcessInfo] = field(default_factory=list)  # dry run only
    cleared_xids: list[FatalXid] = field(default_factory=list)  # --clear-xid's, logged
    no_gpus: bool = False  # a host the inventory gives no GPUs (`gpus: {count: 0}`)


@dataclass
class GpuCheck(Record):
    """Some GPUs polled until they read 0 MiB, or the time ran out."""

    clean: bool
    gpus: list[GpuReading]
    elapsed_s: float
    kept: list[LiveServerInfo] = field(
        default_factory=list
    )  # servers sharing these GPUs, left running


@dataclass
class ServerSummary(Record):
    """A server gpufleet launched on the host, as `inv status` lists it."""

    profile: str
    pid: int
    port: int
    status: str  # kinds.ServerStatus
    started_at: str
    engine: str
    log: str
    alive: bool
    health: str
    engine_version: str | None = None
    uptime_s: float | None = None
    ended: str | None = None  # why a dead server ended, where its log says (Slurm's line)


@dataclass
class StatusAnswer(Record):
    gpus: list[GpuReading]
    stale: list[ProcessInfo] = field(default_factory=list)
    servers: list[ServerSummary] = field(default_factory=list)


@dataclass
class StoppedServer(Record):
    port: int
    profile: str
    pid: int
    signal: str


@dataclass
class StopAnswer(Record):
    stopped: list[StoppedServer] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # state files whose process changed
    verify: GpuCheck | None = None


@dataclass
class LaunchAnswer(Record):
    """launch on one host: its preflight (refusals, warnings, renames, the argv that runs or
    would run, secrets hidden) and, when started, the server's state file."""

    started: bool
    errors: list[str] = field(default_factory=list)  # preflight refusals when not started
    warnings: list[str] = field(default_factory=list)
    renames: list[str] = field(default_factory=list)  # flags rewritten for this engine
    argv: list[str] = field(default_factory=list)
    engine_version: str | None = None
    accepts_config: bool = False  # `--config FILE.yaml` (SGLang 0.5.16+)
    gpu_health: list[str] = field(default_factory=list)  # each GPU's verdict
    state: ServerState | None = None
    # code-loading variables of the login the server does not get (said if it fails)
    dropped_env: list[str] = field(default_factory=list)


@dataclass
class WaitReadyAnswer(Record):
    """wait-ready on one host: ready, or the phase it ended in (running, crashed, timeout,
    or waiting when a slice is over) with the reason and the log's last lines."""

    ready: bool
    phase: str
    elapsed_s: float = 0.0
    reason: str | None = None
    tail: list[str] = field(default_factory=list)
    state: ServerState | None = None


@dataclass
class GpuFacts(Record):
    """One GPU as a run's manifest fingerprints it: identity and what changes speed (a
    manifest archived before a field existed reads it as None)."""

    index: int | None = None
    uuid: str | None = None
    name: str | None = None
    total_mib: int | None = None
    power_limit_w: float | None = None
    sm_clock_app_mhz: int | None = None
    persistence: bool | None = None
    ecc: bool | None = None
    mig: bool | None = None
    compute_mode: str | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    nvlinks_up: int | None = None
    health: str | None = None  # ok, warn or bad

    @classmethod
    def of(cls, gpu: GpuReading) -> GpuFacts:
        h = gpu.health or GpuHealth()
        return cls(
            index=gpu.index, uuid=gpu.uuid, name=gpu.name, total_mib=gpu.total_mib,
            power_limit_w=h.power_limit_w, sm_clock_app_mhz=h.sm_clock_app_mhz,
            persistence=h.persistence, ecc=h.ecc, mig=h.mig, compute_mode=h.compute_mode,
            pcie_gen_max=h.pcie_gen_max, pcie_width=h.pcie_width, nvlinks_up=h.nvlinks_up,
            health=h.verdict if gpu.health is not None else None,
        )  # fmt: skip


@dataclass
class SysInfo(Record):
    """The host's software and GPUs (the sysinfo verb; each run keeps it as sysinfo.json and
    its manifest's host facts)."""

    hostname: str | None = None
    kernel: str | None = None
    python: str | None = None
    python_executable: str | None = None
    uid: int | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    simulated: bool | None = None
    cpu_governor: str | None = None  # powersave slows the client and the scheduler
    driver: str | None = None
    cuda: str | None = None
    gpus: list[GpuFacts] = field(default_factory=list)
    nvml_error: str | None = None
