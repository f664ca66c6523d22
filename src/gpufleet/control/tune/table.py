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
   the ladder on that server (control/sweep/sweep_run.py runs them, resumably);
2. per level, the depth with the highest steady-window output throughput (the level at
   full load, ramp-up and drain left out: with short outputs they flatten whole-level
   figures and hide 3-7% gains; the whole level where no steady window was found), among
   those that keep the per-request speed floor (`--min-request-speed`), else the fastest
   per request. At one closed-loop level every request shares the batch, so this is also
   the per-request speed the verification judges. A tie within the best cell's measured
   noise goes to the shallowest depth: its repeats' spread (MAD / median), or with one run
   the standard error of its per-request speeds (`levels.run_noise`), never a fixed margin;
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
from dataclasses import dataclass, field

from gpufleet.archive import store
from gpufleet.archive.kept import SweepRecord
from gpufleet.archive.layout import Archive
from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.control.tune.depth_cells import PLAIN, SKIP, arm_depth
from gpufleet.control.tune.levels import (
    Cell,
    Cells,
    Tie,
    choose_level,
    level_tie,
    near_best,
)
from gpufleet.control.tune.measurement import Measurement
from gpufleet.engine_facts import SKIP_ZERO_STEP_ENV, AdaptiveSlot, first_batch, padded
from gpufleet.errors import UserError
from gpufleet.kinds import CellStatus
from gpufleet.records import ResultRow
from gpufleet.report import catalogue


@dataclass
class Choice:
    """The depth chosen at one level, and why."""

    concurrency: int
    depth: int
    why: str


@dataclass
class TuneResult:
    """The chosen table (or one depth), the choices and reasoning behind it, and what was
    measured."""

    table: dict[str, AdaptiveSlot]  # SGLang's adaptive config
    choices: list[Choice]
    ranges: list[str]  # one line of reasoning per key
    notes: list[str] = field(default_factory=list)
    measured: Cells = field(default_factory=dict)
    skip_extend: bool = False  # the tuned server sets SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND
    fixed_depth: int | None = None  # an engine with one depth for every load: it (no table)
    ties: list[Tie] = field(default_factory=list)  # what measuring again could still settle


@dataclass
class Retest:
    """A tie measured again (control/tune/ties.py): both depths' rows from the tie rounds
    (interleaved launches, more requests), and what it took."""

    rows: dict[int, list[ResultRow]]  # depth -> rows
    requests: int  # requests per depth over every round
    rounds: int


def choose(
    per_depth: Measurement,
    min_request_speed: float | None = None,
    sizes: list[int] | None = None,
    retests: dict[int, Retest] | None = None,
) -> TuneResult:
    """The table from measurements: depth -> concurrency -> result rows (any hosts).

    Depth 0 is the speculative server pinned at 0; where `skip` (the same with SGLang's
    skip variable) was measured, depth 0 counts at the better of the two, and the tuned
    server sets the variable when the skip won a depth-0 range. `plain` (no speculation) is
    not a choice: the notes give the gap depth 0 leaves to it.

    A level whose best depth ties a shallower one within the noise is settled by its
    `retests` (control/tune/ties.py measured the two again); a tie that survives them, or
    has none, is in `ties`, and settled by the physics (`_follow_physics`), else shallow.

    `sizes` are the server's CUDA-graph capture sizes: SGLang pads a decode batch to the
    next captured size before it picks a key, so keys are padded sizes and each range says
    the batches it really covers (a key of 16 applies from batch 15)."""
    extra = per_depth.only((PLAIN, SKIP)).cells()
    raw = per_depth.without((PLAIN, SKIP)).cells()
    measured = {d: dict(levels) for d, levels in raw.items()}  # depth 0 at its better variant
    skipped = _skip_wins(measured, extra.get(SKIP))
    ladder = sorted(set.intersection(*(set(levels) for levels in measured.values())))
    if not ladder:
        raise UserError("inv tune: the depths share no measured concurrency level")
    choices: list[Choice] = []
    notes: list[str] = []
    ties: dict[int, Tie] = {}
    for c in ladder:
        figures = {d: measured[d][c] for d in sorted(measured)}
        best, why, rejected = choose_level(figures, min_request_speed)
        tie = level_tie(c, figures, min_request_speed)
        retest = (retests or {}).get(c)
        if tie is not None and retest is not None:
            best, why, tie = _settle(tie, retest, min_request_speed)
        if tie is not None:
            ties[c] = tie
        chose = f"chose {figures[best][catalogue.THROUGHPUT]:.0f}"
        choices.append(Choice(c, best, f"{why} ({_detail(figures, rejected)}; {chose})"))
    notes += _follow_physics(choices, ties, measured, min_request_speed)
    notes += [_tie_note(ties[ch.concurrency], retests) for ch in choices
              if ch.concurrency in ties and ch.depth == ties[ch.concurrency].shallow]  # fmt: skip
    notes = [n for n in notes if n]
    notes += _zero_step_notes(choices, measured, extra, skipped)
    table, ranges = table_and_ranges(choices, sizes)
    skip_used = any(ch.depth == 0 and ch.concurrency in skipped for ch in choices)
    result = TuneResult(table, choices, ranges, notes, {**raw, **extra}, skip_used)
    result.ties = [t for t in ties.values() if not t.by_physics]
    return result


