"""Find the processes that hold GPUs or look like stale servers, and kill them as trees.

Safety rules live here and are applied whatever NVML says: never PID 1, never sshd,
never this agent or its ancestors, never another user's process unless asked.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any

from gpufleet.host.agent.protocol import AgentError
from gpufleet.host.agent.redact import redact_argv
from gpufleet.host.proc import identity
from gpufleet.kinds import Kind
from gpufleet.readings import KilledProcess, ProcessInfo

MAX_MATCH_SHARE = 0.25  # a pattern matching more of the host's processes is a mistake
NEVER_KILL_NAMES = {"sshd", "sshd-session", "sshd-auth", "systemd", "init", "dockerd", "containerd"}


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:
        raise AgentError("the host Python lacks psutil", kind=Kind.MISSING_PACKAGE) from None
    return psutil


def describe(proc: Any) -> ProcessInfo | None:
    """psutil details for one process, or None if it vanished."""
    psutil = _psutil()
    try:
        with proc.oneshot():
            created = proc.create_time()
            return ProcessInfo(
                pid=proc.pid,
                ppid=proc.ppid(),
                user=proc.username(),
                uid=proc.uids().real,
                name=proc.name(),
                cmdline=redact_argv(proc.cmdline()),  # --api-key values stay here
                age_s=round(time.time() - created, 1),
                status=proc.status(),
            )
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return ProcessInfo(pid=proc.pid)


def protected_pids() -> set[int]:
    """This agent, its ancestors (the SSH session, sshd, init) and PID 0/1."""
    psutil = _psutil()
    keep = {0, 1, os.getpid()}
    try:
        keep.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pass
    return keep


@dataclass(frozen=True)
class KillPolicy:
    """Who may be killed: never `keep` (the agent, its ancestors, init), other users only
    with --all-users, other tenants (containers, display servers) only with --all-tenants."""

    keep: frozenset[int]
    all_users: bool = False
    all_tenants: bool = False


def refusal(info: ProcessInfo, policy: KillPolicy) -> str | None:
    """Why this process must not be killed, or None if it may be."""
    if info.pid in policy.keep:
        return "agent, ancestor or init"
    if info.name in NEVER_KILL_NAMES:
        return f"{info.name} is never killed"
    infra = identity.infrastructure(info.cmdline, info.name)
    if infra:
        return f"infrastructure ({infra}) is never killed"
    if not policy.all_users and info.uid != os.geteuid():
        return f"owned by {info.user} (use --all-users)"
    if not policy.all_tenants:
        other = identity.tenant(info.pid, info.name)
        if other:
            return f"{other}: another tenant's (use --all-tenants)"
    return None


def compile_patterns(patterns: list[str]) -> list[re.Pattern[str]]:
    """Compiled stale-server patterns; AgentError for a bad one or one that would match
    the agent itself or sshd (it would match everything that runs)."""
    try:
        regexes = [re.compile(p) for p in patterns]
    except re.error as exc:
        raise AgentError(f"bad process pattern: {exc}", kind=Kind.BAD_INPUT) from None
    probes = {
        "the gpufleet agent": (["python3", "agent-0123456789ab.pyz", "clean"], "python3"),
        "sshd": (["sshd: root@notty"], "sshd"),
        "a Python interpreter": (["python3"], "python3"),
    }
    for regex in regexes:
        for what, (cmdline, name) in probes.items():
            if any(regex.search(i) for i in identity.identities(cmdline, name)):
                raise AgentError(
                    f"process pattern {regex.pattern!r} matches {what}: name the server's "
                    "program or module instead (e.g. 'sglang\\.launch_server')",
                    kind=Kind.BAD_INPUT,
                )
    return regexes


def find_pattern_matches(patterns: list[str], sim_state: str | None) -> list[int]:
    """PIDs whose running program or module (never a whole command line) matches a pattern.

    On a simulated host only the processes that joined it count: several simulated hosts
    may share this machine's process table.
    """
    psutil = _psutil()
    regexes = compile_patterns(patterns)
    members: set[int] | None = None
    if sim_state is not None:
        from gpufleet.sim import gpustate

        members = gpustate.host_pids(sim_state)
    me = os.getpid()
    found, seen = [], 0
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        seen += 1
        if proc.pid == me or (members is not None and proc.pid not in members):
            continue
        if identity.matches(regexes, proc.info.get("cmdline") or [], proc.info.get("name") or ""):
            found.append(proc.pid)
    if members is None and len(found) > max(8, MAX_MATCH_SHARE * seen):
        raise AgentError(
            f"process patterns {patterns} match {len(found)} of {seen} processes: refusing "
            "to treat that many as stale servers (narrow the pattern)",
            kind=Kind.BAD_INPUT,
        )
    return found


def _dead(proc: Any) -> bool:
    psutil = _psutil()
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_dead(procs: list[Any], timeout: float) -> list[Any]:
    """Poll until all are gone or zombies (a zombie holds no GPU memory); return survivors."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        alive = [p for p in alive if not _dead(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return alive


