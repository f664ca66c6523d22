"""gpu-clean and GPU status across hosts, on top of the agent's `clean` and `gpus` verbs."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.archive import store
from gpufleet.archive.kept import HealthRecord
from gpufleet.archive.layout import Archive
from gpufleet.control.connect.base import Session
from gpufleet.control.connect.fanout import FleetResult
from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.inventory.model import Host
from gpufleet.control.server import engines
from gpufleet.control.server.host_options import CleanOptions
from gpufleet.errors import HostError, UserError
from gpufleet.host.agent.protocol import AgentError, StatusArgs
from gpufleet.host.proc.gpuprocs import compile_patterns
from gpufleet.kinds import Kind
from gpufleet.readings import CleanAnswer, GpuReading, StatusAnswer
from gpufleet.report.gpu import verdict_reason


def check_patterns(patterns: list[str]) -> None:
    """A bad or all-matching --pattern is the user's mistake: refused here, before any host."""
    try:
        compile_patterns(patterns)
    except AgentError as exc:
        raise UserError(f"--pattern: {exc}") from None


def _driver_message(exc: HostError, host: Host) -> HostError:
    if exc.kind == Kind.NO_DRIVER:
        return HostError(f"no NVIDIA driver on {host.name}", kind=Kind.NO_DRIVER)
    return exc


def clean_on(session: Session, options: CleanOptions) -> CleanAnswer:
    """gpu-clean on one host; raises HostError when the host does not verify clean."""
    try:
        result = session.call(options.agent_args(), timeout=options.timeout_s + 120)
    except HostError as exc:
        raise _driver_message(exc, session.host) from None
    return result


def clean(
    fleet: Fleet, options: CleanOptions, archive: Archive | None = None
) -> FleetResult[CleanAnswer]:
    """gpu-clean on every host; each host's GPU verdicts recorded in the archive's health folder."""
    results = fleet.each(lambda s: clean_on(s, options))
    for res in results:
        if res.value is not None:
            record_health(res.host.name, res.value.gpus, archive)
    for res in results:
        if res.ok and res.value is not None and not options.dry_run and not res.value.clean:
            res.error = verdict_reason(res.value)
            res.kind = Kind.NOT_CLEAN
        elif res.ok and res.value is not None and (bad := bad_gpus(res.value.gpus)):
            res.error = f"{'; '.join(bad)}: a bad GPU makes the host unfit to measure on"
            res.kind = Kind.UNHEALTHY
    return results


def bad_gpus(gpus: list[GpuReading]) -> list[str]:
    """`GPU i is bad` for each GPU whose health verdict is `bad` (its reasons are printed
    beside)."""
    return [f"GPU {g.index} is bad" for g in gpus
            if g.health is not None and g.health.verdict == "bad"]  # fmt: skip


def verdict_lines(gpus: list[GpuReading]) -> list[tuple[bool, str]]:
    """The health verdicts a clean found, for steps that clean on their way (launch --clean,
    sweep): one line per reason a GPU is not ok (True: a warning), or one line saying all
    are ok, so a fatal XID is never used up unseen."""
    out = [
        (True, f"GPU {g.index}: {reason}")
        for g in gpus
        if g.health is not None
        for reason in g.health.reasons
    ]
    judged = [g for g in gpus if g.health is not None]
    return out or [(False, f"GPU health: {len(judged)} of {len(gpus)} GPUs ok")]


def not_clean_error(answer: CleanAnswer) -> HostError:
    """gpu-clean before a launch did not verify: one line saying what still holds each GPU
    (memory, PIDs, and why gpufleet left them), so the failure can be acted on."""
    holders = []
    for gpu in answer.gpus:
        if gpu.is_clean():
            continue
        pids = ", ".join(
            f"{p.pid} {p.name or '?'}" + ("" if p.visible else " (not visible here)")
            for p in gpu.processes
        )  # fmt: skip
        holders.append(f"GPU {gpu.index} holds {gpu.used_mib} MiB" + (f" ({pids})" if pids else ""))
    left = [f"refused {p.pid} {p.name}" for p in answer.refused]
    left += [f"live server pid {s.pid}" for s in answer.live]
    detail = "; ".join(holders + left) or "no holder found"
    return HostError(
        f"gpu-clean before launch did not verify clean: {detail} (after {answer.elapsed_s:.1f}s)",
        kind=Kind.NOT_CLEAN,
    )


def record_health(host: str, gpus: list[GpuReading], archive: Archive | None = None) -> None:
    """Keep the host's GPU verdicts (`--hosts healthy` reads them)."""
    lines = [
        f"GPU {g.index}: {g.health.verdict}"
        + (
            ": " + "; ".join(r.split(": ", 1)[1] for r in g.health.reasons)
            if g.health.reasons
            else ""
        )
        for g in gpus
        if g.health is not None
    ]
    record = HealthRecord(host=host, at=datetime.now(UTC).isoformat(), gpus=lines)
    store.write_private_file(
        (archive or Archive.at()).health_record(host), record.to_json().encode()
    )


def healthy(hosts: list[Host], archive: Archive | None = None) -> tuple[list[Host], list[str]]:
    """The hosts whose last gpu-clean found no bad GPU, and why each other one was skipped
    (a host never cleaned is kept: nothing is known against it)."""
    keep, skipped = [], []
    for host in hosts:
        path = (archive or Archive.at()).health_record(host.name)
        record = HealthRecord.load(path) if path.exists() else None
        if record is not None and record.bad:
            skipped.append(f"{host.name} ({'; '.join(record.bad)}; gpu-clean at {record.at[:19]})")
        else:
            keep.append(host)
    return keep, skipped


def status_on(session: Session) -> StatusAnswer:
    """One host's read-only status, looking for every engine's stale processes."""
    try:
        return session.call(StatusArgs(patterns=engines.process_patterns()))
    except HostError as exc:
        raise _driver_message(exc, session.host) from None


def status(fleet: Fleet) -> FleetResult[StatusAnswer]:
    """Every host's read-only status."""
    return fleet.each(status_on)
