"""PNG plots of a comparison, one per plot of the metric catalogue (throughput, per-request
speed, TTFT, ITL, goodput, energy) vs concurrency; with repeats, each point carries its 95%
interval as an error bar, as the HTML report's do."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpufleet.report import metrics
from gpufleet.report.compare import Arm, common_levels


def write(host: str, arms: list[Arm], out_dir: Path) -> list[Path]:
    """One PNG per catalogue plot that has data (report/metrics.py: PLOTS)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    levels = common_levels(arms)
    written = []
    for spec in metrics.PLOTS:
        if not any(arm.levels[c].get(k) is not None for arm in arms for c in levels
                   for k in spec.keys):  # fmt: skip
            continue  # e.g. no GPU telemetry or no SLO in these runs
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
        for arm in arms:
            color = None
            for index, key in enumerate(spec.keys):
                ys = [arm.levels[c].get(key) for c in levels]
                if all(y is None for y in ys):
                    continue
                label = arm.label + (f" {metrics.BY_KEY[key].label}" if len(spec.keys) > 1 else "")
                line = ax.plot(levels, ys, marker="o", linewidth=2, label=label, color=color,
                               linestyle="--" if index else "-")[0]  # fmt: skip
                color = line.get_color()
                _error_bars(ax, arm, levels, key, ys, color)
                if index == 0:
                    _annotate(ax, levels, ys)
        ax.set_xscale("log")
        ax.set_xticks(levels)
        ax.set_xticklabels([str(c) for c in levels])
        ax.minorticks_off()
        ax.yaxis.set_major_formatter(lambda value, _pos: metrics.tick(value))
        ax.set_xlabel("concurrency (requests in flight, log scale)")
        ax.set_ylabel(f"{spec.title} ({spec.unit})")
        ax.set_title(f"{host}: {spec.title}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"{host}-{spec.name}.png"
        fig.savefig(path)
        plt.close(fig)
        os.chmod(path, stat.S_IMODE(out_dir.stat().st_mode) & 0o666)  # as private as its folder
        written.append(path)
    return written


def _error_bars(ax, arm: Arm, levels: list[int], key: str, ys: list, color: str) -> None:  # type: ignore[no-untyped-def]
    """With repeats, each point's 95% interval (the same ones compare and the page show)."""
    intervals = [(arm.levels[c].get("ci") or {}).get(key) for c in levels]
    if all(intervals) and all(y is not None for y in ys):
        below = [y - ci[0] for y, ci in zip(ys, intervals, strict=True)]
        above = [ci[1] - y for y, ci in zip(ys, intervals, strict=True)]
        ax.errorbar(levels, ys, yerr=[below, above], fmt="none", capsize=3, ecolor=color)


def _annotate(ax, levels: list[int], ys: list) -> None:  # type: ignore[no-untyped-def]
    for x, y in zip(levels, ys, strict=True):
        if y is not None:
            ax.annotate(metrics.tick(y), (x, y), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=8)  # fmt: skip


def write_all(per_host: dict[str, list[Arm]], out_dir: Path) -> list[Path]:
    """The plots of every host that has levels in common; the files written."""
    written: list[Path] = []
    for host, arms in per_host.items():
        if common_levels(arms):
            written += write(host, arms, out_dir)
    return written
