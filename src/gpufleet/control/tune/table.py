"""inv tune: measure static draft depths across a concurrency ladder, turn the measurements
into SGLang's `--speculative-adaptive-config` table, and write a profile that uses it.

The seeds wanted one EAGLE-3 server that drafts at low load and stops under load. SGLang
0.5.x applies a depth per decode-batch range itself (sim/speculation.py describes the
table); this module chooses the table from the user's own measurements:

1. cells: depth 0 as SGLang runs it (the speculative server pinned to a one-slot table
   `[0]`: it still pays the draft model's extend pass every step), the same with
   SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 (a candidate for depth 0, measured), a plain
   server (no speculative flags: the gap depth 0 leaves, reported) and each depth d in
   `--depths` (topk 1, d + 1 draft tokens, adaptive off), one launch each, every level of
   the ladder on that server (control/sweep/run.py runs them, resumably);
2. per level, the depth with the highest steady-window output throughput (the level at
   full load, ramp-up and drain left out: with short outputs they flatten whole-level
   figures and hide 3-7% gains; the whole level where no steady window was found), among
   those that keep the per-request speed floor (`--min-request-speed`), else the fastest
   per request. At one closed-loop level every request shares the batch, so this is also
   the per-request speed the verification judges. A tie within the best cell's measured
   noise goes to the shallowest depth: its repeats' spread (MAD / median), or with one run
   the standard error of its per-request speeds (module `_noise`), never a fixed margin;
3. the table: a key where each run of equal choices begins, one candidate each (a single
   candidate is a fixed depth; SGLang's EMA only moves between several). A range begins
   halfway (geometric mean) between the last level of the run below and the first of its
   own, not at that level: a closed-loop level at C spends part of its time at batches
   just below C (a request finishes before its successor arrives), and a boundary at C
   itself sends those steps to the other depth and back (measured: a key at 8 kept 96% of
   a plain server's throughput at C=8, a key at 6 kept 99%; the switches halved). Within
   the noise the shallowest depth wins (less GPU work per token, and noise does not buy a
   deeper draft), so more load gets a deeper draft than less load only where it measured
   better by more than its noise, and the notes say so.

Batch size vs concurrency: with closed-loop load at C, the decode batch is about C (the
server caps it at max-running-requests), so the ladder's levels are the table's keys.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, TypedDict

from gpufleet.archive import store
from gpufleet.archive.layout import Archive
from gpufleet.archive.records import SweepRecord
from gpufleet.control.server.profiles import load_profile
from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.control.tune.cells import PLAIN, SKIP, arm_depth
from gpufleet.engine_facts import (
    CAPPED_ALGORITHMS,
    SPEC_DEFAULT_MAX_RUNNING,
    capture_sizes,
    first_batch,
    padded,
)
from gpufleet.errors import UserError
from gpufleet.kinds import CellStatus
from gpufleet.records import ResultRow


@dataclass
class Choice:
    """The depth chosen at one level, and why."""

    concurrency: int
    depth: int
    why: str


class AdaptiveSlot(TypedDict):
    """One key of SGLang's adaptive speculative config (the batch size its range starts at):
    the depths the server may pick from there. `inv tune` writes one per key."""

    candidate_steps: list[int]


class Cell(TypedDict, total=False):
    """One depth at one concurrency, over its hosts and repeats (see measured_cells)."""

    output_throughput: float  # median of the objective: steady-window output tok/s
    basis: str  # "steady window", or "whole level" where a run had no steady window
    per_request: float  # median of the per-request output speeds' medians
    mad: float  # median absolute deviation of output_throughput
    noise: float  # relative: the repeats' MAD / median, at least the within-run error
    score: float  # median - MAD: a noisy cell pays for its noise
    runs: int
    rejected: str  # why the cell may not be chosen (absent: it may)


@dataclass
class TuneResult:
    """The chosen table (or one depth), the choices and reasoning behind it, and what was
    measured."""

    table: dict[str, AdaptiveSlot]  # SGLang's adaptive config
    choices: list[Choice]
    ranges: list[str]  # one line of reasoning per key
    notes: list[str] = field(default_factory=list)
    measured: dict[Any, dict[int, dict[str, float]]] = field(default_factory=dict)
    skip_extend: bool = False  # the tuned server sets SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND
    fixed_depth: int | None = None  # an engine with one depth for every load: it (no table)


SPREAD_BOUND = 0.10  # a cell whose repeats spread more than this (MAD / median) is rejected


def _mad(values: list[float]) -> float:
    middle = statistics.median(values)
    return statistics.median(abs(v - middle) for v in values)


def objective(row: ResultRow) -> tuple[float, str]:
    """What the tune maximises at a level, and its basis: the steady window's output
    throughput, else the whole level's (no steady window: too few requests at full load)."""
    if row.steady_output_throughput:
        return float(row.steady_output_throughput), "steady window"
    return float(row.output_throughput or 0.0), "whole level"


