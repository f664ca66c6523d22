"""The fleet view written down: the table (terminal, summary.md), one plot of per-host
ratios per level with the named hosts marked (PNG and inline SVG), and a small page.

The plot follows report/figures.py's rules for a phone (5.6 in wide, no text under 13 pt,
so at 390 px every label is at least 11.9 px): one column per level, every host a dot at
its ratio to the fleet's median with its 95% interval, the material band (1 +- threshold)
shaded, the named hosts in a second colour and marker, labelled by name.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from gpufleet.archive import store
from gpufleet.fleet.outliers import FleetView
from gpufleet.fleet.wording import difference_lines, fact_text, named_sentence
from gpufleet.report.figures import PALETTE, TEXT_PT, WIDTH_IN, svg
from gpufleet.report.markdown import md_table
from gpufleet.report.stats import with_interval

NAMED_MARK = "!"  # after a named host's ratio in the table
SUSPECT_MARK = "?"  # after a suspect's: off the fleet in this round only
UNJUDGED_MARK = "~"  # after a level the client marked late or bound: not judged


def ratio_cell(figure: object) -> str:
    from gpufleet.fleet.outliers import HostFigure

    assert isinstance(figure, HostFigure)
    text = with_interval(figure.ratio, figure.interval, places=3)
    if figure.named:
        return f"{text} {NAMED_MARK}"
    if figure.off:
        return f"{text} {SUSPECT_MARK}"
    return f"{text} {UNJUDGED_MARK}" if figure.unjudged else text


def table(view: FleetView) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: the fleet's median per level, then each host's ratio to it."""
    unit = view.metric.unit
    headers = ["host"] + [f"C={lv.concurrency}" for lv in view.levels]
    rows = [[f"median {unit}"] + [view.metric.fmt.format(lv.median) for lv in view.levels]]
    for host in sorted(view.runs):
        cells = []
        for lv in view.levels:
            mine = [h for h in lv.hosts if h.host == host]
            cells.append(ratio_cell(mine[0]) if mine else "-")
        rows.append([host, *cells])
    return headers, rows


def sentences(view: FleetView) -> list[str]:
    """What the view says: each named host with why, or that none is off; each suspect;
    every host whose fingerprint differs from the majority's; the levels not judged."""
    said = [named_sentence(view, n) for n in view.named]
    if not view.named:
        which = "named off" if view.suspect else "off"
        said.append(
            f"no host of {len(view.runs)} is {which} the fleet's median "
            f"{view.metric.label} by {view.threshold:.0%} or more, significantly, at any level"
        )
    said += [named_sentence(view, n) for n in view.suspect]
    said += [f"differs: {d}" for d in difference_lines(view)]
    return said + view.unjudged


def as_json(views: list[FleetView]) -> str:
    """The views as JSON text for a script (`--format json`)."""
    return json.dumps(
        [
            {
                "profile": view.profile,
                "metric": view.metric.key,
                "threshold": view.threshold,
                "levels": [
                    {
                        "concurrency": lv.concurrency,
                        "median": lv.median,
                        "spread": lv.spread,
                        "hosts": [
                            {
                                "host": h.host,
                                "value": h.estimate.value,
                                "ratio": h.ratio,
                                "interval": interval_json(h.interval),
                                "source": h.estimate.source,
                                "named": h.named,
                                "suspect": h.off and not h.named,
                                "side": h.side or None,
                                "judged": h.unjudged is None,
                                "not_judged": h.unjudged,
                            }
                            for h in lv.hosts
                        ],
                    }
                    for lv in view.levels
                ],
                "named": [
                    {
                        "host": n.host,
                        "levels": n.levels,
                        "differences": [
                            {"field": f, "host": fact_text(a), "fleet": fact_text(b)}
                            for f, a, b in n.differences
                        ],
                    }
                    for n in view.named
                ],
                "suspect": [{"host": n.host, "levels": n.levels} for n in view.suspect],
                "differences": difference_lines(view),
                "runs": {h: [r.run_id for r in rs] for h, rs in sorted(view.runs.items())},
                "left_out": view.left_out,
                "notes": view.notes,
            }
            for view in views
        ],
        indent=1,
    )


def interval_json(value: tuple[float, float] | None) -> list[float] | None:
    """An interval as the JSON outputs give it: [low, high], or null."""
    return list(value) if value else None


def markdown(view: FleetView) -> str:
    headers, rows = table(view)
    lines = [
        f"# Fleet: {view.profile}",
        "",
        f"{view.metric.label}: each host's ratio to the fleet's median, 95% interval; "
        f"`{NAMED_MARK}` marks a host named off the fleet, `{SUSPECT_MARK}` a suspect (this "
        f"round only), `{UNJUDGED_MARK}` a level the client marked late or bound (not judged).",
        "",
    ]
    lines += md_table(headers, rows)
    lines += ["", *[f"- {s}" for s in sentences(view)]]
    lines += [f"- left out: {why}" for why in view.left_out]
    lines += [f"- {note}" for note in view.notes]
    return "\n".join(lines) + "\n"