Tree = dict[int, tuple[Any, ProcessInfo]]  # pid -> (psutil process, what it was)


def collect_trees(root_pids: list[int], policy: KillPolicy) -> tuple[Tree, list[ProcessInfo]]:
    """Each root and its descendants (children first), minus protected processes.

    A root that may not be killed (init, sshd, an ancestor, another user's) is refused with
    its whole subtree: NVML listing PID 1 must never turn into "kill every process".
    A descendant that may not be killed is skipped along with its own descendants.
    Children are collected before any signal, so a parent's death cannot hide them.
    Returns (pid -> (process, details), refused roots with a reason each).
    """
    psutil = _psutil()
    ordered: Tree = {}
    refused: list[ProcessInfo] = []
    for pid in root_pids:
        try:
            root = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        info = describe(root)
        if info is None or pid in ordered:
            continue
        reason = refusal(info, policy)
        if reason:
            info.reason = reason
            refused.append(info)
            continue
        subtree: list[tuple[Any, ProcessInfo]] = []
        _walk(root, policy, subtree)
        for proc, details in subtree:
            ordered.setdefault(proc.pid, (proc, details))
    return ordered, refused


def _walk(proc: Any, policy: KillPolicy, out: list[tuple[Any, ProcessInfo]]) -> None:
    """Children first (depth first), stopping at any process that may not be killed."""
    psutil = _psutil()
    try:
        children = proc.children()
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        info = describe(child)
        if info is None or refusal(info, policy):
            continue
        _walk(child, policy, out)
    info = describe(proc)
    if info is not None:
        out.append((proc, info))


def kill_trees(tree: Tree, grace_s: float) -> list[KilledProcess]:
    """SIGTERM every process of the collected trees, wait `grace_s`, SIGKILL survivors.

    Each entry says how the process ended: `SIGTERM`, `SIGKILL` (after the grace), or
    `exited by itself` (gone before gpufleet signalled it, e.g. a scheduler whose launcher
    just died): only the first two count as killed.
    """
    psutil = _psutil()
    signalled, gone_already = [], set()
    for proc in (p for p, _ in tree.values()):
        try:
            if _dead(proc):
                gone_already.add(proc.pid)
                continue
            proc.terminate()  # psutil refuses if the PID now belongs to another process
            signalled.append(proc)
        except psutil.NoSuchProcess:
            gone_already.add(proc.pid)
    survivors = _wait_dead(signalled, grace_s)
    for proc in survivors:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    stuck = {p.pid for p in _wait_dead(survivors, 5.0)}
    sigkilled = {p.pid for p in survivors}
    out = []
    for pid, (_, info) in tree.items():
        if pid in gone_already:
            how = "exited by itself"
        elif pid in sigkilled:
            how = f"SIGKILL after {grace_s:g}s"
        else:
            how = "SIGTERM"
        out.append(
            KilledProcess(
                pid=pid, name=info.name, user=info.user, cmdline=info.cmdline, signal=how,
                killed=pid not in gone_already, survived=pid in stuck,
            )
        )  # fmt: skip
    return out
