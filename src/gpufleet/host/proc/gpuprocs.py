"""Find the processes that hold GPUs or look like stale servers, and kill them as trees.

Safety rules live here and are applied whatever NVML says: never PID 1, never sshd,
never this agent or its ancestors, never another user's process unless asked.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from gpufleet.host.agent.protocol import AgentError
from gpufleet.host.agent.redact import redact_argv
from gpufleet.host.proc import identity
from gpufleet.host.proc.procfs import AccessDenied, NoSuchProcess, Process, process_iter
from gpufleet.kinds import Kind
from gpufleet.readings import KilledProcess, ProcessInfo

MAX_MATCH_SHARE = 0.25  # a pattern matching more of the host's processes is a mistake
NEVER_KILL_NAMES = {"sshd", "sshd-session", "sshd-auth", "systemd", "init", "dockerd", "containerd"}


def describe(proc: Process) -> ProcessInfo | None:
    """What /proc says of one process, or None if it vanished."""
    try:
        created = proc.create_time()
        return ProcessInfo(
            pid=proc.pid,
            ppid=proc.ppid(),
            user=proc.username(),
            uid=proc.uid(),
            name=proc.name(),
            cmdline=redact_argv(proc.cmdline()),  # --api-key values stay here
            age_s=round(time.time() - created, 1),
            status=proc.status(),
        )
    except NoSuchProcess:
        return None
    except AccessDenied:
        return ProcessInfo(pid=proc.pid)


def describe_pid(pid: int) -> ProcessInfo | None:
    """`describe` of a PID, None where no such process runs."""
    try:
        return describe(Process(pid))
    except NoSuchProcess:
        return None


def protected_pids() -> set[int]:
    """This agent, its ancestors (the SSH session, sshd, init) and PID 0/1."""
    keep = {0, 1, os.getpid()}
    try:
        keep.update(p.pid for p in Process().parents())
    except (NoSuchProcess, AccessDenied):
        pass
    return keep


@dataclass(frozen=True)
class KillPolicy:
    """Who may be killed: never `keep` (the agent, its ancestors, init), other users only
    with --all-users, other tenants (containers, display servers) only with --all-tenants."""

    keep: frozenset[int]
    all_users: bool = False
    all_tenants: bool = False
    # whose processes are gpufleet's own: the agent's uid, and the run_as user's (its
    # servers); others' only with --all-users
    owners: frozenset[int] = frozenset()


def refusal(info: ProcessInfo, policy: KillPolicy) -> str | None:
    """Why this process must not be killed, or None if it may be."""
    if info.pid in policy.keep:
        return "agent, ancestor or init"
    if info.name in NEVER_KILL_NAMES:
        return f"{info.name} is never killed"
    infra = identity.infrastructure(info.cmdline, info.name)
    if infra:
        return f"infrastructure ({infra}) is never killed"
    if not policy.all_users and info.uid not in (policy.owners or {os.geteuid()}):
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
    regexes = compile_patterns(patterns)
    members: set[int] | None = None
    if sim_state is not None:
        from gpufleet.host.agent import simulation

        members = simulation.provider().host_pids(sim_state)
    me = os.getpid()
    found, seen = [], 0
    for proc in process_iter():
        seen += 1
        if proc.pid == me or (members is not None and proc.pid not in members):
            continue
        try:
            cmdline, name = proc.cmdline(), proc.name()
            if _dead(proc):  # ended, not yet reaped (a container's PID 1 may never reap):
                continue  # it holds nothing and no signal reaches it
        except (NoSuchProcess, AccessDenied):
            continue
        if identity.matches(regexes, cmdline, name):
            found.append(proc.pid)
    if members is None and len(found) > max(8, MAX_MATCH_SHARE * seen):
        raise AgentError(
            f"process patterns {patterns} match {len(found)} of {seen} processes: refusing "
            "to treat that many as stale servers (narrow the pattern)",
            kind=Kind.BAD_INPUT,
        )
    return found


def _dead(proc: Process) -> bool:
    try:
        return proc.status() == "zombie"
    except NoSuchProcess:
        return True


def _wait_dead(procs: list[Process], timeout: float) -> list[Process]:
    """Poll until all are gone or zombies (a zombie holds no GPU memory); return survivors."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        alive = [p for p in alive if not _dead(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return alive


Tree = dict[int, tuple[Process, ProcessInfo]]  # pid -> (the process, what it was)


def collect_trees(root_pids: list[int], policy: KillPolicy) -> tuple[Tree, list[ProcessInfo]]:
    """Each root and its descendants (children first), minus protected processes.

    A root that may not be killed (init, sshd, an ancestor, another user's) is refused with
    its whole subtree: NVML listing PID 1 must never turn into "kill every process".
    A descendant that may not be killed is skipped along with its own descendants.
    Children are collected before any signal, so a parent's death cannot hide them.
    Returns (pid -> (process, details), refused roots with a reason each).
    """
    ordered: Tree = {}
    refused: list[ProcessInfo] = []
    for pid in root_pids:
        try:
            root = Process(pid)
        except NoSuchProcess:
            continue
        info = describe(root)
        if info is None or pid in ordered:
            continue
        reason = refusal(info, policy)
        if reason:
            info.reason = reason
            refused.append(info)
            continue
        subtree: list[tuple[Process, ProcessInfo]] = []
        _walk(root, policy, subtree)
        for proc, details in subtree:
            ordered.setdefault(proc.pid, (proc, details))
    return ordered, refused


def _walk(proc: Process, policy: KillPolicy, out: list[tuple[Process, ProcessInfo]]) -> None:
    """Children first (depth first), stopping at any process that may not be killed."""
    try:
        children = proc.children()
    except NoSuchProcess:
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
    signalled, gone_already = [], set()
    for proc in (p for p, _ in tree.values()):
        try:
            if _dead(proc):
                gone_already.add(proc.pid)
                continue
            proc.terminate()  # refused if the PID now belongs to another process
            signalled.append(proc)
        except NoSuchProcess:
            gone_already.add(proc.pid)
    survivors = _wait_dead(signalled, grace_s)
    for proc in survivors:
        try:
            proc.kill()
        except NoSuchProcess:
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
