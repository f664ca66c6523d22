"""Turn gpu-clean and status results into tables and JSON (no logic beyond formatting)."""

from __future__ import annotations

from typing import Any

from gpufleet.cli.output import line, table
from gpufleet.control.fanout import HostResult
from gpufleet.control.gpuclean import CleanOptions
from gpufleet.report.gpu import gpu_verdict, killed_by_gpu


def _short_cmd(cmdline: list[str] | None, width: int = 60) -> str:
    text = " ".join(" ".join(cmdline or []).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def print_clean(results: list[HostResult[dict]], options: CleanOptions) -> None:
    headers = ["host", "gpu", "uuid", "used MiB", "reserved MiB", "killed PIDs", "verdict"]
    rows: list[list[Any]] = []
    for res in results:
        if not res.ok and res.value is None:
            rows.append([res.host.name, "-", "-", "-", "-", "-", "FAILED (below)"])
            continue
        value = res.value
        per_gpu = killed_by_gpu(value)
        held = {i: s for s in value.get("live", []) for i in s["gpus"]}
        how = {k["pid"]: k["signal"] for k in value.get("killed", [])}
        for g in value["gpus"]:
            pids = per_gpu.get(g["index"], [])
            killed = ",".join(
                f"{p}" if how.get(p) == "SIGTERM" else f"{p} ({how.get(p)})" for p in pids
            )
            killed = killed or "-"
            verdict = gpu_verdict(g, options.tolerance_mib)
            if verdict != "clean" and g["index"] in held:
                verdict = f"live server :{held[g['index']]['port']} (left running)"
            rows.append(
                [
                    res.host.name,
                    g["index"],
                    g["uuid"],
                    g["used_mib"],
                    g["reserved_mib"],
                    killed,
                    verdict,
                ]
            )
    title = "gpu-clean (dry run: nothing killed)" if options.dry_run else "gpu-clean"
    table(title, headers, rows)
    for res in results:
        if res.value is None:
            continue
        value = res.value
        if options.dry_run:
            for p in value.get("would_kill", []):
                line(
                    f"{res.host.name}: would kill {p['pid']} ({p['user']}, "
                    f"{p['age_s']}s old, parent {p['ppid']}): {_short_cmd(p['cmdline'])}"
                )
        else:
            on_gpu = {pid for pids in killed_by_gpu(value).values() for pid in pids}
            others = [k for k in value.get("killed", []) if k["pid"] not in on_gpu]
            for k in others:
                command = _short_cmd(k["cmdline"])
                if k.get("killed", True):
                    line(f"{res.host.name}: killed {k['pid']} ({k['signal']}): {command}")
                else:
                    line(f"{res.host.name}: {k['pid']} exited by itself: {command}")
        for s in value.get("live", []):
            line(f"{res.host.name}: {live_server_line(res.host, s)}")
        for p in value.get("refused", []):
            line(
                f"{res.host.name}: left {p['pid']} alone: {p['reason']}: {_short_cmd(p['cmdline'])}"
            )
        for u in value.get("unattributed", []):
            line(
                f"{res.host.name}: GPU {u['gpu']}: {u['used_mib']} MiB held by PID {u['pid']}, "
                "which this host cannot see (another container?): reported, not touched"
            )
        if not options.dry_run:
            state = "verified clean" if value["clean"] else "NOT clean"
            line(f"{res.host.name}: {state} in {value['elapsed_s']:.2f}s")


def live_server_line(host: Any, server: dict[str, Any]) -> str:
    """Which live server holds which GPUs, and the command that frees them."""
    gpus = ",".join(str(i) for i in server["gpus"]) or "none"
    if server.get("profile"):
        who = f"gpufleet server {server['profile']} (pid {server['pid']})"
        free = f"`inv stop --hosts {host.name} --port {server['port']}{host.cli_hint()}`"
    else:
        who = f"server pid {server['pid']} (not launched by gpufleet)"
        free = "stop it, or run gpu-clean with --include-running"
    return (
        f"left the live {who} on port {server['port']} alone (/health 200), "
        f"GPUs {gpus}: free them with {free}"
    )


def clean_json(results: list[HostResult[dict]]) -> dict[str, Any]:
    return {
        r.host.name: {"ok": r.ok, "error": r.error, "kind": r.kind, **(r.value or {})}
        for r in results
    }


def print_status(results: list[HostResult[dict]]) -> None:
    headers = ["host", "gpu", "name", "used MiB", "reserved MiB", "total MiB", "processes"]
    rows: list[list[Any]] = []
    for res in results:
        if not res.ok:
            rows.append([res.host.name, "-", "-", "-", "-", "-", "FAILED (below)"])
            continue
        for g in res.value["gpus"]:
            procs = (
                ", ".join(
                    f"{p['pid']}:{p.get('name', '?')}:{p['used_mib']}MiB"
                    if p.get("visible", True)
                    else f"{p['pid']}:unattributed:{p['used_mib']}MiB"
                    for p in g["processes"]
                )
                or "-"
            )
            rows.append(
                [
                    res.host.name,
                    g["index"],
                    g["name"],
                    g["used_mib"],
                    g["reserved_mib"],
                    g["total_mib"],
                    procs,
                ]
            )
    table("GPU status", headers, rows)
    server_rows = []
    for res in results:
        if not res.ok:
            continue
        for srv in res.value.get("servers", []):
            uptime = f"{srv['uptime_s']:.0f}s" if srv.get("uptime_s") is not None else "-"
            server_rows.append(
                [
                    res.host.name,
                    srv["profile"],
                    srv["pid"],
                    srv["port"],
                    srv["status"],
                    uptime,
                    srv["health"],
                ]
            )
    if server_rows:
        table(
            "servers", ["host", "profile", "pid", "port", "state", "uptime", "health"], server_rows
        )
    for res in results:
        if res.ok:
            for p in res.value.get("stale", []):
                line(
                    f"{res.host.name}: server process {p['pid']} ({p['user']}): "
                    f"{_short_cmd(p['cmdline'])}"
                )


def status_json(results: list[HostResult[dict]]) -> dict[str, Any]:
    return clean_json(results)
