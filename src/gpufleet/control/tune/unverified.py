"""A table its verification has not accepted is never left as the tuned profile (issue 83:
`inv tune` "writes only a table its verification accepts"). The table must be written under
the tuned profile's name for the verification to launch it; where `--budget`, an interrupt
(Ctrl-C, SIGTERM) or a failure stops the tune after that and before the verification (or
the mend's measurement) accepted it, the table
moves to a candidate named unverified (`<name>-unverified.yaml` and its file), the tuned
profile is written as the best single static configuration measured (fallback.py's rule:
from the verification's figures where it finished, else from the measurement's, plain or a
static depth), and the stop's one line says what was not verified, why (the budget: spent X
of Y) and the command that finishes it (the CLI adds it: `--resume` with `budget_hint`)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.control.tune import fallback as tunefallback
from gpufleet.control.tune import files as tunefiles
from gpufleet.control.tune.depth_cells import PLAIN, arm_depth, depth_arms
from gpufleet.control.tune.goal import share_text
from gpufleet.control.tune.levels import Cells
from gpufleet.control.tune.limit import BudgetStop, minutes
from gpufleet.report import catalogue
from gpufleet.terminal import shown

SUFFIX = "-unverified"  # the candidate's name: the tuned profile's, and this
HEADER = "# UNVERIFIED: the tune stopped before its verification accepted this table"
SPARE_S = 60.0  # the finishing command's budget: twice what is left, and at least this more


class Unverified(BudgetStop):
    """The budget stopped the tune before its verification accepted the table: the line,
    and the seconds what is left needs at the tune's pace (the finishing command's
    budget is `budget_hint`)."""

    def __init__(self, text: str, needed_s: float, what: str) -> None:
        super().__init__(text)
        self.needed_s = needed_s
        self.what = what  # "the verification" or "the mend"

    @property
    def budget_hint(self) -> int:
        """A budget that holds what is left with room for a machine as slow again."""
        return math.ceil(max(2 * self.needed_s, self.needed_s + SPARE_S))

    def finished_by(self, command: str) -> str:
        """The line with the command that finishes what was not verified."""
        return f"{self}; finish {self.what} with `{command}`"


def candidate_path(profile_path: Path) -> Path:
    """Where the unverified table's profile goes, beside the tuned profile."""
    return profile_path.with_name(f"{profile_path.stem}{SUFFIX}{profile_path.suffix}")


def drop_candidate(profile: str, profile_path: Path) -> None:
    """An earlier stop's candidate, once a run verified its table: removed (stale)."""
    config, yaml_path = tunefiles.output_paths(profile, candidate_path(profile_path).stem)
    for path in (config, yaml_path):
        path.unlink(missing_ok=True)


NOT_VERIFIED = "{why} left the verification out; inv tune without it verifies"


def mark_unverified(outcome: Any, why: str) -> None:
    """A table written as the tuned profile without a verification on purpose (`why`:
    --no-verify): its header and the record's notes say so, as a demoted table's do."""
    path, said = outcome.profile_path, NOT_VERIFIED.format(why=why)
    path.write_text(f"# NOT VERIFIED: {said}\n{path.read_text()}")
    outcome.result.notes.append(f"the tuned profile is not verified: {said}")


def keep_candidate(profile: str, outcome: Any, table: Any) -> Path:
    """The table (a TuneResult) written as the unverified candidate, with its header saying
    so; the tuned profile's own table file removed (the candidate has its copy)."""
    name = candidate_path(outcome.profile_path).stem
    if outcome.config_path is None:  # one depth for every load: the profile is the table
        path = candidate_path(outcome.profile_path)
        text = outcome.profile_path.read_text()
    else:
        _, path = tunefiles.write_outputs(profile, table, name)
        text = path.read_text()
        outcome.config_path.unlink(missing_ok=True)
    path.write_text(f"{HEADER}\n{text}")
    return path


def best_measured(measured: Cells, arms: list[ArmSpec]) -> tuple[ArmSpec, float] | None:
    """The static server (plain or a static depth) the measurement measured keeping the most
    of each level's best at its worst level, and that share (None: none measured)."""

    def key(a: ArmSpec) -> Any:  # plain is depth 0 where the engine has one depth a load
        depth = arm_depth(a)
        return 0 if depth == PLAIN and PLAIN not in measured else depth

    depths = {a.label: arm_depth(a) for a in arms}  # depth 0's pinned cells are no static
    statics = [a for a in arms if (d := depths[a.label]) == PLAIN or (isinstance(d, int) and d > 0)]
    statics = [a for a in statics if key(a) in measured]
    levels = sorted({c for a in statics for c in measured[key(a)]})
    if not statics or not levels:
        return None

    def figure(a: ArmSpec, c: int) -> float:
        cell = measured[key(a)].get(c)
        return float(cell[catalogue.THROUGHPUT]) if cell else 0.0

    worst = {}
    tops = {c: max(figure(b, c) for b in statics) for c in levels}
    for a in statics:
        worst[a.label] = min(figure(a, c) / tops[c] if tops[c] else 0.0 for c in levels)
    best = max(statics, key=lambda a: worst[a.label])
    return best, worst[best.label]


