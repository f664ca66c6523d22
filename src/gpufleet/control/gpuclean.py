"""gpu-clean and GPU status across hosts, on top of the agent's `clean` and `gpus` verbs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.control.fanout import HostResult, run_on_hosts
from gpufleet.control.inventory import Host
from gpufleet.control.transport import Session
from gpufleet.errors import HostError
from gpufleet.host.protocol import CleanArgs, StatusArgs


@dataclass
class CleanOptions:
    dry_run: bool = False
    all_users: bool = False
    timeout_s: float = 60.0
    grace_s: float = 10.0
    tolerance_mib: int = 0
    patterns: list[str] = field(default_factory=list)

    def agent_args(self) -> CleanArgs:
        return CleanArgs(
            dry_run=self.dry_run,
            all_users=self.all_users,
            timeout_s=self.timeout_s,
            grace_s=self.grace_s,
            tolerance_mib=self.tolerance_mib,
            patterns=self.patterns or None,
        )


def _driver_message(exc: HostError, host: Host) -> HostError:
    if exc.kind == "no_driver":
        return HostError(f"no NVIDIA driver on {host.name}", kind="no_driver")
    return exc


def clean_on(session: Session, options: CleanOptions) -> dict[str, Any]:
    """gpu-clean on one host; raises HostError when the host does not verify clean."""
    try:
        result = session.call(options.agent_args(), timeout=options.timeout_s + 120)
    except HostError as exc:
        raise _driver_message(exc, session.host) from None
    return result


def clean(hosts: list[Host], options: CleanOptions, forks: int) -> list[HostResult[dict]]:
    results = run_on_hosts(hosts, lambda s: clean_on(s, options), forks=forks)
    for res in results:
        if res.ok and not options.dry_run and not res.value["clean"]:
            res.error = verdict_reason(res.value)
            res.kind = "not_clean"
    return results


def status_on(session: Session) -> dict[str, Any]:
    try:
        return session.call(StatusArgs())
    except HostError as exc:
        raise _driver_message(exc, session.host) from None


def status(hosts: list[Host], forks: int) -> list[HostResult[dict]]:
    return run_on_hosts(hosts, status_on, forks=forks)


def gpu_verdict(gpu: dict[str, Any], tolerance_mib: int = 0) -> str:
    """`clean`, or what still holds the GPU (unattributed memory is named, never "fixed")."""
    hidden = [p for p in gpu["processes"] if not p.get("visible", True)]
    if hidden:
        mib = sum(p["used_mib"] for p in hidden)
        pids = ",".join(str(p["pid"]) for p in hidden)
        return f"unattributed {mib} MiB (PID {pids} not visible on this host)"
    if gpu["used_mib"] > tolerance_mib or gpu["processes"]:
        pids = ",".join(str(p["pid"]) for p in gpu["processes"]) or "none listed"
        return f"busy {gpu['used_mib']} MiB (PIDs {pids})"
    return "clean"


def verdict_reason(result: dict[str, Any]) -> str:
    dirty = [
        f"GPU {g['index']}: {gpu_verdict(g)}" for g in result["gpus"] if gpu_verdict(g) != "clean"
    ]
    survived = [str(k["pid"]) for k in result.get("killed", []) if k.get("survived")]
    parts = dirty[:3] + ([f"... {len(dirty) - 3} more"] if len(dirty) > 3 else [])
    if survived:
        parts.append(f"PIDs {','.join(survived)} survived SIGKILL")
    return "not clean after cleanup: " + "; ".join(parts or ["unknown reason"])


def killed_by_gpu(result: dict[str, Any]) -> dict[int, list[int]]:
    """GPU index -> PIDs killed that held memory on it (from the snapshot before killing)."""
    killed = {k["pid"] for k in result.get("killed", [])}
    out: dict[int, list[int]] = {}
    for gpu in result.get("before", []):
        out[gpu["index"]] = [p["pid"] for p in gpu["processes"] if p["pid"] in killed]
    return out
