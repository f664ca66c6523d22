"""Per-level summaries of a run: CSV, Markdown, and the terminal table."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any, Protocol

from gpufleet.archive.kept import Manifest
from gpufleet.report import catalogue
from gpufleet.report.markdown import md_table
from gpufleet.report.notes import said_once


class Figures(Protocol):
    """A level's figures by catalogue name: a results.jsonl row (records.ResultRow) or a
    level aggregated over repeats (report/stats.py)."""

    def get(self, key: str, default: Any = None, /) -> Any: ...


COLUMNS = [(m.label, m.key, m.fmt) for m in catalogue.where(catalogue.Place.RUN_TABLE)]
# the terminal's order: the status beside the level, so the first 100 columns show it
# (overloaded, failed, SLO met by none); summary.csv keeps the catalogue's order
_FIRST = (catalogue.CONCURRENCY, catalogue.STATUS)
SHOWN = sorted(COLUMNS, key=lambda col: [col[1] != key for key in _FIRST])
# Shown only when some level has them: a prefix cache that served tokens, an SLO given.
OPTIONAL = {m.key for m in catalogue.where(catalogue.Place.OPTIONAL)}


def _columns(results: Sequence[Figures] | None) -> list[tuple[str, str, str]]:
    return [col for col in SHOWN if col[1] not in OPTIONAL or _present(results, col[1])]


def _present(results: Sequence[Figures] | None, key: str) -> bool:
    """An optional column is shown where some level has it: an SLO's outcome where any
    level has one, 0% above all (the worst outcome is never hidden); the others where some
    level's is more than 0 (a prefix cache that served nothing says nothing)."""
    found = [r.get(key) for r in results or []]
    if key in catalogue.SLO_KEYS:
        return any(v is not None for v in found)
    return any(found)


def status(row: Figures) -> str | None:
    """A level's status with what marks it: overloaded, no request within the SLO."""
    value = row.get(catalogue.STATUS)
    marks = [str(value)] if value is not None else []
    if row.get("overloaded"):
        marks.append("overloaded")
    elif row.get("overload_unjudged"):
        marks.append("overload not judged")
    if row.get(catalogue.SLO_MET) == 0:
        marks.append("SLO met by none")
    return ", ".join(marks) or None


def _cell(row: Figures, key: str, fmt: str) -> str:
    value = status(row) if key == catalogue.STATUS else row.get(key)
    if value is None or (row.get(catalogue.COMPLETED) == 0 and catalogue.from_completions(key)):
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
        f"overloaded: sent {sent:.2f}{answered} of "
        f"{offered:.2f} req/s offered{backlog}; requests queued p50 {(p50 or 0) / 1000:.2f} s, "
        f"p99 {(p99 or 0) / 1000:.2f} s before being sent, so a user waited that plus the "
        "TTFT shown"
    )


def tokens_note(row: Figures) -> str | None:
    """Where a level's token counts disagreed or were approximated (metrics.token_counts):
    the source its figures came from, then both figures (host/bench/tokencount.py)."""
    note = row.get("output_tokens_note")
    if not note:
        return None
    return f"output tokens from {row.get('output_tokens_source') or 'an unnamed source'}: {note}"


def level_notes(results: Sequence[Figures], steady: bool = True) -> list[str]:
    """What marks the levels: overloaded, not judged for overload, client-bound, timers
    late, no request within the SLO, token counts that disagreed or were approximated, or
    (`steady`) no steady window (summary.md says so; the terminal stays quiet about short
    levels). Each note once (`said_once`), with the levels it holds at and the range of
    its figures over them and their repeats."""
    notes: list[tuple[int, str]] = []
    for r in results:
        c = int(r.get(catalogue.CONCURRENCY) or 0)
        said = [
            overload_note(r),
            r.get("overload_unjudged") and f"overload not judged: {r.get('overload_unjudged')}",
            r.get("client_bound") and f"client-bound: {r.get('client_bound')}",
            r.get("client_late") and f"client timers late: {r.get('client_late')}",
            r.get(catalogue.SLO_MET) == 0 and "no request met the SLO: goodput 0",
            tokens_note(r),
            steady and r.get("steady_note") and f"no steady-state figures: {r.get('steady_note')}",
        ]
        notes += [(c, text) for text in said if text]
    return [f"C={levels}: {text}" for levels, text in said_once(notes)]


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
