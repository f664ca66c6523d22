"""`inv tune`'s time: an estimate before the first launch, updated as cells finish, and
`--budget SECONDS`, which drops the least informative cells to fit and says which.

A tune is 3 + len(depths) measurement launches, then two for each server of the
verification, and `rounds` for each server of the load step, the bursts and the user's
trace (no drafting, static speculation, the tuned server and each static depth). A cell
(one launch on every host at once) costs a fixed part (clean, launch, stop) and its
benchmark, which is about proportional to its decode rounds: a closed-loop level of n
requests at concurrency C, each `output_len` tokens, decodes ceil(n / C) x output_len
steps. The pace (seconds fixed, seconds a round) is fitted to the cells this tune has
finished, or before the first launch to this profile's archived tune
cells; with neither, the first cell sets it.

The verification is planned first (issue 63) and never dropped; nor is a depth the user
asked for unless `--budget-may-drop depths` (issue 83). A budget that cannot hold what is
never dropped is refused before the first launch where a pace is known, else the tune stops
as soon as its first cell gives one (control/tune/limit.py); no cell starts that the budget
cannot hold. What `--budget` drops, least informative first (a unit goes whole):
1. the bursts, the load step, then the replay of the user's trace (extra verdicts on a table
   the verification judges level by level; ties that decide the table make room by dropping
   these: `cannot_afford`);
2. depth 0 with SGLang's skip variable (depth 0 is still measured as SGLang runs it);
3. with `--budget-may-drop depths`, drafting depths, deepest first (once a depth measured
   below the one before it at every level, all deeper ones first).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from gpufleet.archive.layout import Archive
from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.sweep.cells import ArmSpec, interleaved
from gpufleet.control.sweep.sweep_run import CellHooks
from gpufleet.control.sweep.sweep_state import SweepState
from gpufleet.control.tune import levels
from gpufleet.control.tune import table as tuning
from gpufleet.control.tune.drops import DropUnit, depth_of, drop_order, falling_depth
from gpufleet.control.tune.limit import BudgetStop, Shortage, line, minutes, unpaced_line
from gpufleet.control.tune.pace import (  # noqa: F401  (the clock's API: tests and callers)
    FIXED_STEPS,
    Pace,
    PlannedCell,
    archived_pace,
    decode_rounds,
    fit_pace,
)
from gpufleet.control.tune.stages import (
    BURST,
    MEASURE,
    STAGE_NAMES,
    STEP,
    TRACE,
    VERIFY,
    VERIFY_REPEATS,
)
from gpufleet.control.tune.step import BURST_CYCLES, QUIET_S, step_request
from gpufleet.errors import UserError
from gpufleet.kinds import CellStatus


@dataclass(frozen=True)
class TuneArms:
    """The arms a tune runs: its measurement and its verification arms, whether it verifies
    at all, and whether the tuned server switches depth by load (SGLang's adaptive table:
    a load step and bursts then; llama.cpp's one depth: neither)."""

    measure: list[ArmSpec]
    checks: list[ArmSpec]
    verify: bool = True
    switches: bool = True
    may_drop_depths: bool = False  # --budget-may-drop depths (issue 83)
    rounds: int = 3  # each server's runs of the load step and the bursts (issue 83.1)
    replay: tuple[float, float] | None = None  # --verify-trace: its decode rounds, its span


def plan_cells(arms: TuneArms, request: BenchRequest) -> list[PlannedCell]:
    """Every cell the tune would run, in order: the measurement, then (with `verify`) the
    verification, and where the server switches depth by load (`switches`: SGLang's
    table), the load step and the bursts (a trace of BURST_CYCLES bursts, each decoding
    its tokens at once, that lasts its span however fast the server is)."""
    measure, checks, verify, switches = arms.measure, arms.checks, arms.verify, arms.switches
    stages = [(MEASURE, measure, decode_rounds(request), 0.0)]
    if verify:  # each check twice, interleaved, and the best static depths beside them:
        # one reserved up front (the shallowest), the rest as the measurement names them
        repeated = interleaved(checks + verify_depths(measure, {}), VERIFY_REPEATS)
        stages.append((VERIFY, repeated, decode_rounds(request), 0.0))
    if verify and switches:  # the shapes run every static depth too, in rounds
        statics = [a for a in measure if depth_of(a) is not None]
        shape = interleaved([*checks, *statics], arms.rounds)
        stages += [
            (STEP, shape, decode_rounds(step_request(request)), 0.0),
            (BURST, shape, BURST_CYCLES * request.output_len, BURST_CYCLES * 2 * QUIET_S),
        ]
        if arms.replay is not None:
            stages.append((TRACE, shape, *arms.replay))
    return [
        PlannedCell(stage, arm.key, arm.label, rounds, floor)
        for stage, arms, rounds, floor in stages
        for arm in arms
    ]


def verify_depths(measure: list[ArmSpec], measured: dict[int, dict[int, float]]) -> list[ArmSpec]:
    """The static depths the verification may launch beside the tuned server, as far as the
    measurement says yet: each depth not measured yet (it may be best somewhere), and of
    the measured ones the best drafting depth of each level (a level whose best is plain
    or depth 0 still counts its best drafting depth: the estimate errs long). A depth thus
    costs its measurement and its two verification launches, and `--budget` drops the
    three together (`units`)."""
    drafting = {d: a for a in measure if (d := depth_of(a)) is not None}
    levels = sorted({c for figures in measured.values() for c in figures})
    best = {max((d for d in measured if c in measured[d]), key=lambda d: measured[d][c])
            for c in levels}  # fmt: skip
    wanted = (best | (set(drafting) - set(measured))) & set(drafting)
    return [drafting[d] for d in sorted(wanted) or sorted(drafting)[:1]]


class Spend(NamedTuple):
    """A tune's launches and seconds, and of them those of earlier runs (`--resume`)."""

    launches: int
    seconds: float
    earlier_launches: int = 0
    earlier_s: float = 0.0


@dataclass
class TimeKeeper:
    """The tune's clock: what is left, at what pace, against the budget; its sweeps consult
    it before each cell and tell it after each (`hooks`)."""

    measure: list[ArmSpec]
    checks: list[ArmSpec]
    cells: list[PlannedCell]
    budget_s: float | None
    say: Callable[[str], None]
    pace: Pace | None = None
    started: float = field(default_factory=time.monotonic)
    samples: list[tuple[dict[str, float], float]] = field(default_factory=list)
    done: set[tuple[str, str]] = field(default_factory=set)
    dropped: dict[tuple[str, str], str] = field(default_factory=dict)  # -> why
    measured: dict[int, dict[int, float]] = field(default_factory=dict)  # depth -> C -> tok/s
    notes: list[str] = field(default_factory=list)
    verify: bool = True
    may_drop_depths: bool = False  # whether --budget may drop depths the user asked for
    launched: int = 0  # cells this call ran (not those a resumed run found done)
    resumed: dict[tuple[str, str], float] = field(default_factory=dict)  # earlier runs' cells
    tried: int = 0  # cells this call started, failed ones too

    @classmethod
    def for_tune(
        cls, arms: TuneArms, request: BenchRequest, budget_s: float | None,
        say: Callable[[str], None], *, pace: Pace | None,
        finished: set[tuple[str, str]] | None = None,
    ) -> TimeKeeper:  # fmt: skip
        """The clock of a tune about to start; `finished`: (stage, arm key) of the cells an
        interrupted run of it already did (`--resume`), left out of what remains."""
        cells = plan_cells(arms, request)
        clock = cls(arms.measure, arms.checks, cells, budget_s, say, pace,
                    done=set(finished or ()), verify=arms.verify,
                    may_drop_depths=arms.may_drop_depths)  # fmt: skip
        clock.check_limit()  # refused before the first launch where a pace says it
        for text in clock.opening_lines():
            say(text)
        clock.fit_budget()
        return clock

    def least_s(self, may_drop_depths: bool | None = None) -> float | None:
        """The seconds of what no budget drops (plain, depth 0, every depth asked for
        unless the user let the budget drop them, else the shallowest, the verification),
        those still to run, after what is spent; None without a pace."""
        if self.pace is None:
            return None
        droppable = {k for unit in self.units(may_drop_depths) for k in unit.keys}
        kept = [c for c in self.remaining() if (c.stage, c.key) not in droppable]
        return self.elapsed_s() + sum(self.pace.cell_s(c) for c in kept)

    def check_limit(self, starting: bool = False) -> None:
        """A budget is a limit (issue 83): where what the tune must still run does not fit
        (or the budget is spent with cells left, or a cell `starting`), stop now with the
        one line naming the least budget that holds it (BudgetStop; before the first
        launch, a refusal)."""
        least = self.least_s()
        if self.budget_s is None:
            return
        if least is None or self.pace is None:  # no cell finished: the first sets the pace,
            # and once one has failed, none starts past the budget (no pace to plan by)
            if starting and self.tried and self.elapsed_s() >= self.budget_s:
                raise BudgetStop(unpaced_line(self.budget_s, self.tried, self.elapsed_s()))
            return
        if not (starting or self.remaining()):
            return
        spent = self.elapsed_s()
        if least <= self.budget_s and spent < self.budget_s:
            return
        other = None if self.may_drop_depths else self.least_s(may_drop_depths=True)
        raise BudgetStop(line(Shortage(self.budget_s, least, self.pace.basis, self.verify,
                                       other, self.launched, spent)))  # fmt: skip

    def remaining(self) -> list[PlannedCell]:
        """The planned cells not yet done or dropped."""
        gone = self.done | set(self.dropped)
        return [c for c in self.cells if (c.stage, c.key) not in gone]

    def left_s(self) -> float | None:
        """The remaining cells' estimated seconds (None until a cell has set the pace)."""
        if self.pace is None:
            return None
        return sum(self.pace.cell_s(c) for c in self.remaining())

    def elapsed_s(self) -> float:
        """Seconds since the tune started."""
        return time.monotonic() - self.started

    def spent(self) -> Spend:
        """What the whole tune spent, earlier runs of a resumed one included (their cells'
        own seconds: launch to stop), for the closing line (issue 83.5)."""
        earlier = sum(self.resumed.values())
        return Spend(self.launched + len(self.resumed), self.elapsed_s() + earlier,
                     len(self.resumed), earlier)  # fmt: skip

    def opening_lines(self) -> list[str]:
        """What the tune will run and, with a pace, how long it should take."""
        counts: dict[str, int] = {}
        for c in self.cells:
            counts[c.stage] = counts.get(c.stage, 0) + 1
        plan = ", ".join(f"{n} {STAGE_NAMES[s]}" for s, n in counts.items())
        head = f"tune: {len(self.cells)} launches ({plan})"
        if self.done:
            head += f", {len(self.done)} done by the run it resumes"
            if not self.remaining():
                return [head]
        left = self.left_s()
        if left is None or self.pace is None:
            return [f"{head}; the first cell sets the time estimate (no archived tune of "
                    "this profile to go by)"]  # fmt: skip
        return [f"{head}; estimate ~{_minutes(left)} (the pace of {self.pace.basis})"]

    def units(self, may_drop_depths: bool | None = None) -> list[DropUnit]:
        """What can be dropped to fit the budget, least informative first; a drafting
        depth (only where the user allowed it) goes with the verification launches planned
        beside it (a depth not measured is never the best static)."""
        checked = [(s, [c.key for c in self.cells if c.stage == s])
                   for s in (BURST, STEP, TRACE, VERIFY)]  # fmt: skip
        depths = self.may_drop_depths if may_drop_depths is None else may_drop_depths
        units = drop_order(self.measure, checked, falling_depth(self.measured), depths)
        beside: dict[str, tuple[tuple[str, str], ...]] = {}
        for c in self.cells:
            if c.stage in (VERIFY, STEP, BURST, TRACE):
                beside[c.label] = (*beside.get(c.label, ()), (VERIFY, c.key))
        return [
            dataclasses.replace(u, keys=u.keys + beside.get(u.keys[0][1], ()))
            if u.keys[0][0] == MEASURE and u.keys[0][1] in beside else u
            for u in units
        ]  # fmt: skip

    def fit_budget(self) -> None:
        """Drop units, least informative first, until the estimate fits the budget (a unit
        with a cell already run is kept whole); where even that does not fit, check_limit
        stops the tune."""
        if self.budget_s is None or self.pace is None:
            return
        for unit in self.units():
            if self.elapsed_s() + (self.left_s() or 0.0) <= self.budget_s:
                return
            if any(k in self.done for k in unit.keys):
                continue
            self._drop(unit, unit.why)

    def finished(
        self, stage: str, arm: ArmSpec, steps: dict[str, float],
        figures: dict[int, float] | None = None, said: bool = True,
    ) -> None:  # fmt: skip
        """A cell is done: refit the pace, drop what no longer fits, say what is left
        (`said`: not for a cell an earlier run of a resumed tune finished)."""
        key = (stage, arm.key)
        if not said:  # an earlier run of this resumed tune ran it: its seconds, for `spent`
            self.resumed.setdefault(key, sum(steps.values()))
        if key in self.done:
            return
        self.done.add(key)
        self.launched += said
        planned = next((c for c in self.cells if (c.stage, c.key) == key), None)
        if planned is not None and steps:
            self.samples.append((steps, planned.rounds))
        depth = depth_of(arm)
        if stage == MEASURE and depth is not None and figures:
            self.measured[depth] = figures
            self._replan_verification()
        fitted = fit_pace(self.samples, f"{len(self.samples)} cells of this tune")
        self.pace = fitted or self.pace
        self.fit_budget()
        self.check_limit()  # the first cell of a fresh archive sets the pace: stop at once
        left = self.left_s()
        if said and left is not None and self.pace is not None and self.remaining():
            budget = f" of --budget {self.budget_s:g}s" if self.budget_s is not None else ""
            n = len(self.remaining())
            self.say(
                f"tune: {n} cell{'s' * (n != 1)} left, ~{_minutes(left)} at "
                f"{self.pace.fixed_s:.0f}s a launch + {self.pace.round_s * 1000:.1f} ms a "
                f"decode round ({_minutes(self.elapsed_s())} spent{budget})"
            )

    def _drop(self, unit: DropUnit, why: str) -> None:
        """Drop a unit's cells not yet run or dropped, and say so (in the notes too)."""
        todo = [k for k in unit.keys if k not in self.dropped and k not in self.done]
        if not todo:
            return
        for key in todo:
            self.dropped[key] = why
        note = f"--budget: dropped {unit.what} ({len(todo)} launches): {why}"
        self.notes.append(note)
        self.say(f"tune: {note}")

    def _replan_verification(self) -> None:
        """The verification's static depths as the measurement so far names them (a depth
        no longer expected leaves the plan; one newly expected joins it)."""
        planned = [c for c in self.cells if c.stage == VERIFY]
        if not planned:
            return  # --no-verify
        checks = {c.key for c in planned if (VERIFY, c.key) in self.done} | {
            a.key for a in interleaved(self.checks, VERIFY_REPEATS)
        }
        wanted = interleaved(verify_depths(self.measure, self.measured), VERIFY_REPEATS)
        keep = checks | {a.key for a in wanted}
        self.cells = [c for c in self.cells if c.stage != VERIFY or c.key in keep]
        rounds = planned[0].rounds
        have = {c.key for c in self.cells if c.stage == VERIFY}
        self.cells += [PlannedCell(VERIFY, a.key, a.label, rounds) for a in wanted
                       if a.key not in have]  # fmt: skip

    def plan_more(self, stage: str, arms: list[ArmSpec], request: BenchRequest) -> None:
        """Cells a stage gained once the measurement said what to run (the verification's
        best static depths and repeats): planned, and dropped with their stage if it was;
        a cell planned for the stage that it will not run leaves the plan."""
        dropped = self.stage_dropped(stage)
        running = {a.key for a in arms}
        self.cells = [c for c in self.cells if c.stage != stage or c.key in running
                      or (c.stage, c.key) in self.done]  # fmt: skip
        planned = {(c.stage, c.key) for c in self.cells}
        like = next((c for c in self.cells if c.stage == stage), None)  # a stage's cells cost alike
        for arm in arms:
            if (stage, arm.key) in planned:
                continue
            rounds, floor = (like.rounds, like.floor_s) if like else (decode_rounds(request), 0.0)
            self.cells.append(PlannedCell(stage, arm.key, arm.label, rounds, floor))
            if dropped:
                self.dropped[(stage, arm.key)] = "its stage was dropped"
        self.fit_budget()

    def cannot_afford(self, stage: str, arms: list[ArmSpec], request: BenchRequest) -> str:
        """Why a stage decided on the way (the ties' retests) does not fit `--budget` beside
        what is left, after making room by dropping what ranks below it (the bursts and the
        load step: a tie decides the table, the verification judges it and comes first);
        empty where it fits (or there is no budget, or no pace yet)."""
        if self.budget_s is None or self.pace is None:
            return ""
        cost = self.cost_s(stage, arms, request)
        below = [u for u in self.units() if u.keys[0][0] in (BURST, STEP, TRACE)]
        for unit in [None, *below]:
            if unit is not None:
                self._drop(unit, f"to measure ties again: {unit.why}")
            total = self.elapsed_s() + (self.left_s() or 0.0) + cost
            if total <= self.budget_s:
                return ""
        return (f"they need ~{_minutes(cost)} more, ~{_minutes(total)} in all against "
                f"--budget {self.budget_s:g}s")  # fmt: skip

    def cost_s(self, stage: str, arms: list[ArmSpec], request: BenchRequest) -> float:
        """These cells' estimated seconds at the pace (0 without one)."""
        if self.pace is None:
            return 0.0
        rounds = decode_rounds(request)
        return sum(self.pace.cell_s(PlannedCell(stage, a.key, a.label, rounds)) for a in arms)

    def resume_s(self) -> float:
        """What a `--resume` of this tune must still run, as its clock plans it before its
        first cell: what no budget drops that this run has not done, the verification
        planned beside every depth (the measurement names the best ones only as it is
        read again)."""
        if self.pace is None:
            return 0.0
        rest = [c for c in self.remaining() if c.stage in (MEASURE, VERIFY)]
        droppable = {k for unit in self.units() for k in unit.keys}
        have = {(c.stage, c.key) for c in rest} | self.done
        rounds = next((c.rounds for c in self.cells if c.stage == MEASURE), 0.0)
        every = interleaved(self.checks + verify_depths(self.measure, {}), VERIFY_REPEATS)
        rest += [PlannedCell(VERIFY, a.key, a.label, rounds) for a in every
                 if (VERIFY, a.key) not in have]  # fmt: skip
        return sum(self.pace.cell_s(c) for c in rest if (c.stage, c.key) not in droppable)

    def stage_dropped(self, stage: str) -> bool:
        """Whether every cell of a stage was dropped (the stage is then not run at all)."""
        keys = [(c.stage, c.key) for c in self.cells if c.stage == stage]
        return bool(keys) and all(k in self.dropped for k in keys)

    def hooks(self, stage: str, archive: Archive) -> CellHooks:
        """The sweep's side: ask before each cell, report each finished one (its slowest
        host's steps; a measured drafting depth's objective by level)."""

        def after(arm: ArmSpec, state: SweepState, ran: bool) -> None:
            self.tried += ran
            cells = list(state.record.cells[arm.key].values())
            if not cells or any(c.status != CellStatus.DONE for c in cells):
                return  # failed or interrupted: not done, and --resume runs it again
            steps = max((c.steps_s for c in cells), key=lambda s: sum(s.values()), default={})
            figures = None
            if stage == MEASURE and depth_of(arm) is not None:
                rows = tuning.rows_by_depth([arm], state.record, archive)
                figures = {
                    c: statistics.median(levels.objective(r)[0] for r in rows.at(key, c))
                    for key in rows for c in rows.levels(key)
                }  # fmt: skip
            self.finished(stage, arm, steps, figures, said=ran)

        def drop(arm: ArmSpec) -> str | None:
            why = self.dropped.get((stage, arm.key))
            if why is None:
                self.check_limit(starting=True)  # never start a cell the budget cannot hold
            return why

        return CellHooks(drop=drop, after=after)


_minutes = minutes


def has_state(root: Archive, profiles: list[str], arms: list[ArmSpec], kind: str) -> bool:
    """Whether an earlier (interrupted) tune got as far as this sweep."""
    try:
        SweepState.latest(root, profiles, arms, kind)
    except UserError:
        return False
    return True