def _noise(row: ResultRow) -> float:
    """One run's relative standard error on its level figure: the spread of its requests'
    speeds (median - p10 is 1.28 sigma) over the root of their number. A closed-loop
    level's throughput is its slots times the mean request speed, so it carries that error."""
    median, p10 = row.median_per_request_output_tps, row.p10_per_request_output_tps
    if not (median and p10 is not None and row.completed):
        return 0.0
    return max(0.0, median - p10) / 1.2816 / median / math.sqrt(row.completed)


def measured_cells(per_depth: dict[Any, dict[int, list[ResultRow]]]) -> dict:
    """depth -> C -> the cell's figures over its hosts and repeats: medians of the
    objective, the spread (median absolute deviation), the relative noise (the larger of
    the spread and the runs' own standard error), `score` = median - MAD (a noisy cell
    pays for its noise), and `rejected` (why, or absent): failed requests, or a spread
    above SPREAD_BOUND."""
    out: dict[Any, dict[int, Cell]] = {}
    for depth, levels in per_depth.items():
        for c, rows in levels.items():
            judged = [objective(r) for r in rows]
            tput = [figure for figure, _ in judged]
            middle, mad = statistics.median(tput), _mad(tput)
            within = statistics.median(_noise(r) for r in rows) / math.sqrt(len(rows))
            cell: Cell = {
                "output_throughput": middle,
                "basis": "steady window"
                if all(b == "steady window" for _, b in judged)
                else "whole level",
                "per_request": statistics.median(
                    r.median_per_request_output_tps or 0.0 for r in rows
                ),
                "mad": mad,
                "noise": max(mad / middle if middle else 0.0, within),
                "score": middle - mad,
                "runs": len(rows),
            }
            failed = sum(r.failed for r in rows)
            if failed:
                cell["rejected"] = f"{failed} failed request(s)"
            elif middle and mad / middle > SPREAD_BOUND:
                cell["rejected"] = f"spread {mad / middle:.0%} (bound {SPREAD_BOUND:.0%})"
            out.setdefault(depth, {})[c] = cell
    return out


def choose(
    per_depth: dict[Any, dict[int, list[ResultRow]]],
    min_request_speed: float | None = None,
    sizes: list[int] | None = None,
) -> TuneResult:
    """The table from measurements: depth -> concurrency -> result rows (any hosts).

    Depth 0 is the speculative server pinned at 0; where `skip` (the same with SGLang's
    skip variable) was measured, depth 0 counts at the better of the two, and the tuned
    server sets the variable when the skip won a depth-0 range. `plain` (no speculation) is
    not a choice: the notes give the gap depth 0 leaves to it.

    `sizes` are the server's CUDA-graph capture sizes: SGLang pads a decode batch to the
    next captured size before it picks a key, so keys are padded sizes and each range says
    the batches it really covers (a key of 16 applies from batch 15)."""
    extra = measured_cells({k: v for k, v in per_depth.items() if k in (PLAIN, SKIP)})
    raw = measured_cells({k: v for k, v in per_depth.items() if k not in (PLAIN, SKIP)})
    measured = {d: dict(levels) for d, levels in raw.items()}  # depth 0 at its better variant
    skipped = _skip_wins(measured, extra.get(SKIP))
    ladder = sorted(set.intersection(*(set(levels) for levels in measured.values())))
    if not ladder:
        raise UserError("inv tune: the depths share no measured concurrency level")
    choices: list[Choice] = []
    notes: list[str] = []
    for c in ladder:
        figures = {d: measured[d][c] for d in sorted(measured)}
        best, why, rejected = choose_level(figures, min_request_speed)
        previous = choices[-1].depth if choices else None
        if previous is not None and best > previous:  # deeper under more load: say why
            gain = figures[best]["output_throughput"] / figures[previous]["output_throughput"] - 1
            notes.append(
                f"C={c}: depth {best} drafts deeper than at lower load (depth {previous}) "
                f"because it measured {gain:+.1%} more throughput there (more than its "
                f"measured noise, {figures[best]['noise']:.1%})"
            )
        chose = f"chose {figures[best]['output_throughput']:.0f}"
        choices.append(Choice(c, best, f"{why} ({_detail(figures, rejected)}; {chose})"))
        notes += _noise_note(c, best, figures, rejected)
    notes += _zero_step_notes(choices, measured, extra, skipped)
    table, ranges = _table_and_ranges(choices, sizes)
    skip_used = any(ch.depth == 0 and ch.concurrency in skipped for ch in choices)
    return TuneResult(table, choices, ranges, notes, {**raw, **extra}, skip_used)


