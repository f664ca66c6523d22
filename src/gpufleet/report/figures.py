"""A comparison's plots, drawn once by matplotlib: the PNG files beside the report and the
same figures inline in report.html as SVG (text kept as text, so it is readable, searchable
and measurable). One per plot of the metric catalogue (report/catalogue.py: PLOTS).

Readable on a phone: the figure is 5.6 in wide and no text is under 13 pt, so at the 368 px
a 390 px phone gives it every label is at least 11.9 px. p50 and p99 differ in line and
marker (solid circles, dashed triangles), ticks fall on round values, error bars (the 95%
intervals with repeats) stop at zero, a goodput plot states its SLO, and each profile keeps
one colour in every report (chosen from its name, not the order of the arguments).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import textwrap
from pathlib import Path
from typing import Any

from gpufleet.report import catalogue
from gpufleet.report.compare import Arm, common_levels
from gpufleet.report.stats import with_interval

# Colour-blind-safe and distinct on white (Okabe-Ito, then Tableau's remaining hues).
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#8C564B",
           "#7F7F7F", "#BCBD22", "#000000"]  # fmt: skip
MARKERS = ["o", "^", "s"]  # p50, p99 (or p10, p90)
STYLES = ["-", "--", ":"]
WIDTH_IN, HEIGHT_IN = 5.6, 4.4
TITLE_CHARS = 40  # a title line at TEXT_PT + 1 across WIDTH_IN
LEGEND_CHARS = 36  # a legend line at TEXT_PT: longer labels wrap, one column
TEXT_PT = 13  # the smallest text in a figure
SVG_ROOT = re.compile(r"<svg\b[^>]*>")


def profile_name(label: str) -> str:
    """The profile an arm's label names: `eagle3[depth=2]`, `eagle3 11-30 14:02` -> eagle3."""
    return re.split(r"[\[ ]", label, maxsplit=1)[0]


def colour_of(label: str) -> str:
    """A profile's own colour, the same in every report."""
    digest = hashlib.sha256(profile_name(label).encode()).digest()
    return PALETTE[digest[0] % len(PALETTE)]


def colours(arms: list[Arm]) -> list[str]:
    """Each arm's colour: its profile's, or the next free one when two profiles of one
    report would share it (arms of one profile, as a grid's points, keep theirs)."""
    taken: dict[str, str] = {}
    out = []
    for arm in arms:
        name = profile_name(arm.label)
        if name not in taken:
            colour = colour_of(arm.label)
            start = PALETTE.index(colour)
            for step in range(len(PALETTE)):
                candidate = PALETTE[(start + step) % len(PALETTE)]
                if candidate not in taken.values():
                    colour = candidate
                    break
            taken[name] = colour
        out.append(taken[name])
    return out


def _slo_text(arms: list[Arm], levels: list[int]) -> str:
    slos = [arm.levels[c].get("slo") for arm in arms for c in levels if arm.levels[c].get("slo")]
    if not slos:
        return ""
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}  # host/bench/slo.py's order
    parts = [f"{name} <= {slos[0][key]:g} ms" for key, name in names.items() if key in slos[0]]
    differ = any(s != slos[0] for s in slos)
    return "SLO: " + ", ".join(parts) + (" (differs between arms)" if differ else "")


def draw(host: str, arms: list[Arm], spec: catalogue.PlotSpec) -> tuple[Any, list[str]] | None:
    """(figure, hover text per point in drawing order), or None when no arm has the data."""
    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: no global figure state to import
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    levels = common_levels(arms)
    if not any(arm.levels[c].get(k) is not None for arm in arms for c in levels for k in spec.keys):
        return None
    matplotlib.rcParams.update({"svg.fonttype": "none", "font.size": TEXT_PT})
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=120)
    ax = fig.add_subplot()
    points: list[str] = []
    for arm, colour in zip(arms, colours(arms), strict=True):
        for index, key in enumerate(spec.keys):
            ys = [arm.levels[c].get(key) for c in levels]
            if all(y is None for y in ys):
                continue
            label = arm.label + (f" {catalogue.BY_KEY[key].label}" if len(spec.keys) > 1 else "")
            marker, style = MARKERS[min(index, 2)], STYLES[min(index, 2)]
            xs = [c for c, y in zip(levels, ys, strict=True) if y is not None]
            shown = [float(y) for y in ys if y is not None]
            ax.plot(xs, shown, linestyle=style, linewidth=2, color=colour, label=label,
                    marker=marker, markersize=7,
                    markerfacecolor=colour if index == 0 else "white")  # fmt: skip
            _error_bars(ax, arm, xs, key, ys=shown, colour=colour)
            for c, y in zip(xs, shown, strict=True):
                ci = arm.levels[c].ci.get(key)
                shown_ci = (max(0.0, ci[0]), ci[1]) if ci else None
                gid = f"gpufleet-pt-{len(points)}"
                ax.plot([c], [y], linestyle="none", marker=marker, markersize=12, alpha=0.0,
                        gid=gid)  # fmt: skip
                points.append(f"{label} at C={c}: {with_interval(y, shown_ci)} {spec.unit}")
    ax.set_xscale("log")
    ax.set_xticks(levels)
    ax.set_xticklabels([str(c) for c in levels])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: catalogue.tick(value)))
    ax.set_xlabel("concurrency (log scale)")
    ax.set_ylabel(spec.unit)
    title = f"{host}: {spec.title}"
    slo = _slo_text(arms, levels) if spec.name == "goodput" else ""
    wrapped = "\n".join(textwrap.wrap(title, TITLE_CHARS) + textwrap.wrap(slo, TITLE_CHARS))
    ax.set_title(wrapped, fontsize=TEXT_PT + 1).set_gid("gpufleet-title")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    labels = ["\n".join(textwrap.wrap(label, LEGEND_CHARS)) or label for label in labels]
    one_column = any(len(label) > LEGEND_CHARS // 2 for label in labels)
    legend = ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                       ncol=1 if one_column else 2, frameon=False, fontsize=TEXT_PT)  # fmt: skip
    legend.set_gid("gpufleet-legend")
    # no layout engine: every saved figure is cropped to what it draws (bbox_inches
    # "tight" in `svg` and `render`), so a long legend below the axes or a wrapped title is never
    # cut off, and matplotlib has no layout to give up on ("Tight layout not applied")
    return fig, points


