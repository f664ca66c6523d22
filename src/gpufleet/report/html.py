"""One self-contained HTML page for a sweep or a comparison: open it offline, mail it.

Everything is inline: CSS, SVG plots (hover a point for its value: SVG <title>), the data
as embedded JSON. Links to raw files are relative to the page, so they keep working when
the archive folder is copied. The page reads top to bottom: the answer per host, the
verdict table, plots, fairness warnings, failures, provenance and raw files.
"""

from __future__ import annotations

import html
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.archived import Manifest
from gpufleet.report import metrics
from gpufleet.report.compare import Arm, common_levels, fairness, sentence

VERDICT_METRICS = [  # (heading, key, format, higher is better): from the catalogue
    (m.label, m.key, m.fmt, bool(m.higher_is_better)) for m in metrics.where(metrics.Place.VERDICT)
]
COLORS = ["#1f6feb", "#d1495b", "#2e9f6b", "#8a5cd1", "#e08a00", "#3b9bb3"]


@dataclass
class Failure:
    """A cell or run that failed: where, why, and the server log's last lines."""

    host: str
    label: str
    error: str
    tail: list[str] = field(default_factory=list)


@dataclass
class ReportInput:
    title: str
    per_host: dict[str, list[Arm]]
    failures: list[Failure] = field(default_factory=list)
    run_dirs: dict[str, Path] = field(default_factory=dict)  # run id -> its directory
    checksums: dict[str, str] = field(default_factory=dict)  # run id -> ok, or the problems


def render(data: ReportInput, out_dir: Path) -> str:
    """The whole page; `out_dir` is where it will be written (for relative links)."""
    body = [f"<h1>{_e(data.title)}</h1>"]
    body.append(_answers(data.per_host))
    for host, arms in data.per_host.items():
        body.append(f'<section class="host"><h2>{_e(host)}</h2>')
        body.append(_verdict_table(arms))
        body.append('<div class="plots">' + "".join(_plots(host, arms)) + "</div>")
        warnings = fairness(arms, common_levels(arms))
        if warnings:
            items = "".join(f"<li>{_e(w)}</li>" for w in warnings)
            body.append(f'<h3>Fairness warnings</h3><ul class="warn">{items}</ul>')
        body.append("</section>")
    if data.failures:
        body.append(_failures(data.failures))
    body.append(_provenance(data, out_dir))
    payload = {
        host: {a.label: {str(c): row for c, row in sorted(a.levels.items())} for a in arms}
        for host, arms in data.per_host.items()
    }
    embedded = json.dumps(_finite(payload), default=str).replace("</", "<\\/")
    return PAGE.format(
        title=_e(data.title),
        css=CSS,
        body="\n".join(body),
        data=embedded,
    )


def _finite(value: Any) -> Any:
    """JSON has no Infinity or NaN (results.jsonl writes `request_rate: Infinity`, as
    bench_serving does): they become strings so the page can parse its own data."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(float(value))
    except (TypeError, ValueError):
        return _e(value)


def _answers(per_host: dict[str, list[Arm]]) -> str:
    items = []
    for host, arms in per_host.items():
        levels = common_levels(arms)
        if len(arms) > 1 and levels:
            items.append(f"<li><b>{_e(host)}</b>: {_e(sentence(arms[0], arms[1], levels))}</li>")
        else:
            labels = ", ".join(a.label for a in arms)
            items.append(f"<li><b>{_e(host)}</b>: {_e(labels)} (nothing to compare with)</li>")
    return f'<section class="answer"><h2>The answer</h2><ul>{"".join(items)}</ul></section>'


def _verdict_table(arms: list[Arm]) -> str:
    ref = arms[0]
    span = 2 * len(arms) - 1
    top = ['<th rowspan="2">C</th>']
    sub = []
    for name, _, _, _ in VERDICT_METRICS:
        top.append(f'<th colspan="{span}">{_e(name)}</th>')
        sub += [f"<th>{_e(a.label)}</th>" for a in arms]
        sub += [
            f'<th title="{_e(a.label)} / {_e(ref.label)}">{_e(a.label)} / {_e(ref.label)}</th>'
            for a in arms[1:]
        ]
    rows = []
    for c in common_levels(arms):
        cells = [f"<td>{c}</td>"]
        for _, key, fmt, higher in VERDICT_METRICS:
            values = [arm.levels[c].get(key) for arm in arms]
            cells += [f'<td class="num">{_fmt(v, fmt)}</td>' for v in values]
            for v in values[1:]:
                if v is None or not values[0]:
                    cells.append('<td class="num">-</td>')
                    continue
                ratio = float(v) / float(values[0])
                better = ratio > 1.0 if higher else ratio < 1.0
                css = (
                    "win"
                    if better and abs(ratio - 1) > 0.02
                    else "lose"
                    if abs(ratio - 1) > 0.02
                    else ""
                )
                cells.append(f'<td class="num ratio {css}">{ratio:.2f}x</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (
        '<div class="scroll"><table class="verdict"><thead><tr>'
        + "".join(top)
        + "</tr><tr>"
        + "".join(sub)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


Series = tuple[str, str, bool, list[tuple[int, float, tuple[float, float] | None]]]


def _plots(host: str, arms: list[Arm]) -> list[str]:
    """The catalogue's plots (the same ones as the PNGs), with the same 95% intervals."""
    levels = common_levels(arms)
    out = []
    for spec in metrics.PLOTS:
        series: list[Series] = []
        for index, arm in enumerate(arms):
            for n, key in enumerate(spec.keys):
                points = []
                for c in levels:
                    value = arm.levels[c].get(key)
                    if isinstance(value, int | float):
                        ci = (arm.levels[c].get("ci") or {}).get(key)
                        points.append((c, float(value), tuple(ci) if ci else None))
                if points:
                    suffix = f" {metrics.BY_KEY[key].label}" if len(spec.keys) > 1 else ""
                    color = COLORS[index % len(COLORS)]
                    series.append((arm.label + suffix, color, n > 0, points))
        if series:
            out.append(_svg_plot(f"{host}: {spec.title}", spec.unit, levels, series))
    return out