def choose_level(
    figures: dict[int, Cell], min_request_speed: float | None
) -> tuple[int, str, dict[int, str]]:
    """One load level's depth, why, and the depths rejected as noisy or failed: the highest
    scoring (median minus spread) depth at or above the speed floor, or the shallowest
    within the noise of it."""
    rejected = {d: f["rejected"] for d, f in figures.items() if f.get("rejected")}
    usable = {d: f for d, f in figures.items() if d not in rejected} or figures
    allowed = [
        d for d, f in usable.items()
        if min_request_speed is None or f["per_request"] >= min_request_speed
    ]  # fmt: skip
    if not allowed:
        best = max(figures, key=lambda d: figures[d]["per_request"])
        return (
            best,
            f"no depth reaches {min_request_speed:g} tok/s per request: the fastest",
            (rejected),
        )
    top_depth = max(allowed, key=lambda d: figures[d]["score"])
    top = figures[top_depth]["score"]
    # a tie within the best cell's own measured noise goes to the shallower depth
    noise = figures[top_depth]["noise"]
    near = [d for d in allowed if figures[d]["score"] >= top * (1 - noise)]
    basis = figures[top_depth]["basis"]
    why = f"highest {basis} output throughput"
    if len(near) > 1:
        why = (f"shallowest depth within {noise:.1%} (the best cell's measured noise) of the "
               f"highest {basis} output throughput")  # fmt: skip
    if min_request_speed is not None:
        why += f" among depths at or above {min_request_speed:g} tok/s per request"
    return min(near), why, rejected  # within the margin of the best, the least drafting


NOISE_NOTE_BOUND = 0.02  # a within-noise choice that may cost more than this is said


def _noise_note(c: int, best: int, figures: dict[int, Cell], rejected: dict[int, str]) -> list[str]:
    """Where the shallower depth won a tie that measured more than 2% behind the best: the
    level's cells were too short to tell them apart, and the choice may cost that much (the
    verification then shows it). More requests per level narrow the noise."""
    usable = {d: f for d, f in figures.items() if d not in rejected}
    if best not in usable:
        return []
    top = max(usable, key=lambda d: usable[d]["output_throughput"])
    base = usable[best]["output_throughput"]
    gap = usable[top]["output_throughput"] / base - 1 if base else 0.0
    if top == best or gap <= NOISE_NOTE_BOUND:
        return []
    return [
        f"C={c}: depth {best} measured {gap:.1%} behind depth {top}, within the cells' noise "
        f"({usable[top]['noise']:.1%}): too few requests at this level to tell them apart, "
        "so the choice may cost that much; more requests per level (--num-prompts, or "
        "--repeat) narrow it"
    ]


def _detail(figures: dict[int, Cell], rejected: dict[int, str]) -> str:
    """Every depth's figures at one level, and the ones rejected."""
    detail = ", ".join(
        f"depth {d}: {figures[d]['output_throughput']:.0f} tok/s"
        + (f" +-{figures[d]['mad']:.0f}" if figures[d]["mad"] else "")
        + f", {figures[d]['per_request']:.1f} per request"
        for d in figures
    )
    if rejected:
        detail += "; rejected: " + ", ".join(f"depth {d} ({r})" for d, r in rejected.items())
    return detail


def _table_and_ranges(
    choices: list[Choice], sizes: list[int] | None
) -> tuple[dict[str, AdaptiveSlot], list[str]]:
    """SGLang's adaptive table (a key per range start) and each range said in batches."""
    table: dict[str, AdaptiveSlot] = {}
    starts = _range_starts(choices, sizes)
    ranges: list[str] = []
    for n, (i, key) in enumerate(starts):
        choice = choices[i]
        table[str(key)] = {"candidate_steps": [choice.depth]}
        low = first_batch(key, sizes)
        if n + 1 < len(starts):
            high = first_batch(starts[n + 1][1], sizes) - 1
            span = f"batch {low}" if high == low else f"batch {low}-{high}"
        else:
            span = f"batch >= {low}"
        ranges.append(f"{span}: depth {choice.depth} (C={choice.concurrency}: {choice.why})")
    return table, ranges


def _range_starts(choices: list[Choice], sizes: list[int] | None) -> list[tuple[int, int]]:
    """(index of the choice, table key) where each run of equal depths begins: 1 for the
    first; else the padded size halfway (geometric mean) between the level below and the
    run's first level, above the previous key."""
    starts = [(0, 1)]
    for i in range(1, len(choices)):
        if choices[i].depth == choices[i - 1].depth:
            continue
        below, level = choices[i - 1].concurrency, choices[i].concurrency
        key = padded(max(below + 1, math.ceil(math.sqrt(below * level))), sizes)
        if key <= starts[-1][1]:
            key = padded(starts[-1][1] + 1, sizes)
        starts.append((i, key))
    return starts


