"""Find the processes that hold GPUs or look like stale servers, and kill them as trees.

Safety rules live here and are applied whatever NVML says: never PID 1, never sshd,
never this agent or its ancestors, never another user's process unless asked.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from gpufleet.host.protocol import AgentError

# Upstream SGLang's own cleanup pattern (docs/FACTS.md, "SGLang's HTTP server").
DEFAULT_PATTERNS = [
    r"sglang::|sglang\.launch_server|sglang\.bench|sglang\.data_parallel|sglang\.srt"
]
NEVER_KILL_NAMES = {"sshd", "sshd-session", "sshd-auth", "systemd", "init", "dockerd", "containerd"}


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:
        raise AgentError("the host Python lacks psutil", kind="missing_package") from None
    return psutil


def describe(proc: Any) -> dict[str, Any] | None:
    """psutil details for one process, or None if it vanished."""
    psutil = _psutil()
    try:
        with proc.oneshot():
            created = proc.create_time()
            return {
                "pid": proc.pid,
                "ppid": proc.ppid(),
                "user": proc.username(),
                "uid": proc.uids().real,
                "name": proc.name(),
                "cmdline": proc.cmdline(),
                "age_s": round(time.time() - created, 1),
                "status": proc.status(),
            }
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return {"pid": proc.pid, "user": "?", "uid": -1, "name": "?", "cmdline": [], "age_s": None}


def protected_pids() -> set[int]:
    """This agent, its ancestors (the SSH session, sshd, init) and PID 0/1."""
    psutil = _psutil()
    keep = {0, 1, os.getpid()}
    try:
        keep.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pass
    return keep


def refusal(info: dict[str, Any], keep: set[int], all_users: bool) -> str | None:
    """Why this process must not be killed, or None if it may be."""
    if info["pid"] in keep:
        return "agent, ancestor or init"
    if info.get("name") in NEVER_KILL_NAMES:
        return f"{info['name']} is never killed"
    if not all_users and info.get("uid") != os.geteuid():
        return f"owned by {info.get('user')} (use --all-users)"
    return None


def find_pattern_matches(patterns: list[str], sim_state: str | None) -> list[int]:
    """PIDs whose command line matches a stale-server pattern.

    On a simulated host only the processes that joined it count: several simulated hosts
    may share this machine's process table.
    """
    psutil = _psutil()
    try:
        regexes = [re.compile(p) for p in patterns]
    except re.error as exc:
        raise AgentError(f"bad process pattern: {exc}", kind="bad_input") from None
    members: set[int] | None = None
    if sim_state is not None:
        from gpufleet.sim import gpustate

        members = gpustate.host_pids(sim_state)
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        if proc.pid == me or (members is not None and proc.pid not in members):
            continue
        text = " ".join(proc.info.get("cmdline") or []) or (proc.info.get("name") or "")
        if any(r.search(text) for r in regexes):
            found.append(proc.pid)
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


def collect_trees(
    root_pids: list[int], keep: set[int], all_users: bool
) -> tuple[dict[int, tuple[Any, dict[str, Any]]], list[dict[str, Any]]]:
    """Each root and its descendants (children first), minus protected processes.

    A root that may not be killed (init, sshd, an ancestor, another user's) is refused with
    its whole subtree: NVML listing PID 1 must never turn into "kill every process".
    A descendant that may not be killed is skipped along with its own descendants.
    Children are collected before any signal, so a parent's death cannot hide them.
    Returns (pid -> (process, details), refused roots with a reason each).
    """
    psutil = _psutil()
    ordered: dict[int, tuple[Any, dict[str, Any]]] = {}
    refused: list[dict[str, Any]] = []
    for pid in root_pids:
        try:
            root = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        info = describe(root)
        if info is None or pid in ordered:
            continue
        reason = refusal(info, keep, all_users)
        if reason:
            refused.append({**info, "reason": reason})
            continue
        subtree: list[tuple[Any, dict[str, Any]]] = []
        _walk(root, keep, all_users, subtree)
        for proc, details in subtree:
            ordered.setdefault(proc.pid, (proc, details))
    return ordered, refused


def _walk(
    proc: Any, keep: set[int], all_users: bool, out: list[tuple[Any, dict[str, Any]]]
) -> None:
    """Children first (depth first), stopping at any process that may not be killed."""
    psutil = _psutil()
    try:
        children = proc.children()
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        info = describe(child)
        if info is None or refusal(info, keep, all_users):
            continue
        _walk(child, keep, all_users, out)
    info = describe(proc)
    if info is not None:
        out.append((proc, info))


def kill_trees(tree: dict[int, tuple[Any, dict[str, Any]]], grace_s: float) -> list[dict[str, Any]]:
    """SIGTERM every process of the collected trees, wait `grace_s`, SIGKILL survivors."""
    psutil = _psutil()
    procs = [p for p, _ in tree.values()]
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    survivors = _wait_dead(procs, grace_s)
    for proc in survivors:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    stuck = {p.pid for p in _wait_dead(survivors, 5.0)}
    sigkilled = {p.pid for p in survivors}
    killed = []
    for pid, (_, info) in tree.items():
        entry = {
            "pid": pid,
            "name": info["name"],
            "user": info["user"],
            "cmdline": info["cmdline"],
            "signal": "SIGKILL" if pid in sigkilled else "SIGTERM",
        }
        if pid in stuck:
            entry["survived"] = True
        killed.append(entry)
    return killed
