"""One self-contained HTML page for a sweep or a comparison: open it offline, mail it.

Everything is inline: CSS, the SVG plots (matplotlib's, the same figures as the PNGs: hover
a point for its value), the data as embedded JSON. Links to raw files are relative to the
page, so they keep working when the archive folder is copied. The page reads top to bottom:
the answer per host with the errors that put it in doubt beside it (report/answer.py, the
same object the terminal and summary.md render), failed runs, then per host the verdict
table, plots and warnings, then provenance and raw files.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.archive.kept import Manifest
from gpufleet.report import answer, catalogue, figures
from gpufleet.report.answer import Answer
from gpufleet.report.compare import Arm, common_levels
from gpufleet.terminal import shown

VERDICT_METRICS = [  # (heading, key, format, higher is better): from the catalogue
    (m.label, m.key, m.fmt, bool(m.higher_is_better))
    for m in catalogue.where(catalogue.Place.VERDICT)
]


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
    plots: dict[str, list[str]] | None = None  # host -> inline SVGs already drawn (with PNGs)
    headlines: dict[str, list[str]] = field(default_factory=dict)  # a tune's: host -> sentences


def render(data: ReportInput, out_dir: Path) -> str:
    """The whole page; `out_dir` is where it will be written (for relative links)."""
    body = [f"<h1>{_e(data.title)}</h1>"]
    answers = {host: answer.build(host, arms) for host, arms in data.per_host.items()}
    body.append(_answers(answers))
    if data.headlines:
        body.append(_headlines(data.headlines))
    if data.failures:
        body.append(_failures(data.failures))
    for host, arms in data.per_host.items():
        body.append(f'<section class="host"><h2>{_e(host)}</h2>')
        body.append(_verdict_table(arms, answers[host]))
        body.append(_open_loop_table(arms))
        drawn = data.plots.get(host) if data.plots is not None else None
        svgs = drawn if drawn is not None else figures.inline(host, arms)
        body.append('<div class="plots">' + "".join(svgs) + "</div>")
        body.append("</section>")
    body.append(_provenance(data, out_dir))
    payload = {
        host: {
            a.label: {str(c): row.to_json() for c, row in sorted(a.levels.items())} for a in arms
        }
        for host, arms in data.per_host.items()
    }
    embedded = json.dumps(_finite(payload), default=str).replace("</", "<\\/")
    return PAGE.format(
        title=_e(data.title),
        css=CSS,
        body="\n".join(body),
        data=embedded,
        show_hints=SHOW_HINTS,
        script_hash=SCRIPT_HASH,
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
    return html.escape(shown(str(value)), quote=True)  # control characters written out


def _words(text: str) -> str:
    """A header's words, each kept whole: it wraps between words only, never inside one
    (`basel`/`ine`) or a number (`06:1`/`4`, or `12-`/`03` at a hyphen)."""
    return " ".join(f'<span class="w">{_e(word)}</span>' for word in str(text).split())


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(float(value))
    except (TypeError, ValueError):
        return _e(value)


def _answers(answers: dict[str, Answer]) -> str:
    """The answer per host, and beside it each error that puts it in doubt."""
    items = []
    for host, said in answers.items():
        errors = "".join(f"<li>{_e(n.text)}</li>" for n in said.errors)
        box = f'<ul class="errors" aria-label="errors">{errors}</ul>' if errors else ""
        warned = "".join(f"<li>{_e(n.text)}</li>" for n in said.warnings)
        box += f'<ul class="warn" aria-label="warnings">{warned}</ul>' if warned else ""
        if len(said.labels) > 1 and said.levels:
            told = "</p><p>".join(_e(text) for text in said.sentences)
            items.append(f"<li><b>{_e(host)}</b>: <p>{told}</p>{box}</li>")
        else:
            labels = ", ".join(said.labels)
            items.append(f"<li><b>{_e(host)}</b>: {_e(labels)} (nothing to compare with){box}</li>")
    return f'<section class="answer"><h2>The answer</h2><ul>{"".join(items)}</ul></section>'


def _headlines(headlines: dict[str, list[str]]) -> str:
    """A tune's headline per load shape (issue 83.1), the record's sentences word for word."""
    items = "".join(f"<li><b>{_e(host)}</b>: {_e(text)}</li>"
                    for host, said in headlines.items() for text in said)  # fmt: skip
    return f'<section class="headline"><h2>The tune\'s headline</h2><ul>{items}</ul></section>'


def _verdict_table(arms: list[Arm], said: Answer) -> str:
    """Each figure per arm, then B/A with its interval and `n.s.` as the terminal prints it;
    coloured only where the difference is significant (repeats gave an interval that
    excludes 1.0)."""
    ref = arms[0]
    ratios = {(r.level, r.key, r.arm): r for r in said.ratios}
    span = 2 * len(arms) - 1
    top = ['<th rowspan="2">C</th>']
    sub = []
    for name, _, _, _ in VERDICT_METRICS:
        top.append(f'<th colspan="{span}">{_words(name)}</th>')
        sub += [f"<th>{_words(a.label)}</th>" for a in arms]
        sub += [
            f'<th title="{_e(a.label)} / {_e(ref.label)}">{_words(f"{a.label} / {ref.label}")}</th>'
            for a in arms[1:]
        ]
    rows = []
    for c in common_levels(arms):
        cells = [f"<td>{c}</td>"]
        for _, key, fmt, _ in VERDICT_METRICS:
            values = [arm.levels[c].get(key) for arm in arms]
            cells += [f'<td class="num">{_fmt(v, fmt)}</td>' for v in values]
            for arm in arms[1:]:
                ratio = ratios.get((c, key, arm.label))
                if ratio is None:
                    cells.append('<td class="num">-</td>')
                    continue
                css = "" if not ratio.significant else "win" if ratio.better else "lose"
                cells.append(f'<td class="num ratio {css}">{_e(ratio.text)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    columns = 1 + len(VERDICT_METRICS) * span
    return (
        _scroll_hint(columns)
        + '<div class="scroll"><table class="verdict"><thead><tr>'
        + "".join(top)
        + "</tr><tr>"
        + "".join(sub)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


# an open-loop level's rates and queue, then the figures measured after that queue (their
# own heading says so: the TTFT), as the catalogue names, heads and formats them
OPEN_LOOP = [
    m.key
    for m in sorted(
        catalogue.where(catalogue.Place.OPEN_LOOP), key=lambda m: bool(m.open_loop_label)
    )
]


def _scroll_hint(columns: int) -> str:
    """The hint above a table that may not fit: hidden until SHOW_HINTS finds its table
    wider than its box (at this width), so it is said only where the table scrolls."""
    return (
        f'<p class="hint" hidden>{columns} columns: scroll the table sideways to see them '
        "all &rarr;</p>"
    )


# shows each table's hint exactly while the table overflows its box, at load and on every
# resize; the page's policy runs this script alone (its hash), nothing else
SHOW_HINTS = (
    "function hints(){for(const s of document.querySelectorAll('div.scroll')){"
    "const h=s.previousElementSibling;if(h&&h.classList.contains('hint'))"
    "h.hidden=s.scrollWidth<=s.clientWidth+1;}}"
    "addEventListener('load',hints);addEventListener('resize',hints);"
)
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SHOW_HINTS.encode()).digest()).decode()


def _open_loop_heading(key: str) -> str:
    metric = catalogue.BY_KEY[key]
    return metric.open_loop_label or metric.label


def _open_loop_table(arms: list[Arm]) -> str:
    """Levels with a request rate: offered against achieved, the queue before each send, and
    whether the level was overloaded (its TTFT then follows a queue the user also waited)."""
    rows = []
    for c in common_levels(arms):
        for arm in arms:
            row = arm.levels[c]
            if row.get(catalogue.OFFERED_RATE) is None:
                continue
            cells = [f"<td>{c}</td>", f"<td>{_e(arm.label)}</td>"]
            cells += [
                f'<td class="num">{_fmt(row.get(k), catalogue.BY_KEY[k].fmt)}</td>'
                for k in OPEN_LOOP
            ]
            state = (
                "overloaded" if row.get("overloaded")
                else "not judged" if row.get("overload_unjudged")
                else "kept up"
            )  # fmt: skip
            cells.append(f'<td class="{"lose" if row.get("overloaded") else ""}">{state}</td>')
            rows.append("<tr>" + "".join(cells) + "</tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{_words(h)}</th>" for h in ["C", "arm",
                   *map(_open_loop_heading, OPEN_LOOP), "load"])  # fmt: skip
    return (
        "<h3>Open loop: offered, sent and completed</h3>"
        + _scroll_hint(len(OPEN_LOOP) + 3)
        + '<div class="scroll"><table class="open">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


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
                rows.append(
                    _run_card(
                        host, arm.label, m, run_dir, checksums=data.checksums, out_dir=out_dir
                    )
                )
    return '<section class="prov"><h2>Provenance and raw files</h2>' + "".join(rows) + "</section>"


def _run_card(
    host: str,
    label: str,
    m: Manifest,
    run_dir: Path | None,
    *,
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
       margin: 0 auto; padding: 16px 24px; max-width: 1240px; overflow-wrap: anywhere; }
h1 { font-size: 22px; margin: 8px 0 16px; } h2 { font-size: 18px; margin: 24px 0 8px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
.answer ul { font-size: 16px; padding-left: 20px; } .answer li { margin: 4px 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
table.verdict th { text-align: center; font-size: 12px; } table.verdict { width: 100%; }
td.num { text-align: right; } th small { color: var(--muted); font-weight: normal; }
/* a number or a word never breaks, headers included (`basel`/`ine`, `06:1`/`4`): the table
   scrolls instead; a header wraps between its words only */
table.verdict :is(th, td), table.open :is(th, td) { overflow-wrap: normal; padding: 4px; }
table.verdict td { font-size: 14px; }
table.verdict td, table.open td, th span.w { white-space: nowrap; }
td.win { background: var(--win); } td.lose { background: var(--lose); }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 12px; }
svg.plot { width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
svg .pt:hover path { stroke-opacity: 0.3; fill-opacity: 0.3; }
ul.warn li { color: #8a5300; }
ul.errors { margin: 6px 0; padding: 8px 8px 8px 28px; background: #fdecec; border-left: 4px
            solid #c62828; font-size: 15px; } ul.errors li { color: #8e1b1b; }
p.hint { color: var(--muted); font-size: 13px; margin: 4px 0; }

.failures pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 12px; }
details.run { border: 1px solid var(--line); border-radius: 6px; padding: 6px 10px; margin: 6px 0; }
table.facts td { word-break: break-all; } .files a { margin-right: 10px; font-size: 13px; }
@media (max-width: 700px) {
  body { padding: 10px; } .plots { grid-template-columns: 1fr; } .plots { gap: 8px; }
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
 content="default-src 'none'; style-src 'unsafe-inline'; img-src data:;
 script-src 'sha256-{script_hash}'">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
{body}
<script type="application/json" id="gpufleet-data">{data}</script>
<script>{show_hints}</script>
<footer><p><small>gpufleet report: every figure comes from the archived results.jsonl of
the runs above (SGLang bench_serving's definitions); the data is embedded in this page.
</small></p></footer>
</body>
</html>
"""