def _error_bars(
    ax: Any, arm: Arm, xs: list[int], key: str, *, ys: list[float], colour: str
) -> None:
    """With repeats, each point's 95% interval, clipped at zero (no figure here is negative)."""
    intervals = [arm.levels[c].ci.get(key) for c in xs]
    if not all(intervals):
        return
    below = [y - max(0.0, ci[0]) for y, ci in zip(ys, intervals, strict=True)]
    above = [max(0.0, ci[1] - y) for y, ci in zip(ys, intervals, strict=True)]
    ax.errorbar(xs, ys, yerr=[below, above], fmt="none", capsize=4, ecolor=colour)


def svg(fig: Any, title: str, points: list[str]) -> str:
    """The figure as inline SVG: sized by the page, labelled, each point's value on hover."""
    import html

    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", pad_inches=0.1)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    for n, point in enumerate(points):
        text = text.replace(
            f'<g id="gpufleet-pt-{n}">',
            f'<g id="gpufleet-pt-{n}" class="pt"><title>{html.escape(point)}</title>',
            1,
        )
    root = SVG_ROOT.search(text)
    assert root is not None
    view = re.search(r'viewBox="([^"]+)"', root.group(0))
    tag = (
        f'<svg class="plot" role="img" aria-label="{html.escape(title)}" '
        f'viewBox="{view.group(1) if view else "0 0 403 317"}" '
        'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">'
    )
    return text[: root.start()] + tag + text[root.end() :]


def plot_specs(arms: list[Arm]) -> list[catalogue.PlotSpec]:
    return list(catalogue.PLOTS) if common_levels(arms) else []


def inline(host: str, arms: list[Arm]) -> list[str]:
    """Every plot of one host as inline SVG, for report.html."""
    return render(host, arms, None)[0]


def render(host: str, arms: list[Arm], png_dir: Path | None) -> tuple[list[str], list[Path]]:
    """Every catalogue plot of one host that has data, each figure drawn once: as inline
    SVG for report.html and, with `png_dir`, as a PNG file there, as private as its folder
    (drawing is most of a report's time: an `inv sweep` writes both)."""
    if png_dir is not None:
        png_dir.mkdir(parents=True, exist_ok=True)
    svgs, written = [], []
    for spec in plot_specs(arms):
        drawn = draw(host, arms, spec)
        if drawn is None:
            continue
        fig, points = drawn  # a pyplot-free Figure: nothing global to close
        if png_dir is not None:
            path = png_dir / f"{host}-{spec.name}.png"
            fig.savefig(path, bbox_inches="tight", pad_inches=0.1)
            os.chmod(path, stat.S_IMODE(png_dir.stat().st_mode) & 0o666)
            written.append(path)
        svgs.append(svg(fig, f"{host}: {spec.title}", points))
    return svgs, written


def write_all(
    per_host: dict[str, list[Arm]], out_dir: Path
) -> tuple[dict[str, list[str]], list[Path]]:
    """The plots of every host that has levels in common: host -> inline SVGs, and the PNG
    files written (one drawing each)."""
    svgs: dict[str, list[str]] = {}
    written: list[Path] = []
    for host, arms in per_host.items():
        svgs[host], pngs = render(host, arms, out_dir)
        written += pngs
    return svgs, written
