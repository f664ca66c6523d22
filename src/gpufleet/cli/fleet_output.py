"""How inv fleet and inv history print: tables and sentences, or JSON for a script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpufleet.cli.output import line, prose, table
from gpufleet.fleet.estimate import Estimate
from gpufleet.fleet.history import HostHistory
from gpufleet.fleet.outliers import FleetView
from gpufleet.fleet.page import as_json, interval_json, markdown, sentences
from gpufleet.fleet.page import table as fleet_table
from gpufleet.fleet.wording import change_text, fact_text
from gpufleet.report.stats import with_interval


def _notes(notes: list[str]) -> None:
    for note in notes:
        line(f"note: {note}", sys.stderr)


def print_fleet(
    views: list[FleetView], fmt: str, notes: list[str], pages: dict[str, list[Path]]
) -> None:
    _notes(notes)
    if fmt == "json":
        print(as_json(views))
        return
    for view in views:
        if fmt == "md":
            print(markdown(view))
            continue
        headers, rows = fleet_table(view)
        runs = [r for rs in view.runs.values() for r in rs]
        newest = max(runs, key=lambda r: r.started_at).round_id if runs else "-"
        prose(
            f"{view.profile}: {view.metric.label}, each host's ratio to the fleet's median "
            f"[95% interval]; ! = named off the fleet (>= {view.threshold:.0%} and significant), "
            "? = suspect (this round only), ~ = not judged (the client's mark)"
        )
        table("", headers, rows)
        for sentence in sentences(view):
            prose(sentence)
        for why in view.left_out:
            line(f"left out: {why}")
        for note in view.notes:
            line(note)
        line(f"from {len(runs)} run(s) of {len(view.runs)} hosts; newest round: {newest}")
        written = pages.get(view.profile) or []
        if written:
            line(
                f"summary: {written[0]} (`{report_hint(view.profile, written[0])}` draws the plot)"
            )


def report_hint(profile: str, summary: Path) -> str:
    """The command that draws this view's plot, with the archive named unless it is the
    one a bare `inv` finds (pasted, it must work)."""
    import os
    import shlex

    from gpufleet.archive.layout import DEFAULT_ROOT

    root = summary.parent.parent.parent
    found = os.environ.get("GPUFLEET_ARCHIVE") or DEFAULT_ROOT
    where = (
        "" if root.resolve() == Path(found).resolve() else f" --archive {shlex.quote(str(root))}"
    )
    return f"inv report --fleet {shlex.quote(profile)}{where}"


def _figure(e: Estimate) -> str:
    return with_interval(e.value, e.interval(), places=1)


def history_json(found: list[HostHistory]) -> str:
    """The histories as JSON text for a script (`--format json`)."""
    return json.dumps(
        [
            {
                "host": h.host,
                "profile": h.profile,
                "metric": h.metric.key,
                "newest": [r.run_id for r in h.newest],
                "baseline": [r.run_id for r in h.baseline],
                "levels": [
                    {
                        "concurrency": lv.concurrency,
                        "before": lv.before.value,
                        "after": lv.after.value,
                        "ratio": lv.ratio,
                        "interval": interval_json(lv.interval),
                        "verdict": lv.verdict,
                        "change": lv.change,
                        "note": lv.note,
                    }
                    for lv in h.levels
                ],
                "changes": [
                    {"field": f, "before": fact_text(a), "after": fact_text(b)}
                    for f, a, b in h.changes
                ],
                "left_out": h.left_out,
                "fleet_moved": h.fleet_moved,
            }
            for h in found
        ],
        indent=1,
    )


def print_history(
    found: list[HostHistory], fmt: str, notes: list[str], damaged: list[str] = ()
) -> None:
    """The histories, and the damaged runs no history reads (left out by name)."""
    _notes(notes)
    if fmt == "json":
        _notes([f"left out: {why}" for why in damaged])
        print(history_json(found))
        return
    for why in damaged:
        line(f"left out: {why}")
    if not found:
        line("no archived runs match")
    for h in found:
        title = f"{h.host} {h.profile}: newest {h.newest[-1].run_id}"
        if not h.baseline:
            line(f"{title}: no earlier comparable run to compare with")
            for why in h.left_out:
                line(f"  left out: {why}")
            continue
        prose(
            f"{title} against {len(h.baseline)} earlier run(s) "
            f"({h.baseline[0].started_at[:10]} to {h.baseline[-1].started_at[:10]})"
        )
        rows = [
            [
                f"C={lv.concurrency}",
                _figure(lv.before),
                _figure(lv.after),
                with_interval(lv.ratio, lv.interval, places=3),
                f"{lv.verdict} ({lv.change:+.1%})",
            ]
            for lv in h.levels
        ]
        table(
            "",
            [
                "level",
                f"before {h.metric.unit}",
                f"newest {h.metric.unit}",
                "newest/before",
                "verdict",
            ],
            rows,
        )
        for lv in h.levels:
            if lv.note:
                prose(f"  C={lv.concurrency}: {lv.note}")
        if h.changes:
            prose("  changed: " + "; ".join(change_text(f, a, b) for f, a, b in h.changes))
        else:
            line("  changed: nothing recorded in the fingerprint")
        if h.fleet_moved:
            prose(f"  {h.fleet_moved} (a shared cause, not this host's alone)")
        for why in h.left_out:
            line(f"  left out: {why}")
