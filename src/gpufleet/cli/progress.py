"""Per-host progress lines for long tasks: launch phases, bench levels, followed logs."""

from __future__ import annotations

import time

from gpufleet.cli.output import line
from gpufleet.control.connect.base import Progress
from gpufleet.host.agent.protocol import ProgressEvent
from gpufleet.report import catalogue


def launch_progress() -> Progress:
    """Each phase change, warnings, and the server log's last line."""
    last: dict[str, str] = {}

    def show(host: str, event: ProgressEvent) -> None:
        if "warning" in event:
            line(f"{host}: warning: {event['warning']}")
        elif "note" in event:
            line(f"{host}: note: {event['note']}")
        elif "line" in event:
            line(f"{host}| {event['line']}")
        elif event.get("phase") == "started":
            line(f"{host}: started pid {event['pid']}, log {event['log']}")
        elif "phase" in event and event["phase"] != last.get(host):
            last[host] = event["phase"]
            tail = f"  | {event['last_line']}" if event.get("last_line") else ""
            line(f"{host}: {event['phase']} ({event['elapsed_s']:.1f}s){tail}")

    return show


def bench_progress() -> Progress:
    """Level starts and ends, and a line every 5 s in between."""
    last: dict[str, float] = {}

    def show(host: str, event: ProgressEvent) -> None:
        if "warning" in event:
            line(f"{host}: warning: {event['warning']}")
        elif event.get("phase") == "started":
            line(f"{host}: run {event['run_id']} started against {event['base_url']}")
        elif event.get("phase") == "start":
            sessions = f" ({event['sessions']} sessions)" if event.get("sessions") else ""
            line(f"{host}: C={event['level']}: {event['total']} requests{sessions}")
        elif event.get("phase") == "end":
            line(
                f"{host}: C={event['level']}: done, {event[catalogue.COMPLETED]} ok, "
                f"{event[catalogue.FAILED]} failed, {event[catalogue.THROUGHPUT]} tok/s"
            )
        elif "done" in event and time.monotonic() - last.get(host, 0) >= 5:
            last[host] = time.monotonic()
            eta = f", ~{event['eta_s']:.0f}s left" if event.get("eta_s") is not None else ""
            line(
                f"{host}: C={event['level']}: {event['done']}/{event['total']} done, "
                f"{event['errors']} errors, {event['tok_s']} tok/s{eta}"
            )

    return show
