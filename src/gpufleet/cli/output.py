"""Tables for people: rich on a terminal, plain aligned text when piped (tests, logs, CI)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpufleet.kinds import Kind
from gpufleet.records import ResultRow
from gpufleet.report import catalogue

if TYPE_CHECKING:  # report is heavy: imported where a comparison is printed
    from gpufleet.report.compare import Arm


def _plain(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [title] if title else []
    for i, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    stream: TextIO | None = None,
) -> None:
    stream = stream or sys.stdout
    if stream.isatty():
        from rich.console import Console
        from rich.table import Table

        from gpufleet.cli.scrubbing import for_terminal, raw

        t = Table(title=for_terminal(title) or None, title_justify="left")
        for h in headers:
            t.add_column(for_terminal(str(h)))
        for row in rows:  # rich's styling goes beside the filter, the cells through it
            t.add_row(*(for_terminal(str(c)) for c in row))
        Console(file=raw(stream), markup=False).print(t)
    else:
        print(_plain(title, headers, rows), file=stream)


def line(text: str, stream: TextIO | None = None) -> None:
    print(text, file=stream or sys.stdout, flush=True)


def report_lost_hosts_at_once(res: Any) -> None:
    """A host lost mid-run is said the moment it happens (with its resume hint), not after
    the other hosts finish."""
    if not res.ok and res.kind in (Kind.CONNECTION, Kind.JOB_ENDED):
        line(f"{res.host.name}: FAILED: {res.error}", sys.stderr)
        res.reported = True


def print_runs(results: list[Any]) -> None:
    """Each archived run's level table and path (failed runs too: they are archived)."""
    for res in results:
        if res.value is not None:
            print_run(res.value, f"{res.host.name}: ")


def print_run(value: Any, prefix: str = "") -> None:
    """One archived run as both paths print it (the hosts' and `--client local`): its level
    table, repeat lines, the levels' notes (overloaded, not judged, client-bound, late
    timers, SLO met by none) and where it is archived."""
    from gpufleet.report.tables import headers, level_notes, rows

    table(f"{prefix}{value.run_id} ({value.status})", headers(value.results), rows(value.results))
    for text in repeat_lines(value.results, value.path):
        line(f"{prefix}{text}")
    for text in level_notes(value.results, steady=False):
        line(f"{prefix}{text}")
    line(f"{prefix}archived {value.path}")


def repeat_lines(results: list[ResultRow], run_dir: str | None = None) -> list[str]:
    """With --repeat: each level's mean and 95% interval of the headline figures (the
    percentiles' from the archived run's requests)."""
    from gpufleet.archive import store
    from gpufleet.report.stats import aggregate, with_interval

    by_level: dict[int, list[ResultRow]] = {}
    for row in results:
        by_level.setdefault(row.max_concurrency, []).append(row)
    out = []
    for c, rows in sorted(by_level.items()):
        if len(rows) < 2:
            continue
        requests = (
            store.read_level_requests([(Path(run_dir), r) for r in rows]) if run_dir else None
        )
        agg = aggregate(rows, requests)
        counted = (
            f"{len(rows)} repeats"
            if agg.measured == len(rows)
            else f"{agg.measured} of {len(rows)} repeats measured"
        )
        if not agg.measured:
            out.append(f"C={c}, {counted}: every request failed, nothing to average")
            continue
        parts = []
        for metric in catalogue.where(catalogue.Place.REPEATS):
            mean = agg.get(metric.key)
            if mean is not None:
                interval = agg.ci.get(metric.key)
                parts.append(f"{metric.label} {with_interval(mean, interval, places=1)}")
        said = "mean [95% CI]" if agg.ci else "mean (too few repeats for an interval: 3 give one)"
        out.append(f"C={c}, {counted}, {said}: " + "; ".join(parts))
    return out


def prose(text: str, stream: TextIO | None = None) -> None:
    """A sentence wrapped to the terminal's width (100 columns when not a terminal), the
    lines after the first indented."""
    import shutil
    import textwrap

    stream = stream or sys.stdout
    width = shutil.get_terminal_size((100, 24)).columns if stream.isatty() else 100
    print(textwrap.fill(text, width=max(40, width), subsequent_indent="    ",
                        break_on_hyphens=False, break_long_words=False), file=stream)  # fmt: skip


def _compare_table(
    title: str, headers: list[str], rows: list[list[str]], fmt: str, host: str
) -> None:
    """One host's comparison table as csv, Markdown or a terminal table."""
    import csv
    import io

    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["host", *headers])
        writer.writerows([[host, *r] for r in rows])
        print(out.getvalue(), end="")
    elif fmt == "md":
        from gpufleet.report.markdown import md_table

        line(f"### {title}\n")
        for text in md_table(headers, rows):
            line(text)
        line("")
    else:
        table(title, headers, rows)


def print_compare(per_host: dict[str, list[Arm]], fmt: str, wide: bool = False) -> None:
    """Per host: the table (table/md/csv/json), then the answer (report/answer.py): its
    sentence, its errors and its warnings, wrapped to the terminal.

    The terminal table shows the headline columns unless `wide`; md and csv show all."""
    import json

    from gpufleet.report import answer as answers
    from gpufleet.report import compare

    built = {host: answers.build(host, arms) for host, arms in per_host.items()}
    if fmt == "json":
        out = {
            host: {
                **built[host].to_json(),
                "arms": [
                    {"label": a.label, "run_ids": [m.run_id for m in a.manifests]} for a in arms
                ],
                "levels": {
                    str(c): {a.label: a.levels[c].to_json() for a in arms}
                    for c in compare.common_levels(arms)
                },
            }
            for host, arms in per_host.items()
        }
        print(json.dumps(out, indent=2, default=str))
        return
    for host, arms in per_host.items():
        headline = fmt == "table" and not wide
        headers, rows = compare.table(arms, wide=not headline)
        title = (
            f"{host}: {compare.letters(arms) if headline else ' vs '.join(a.label for a in arms)}"
        )
        _compare_table(title, headers, rows, fmt, host)
        levels = compare.common_levels(arms)
        said = built[host]
        if len(arms) > 1 and levels:
            for text in said.sentences:
                prose(f"{host}: {text}")
        if fmt == "table" and any(
            a.levels[c].get(catalogue.STEADY_THROUGHPUT) is not None for a in arms for c in levels
        ):
            prose(
                f"{host}: figures over each whole level (ramp-up and drain included); "
                + ("`steady tok/s` is the steady window's" if wide else
                   "`--wide` adds the steady window's throughput")
            )  # fmt: skip
        for notice in said.notices:
            prose(f"{host}: {notice.severity}: {notice.text}")
