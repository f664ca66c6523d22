"""PNG plots of a comparison: total throughput, per-request speed, TTFT, energy and goodput
vs concurrency; with repeats, each point carries its 95% interval as an error bar."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpufleet.report.compare import Arm, common_levels

PLOTS = [
    ("throughput", "output_throughput", "total output throughput (tok/s)"),
    ("per_request", "median_per_request_output_tps", "per-request output speed, median (tok/s)"),
    ("ttft", "median_ttft_ms", "time to first token, median (ms)"),
    ("tokens_per_joule", "output_tokens_per_joule", "output tokens per joule (GPU energy)"),
    ("goodput", "goodput_output_throughput", "goodput: output tok/s of requests within the SLO"),
]


def write(host: str, arms: list[Arm], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    levels = common_levels(arms)
    written = []
    for name, key, ylabel in PLOTS:
        if not any(arm.levels[c].get(key) is not None for arm in arms for c in levels):
            continue  # e.g. no GPU telemetry in these runs
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
        for arm in arms:
            ys = [arm.levels[c].get(key) for c in levels]
            line = ax.plot(levels, ys, marker="o", linewidth=2, label=arm.label)[0]
            intervals = [(arm.levels[c].get("ci") or {}).get(key) for c in levels]
            if all(intervals) and all(y is not None for y in ys):
                below = [y - ci[0] for y, ci in zip(ys, intervals, strict=True)]
                above = [ci[1] - y for y, ci in zip(ys, intervals, strict=True)]
                ax.errorbar(levels, ys, yerr=[below, above], fmt="none", capsize=3,
                            ecolor=line.get_color())  # fmt: skip
            for x, y in zip(levels, ys, strict=True):
                if y is not None:
                    ax.annotate(
                        f"{y:.0f}",
                        (x, y),
                        textcoords="offset points",
                        xytext=(0, 6),
                        ha="center",
                        fontsize=8,
                    )
        ax.set_xscale("log")
        ax.set_xticks(levels)
        ax.set_xticklabels([str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrency (requests in flight, log scale)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{host}: {ylabel.split(' (')[0]}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"{host}-{name}.png"
        fig.savefig(path)
        plt.close(fig)
        os.chmod(path, stat.S_IMODE(out_dir.stat().st_mode) & 0o666)  # as private as its folder
        written.append(path)
    return written


def write_all(per_host: dict[str, list[Arm]], out_dir: Path) -> list[Path]:
    """The plots of every host that has levels in common; the files written."""
    written: list[Path] = []
    for host, arms in per_host.items():
        if common_levels(arms):
            written += write(host, arms, out_dir)
    return written