@dataclasses.dataclass(frozen=True)
class Stopped:
    """Where the budget stopped the tune: the stage in words, what it left unverified, the
    seconds spent, the budget and the launches run."""

    what: str  # "the verification" or "the mend"
    table: str  # "table" or "mended table": what was not verified
    spent_s: float
    budget_s: float
    launches: int
    needed_s: float
    cause: str = ""  # what stopped it other than the budget (cause_of), "" for the budget


def stopped(clock: Any, what: str, table: str, needed_s: float,
            exc: BaseException | None = None) -> Stopped:  # fmt: skip
    """Where the budget (or `exc`) stopped the tune (`clock`: its budget.TimeKeeper)."""
    cause = "" if exc is None or isinstance(exc, BudgetStop) else cause_of(exc)
    return Stopped(what, table, clock.elapsed_s(), clock.budget_s or 0.0, clock.launched,
                   needed_s, cause)  # fmt: skip


def cause_of(exc: BaseException) -> str:
    """What stopped the tune, other than its budget, in words: Ctrl-C and the signals
    handled as it (cli/common.INTERRUPTS), or a failure by its one line (bounded)."""
    if isinstance(exc, KeyboardInterrupt) or getattr(exc, "interrupted", False):
        return "an interrupt (Ctrl-C, SIGTERM or SIGHUP) stopped the tune"  # or its sweep's
    first = shown((str(exc).splitlines() or [""])[0][:200])  # a host's words: ESC in a
    return f"a failure stopped the tune ({first})"  # profile's header, and YAML refuses it


def demote(profile: str, checks: list[ArmSpec], outcome: Any, table: Any,
           stop: Stopped) -> Unverified:  # fmt: skip
    """The table (`table`: the one the stopped stage was verifying) kept as the unverified
    candidate, the tuned profile written as the best static measured (or removed where
    nothing was), the record's notes told; the line to stop with."""
    candidate = keep_candidate(profile, outcome, table)
    ran = f"{stop.launches} launch{'es' * (stop.launches != 1)}"
    why = (f"{stop.cause} during {stop.what} ({stop.spent_s:.0f}s spent, {ran})" if stop.cause
           else f"--budget {stop.budget_s:g}: the budget stopped the tune during {stop.what} "
           f"({stop.spent_s:.0f}s spent of {stop.budget_s:g}s, {ran})")  # fmt: skip
    why += f": the {stop.table} was not verified, so it is not the tuned profile"
    launch = tunefiles.tuned_reference(profile, candidate.stem)  # a path where profile was one
    kept = (f"; the table is kept unverified as {candidate} (inv launch --profile "
            f"{launch}, by hand); what is left needs ~{minutes(stop.needed_s)}")  # fmt: skip
    first = "as first written (the mend's measurement did not finish)"
    decision = tunefallback.decide(outcome.verdicts, first) if outcome.verdicts else None
    arm = decision and tunefallback.static_arm(profile, checks, outcome, decision.static)
    if decision is not None and arm is not None:  # the verification finished: its static
        outcome.fallback = decision
        why += f"; {decision.why}{kept}"
        tunefiles.write_static(profile, outcome.profile_path.stem, arm, why)
        tunefiles.note_verification(outcome.profile_path,
                                    {v.host: v.sentence for v in outcome.verdicts})  # fmt: skip
    elif best := best_measured(outcome.result.measured, _measured_arms(profile, outcome)):
        arm, share = best
        why += (f"; the best single static the measurement measured, {arm.label}, keeps "
                f"{share_text(share)} of each level's best at its worst level: the tuned "
                f"profile is written as {arm.label}{kept}")  # fmt: skip
        tunefiles.write_static(profile, outcome.profile_path.stem, arm, why)
    else:
        outcome.profile_path.unlink(missing_ok=True)
        why += f"; no tuned profile is written ({outcome.profile_path} removed){kept}"
    outcome.result.notes.append(why)
    return Unverified(why, stop.needed_s, stop.what)


def _measured_arms(profile: str, outcome: Any) -> list[ArmSpec]:
    """The measurement's servers (its depths as the record lists them)."""
    return depth_arms(profile, [d for d in outcome.record.depths if d > 0])
