"""GPU verbs: gpu-clean, the read-only status, host facts, and the transport self-test."""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.host.agent.protocol import (
    AgentError,
    CleanArgs,
    EchoArgs,
    StatusArgs,
    VerbArgs,
)
from gpufleet.host.gpu import health as gpuhealth
from gpufleet.host.gpu import nvml as nvmlread
from gpufleet.host.proc import gpuprocs as procs
from gpufleet.host.server import live as liveservers
from gpufleet.kinds import Kind
from gpufleet.readings import (
    CleanAnswer,
    FatalXid,
    GpuCheck,
    GpuFacts,
    GpuProcess,
    GpuReading,
    LiveServerInfo,
    ProcessInfo,
    SysInfo,
)
from gpufleet.wire import JsonObject


def _check_count(gpus: list[GpuReading], expected: int | None) -> None:
    if expected is not None and len(gpus) != expected:
        raise AgentError(f"expected {expected} GPUs, NVML sees {len(gpus)}", kind=Kind.GPU_COUNT)


def _annotate(gpus: list[GpuReading]) -> None:
    """Attach psutil details to NVML's PIDs; PIDs this host cannot see are unattributed."""
    psutil = procs._psutil()
    for gpu in gpus:
        for entry in gpu.processes:
            try:
                info = procs.describe(psutil.Process(entry.pid))
            except psutil.NoSuchProcess:
                info = None
            entry.visible = info is not None
            if info:
                entry.user, entry.name, entry.cmdline = info.user, info.name, info.cmdline
                entry.age_s, entry.ppid = info.age_s, info.ppid


