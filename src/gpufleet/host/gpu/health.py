"""Is an empty GPU fit to measure on? Read what changes speed or correctness through NVML
(and XIDs from the kernel log), then judge each GPU `ok`, `warn` or `bad` with reasons,
including outliers among the GPUs of one host.

A field the GPU or driver does not support reads None ("n/a"): NVML answers Not Supported
for NVLink on a single GPU, for retired pages on Hopper. Nothing here changes a setting.
Figures from the lent H200 are in docs/GPU-VALIDATION.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.host.agent import childenv, safewrite
from gpufleet.readings import FatalXid, GpuHealth, GpuReading
from gpufleet.wire import WireError

CLOCK_EVENTS = {  # NVML's clock event (throttle) reason bits; idle and app clocks are benign
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
    0x80: "hw_power_brake",
}  # fmt: skip
BAD_CLOCK_EVENTS = {"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}
# XIDs after which NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors, "Resolution
# Bucket (Immediate Action)": RESET_GPU or REBOOT) says the GPU is unfit until reset. Such an
# XID stays in force, whoever saw it first, until the host reboots (a new boot id) or an
# operator clears it after resetting the GPU (`inv gpu-clean --clear-xid N --reason ...`).
# Every other XID (13, 31, 43, 94: RESTART_APP) is a warning, reported once.
FATAL_XIDS = {
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "row remapping or page retirement pending",
    64: "row remapping or page retirement failed", 74: "NVLink error",
    79: "GPU has fallen off the bus", 95: "uncontained ECC error", 119: "GSP RPC timeout",
    120: "GSP error", 140: "unrecovered ECC error", 154: "GPU recovery action changed",
}  # fmt: skip
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
XID_LEDGER = Path("health") / "xids.json"  # in the workdir: XIDs seen, fatal ones in force
XID_CLEARED_LOG = Path("health") / "xid-clears.log"  # who cleared which XID, when, why
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
HOT_IDLE_C = 85
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def _na(fn: Callable[..., Any], *args: Any) -> Any:
    """The value, or None where NVML says Not Supported (or the binding lacks the call)."""
    try:
        return fn(*args)
    except Exception:  # NVMLError of any kind, a missing symbol, an older binding
        return None


def _call(nvml: Any, names: tuple[str, ...], *args: Any) -> Any:
    for name in names:
        fn = getattr(nvml, name, None)
        if fn is not None:
            return _na(fn, *args)
    return None


def read(nvml: Any, handle: Any, count: int) -> GpuHealth:
    """One GPU's health fields (no verdict yet: `judge` needs its siblings)."""
    started = time.perf_counter()
    h = GpuHealth()
    sm = getattr(nvml, "NVML_CLOCK_SM", 1)
    persistence = _na(nvml.nvmlDeviceGetPersistenceMode, handle)
    h.persistence = None if persistence is None else bool(persistence)
    mode = _na(nvml.nvmlDeviceGetComputeMode, handle)
    h.compute_mode = None if mode is None else COMPUTE_MODES.get(int(mode), str(mode))
    mig = _na(nvml.nvmlDeviceGetMigMode, handle)
    if mig is not None:
        h.mig, h.mig_pending = bool(mig[0]), bool(mig[1])
    ecc = _na(nvml.nvmlDeviceGetEccMode, handle)
    if ecc is not None:
        h.ecc, h.ecc_pending = bool(ecc[0]), bool(ecc[1])
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    h.ecc_uncorrected_volatile = _na(nvml.nvmlDeviceGetTotalEccErrors, handle, uncorrected, 0)
    h.ecc_uncorrected_aggregate = _na(nvml.nvmlDeviceGetTotalEccErrors, handle, uncorrected, 1)
    rows = _na(nvml.nvmlDeviceGetRemappedRows, handle)
    if rows is not None:
        h.remap_pending, h.remap_failed = bool(rows[2]), bool(rows[3])
    pages = _call(nvml, ("nvmlDeviceGetRetiredPagesPendingStatus",), handle)
    h.retired_pages_pending = None if pages is None else bool(pages)
    limit = _call(nvml, ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"),
                  handle)  # fmt: skip
    default = _na(nvml.nvmlDeviceGetPowerManagementDefaultLimit, handle)
    h.power_limit_w = None if limit is None else round(limit / 1000, 1)
    h.power_default_w = None if default is None else round(default / 1000, 1)
    h.sm_clock_app_mhz = _na(nvml.nvmlDeviceGetApplicationsClock, handle, sm)
    h.sm_clock_default_mhz = _na(nvml.nvmlDeviceGetDefaultApplicationsClock, handle, sm)
    h.sm_clock_max_mhz = _na(nvml.nvmlDeviceGetMaxClockInfo, handle, sm)
    reasons = _call(
        nvml,
        ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
        handle,
    )
    if reasons is not None:
        h.clock_events = [name for bit, name in CLOCK_EVENTS.items() if int(reasons) & bit]
    h.temperature_c = _na(nvml.nvmlDeviceGetTemperature, handle, 0)
    h.pcie_gen = _na(nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)
    h.pcie_gen_max = _na(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
    h.pcie_width = _na(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle)
    h.pcie_width_max = _na(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
    if count > 1:
        states = [
            _na(nvml.nvmlDeviceGetNvLinkState, handle, link)
            for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        ]
        known = [(link, s) for link, s in enumerate(states) if s is not None]
        if known:
            h.nvlinks_up = sum(1 for _, s in known if s)
            h.nvlinks_down = [link for link, s in known if not s]
    h.read_ms = round((time.perf_counter() - started) * 1000, 1)
    return h


def _kernel_log(nvml: Any) -> list[str] | None:
    """The kernel log's lines, or None where it cannot be read (dmesg_restrict, no dmesg)."""
    simulated = getattr(nvml, "gpufleet_kernel_log", None)
    if simulated is not None:
        return list(simulated())
    try:
        out = subprocess.run(
            ["dmesg"],
            capture_output=True,
            text=True,
            timeout=3,
            check=False,
            stdin=subprocess.DEVNULL,  # a serving agent's stdin carries the next verb
            env=childenv.child_env(),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.splitlines() if out.returncode == 0 else None


BUS_KEY = re.compile(r"([0-9a-f]{2}):([0-9a-f]{2})(?:\.[0-7])?$")


def bus_key(text: str) -> str | None:
    """`18:00` (bus and device) from NVML's `00000000:18:00.0` or NVRM's `0000:18:00`."""
    match = BUS_KEY.search(text.lower())
    return f"{match.group(1)}:{match.group(2)}" if match else None


def _bus(nvml: Any, handle: Any) -> str | None:
    info = _na(nvml.nvmlDeviceGetPciInfo, handle)
    bus = getattr(info, "busId", None)
    if isinstance(bus, bytes):
        bus = bus.decode()
    return bus_key(bus) if bus else None


@dataclass
class XidLedger:
    """What this host's agents have seen in the kernel log since boot: every XID line already
    reported (`seen`) and the fatal ones still in force (`fatal`, per GPU bus). A new boot id
    empties it: a reboot resets every GPU and the kernel log."""

    boot_id: str = ""
    seen: list[str] = field(default_factory=list)
    fatal: list[FatalXid] = field(default_factory=list)

    @classmethod
    def load(cls, boot_id: str) -> XidLedger:
        try:
            data = json.loads(XID_LEDGER.read_text())
            fatal = [FatalXid.from_wire(f, "fatal") for f in data["fatal"]]
            ledger = cls(str(data["boot_id"]), list(data["seen"]), fatal)
        except (OSError, ValueError, KeyError, TypeError, WireError):
            return cls(boot_id)
        return ledger if ledger.boot_id == boot_id else cls(boot_id)

    def save(self) -> None:
        fatal = [f.to_wire() for f in self.fatal]
        data = {"boot_id": self.boot_id, "seen": self.seen[-1000:], "fatal": fatal}
        safewrite.write_atomic(XID_LEDGER, json.dumps(data, indent=1))

    def merge(self, seen: list[str], fatal: list[FatalXid]) -> None:
        """Add what one reader found (under the lock: another may have written since)."""
        self.seen.extend(line for line in seen if line not in self.seen)
        known = {f.line for f in self.fatal}
        self.fatal.extend(f for f in fatal if f.line not in known)

    def has_seen(self, event: str, first: bool) -> bool:
        """Whether an event was reported: by its full line, or (`first` of its text, for a
        ledger an earlier version wrote without the kernel's timestamps) by its text."""
        return event in self.seen or (first and _text(event) in self.seen)


def _text(event: str) -> str:
    """An XID line without its kernel timestamp and occurrence number."""
    return event.split(" #", 1)[0].split("]", 1)[-1].strip()


def xid_events(lines: list[str]) -> list[tuple[str, bool]]:
    """Each XID line of the kernel log as one event: the line as the kernel wrote it, its
    timestamp included, numbered among identical lines (` #2`), so the same XID again
    after a clear is a new event; and whether it is the first line of its text."""
    counts: dict[str, int] = {}
    texts: set[str] = set()
    out = []
    for raw in lines:
        if not XID_LINE.search(raw):
            continue
        line = raw.strip()
        counts[line] = counts.get(line, 0) + 1
        first = _text(line) not in texts
        texts.add(_text(line))
        out.append((line if counts[line] == 1 else f"{line} #{counts[line]}", first))
    return out


@contextlib.contextmanager
def _ledger_lock() -> Iterator[None]:
    """One writer of the ledger at a time (status, launch and gpu-clean may read at once;
    a clear must not be undone by a reader that loaded the ledger before it). Taken only to
    write, so a host without XIDs never gets a lock file."""
    fd = safewrite.open_lock(XID_LEDGER.with_name("xids.lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _boot_id(nvml: Any) -> str:
    simulated = getattr(nvml, "gpufleet_boot_id", None)
    if simulated is not None:
        return str(simulated())
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return "unknown"


def new_xids(
    nvml: Any, handles: list[Any], remember: bool
) -> tuple[list[list[int] | None], list[list[FatalXid]], list[FatalXid]]:
    """Per GPU: the XIDs in the kernel log not reported by an earlier check (None: the log is
    not readable here), and the fatal XIDs still in force; and the fatal XIDs in force on a
    bus NVML does not list. `remember` marks the others reported (gpu-clean does; status and
    launch do not); a fatal one is entered in the ledger by whoever reads it first and stays
    there until a reboot or an operator's clear. Read, merge and write are one critical
    section: a clear made meanwhile is never undone, an event never lost."""
    buses = [_bus(nvml, handle) for handle in handles]
    lines = _kernel_log(nvml)
    boot = _boot_id(nvml)
    out: list[list[int] | None] = [None if lines is None else [] for _ in handles]
    events = xid_events(lines or [])
    if not events:
        ledger = XidLedger.load(boot)  # no XID line: no lock file on a healthy host
    else:
        with _ledger_lock():
            ledger = XidLedger.load(boot)
            fresh = [e for e, first in events if not ledger.has_seen(e, first)]
            entered = _enter(fresh, buses, out)
            reported = fresh if remember else [f.line for f in entered]
            if reported:
                ledger.merge(reported, entered)
                ledger.save()
    in_force = [[f for f in ledger.fatal if f.bus == bus] for bus in buses]
    listed = _listed_buses(nvml)
    missing = [f for f in ledger.fatal if listed is not None and f.bus not in listed]
    return out, in_force, missing


def _enter(
    fresh: list[str], buses: list[str | None], out: list[list[int] | None]
) -> list[FatalXid]:
    """Each fresh event's XID under its GPU in `out`; the fatal ones as ledger entries."""
    entered: list[FatalXid] = []
    for line in fresh:
        match = XID_LINE.search(line)
        assert match is not None
        bus, xid = bus_key(match.group(1)), int(match.group(2))
        for i, mine in enumerate(buses):
            if mine is not None and mine == bus:
                out[i].append(xid)  # type: ignore[union-attr]
        if xid in FATAL_XIDS:
            at = datetime.now(UTC).isoformat(timespec="seconds")
            entered.append(FatalXid(bus, xid, line, at))
    return entered


def _listed_buses(nvml: Any) -> set[str | None] | None:
    """Every GPU bus NVML lists on this host (None where it cannot count them)."""
    count = _na(nvml.nvmlDeviceGetCount)
    if count is None:
        return None
    return {_bus(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(int(count))}


def clear_fatal(nvml: Any, indexes: list[int], reason: str, who: str) -> list[FatalXid]:
    """An operator's word that these GPUs were reset: their fatal XIDs leave the ledger, and
    the clear is logged (who, when, which XID, why). Returns what was cleared."""
    handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in indexes}
    buses = {i: _bus(nvml, h) for i, h in handles.items()}
    new_xids(nvml, list(handles.values()), remember=False)  # enter any not yet recorded
    chosen = set(buses.values())
    with _ledger_lock():
        ledger = XidLedger.load(_boot_id(nvml))
        cleared = [f for f in ledger.fatal if f.bus in chosen]
        ledger.fatal = [f for f in ledger.fatal if f.bus not in chosen]
        ledger.save()
    at = datetime.now(UTC).isoformat(timespec="seconds")
    with safewrite.open_append(XID_CLEARED_LOG, text=True) as log:
        for entry in cleared:
            index = next(i for i, b in buses.items() if b == entry.bus)
            log.write(json.dumps({"at": at, "by": who, "gpu": index, "xid": entry.xid,
                                  "line": entry.line, "reason": reason}) + "\n")  # fmt: skip
    return cleared


def _fatal_reason(entry: FatalXid) -> str:
    xid = entry.xid
    return (
        f"XID {xid} ({FATAL_XIDS.get(xid, 'fatal')}) logged {entry.first_seen[:19]}Z: "
        "unfit until the GPU is reset or the host reboots"
    )


def judge(gpus: list[GpuReading]) -> None:
    """Set each GPU's verdict and reasons: its own readings, then against its siblings."""
    for gpu in gpus:
        h = gpu.health
        if h is None:
            continue
        bad, warn = _own_problems(h)
        h.reasons = [f"bad: {r}" for r in bad] + [f"warn: {r}" for r in warn]
    _outliers(gpus)
    for gpu in gpus:
        if gpu.health is not None:
            reasons = gpu.health.reasons
            gpu.health.verdict = (
                "bad" if any(r.startswith("bad:") for r in reasons)
                else "warn" if reasons else "ok"
            )  # fmt: skip


def _own_problems(h: GpuHealth) -> tuple[list[str], list[str]]:
    bad: list[str] = []
    warn: list[str] = []
    if h.ecc_uncorrected_volatile:
        bad.append(f"{h.ecc_uncorrected_volatile} uncorrectable ECC errors since the driver loaded")
    if h.remap_failed:
        bad.append("a row remapping failed: the GPU needs service")
    if h.remap_pending:
        bad.append("a row remap is pending: reset the GPU before measuring")
    if h.retired_pages_pending:
        bad.append("retired pages are pending: reset the GPU before measuring")
    for entry in h.fatal_xids or []:
        bad.append(_fatal_reason(entry))
    for entry in h.missing_xids or []:
        bad.append(f"GPU at bus {entry.bus} is missing from NVML: {_fatal_reason(entry)}")
    for xid in h.xids or []:
        if xid not in FATAL_XIDS:
            warn.append(f"XID {xid} in the kernel log since the last check")
    if h.nvlinks_down and h.nvlinks_up:
        bad.append(f"NVLink {','.join(map(str, h.nvlinks_down))} down ({h.nvlinks_up} up)")
    if h.power_limit_w and h.power_default_w and h.power_limit_w < h.power_default_w:
        bad.append(f"power limit {h.power_limit_w:g} W, below its default {h.power_default_w:g} W")
    throttled = sorted(set(h.clock_events or []) & BAD_CLOCK_EVENTS)
    if throttled:
        bad.append(f"clocks held down ({', '.join(throttled)})")
    if "sw_power_cap" in (h.clock_events or []):
        warn.append("clocks held down by the software power cap")
    if h.pcie_width and h.pcie_width_max and h.pcie_width < h.pcie_width_max:
        bad.append(f"PCIe width x{h.pcie_width}, the GPU and slot support x{h.pcie_width_max}")
    if h.mig:
        bad.append("MIG is on: a benchmark needs whole GPUs")
    if h.mig_pending is not None and h.mig is not None and h.mig_pending != h.mig:
        warn.append(f"MIG {'on' if h.mig_pending else 'off'} is pending (needs a GPU reset)")
    if (
        h.sm_clock_app_mhz
        and h.sm_clock_default_mhz
        and h.sm_clock_app_mhz != h.sm_clock_default_mhz
    ):
        warn.append(f"application clocks {h.sm_clock_app_mhz} MHz, default "
                    f"{h.sm_clock_default_mhz} MHz (set or locked by someone)")  # fmt: skip
    if h.temperature_c is not None and h.temperature_c >= HOT_IDLE_C:
        warn.append(f"{h.temperature_c} C while idle")
    if h.persistence is False:
        warn.append("persistence mode off (the driver reloads between jobs)")
    if h.compute_mode not in (None, "default"):
        warn.append(f"compute mode {h.compute_mode}")
    if h.ecc is False:
        warn.append("ECC off")
    if h.ecc_pending is not None and h.ecc is not None and h.ecc_pending != h.ecc:
        warn.append(f"ECC {'on' if h.ecc_pending else 'off'} is pending (needs a reboot)")
    return bad, warn


def _outliers(gpus: list[GpuReading]) -> None:
    """One GPU set lower than its siblings (power limit, clocks, PCIe width): an unequal
    tensor-parallel group runs at the speed of its slowest GPU."""
    healths = [g.health for g in gpus if g.health is not None]
    if len(healths) < 2:
        return
    for label, attr, unit in (
        ("power limit", "power_limit_w", "W"),
        ("application clocks", "sm_clock_app_mhz", "MHz"),
        ("PCIe width", "pcie_width", "lanes"),
        ("PCIe generation", "pcie_gen", ""),  # idle links drop it, but not one GPU alone
    ):
        values = [getattr(h, attr) for h in healths if getattr(h, attr) is not None]
        if not values:
            continue
        top = max(values)
        for gpu in gpus:
            value = getattr(gpu.health, attr, None)
            said = any(label in r for r in gpu.health.reasons) if gpu.health else False
            if value is not None and value < top and not said:
                gpu.health.reasons.append(  # type: ignore[union-attr]
                    f"warn: {label} {value:g}{unit and ' ' + unit}, below its siblings' "
                    f"{top:g}{unit and ' ' + unit}"
                )


def attach(nvml: Any, gpus: list[GpuReading], remember_xids: bool) -> None:
    """Read every GPU's health into its reading and judge them together."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(g.index) for g in gpus]
    count = int(_na(nvml.nvmlDeviceGetCount) or len(gpus))
    xids, in_force, missing = new_xids(nvml, handles, remember_xids)
    for gpu, handle, found, fatal in zip(gpus, handles, xids, in_force, strict=True):
        gpu.health = read(nvml, handle, count)
        gpu.health.xids = found
        gpu.health.fatal_xids = fatal or None
        gpu.health.missing_xids = missing or None  # the host's: every GPU says it
    judge(gpus)
