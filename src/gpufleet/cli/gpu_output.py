"""Turn gpu-clean and status results into tables and JSON (no logic beyond formatting)."""

from __future__ import annotations

from typing import Any

from gpufleet.cli.output import line, table
from gpufleet.control.connect.fanout import HostResult
from gpufleet.control.server.gpuclean import CleanOptions
from gpufleet.readings import CleanAnswer, GpuCheck, GpuReading, LiveServerInfo, StatusAnswer
from gpufleet.report.gpu import gpu_verdict, killed_by_gpu
from gpufleet.wire import JsonDict


def _short_cmd(cmdline: list[str] | None, width: int = 60) -> str:
    text = " ".join(" ".join(cmdline or []).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def print_clean(results: list[HostResult[CleanAnswer]], options: CleanOptions) -> None:
    headers = ["host", "gpu", "uuid", "used MiB", "reserved MiB", "killed PIDs", "verdict",
               "health"]  # fmt: skip
    rows: list[list[Any]] = []
    for res in results:
        value = res.value
        if value is None:
            rows.append([res.host.name, "-", "-", "-", "-", "-", "FAILED (below)", "-"])
            continue
        per_gpu = killed_by_gpu(value)
        held = {i: s for s in value.live for i in s.gpus}
        how = {k.pid: k.signal for k in value.killed}
        for g in value.gpus:
            pids = per_gpu.get(g.index, [])
            killed = ",".join(
                f"{p}" if how.get(p) == "SIGTERM" else f"{p} ({how.get(p)})" for p in pids
            )
            verdict = gpu_verdict(g, options.tolerance_mib)
            if verdict != "clean" and g.index in held:
                verdict = f"live server :{held[g.index].port} (left running)"
            rows.append(
                [res.host.name, g.index, g.uuid, g.used_mib, g.reserved_mib, killed or "-", verdict,
                 _health(g)]
            )  # fmt: skip
    title = "gpu-clean (dry run: nothing killed)" if options.dry_run else "gpu-clean"
    table(title, headers, rows)
    for res in results:
        if res.value is not None:
            _clean_lines(res.host, res.value, options)


def _clean_lines(host: Any, value: CleanAnswer, options: CleanOptions) -> None:
    """Under the table: what was killed (or would be), left alone or cannot be seen."""
    name = host.name
    if options.dry_run:
        for p in value.would_kill:
            line(
                f"{name}: would kill {p.pid} ({p.user}, {p.age_s}s old, parent {p.ppid}): "
                f"{_short_cmd(p.cmdline)}"
            )
    else:
        on_gpu = {pid for pids in killed_by_gpu(value).values() for pid in pids}
        for k in (k for k in value.killed if k.pid not in on_gpu):
            command = _short_cmd(k.cmdline)
            if k.killed:
                line(f"{name}: killed {k.pid} ({k.signal}): {command}")
            else:
                line(f"{name}: {k.pid} exited by itself: {command}")
    for s in value.live:
        line(f"{name}: {live_server_line(host, s)}")
    for p in value.refused:
        line(f"{name}: left {p.pid} alone: {p.reason}: {_short_cmd(p.cmdline)}")
    for u in value.unattributed:
        line(
            f"{name}: GPU {u.gpu}: {u.used_mib} MiB held by PID {u.pid}, "
            "which this host cannot see (another container?): reported, not touched"
        )
    for entry in value.cleared_xids:
        line(f"{name}: cleared XID {entry.xid} on bus {entry.bus} ({entry.line[:60]}); "
             "logged in the workdir's health/xid-clears.log")  # fmt: skip
    health_lines(host, value.gpus)
    if value.no_gpus:
        line(f"{name}: no GPUs (the inventory gives it `gpus: {{count: 0}}`): nothing to clean")
    elif not options.dry_run:
        state = "verified clean" if value.clean else "NOT clean"
        line(f"{name}: {state} in {value.elapsed_s:.2f}s")


def _health(gpu: GpuReading) -> str:
    return gpu.health.verdict if gpu.health is not None else "n/a"


def health_lines(host: Any, gpus: list[GpuReading]) -> None:
    """Each reason a GPU is not `ok`, one line each; `bad` ones refuse a launch."""
    for gpu in gpus:
        for reason in gpu.health.reasons if gpu.health is not None else []:
            line(f"{host.name}: GPU {gpu.index}: {reason}")
    if any(g.health is not None and g.health.verdict == "bad" for g in gpus):
        line(f"{host.name}: launch, sweep and tune refuse a bad GPU (--allow-unhealthy "
             "launches anyway and records it)")  # fmt: skip
    if any(g.health is not None and g.health.missing_xids for g in gpus):
        line(f"{host.name}: a GPU missing from NVML returns only when the host is rebooted "
             "(or the GPU reset through its PCI bus); until then launches refuse")  # fmt: skip
    fatal = [str(g.index) for g in gpus if g.health is not None and g.health.fatal_xids]
    if fatal:
        line(f"{host.name}: a fatal XID holds until a reboot; after resetting the GPU "
             f"(nvidia-smi -r -i {fatal[0]}), clear it: inv gpu-clean --hosts {host.name} "
             f"--clear-xid {','.join(fatal)} --reason 'GPU reset'{host.cli_hint()}")  # fmt: skip


def verified_line(verify: GpuCheck) -> str:
    """A stop's verification: clean, or freed of the stopped server where servers sharing
    its GPUs run on (their memory is theirs, and it stays)."""
    gpus = ",".join(str(g.index) for g in verify.gpus)
    if not verify.kept:
        return f"GPUs {gpus} verified clean in {verify.elapsed_s:.2f}s"
    left = ", ".join(
        f"server :{k.port} ({k.profile}) on GPU {','.join(map(str, k.gpus))}" for k in verify.kept
    )
    return (
        f"GPUs {gpus} verified free of the stopped server in {verify.elapsed_s:.2f}s; "
        f"left running beside it: {left}"
    )


def live_server_line(host: Any, server: LiveServerInfo) -> str:
    """Which live server holds which GPUs, and the command that frees them."""
    gpus = ",".join(str(i) for i in server.gpus) or "none"
    if server.profile:
        who = f"gpufleet server {server.profile} (pid {server.pid})"
        free = f"`inv stop --hosts {host.name} --port {server.port}{host.cli_hint()}`"
    else:
        who = f"server pid {server.pid} (not launched by gpufleet)"
        free = "stop it, or run gpu-clean with --include-running"
    return (
        f"left the live {who} on port {server.port} alone (/health 200), "
        f"GPUs {gpus}: free them with {free}"
    )


def per_host_json(results: list[HostResult[Any]]) -> JsonDict:
    """--json of gpu-clean and status: each host's answer, with whether it succeeded."""
    return {
        r.host.name: {
            "ok": r.ok, "error": r.error, "kind": r.kind,
            **(r.value.to_wire() if r.value is not None else {}),
        }
        for r in results
    }  # fmt: skip


def print_status(results: list[HostResult[StatusAnswer]]) -> None:
    headers = ["host", "gpu", "name", "used MiB", "reserved MiB", "total MiB", "processes",
               "health"]  # fmt: skip
    rows: list[list[Any]] = []
    for res in results:
        if res.value is None:
            rows.append([res.host.name, "-", "-", "-", "-", "-", "FAILED (below)", "-"])
            continue
        for g in res.value.gpus:
            procs = (
                ", ".join(
                    f"{p.pid}:{p.name or '?'}:{p.used_mib}MiB"
                    if p.visible
                    else f"{p.pid}:unattributed:{p.used_mib}MiB"
                    for p in g.processes
                )
                or "-"
            )
            rows.append(
                [res.host.name, g.index, g.name, g.used_mib, g.reserved_mib, g.total_mib, procs,
                 _health(g)]
            )  # fmt: skip
    table("GPU status", headers, rows)
    for res in results:
        if res.value is not None:
            health_lines(res.host, res.value.gpus)
    server_rows = []
    for res in results:
        for srv in res.value.servers if res.value is not None else []:
            uptime = f"{srv.uptime_s:.0f}s" if srv.uptime_s is not None else "-"
            server_rows.append(
                [res.host.name, srv.profile, srv.pid, srv.port, srv.status, uptime, srv.health]
            )
    if server_rows:
        table(
            "servers", ["host", "profile", "pid", "port", "state", "uptime", "health"], server_rows
        )
    for res in results:
        for srv in res.value.servers if res.value is not None else []:
            if srv.ended:
                line(f"{res.host.name}: server {srv.profile} (port {srv.port}) ended with its "
                     f"Slurm job: {srv.ended}")  # fmt: skip
    for res in results:
        for p in res.value.stale if res.value is not None else []:
            line(f"{res.host.name}: server process {p.pid} ({p.user}): {_short_cmd(p.cmdline)}")