def _svg_plot(title: str, unit: str, levels: list[int], series: list[Series]) -> str:
    """A line plot on a log-concurrency axis; each point's value (and 95% interval, with
    repeats) shows on hover, the interval also as an error bar."""
    width, height, left, right, top, bottom = 560, 320, 64, 16, 34, 44
    ymax = max(max(v, ci[1] if ci else v) for _, _, _, pts in series for _, v, ci in pts) or 1.0
    ymax *= 1.1
    lo, hi = math.log(min(levels)), math.log(max(levels))
    span = (hi - lo) or 1.0

    def x(c: float) -> float:
        frac = (math.log(c) - lo) / span if len(levels) > 1 else 0.5
        return left + frac * (width - left - right)

    def y(v: float) -> float:
        return top + (1 - v / ymax) * (height - top - bottom)

    parts = [
        f'<svg class="plot" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{_e(title)}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{width / 2}" y="20" class="ptitle" text-anchor="middle">{_e(title)}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" '
        f'y2="{height - bottom}" class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" class="axis"/>',
    ]
    for tick in range(5):
        value = ymax * tick / 4
        ty = y(value)
        parts.append(
            f'<line x1="{left}" y1="{ty:.1f}" x2="{width - right}" y2="{ty:.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{ty + 4:.1f}" text-anchor="end" class="tick">'
            f"{_e(metrics.tick(value))}</text>"
        )
    for c in levels:
        parts.append(
            f'<text x="{x(c):.1f}" y="{height - bottom + 16}" text-anchor="middle" '
            f'class="tick">{c}</text>'
        )
    parts.append(
        f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle" '
        f'class="tick">concurrency (log scale)</text>'
        f'<text x="14" y="{(top + height - bottom) / 2}" class="tick" '
        f'transform="rotate(-90 14 {(top + height - bottom) / 2})" text-anchor="middle">'
        f"{_e(unit)}</text>"
    )
    for index, (name, color, dashed, points) in enumerate(series):
        path = " ".join(f"{x(c):.1f},{y(v):.1f}" for c, v, _ in points)
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        parts.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
        )
        for c, v, ci in points:
            interval = f" (95% CI {ci[0]:,.2f}-{ci[1]:,.2f})" if ci else ""
            if ci:
                parts.append(
                    f'<line x1="{x(c):.1f}" y1="{y(ci[0]):.1f}" x2="{x(c):.1f}" '
                    f'y2="{y(ci[1]):.1f}" stroke="{color}" class="ci"/>'
                )
            parts.append(
                f'<circle cx="{x(c):.1f}" cy="{y(v):.1f}" r="4" fill="{color}" class="pt">'
                f"<title>{_e(name)} at C={c}: {v:,.2f} {_e(unit)}{_e(interval)}"
                "</title></circle>"
            )
        ly = top + 4 + 14 * index
        parts.append(
            f'<rect x="{width - right - 150}" y="{ly}" width="10" height="10" fill="{color}"/>'
            f'<text x="{width - right - 136}" y="{ly + 9}" class="tick">{_e(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _failures(failures: list[Failure]) -> str:
    items = []
    for f in failures:
        tail = "\n".join(f.tail[-40:])
        log = f"<details><summary>last log lines</summary><pre>{_e(tail)}</pre></details>"
        items.append(
            f"<li><b>{_e(f.label)}</b> on <b>{_e(f.host)}</b>: {_e(f.error)}"
            + (log if f.tail else "")
            + "</li>"
        )
    heading = "<h2>Failed runs and cells</h2>"
    return f'<section class="failures">{heading}<ul>{"".join(items)}</ul></section>'


def _provenance(data: ReportInput, out_dir: Path) -> str:
    rows = []
    for host, arms in data.per_host.items():
        for arm in arms:
            for m in arm.manifests:
                run_dir = data.run_dirs.get(m.run_id)
                rows.append(_run_card(host, arm.label, m, run_dir, data.checksums, out_dir))
    return '<section class="prov"><h2>Provenance and raw files</h2>' + "".join(rows) + "</section>"


def _run_card(
    host: str,
    label: str,
    m: Manifest,
    run_dir: Path | None,
    checksums: dict[str, str],
    out_dir: Path,
) -> str:
    facts, server, prompts = m.host_facts, m.server, m.prompt_set
    gpus = facts.gpus or []
    gpu_text = ", ".join(f"{g.name or '?'} {g.uuid or ''}".strip() for g in gpus)
    argv = " ".join(server.argv or []) or "-"
    fields = [
        ("host", host),
        ("run", m.run_id),
        ("status", m.status + (" (superseded)" if m.superseded else "")),
        ("GPUs", gpu_text or "-"),
        ("driver / CUDA", f"{facts.driver or '-'} / {facts.cuda or '-'}"),
        ("engine", f"{server.engine or '-'} {server.engine_version or ''}"),
        ("server argv", argv),
        ("prompt set", f"{prompts.name or '-'} (seed {prompts.seed})"),
        ("checksums", checksums.get(m.run_id) or "-"),
    ]
    table = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in fields)
    links = ""
    if run_dir is not None:
        rel = Path(os.path.relpath(run_dir, out_dir))
        names = sorted([*m.files, "manifest.json"])
        links = " ".join(f'<a href="{_e((rel / n).as_posix())}">{_e(n)}</a>' for n in names)
    return (
        f'<details class="run"><summary>{_e(label)} on {_e(host)}: {_e(m.run_id)} '
        f'({_e(m.status)})</summary><table class="facts">{table}</table>'
        f'<p class="files">{links}</p></details>'
    )


CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dee7; --win:#d8f3e3; --lose:#fbe0e0; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
       margin: 0 auto; padding: 16px 24px; max-width: 1240px; }
h1 { font-size: 22px; margin: 8px 0 16px; } h2 { font-size: 18px; margin: 24px 0 8px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
.answer ul { font-size: 16px; padding-left: 20px; } .answer li { margin: 4px 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
table.verdict th { text-align: center; font-size: 13px; } table.verdict { width: 100%; }
td.num { text-align: right; } th small { color: var(--muted); font-weight: normal; }
td.win { background: var(--win); } td.lose { background: var(--lose); }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(380px, 1fr)); gap: 12px; }
svg.plot { width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
svg .axis { stroke: #8892a3; } svg .grid { stroke: #eceff4; }
svg .tick { font-size: 11px; fill: var(--muted); }
svg .ptitle { font-size: 13px; font-weight: 600; }
svg .pt:hover { r: 6; }
ul.warn li { color: #8a5300; }
.failures pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 12px; }
details.run { border: 1px solid var(--line); border-radius: 6px; padding: 6px 10px; margin: 6px 0; }
table.facts td { word-break: break-all; } .files a { margin-right: 10px; font-size: 13px; }
@media (max-width: 700px) {
  body { padding: 10px; } .plots { grid-template-columns: 1fr; }
  table.facts th, table.facts td { display: block; border: none; padding: 2px 0; }
}
@media print {
  body { max-width: none; padding: 0; } details { break-inside: avoid; }
  details:not([open]) > *:not(summary) { display: block; }
  .plots { grid-template-columns: 1fr 1fr; } svg.plot { break-inside: avoid; }
  a { color: inherit; text-decoration: none; }
}
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
{body}
<script type="application/json" id="gpufleet-data">{data}</script>
<footer><p><small>gpufleet report: every figure comes from the archived results.jsonl of
the runs above (SGLang bench_serving's definitions); the data is embedded in this page.
</small></p></footer>
</body>
</html>
"""