def _settle(
    tie: Tie, retest: Retest, min_request_speed: float | None
) -> tuple[int, str, Tie | None]:
    """A tie's depth from its retest: the better one where they now differ by more than the
    noise, else still a tie (returned, judged on the retest's figures)."""
    figures = Measurement({d: {tie.concurrency: rows} for d, rows in retest.rows.items()}).cells()
    cells = {d: levels[tie.concurrency] for d, levels in figures.items()}
    again = level_tie(tie.concurrency, cells, min_request_speed)
    best, _, _ = choose_level(cells, min_request_speed)
    said = ", ".join(f"depth {d} {cells[d]['score']:.0f}" for d in sorted(cells))
    if again is None:
        other = next((d for d in cells if d != best), best)
        gap = 1 - cells[other]["score"] / cells[best]["score"] if cells[best]["score"] else 0.0
        return best, (
            f"measured again, interleaved ({retest.rounds} round(s), {retest.requests} requests "
            f"per depth): {said} tok/s (median - spread), {gap:.1%} apart, beyond the "
            f"{cells[best]['noise']:.1%} noise"
        ), None  # fmt: skip
    why = (f"measured again ({retest.rounds} round(s), {retest.requests} requests per depth): "
           f"{said} tok/s, still within the noise: the shallower")  # fmt: skip
    return again.shallow, why, again


def _follow_physics(
    choices: list[Choice], ties: dict[int, Tie], measured: Cells, floor: float | None
) -> list[str]:
    """Deeper speculation pays less as the batch grows: a level that cannot tell its depth
    from the deeper one more load chose (within the noise) takes that deeper one, as the
    physics says it is at least as good here. A rise that remains is kept because a level
    measured it beyond the noise (or ruled the shallower depth out), and the note says which."""
    for i in range(len(choices) - 2, -1, -1):
        low, high = choices[i], choices[i + 1]
        if high.depth <= low.depth:
            continue
        found = near_best({d: measured[d][low.concurrency] for d in measured}, floor)
        if found is None or high.depth not in found[2]:
            continue
        if low.concurrency in ties:
            ties[low.concurrency].by_physics = True
        low.depth = high.depth
        low.why = (f"within the noise ({found[1]:.1%}) of the best here; more load "
                   f"(C={high.concurrency}) chose depth {high.depth}, and deeper speculation "
                   "pays less as the batch grows, so it is at least as good here")  # fmt: skip
    return [_rise_note(choices, i, measured, floor)
            for i in range(1, len(choices)) if choices[i].depth > choices[i - 1].depth]  # fmt: skip


def _rise_note(choices: list[Choice], i: int, measured: Cells, floor: float | None) -> str:
    """Why level i drafts deeper than the one below: the figures that ruled the lower
    level's depth out, here or at the first level above that measured it so."""
    prev, ch = choices[i - 1], choices[i]
    p = prev.depth
    head = f"C={ch.concurrency}: depth {ch.depth} drafts deeper than at lower load (depth {p})"
    for later in choices[i:]:
        if later.depth != ch.depth:
            break
        figures = {d: measured[d][later.concurrency] for d in measured}
        at = "here" if later is ch else f"at C={later.concurrency}"
        if figures[prev.depth].get("rejected"):
            return (
                f"{head}: depth {prev.depth} was rejected {at} ({figures[prev.depth]['rejected']})"
            )
        found = near_best(figures, floor)
        if found is None or (floor is not None and figures[prev.depth]["per_request"] < floor):
            return f"{head}: depth {prev.depth} is below the speed floor {at}"
        top, noise, near = found
        if prev.depth in near:
            continue  # within the noise here: the level above decides
        gap = 1 - figures[prev.depth]["score"] / figures[top]["score"]
        return (f"{head} because depth {prev.depth} scored {gap:.1%} behind depth {top} {at}, "
                f"beyond that cell's measured noise ({noise:.1%})")  # fmt: skip
    return f"{head}: no level measured it beyond the noise"


def _tie_note(tie: Tie, retests: dict[int, Retest] | None) -> str:
    """A tie the shallower depth kept, in the figures that decided it: both scores, the gap,
    the noise it is within, and the requests it took; only where it may cost over 2%."""
    if tie.gap <= NOISE_NOTE_BOUND:
        return ""
    retest = (retests or {}).get(tie.concurrency)
    took = (f"measured again ({retest.requests} requests per depth) and still "
            if retest else "not measured again, ")  # fmt: skip
    return (
        f"C={tie.concurrency}: depth {tie.shallow} scored {tie.shallow_score:.0f} tok/s, "
        f"{tie.gap:.1%} behind depth {tie.deep}'s {tie.deep_score:.0f}, within that cell's "
        f"noise ({tie.noise:.1%}): {took}too close to tell apart, so the shallower was kept "
        "and may cost that much; more requests per level (--num-prompts, or --repeat) narrow it"
    )