def measured_columns(measured: dict[Any, Any]) -> list[tuple[Any, str]]:
    """The measured table's columns in reading order: plain, depth 0 (and its skip
    variant), then the drafting depths."""
    depths = sorted(k for k in measured if isinstance(k, int))
    zero = "depth 0" if PLAIN in measured else "depth 0 (plain)"  # one depth per launch
    order = [(PLAIN, "plain")] + [(0, zero)] * (0 in depths) + [(SKIP, "depth 0 skip")]
    order += [(d, f"depth {d}") for d in depths if d != 0]
    return [(key, title) for key, title in order if key in measured]


def _skip_wins(
    measured: dict[Any, dict[int, dict[str, float]]], skip: dict[int, dict[str, float]] | None
) -> set[int]:
    """Levels where depth 0 with the skip variable measured better by more than the pinned
    cell's noise: depth 0 counts at the skip's figures there (the variable is measured,
    never assumed)."""
    if not skip or 0 not in measured:
        return set()
    wins = set()
    for c, figures in skip.items():
        pinned = measured[0].get(c)
        if pinned and figures["output_throughput"] > pinned["output_throughput"] * (
            1 + pinned["noise"]
        ):
            measured[0][c] = figures
            wins.add(c)
    return wins


def _zero_step_notes(
    choices: list[Choice],
    measured: dict[Any, dict[int, dict[str, float]]],
    extra: dict[Any, dict[int, dict[str, float]]],
    skipped: set[int],
) -> list[str]:
    """What depth 0 costs on this EAGLE server against a plain one, where depth 0 was
    chosen, and what the skip variable costs when drafting resumes."""
    notes = []
    plain = extra.get(PLAIN, {})
    for ch in choices:
        if ch.depth != 0 or ch.concurrency not in plain or ch.concurrency not in measured[0]:
            continue
        ours = measured[0][ch.concurrency]["output_throughput"]
        theirs = plain[ch.concurrency]["output_throughput"]
        how = " with the skip variable" if ch.concurrency in skipped else ""
        notes.append(
            f"C={ch.concurrency}: depth 0{how} on this EAGLE server measured {ours:.0f} tok/s, "
            f"a server without speculation {theirs:.0f} ({ours / theirs - 1:+.1%})"
        )
    if any(ch.depth == 0 and ch.concurrency in skipped for ch in choices):
        notes.append(
            "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 is set: it measured better where depth "
            "0 applies; its cost is at the next upshift, whose first draft step starts from a "
            "zeroed draft state and accepts nothing (SGLang's _stub_skipped_draft_extend)"
        )
    return notes


def profile_capture_sizes(profile: str) -> list[int] | None:
    """The capture sizes the profile's server will have (its flags, else SGLang's
    speculative defaults)."""
    loaded = load_profile(profile)
    flags = loaded.flags
    listed = flags.get("cuda-graph-bs")
    if isinstance(listed, str):
        listed = [int(x) for x in listed.replace(",", " ").split()]
    elif isinstance(listed, int):
        listed = [listed]
    cap = flags.get("cuda-graph-max-bs-decode") or flags.get("cuda-graph-max-bs")
    running = flags.get("max-running-requests")
    if running is None and flags.get("speculative-algorithm") in CAPPED_ALGORITHMS:
        running = SPEC_DEFAULT_MAX_RUNNING  # SGLang's reset for speculative servers
    return capture_sizes(
        listed or None, int(cap) if cap else None, bool(flags.get("disable-cuda-graph")),
        max_running=int(running) if running else None, tp=loaded.tp,
        padding_disabled=bool(flags.get("disable-cuda-graph-padding")),
    )  # fmt: skip


def rows_by_depth(
    arms: list[ArmSpec], state: SweepRecord, archive: Archive
) -> dict[Any, dict[int, list[ResultRow]]]:
    """The finished cells' result rows: depth (or PLAIN, SKIP) -> concurrency -> rows."""
    out: dict[Any, dict[int, list[ResultRow]]] = {}
    for arm in arms:
        depth = arm_depth(arm)
        for host, cell in state.cells[arm.key].items():
            if cell.status != CellStatus.DONE:
                continue
            for row in store.read_results(archive.run_dir(host, str(cell.run_id))):
                out.setdefault(depth, {}).setdefault(row.max_concurrency, []).append(row)
    return out
