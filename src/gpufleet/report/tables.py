"""Per-level summaries of a run: CSV, Markdown, and the terminal table."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any, Protocol

from gpufleet.archived import Manifest
from gpufleet.report import metrics


class Figures(Protocol):
    """A level's figures by catalogue name: a results.jsonl row (records.ResultRow) or a
    level aggregated over repeats (report/stats.py)."""

    def get(self, key: str, default: Any = None, /) -> Any: ...


COLUMNS = [(m.label, m.key, m.fmt) for m in metrics.where(metrics.Place.RUN_TABLE)]
# Shown only when some level has them: a prefix cache that served tokens, an SLO given.
OPTIONAL = {m.key for m in metrics.where(metrics.Place.OPTIONAL)}


def _columns(results: Sequence[Figures] | None) -> list[tuple[str, str, str]]:
    return [
        col
        for col in COLUMNS
        if col[1] not in OPTIONAL or any(r.get(col[1]) for r in results or [])
    ]


def _cell(row: Figures, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
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


def client_notes(results: Sequence[Figures], steady: bool = True) -> list[str]:
    """One line per level whose client was the bottleneck, or (`steady`) that had no steady
    window (summary.md says so; the terminal stays quiet about short levels)."""
    notes = []
    for r in results:
        level = f"C={r.get('max_concurrency')}"
        if r.get("client_bound"):
            notes.append(f"{level}: client-bound: {r.get('client_bound')}")
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
        "| " + " | ".join(headers(results)) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(results)]
    notes = client_notes(results)
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"
