"""Per-level summaries of a run: CSV, Markdown, and the terminal table."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any, Protocol

from gpufleet.archive.kept import Manifest
from gpufleet.report import catalogue
from gpufleet.report.markdown import md_table


class Figures(Protocol):
    """A level's figures by catalogue name: a results.jsonl row (records.ResultRow) or a
    level aggregated over repeats (report/stats.py)."""

    def get(self, key: str, default: Any = None, /) -> Any: ...


COLUMNS = [(m.label, m.key, m.fmt) for m in catalogue.where(catalogue.Place.RUN_TABLE)]
# Shown only when some level has them: a prefix cache that served tokens, an SLO given.
OPTIONAL = {m.key for m in catalogue.where(catalogue.Place.OPTIONAL)}


def _columns(results: Sequence[Figures] | None) -> list[tuple[str, str, str]]:
    return [
        col
        for col in COLUMNS
        if col[1] not in OPTIONAL or any(r.get(col[1]) for r in results or [])
    ]


def _measured(key: str) -> bool:
    """A figure measured from completed requests (a speed, a latency), not a count or a
    status: a level that completed none has no such figure."""
    metric = catalogue.BY_KEY.get(key)
    return metric is not None and metric.unit not in ("requests", "")


def _cell(row: Figures, key: str, fmt: str) -> str:
    value = row.get(key)
    if key == catalogue.STATUS and row.get("overloaded"):
        return "overloaded" if value is None else f"{value}, overloaded"
    if value is None or (row.get(catalogue.COMPLETED) == 0 and _measured(key)):
        return "-"  # a failed level's 0.0 tok/s and 0.0 ms TTFT were never measured
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def rows(results: Sequence[Figures]) -> list[list[str]]:
    columns = _columns(results)
    return [[_cell(r, key, fmt) for _, key, fmt in columns] for r in results]


def headers(results: Sequence[Figures] | None = None) -> list[str]:
    return [name for name, _, _ in _columns(results)]


def summary_csv(results: Sequence[Figures]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([key for _, key, _ in COLUMNS])
    for r in results:
        writer.writerow([r.get(key) for _, key, _ in COLUMNS])
    return out.getvalue()


def overload_note(row: Figures) -> str | None:
    """An open-loop level that fell behind its arrivals, in words: its latencies are
    measured from the send, after a queue wait the user also waited."""
    if not row.get("overloaded"):
        return None
    offered, sent = row.get(catalogue.OFFERED_RATE), row.get(catalogue.ACHIEVED_RATE)
    p50, p99 = row.get(catalogue.QUEUE_WAIT), row.get(catalogue.QUEUE_WAIT_P99)
    completed = row.get(catalogue.COMPLETED_RATE)
    answered = f", completed {completed:.2f}" if completed is not None else ""
    queued = row.get(catalogue.QUEUE_AT_END)
    backlog = f", {queued} waiting for an answer at the last arrival" if queued else ""
    return (
        f"C={row.get(catalogue.CONCURRENCY)}: overloaded: sent {sent:.2f}{answered} of "
        f"{offered:.2f} req/s offered{backlog}; requests queued p50 {(p50 or 0) / 1000:.2f} s, "
        f"p99 {(p99 or 0) / 1000:.2f} s before being sent, so a user waited that plus the "
        "TTFT shown"
    )


def level_notes(results: Sequence[Figures], steady: bool = True) -> list[str]:
    """One line per level that was overloaded, whose client was the bottleneck, or
    (`steady`) that had no steady window (summary.md says so; the terminal stays quiet
    about short levels)."""
    notes = []
    for r in results:
        level = f"C={r.get(catalogue.CONCURRENCY)}"
        overloaded = overload_note(r)
        if overloaded:
            notes.append(overloaded)
        if r.get("client_bound"):
            notes.append(f"{level}: client-bound: {r.get('client_bound')}")
        if r.get("client_late"):
            notes.append(f"{level}: client timers late: {r.get('client_late')}")
        if steady and r.get("steady_note"):
            notes.append(f"{level}: no steady-state figures: {r.get('steady_note')}")
    return notes


def summary_md(manifest: Manifest, results: Sequence[Figures]) -> str:
    m = manifest
    lines = [
        f"# {m.run_id}",
        "",
        f"- host: {m.host}; profile: {m.profile}; status: **{m.status}**"
        + (f" ({m.reason})" if m.reason else ""),
        f"- engine: {m.server.engine} {m.server.engine_version}; "
        f"prompts: {m.prompt_set.name} (seed {m.prompt_set.seed}); "
        f"output length {m.plan.output_len if m.plan else None}",
        "- metrics use SGLang bench_serving's definitions (see definitions.json)",
        "",
        *md_table(headers(results), rows(results)),
    ]
    notes = level_notes(results)
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"