def stale_processes(args: StatusArgs) -> tuple[list[GpuReading], list[ProcessInfo]]:
    """Who holds GPU memory and who looks like a stale server (read-only)."""
    psutil = procs._psutil()
    nvml = nvmlread.load_pynvml()
    snap = nvmlread.snapshot(nvml)
    _check_count(snap, args.expected_gpus)  # a GPU missing from NVML is the first health fact
    _annotate(snap)
    gpuhealth.attach(nvml, snap, remember_xids=False)  # status reads; gpu-clean checks
    sim_state = (args.sim or {}).get("state_dir")
    stale = []
    for pid in procs.find_pattern_matches(args.patterns or [], sim_state):
        try:
            info = procs.describe(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
        if info:
            stale.append(info)
    return snap, stale


def clean(args: CleanArgs) -> CleanAnswer:
    """gpu-clean on this host in one call: find, kill (unless dry run), verify by NVML v2.
    A host the inventory gives no GPUs (a CPU engine's) is not asked of NVML at all: it
    has nothing to clean and says so."""
    if args.expected_gpus == 0 and not args.sim:
        return CleanAnswer(before=[], gpus=[], clean=True, elapsed_s=0.0, no_gpus=True)
    nvml = nvmlread.load_pynvml()
    started = time.monotonic()
    before = nvmlread.snapshot(nvml)
    _check_count(before, args.expected_gpus)
    cleared = _clear_xids(nvml, before, args)
    _annotate(before)
    sim_state = (args.sim or {}).get("state_dir")
    patterns = args.patterns or []
    tolerance = args.tolerance_mib

    roots: list[int] = []
    unattributed: list[GpuProcess] = []
    for gpu in before:
        for entry in gpu.processes:
            if entry.visible:
                roots.append(entry.pid)
            else:
                unattributed.append(dataclasses.replace(entry, gpu=gpu.index))
    roots += procs.find_pattern_matches(patterns, sim_state)
    roots = list(dict.fromkeys(roots))
    live: list[LiveServerInfo] = []
    live_pids: set[int] = set()
    if not args.include_running:
        for server in liveservers.find(roots, procs._psutil()):
            live_pids |= server.pids
            on = [g.index for g in before if any(p.pid in server.pids for p in g.processes)]
            live.append(server.info(on))
        roots = [pid for pid in roots if pid not in live_pids]
    policy = procs.KillPolicy(frozenset(procs.protected_pids()), args.all_users, args.all_tenants)
    tree, refused = procs.collect_trees(roots, policy)
    for pid in live_pids:
        tree.pop(pid, None)  # a live server's children are not stale either
    live_gpus = {index for server in live for index in server.gpus}

    def verified(gpus: list[GpuReading]) -> bool:
        """Every GPU reads 0 MiB, but for those a live server was left holding."""
        return all(g.is_clean(tolerance) or g.index in live_gpus for g in gpus)

    answer = CleanAnswer(
        before=before, gpus=before, clean=verified(before), elapsed_s=0.0, refused=refused,
        unattributed=unattributed, live=live, cleared_xids=cleared,
    )  # fmt: skip
    if args.dry_run:
        gpuhealth.attach(nvml, before, remember_xids=False)
        answer.would_kill = [info for _, info in tree.values()]
        answer.elapsed_s = round(time.monotonic() - started, 3)
        return answer

    answer.killed = procs.kill_trees(tree, args.grace_s)
    # Memory held by processes we may not kill (other users, protected) or cannot see will
    # not go away by waiting: stop polling as soon as only those remain.
    untouchable = {p.pid for p in refused} | {u.pid for u in unattributed} | live_pids
    deadline = time.monotonic() + args.timeout_s
    while True:
        after = nvmlread.snapshot(nvml)
        clean_now = verified(after)
        remaining = {p.pid for g in after for p in g.processes}
        hopeless = bool(remaining) and remaining <= untouchable
        if clean_now or hopeless or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    _annotate(after)
    gpuhealth.attach(nvml, after, remember_xids=True)  # XIDs from here on are "new"
    answer.gpus, answer.clean = after, clean_now
    answer.elapsed_s = round(time.monotonic() - started, 3)
    return answer


def _clear_xids(nvml: Any, gpus: list[GpuReading], args: CleanArgs) -> list[FatalXid]:
    """--clear-xid: the operator reset these GPUs; their fatal XIDs leave the ledger (logged)."""
    if not args.clear_xids:
        return []
    known = {g.index for g in gpus}
    missing = [i for i in args.clear_xids if i not in known]
    if missing:
        raise AgentError(
            f"--clear-xid: GPU {','.join(map(str, missing))} does not exist "
            f"(NVML sees {len(gpus)}: 0-{len(gpus) - 1})",
            kind=Kind.BAD_INPUT,
        )
    if not args.clear_reason.strip():
        raise AgentError("--clear-xid needs --reason", kind=Kind.BAD_INPUT)
    who = f"{args.cleared_by or '?'} as uid {os.geteuid()}"
    return gpuhealth.clear_fatal(nvml, args.clear_xids, args.clear_reason, who)


def wait_gpus_clean(indexes: list[int], timeout_s: float, tolerance_mib: int = 0) -> GpuCheck:
    """Poll NVML until the given GPUs read 0 MiB (v2 used) with no process; report them."""
    nvml = nvmlread.load_pynvml()
    started = time.monotonic()
    while True:
        snap = [g for g in nvmlread.snapshot(nvml) if g.index in indexes]
        clean_now = all(g.is_clean(tolerance_mib) for g in snap)
        if clean_now or time.monotonic() - started >= timeout_s:
            break
        time.sleep(0.2)
    _annotate(snap)
    return GpuCheck(clean=clean_now, gpus=snap, elapsed_s=round(time.monotonic() - started, 3))


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


PACKAGES = ("sglang", "torch", "flashinfer-python", "psutil", "nvidia-ml-py", "aiohttp")


def sysinfo(args: VerbArgs) -> SysInfo:
    info = SysInfo(
        hostname=socket.gethostname(),
        kernel=platform.release(),
        python=sys.version.split()[0],
        python_executable=sys.executable,
        uid=os.geteuid(),
        packages={name: _version(name) for name in PACKAGES},
        simulated=bool(args.sim),
        cpu_governor=cpu_governor(),
    )
    try:
        nvml = nvmlread.load_pynvml()
    except AgentError as exc:
        info.nvml_error = str(exc)
        return info
    snap = nvmlread.snapshot(nvml)
    gpuhealth.attach(nvml, snap, remember_xids=False)
    info.driver, info.cuda = nvmlread.driver_versions(nvml)
    info.gpus = [GpuFacts.of(g) for g in snap]
    return info


def cpu_governor() -> str | None:
    """The CPU frequency governor (powersave slows the client and the server's scheduler)."""
    try:
        return Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()
    except OSError:
        return None


def echo(args: EchoArgs) -> JsonObject:
    """Return the payload as received, with argv and cwd: a transport self-test."""
    return {"payload": args.payload, "argv": sys.argv[1:], "cwd": os.getcwd()}