def draw(view: FleetView):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, 4.4))
    ax = fig.subplots()
    points: list[str] = []
    labels = []
    xs = list(range(len(view.levels)))
    ax.axhspan(1 - view.threshold, 1 + view.threshold, color="#DDDDDD", zorder=0)
    ax.axhline(1.0, color="#555555", linewidth=1)
    for x, level in zip(xs, view.levels, strict=True):
        for n, h in enumerate(sorted(level.hosts, key=lambda f: f.ratio)):
            colour, marker = (PALETTE[1], "^") if h.named else (PALETTE[0], "o")
            jitter = (n - (len(level.hosts) - 1) / 2) * min(0.5 / max(1, len(level.hosts)), 0.06)
            group = ax.errorbar(
                [x + jitter],
                [h.ratio],
                yerr=None
                if not h.interval
                else [[h.ratio - h.interval[0]], [h.interval[1] - h.ratio]],
                fmt=marker,
                color=colour,
                markersize=7 if h.named else 5,
                capsize=3,
            )
            group.lines[0].set_gid(f"gpufleet-pt-{len(points)}")
            points.append(f"{h.host} at C={level.concurrency}: {ratio_cell(h)}")
            if h.named:
                labels.append(
                    ax.annotate(
                        h.host,
                        (x + jitter, h.ratio),
                        textcoords="offset points",
                        xytext=(6, -4),
                        fontsize=TEXT_PT,
                        color=colour,
                    )
                )
    ax.set_xticks(xs, [f"C={lv.concurrency}" for lv in view.levels], fontsize=TEXT_PT)
    ax.tick_params(axis="y", labelsize=TEXT_PT)
    ax.set_xlim(-0.6, len(xs) - 0.4)
    ax.set_ylabel("ratio to fleet median", fontsize=TEXT_PT)
    ax.set_title(f"{view.profile}: {view.metric.label}", fontsize=TEXT_PT + 1)
    apart(fig, labels)
    return fig, points


def apart(fig, labels: list) -> None:
    """Move the named hosts' labels apart until no two overlap: two hosts at similar
    ratios drew their names on top of each other. Each overlap moves the lower label
    down by the overlap (its offset in points), a bounded number of times."""
    from itertools import combinations

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    for _ in range(20 * len(labels)):
        boxes = [label.get_window_extent(renderer) for label in labels]
        clash = next(((i, j) for i, j in combinations(range(len(labels)), 2)
                      if boxes[i].overlaps(boxes[j])), None)  # fmt: skip
        if clash is None:
            return
        i, j = clash
        lower = j if (boxes[j].y0, j) <= (boxes[i].y0, i) else i
        dy = min(boxes[i].y1, boxes[j].y1) - max(boxes[i].y0, boxes[j].y0) + 1.0
        x, y = labels[lower].xyann
        labels[lower].xyann = (x, y - dy * 72.0 / fig.dpi)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1rem; max-width: 60rem; }}
.scroll {{ overflow-x: auto; }}
table {{ border-collapse: collapse; }}
th, td {{ padding: 0.2rem 0.5rem; border-bottom: 1px solid #ddd; white-space: nowrap;
  text-align: right; font-variant-numeric: tabular-nums; }}
th:first-child, td:first-child {{ text-align: left; }}
td.named {{ color: {named}; font-weight: bold; }}
svg.plot {{ width: 100%; height: auto; max-width: 40rem; }}
</style></head><body>
<h1>{title}</h1>
{sentences}
<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>
{plot}
{notes}
<script type="application/json" id="gpufleet-data">{data}</script>
</body></html>
"""


def page(view: FleetView, plot_svg: str | None) -> str:
    headers, rows = table(view)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="named">{html.escape(c)}</td>'
            if c.endswith(NAMED_MARK)
            else f"<td>{html.escape(c)}</td>"
            for c in row
        )
        + "</tr>"
        for row in rows
    )
    return PAGE.format(
        title=html.escape(f"Fleet: {view.profile}"),
        named=PALETTE[1],
        sentences="".join(f"<p>{html.escape(s)}</p>" for s in sentences(view)),
        head=head,
        body=body,
        plot=plot_svg or "",
        notes="".join(f"<p>{html.escape(n)}</p>" for n in [*view.left_out, *view.notes]),
        data=as_json([view]).replace("</", "<\\/"),
    )


def write(view: FleetView, out_dir: Path, plots: bool = True) -> list[Path]:
    """summary.md, and with `plots` ratios.png and report.html, under `out_dir` (each
    written atomically). `inv fleet` writes the summary (drawing is most of a second);
    `inv report --fleet` all three."""
    store.make_dirs(out_dir)
    written = [out_dir / "summary.md"]
    store.write_private_file(written[0], markdown(view).encode())
    if not plots:
        return written
    plot_svg = None
    if view.levels:
        import io

        fig, points = draw(view)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight", pad_inches=0.1)
        store.write_private_file(out_dir / "ratios.png", buffer.getvalue())
        written.append(out_dir / "ratios.png")
        plot_svg = svg(fig, f"{view.profile}: ratio to the fleet median", points)
    store.write_private_file(out_dir / "report.html", page(view, plot_svg).encode())
    written.append(out_dir / "report.html")
    return written