NOISE_NOTE_BOUND = 0.02  # a within-noise choice that may cost more than this is said


def _detail(figures: dict[int, Cell], rejected: dict[int, str]) -> str:
    """Every depth's figures at one level, and the ones rejected."""
    detail = ", ".join(
        f"depth {d}: {figures[d][catalogue.THROUGHPUT]:.0f} tok/s"
        + (f" +-{figures[d]['mad']:.0f}" if figures[d]["mad"] else "")
        + f", {figures[d]['per_request']:.1f} per request"
        for d in figures
    )
    if rejected:
        detail += "; rejected: " + ", ".join(f"depth {d} ({r})" for d, r in rejected.items())
    return detail


def table_and_ranges(
    choices: list[Choice], sizes: list[int] | None, early: frozenset[int] = frozenset()
) -> tuple[dict[str, AdaptiveSlot], list[str]]:
    """SGLang's adaptive table (a key per range start) and each range said in batches;
    `early`: levels whose range begins right above the level below (control/tune/mend.py)."""
    table: dict[str, AdaptiveSlot] = {}
    starts = range_starts(choices, sizes, early)
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


def range_starts(
    choices: list[Choice], sizes: list[int] | None, early: frozenset[int] = frozenset()
) -> list[tuple[int, int]]:
    """(index of the choice, table key) where each run of equal depths begins: 1 for the
    first; else the padded size halfway (geometric mean) between the level below and the
    run's first level, above the previous key; for a run whose first level is in `early`,
    right above the level below (its batch dips stay in its range)."""
    starts = [(0, 1)]
    for i in range(1, len(choices)):
        if choices[i].depth == choices[i - 1].depth:
            continue
        below, level = choices[i - 1].concurrency, choices[i].concurrency
        halfway = math.ceil(math.sqrt(below * level))
        key = padded(below + 1 if level in early else max(below + 1, halfway), sizes)
        if key <= starts[-1][1]:
            key = padded(starts[-1][1] + 1, sizes)
        starts.append((i, key))
    return starts


def _skip_wins(measured: Cells, skip: dict[int, Cell] | None) -> set[int]:
    """Levels where depth 0 with the skip variable measured better by more than the pinned
    cell's noise: depth 0 counts at the skip's figures there (the variable is measured,
    never assumed)."""
    if not skip or 0 not in measured:
        return set()
    wins = set()
    for c, figures in skip.items():
        pinned = measured[0].get(c)
        if pinned and figures[catalogue.THROUGHPUT] > pinned[catalogue.THROUGHPUT] * (
            1 + pinned["noise"]
        ):
            measured[0][c] = figures
            wins.add(c)
    return wins


def _zero_step_notes(
    choices: list[Choice],
    measured: Cells,
    extra: Cells,
    skipped: set[int],
) -> list[str]:
    """What depth 0 costs on this EAGLE server against a plain one, where depth 0 was
    chosen, and what the skip variable costs when drafting resumes."""
    notes = []
    plain = extra.get(PLAIN, {})
    for ch in choices:
        if ch.depth != 0 or ch.concurrency not in plain or ch.concurrency not in measured[0]:
            continue
        ours = measured[0][ch.concurrency][catalogue.THROUGHPUT]
        theirs = plain[ch.concurrency][catalogue.THROUGHPUT]
        how = " with the skip variable" if ch.concurrency in skipped else ""
        notes.append(
            f"C={ch.concurrency}: depth 0{how} on this EAGLE server measured {ours:.0f} tok/s, "
            f"a server without speculation {theirs:.0f} ({ours / theirs - 1:+.1%})"
        )
    if any(ch.depth == 0 and ch.concurrency in skipped for ch in choices):
        notes.append(
            f"{SKIP_ZERO_STEP_ENV}=1 is set: it measured better where depth "
            "0 applies; its cost is at the next upshift, whose first draft step starts from a "
            "zeroed draft state and accepts nothing (SGLang's _stub_skipped_draft_extend)"
        )
    return notes


def rows_by_depth(arms: list[ArmSpec], state: SweepRecord, archive: Archive) -> Measurement:
    """The finished cells' result rows: depth (or PLAIN, SKIP) -> concurrency -> rows."""
    out = Measurement()
    for arm in arms:
        depth = arm_depth(arm)
        for host, cell in state.cells[arm.key].items():
            if cell.status != CellStatus.DONE:
                continue
            for row in store.read_results(archive.run_dir(host, str(cell.run_id))):
                out.add(depth, row)
    return out
