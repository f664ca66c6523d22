"""One level of a tune, measured and judged: each depth's cell over its hosts and repeats
(median, spread, noise, score), the depth chosen there, and the tie where the shallowest
depth within the noise is not the best scoring one. control/tune/table.py turns the levels
into SGLang's table; control/tune/fixed.py into one depth."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TypeAlias, TypedDict

from gpufleet.records import ResultRow

ArmKey: TypeAlias = int | str  # a tune's arm: a depth, or PLAIN / SKIP (control/tune/depth_cells)


class Cell(TypedDict, total=False):
    """One depth at one concurrency, over its hosts and repeats (see
    control/tune/measurement.Measurement.cells)."""

    output_throughput: float  # median of the objective: steady-window output tok/s
    basis: str  # "steady window", or "whole level" where a run had no steady window
    per_request: float  # median of the per-request output speeds' medians
    mad: float  # median absolute deviation of output_throughput
    noise: float  # relative: the repeats' MAD / median, at least the within-run error
    score: float  # median - MAD: a noisy cell pays for its noise
    runs: int
    rejected: str  # why the cell may not be chosen (absent: it may)


Cells: TypeAlias = dict[ArmKey, dict[int, Cell]]  # arm -> level -> its figures

SPREAD_BOUND = 0.10  # a cell whose repeats spread more than this (MAD / median) is rejected


def mad(values: list[float]) -> float:
    """The median absolute deviation: a cell's spread over its repeats."""
    middle = statistics.median(values)
    return statistics.median(abs(v - middle) for v in values)


def objective(row: ResultRow) -> tuple[float, str]:
    """What the tune maximises at a level, and its basis: the steady window's output
    throughput, else the whole level's (no steady window: too few requests at full load)."""
    if row.steady_output_throughput:
        return float(row.steady_output_throughput), "steady window"
    return float(row.output_throughput or 0.0), "whole level"


def run_noise(row: ResultRow) -> float:
    """One run's relative standard error on its level figure: the spread of its requests'
    speeds (median - p10 is 1.28 sigma) over the root of their number. A closed-loop
    level's throughput is its slots times the mean request speed, so it carries that error."""
    median, p10 = row.median_per_request_output_tps, row.p10_per_request_output_tps
    if not (median and p10 is not None and row.completed):
        return 0.0
    return max(0.0, median - p10) / 1.2816 / median / math.sqrt(row.completed)


@dataclass
class Tie:
    """Two depths one level could not tell apart: the best scoring (`deep`) and the
    shallowest within its noise (`shallow`, the tie's default), in the figures that decided."""

    concurrency: int
    deep: int
    shallow: int
    gap: float  # how far the shallower scored behind, relative to the deeper's score
    noise: float  # the deeper cell's measured noise: the bound the gap is within
    deep_score: float
    shallow_score: float
    by_physics: bool = False  # settled by a higher level's significant measurement


def near_best(
    figures: dict[int, Cell], min_request_speed: float | None
) -> tuple[int, float, list[int]] | None:
    """The best-scoring usable depth at or above the floor, its noise, and every depth
    within that noise of it (None: no depth reaches the floor)."""
    rejected = {d for d, f in figures.items() if f.get("rejected")}
    usable = {d: f for d, f in figures.items() if d not in rejected} or figures
    allowed = [
        d for d, f in usable.items()
        if min_request_speed is None or f["per_request"] >= min_request_speed
    ]  # fmt: skip
    if not allowed:
        return None
    top_depth = max(allowed, key=lambda d: figures[d]["score"])
    top, noise = figures[top_depth]["score"], figures[top_depth]["noise"]
    return top_depth, noise, [d for d in allowed if figures[d]["score"] >= top * (1 - noise)]


def choose_level(
    figures: dict[int, Cell], min_request_speed: float | None
) -> tuple[int, str, dict[int, str]]:
    """One load level's depth, why, and the depths rejected as noisy or failed: the highest
    scoring (median minus spread) depth at or above the speed floor, or the shallowest
    within the noise of it."""
    rejected = {d: f["rejected"] for d, f in figures.items() if f.get("rejected")}
    found = near_best(figures, min_request_speed)
    if found is None:
        best = max(figures, key=lambda d: figures[d]["per_request"])
        return (
            best,
            f"no depth reaches {min_request_speed:g} tok/s per request: the fastest",
            (rejected),
        )
    top_depth, noise, near = found
    basis = figures[top_depth]["basis"]
    why = f"highest {basis} output throughput"
    if len(near) > 1:
        why = (f"shallowest depth within {noise:.1%} (the best cell's measured noise) of the "
               f"highest {basis} output throughput")  # fmt: skip
    if min_request_speed is not None:
        why += f" among depths at or above {min_request_speed:g} tok/s per request"
    return min(near), why, rejected  # within the margin of the best, the least drafting


def level_tie(c: int, figures: dict[int, Cell], min_request_speed: float | None) -> Tie | None:
    """The tie at one level, where the shallowest depth within the noise is not the best
    scoring one (what a retest can settle); None where the best is also the shallowest."""
    found = near_best(figures, min_request_speed)
    if found is None or min(found[2]) == found[0]:
        return None
    deep, noise, near = found
    shallow = min(near)
    gap = 1 - figures[shallow]["score"] / figures[deep]["score"] if figures[deep]["score"] else 0.0
    return Tie(c, deep, shallow, gap, noise, figures[deep]["score"], figures[shallow]["score"])
