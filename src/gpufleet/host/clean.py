"""gpu-clean and the read-only status of stale processes: the verbs that cross the host's
rooms (GPUs through NVML, processes, live servers), so they sit above them."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from gpufleet.host.agent import runas
from gpufleet.host.agent.protocol import AgentError, CleanArgs, StatusArgs
from gpufleet.host.gpu import facts
from gpufleet.host.gpu import health as gpuhealth
from gpufleet.host.gpu import nvml as nvmlread
from gpufleet.host.proc import gpuprocs as procs
from gpufleet.host.server import live as liveservers
from gpufleet.kinds import Kind
from gpufleet.readings import (
    CleanAnswer,
    FatalXid,
    GpuProcess,
    GpuReading,
    LiveServerInfo,
    ProcessInfo,
)


def stale_processes(args: StatusArgs) -> tuple[list[GpuReading], list[ProcessInfo]]:
    """Who holds GPU memory and who looks like a stale server (read-only)."""
    nvml = nvmlread.load_pynvml()
    snap = nvmlread.snapshot(nvml)
    facts.check_count(snap, args.expected_gpus)  # a GPU missing from NVML is the first health fact
    facts.annotate(snap)
    gpuhealth.attach(nvml, snap, remember_xids=False)  # status reads; gpu-clean checks
    sim_state = (args.sim or {}).get("state_dir")
    stale = []
    for pid in procs.find_pattern_matches(args.patterns or [], sim_state):
        info = procs.describe_pid(pid)
        if info:
            stale.append(info)
    return snap, stale


def _roots(
    before: list[GpuReading], patterns: list[str], sim_state: str | None
) -> tuple[list[int], list[GpuProcess]]:
    """The processes to kill from: every visible GPU holder and every pattern match, once;
    and the GPU memory NVML attributes to a PID this agent cannot see."""
    roots: list[int] = []
    unattributed: list[GpuProcess] = []
    for gpu in before:
        for entry in gpu.processes:
            if entry.visible:
                roots.append(entry.pid)
            else:
                unattributed.append(dataclasses.replace(entry, gpu=gpu.index))
    roots += procs.find_pattern_matches(patterns, sim_state)
    return list(dict.fromkeys(roots)), unattributed


def _live_servers(
    before: list[GpuReading], roots: list[int]
) -> tuple[list[LiveServerInfo], set[int]]:
    """Servers among the roots that answer /health: left alone, with their GPUs and PIDs."""
    live: list[LiveServerInfo] = []
    live_pids: set[int] = set()
    for server in liveservers.find(roots):
        live_pids |= server.pids
        on = [g.index for g in before if any(p.pid in server.pids for p in g.processes)]
        live.append(server.info(on))
    return live, live_pids


def _wait_verified(
    nvml: Any, verified: Callable[[list[GpuReading]], bool], untouchable: set[int],
    timeout_s: float,
) -> tuple[list[GpuReading], bool]:  # fmt: skip
    """Read NVML until the GPUs verify, only untouchable holders remain, or time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = nvmlread.snapshot(nvml)
        clean_now = verified(after)
        remaining = {p.pid for g in after for p in g.processes}
        hopeless = bool(remaining) and remaining <= untouchable
        if clean_now or hopeless or time.monotonic() >= deadline:
            return after, clean_now
        time.sleep(0.2)


def clean(args: CleanArgs) -> CleanAnswer:
    """gpu-clean on this host in one call: find, kill (unless dry run), verify by NVML v2.
    A host the inventory gives no GPUs (a CPU engine's) is not asked of NVML at all: it
    has nothing to clean and says so."""
    if args.expected_gpus == 0 and not args.sim:
        return CleanAnswer(before=[], gpus=[], clean=True, elapsed_s=0.0, no_gpus=True)
    nvml = nvmlread.load_pynvml()
    started = time.monotonic()
    before = nvmlread.snapshot(nvml)
    facts.check_count(before, args.expected_gpus)
    cleared = _clear_xids(nvml, before, args)
    facts.annotate(before)
    sim_state = (args.sim or {}).get("state_dir")
    patterns = args.patterns or []
    tolerance = args.tolerance_mib

    roots, unattributed = _roots(before, patterns, sim_state)
    live, live_pids = ([], set()) if args.include_running else _live_servers(before, roots)
    roots = [pid for pid in roots if pid not in live_pids]
    policy = procs.KillPolicy(frozenset(procs.protected_pids()), args.all_users, args.all_tenants,
                              frozenset(runas.owners(args.run_as)))  # fmt: skip
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
    after, clean_now = _wait_verified(nvml, verified, untouchable, args.timeout_s)
    facts.annotate(after)
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
