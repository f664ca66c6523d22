"""A table its own verification puts below the goal is never written as the tuned profile
(issue 83.3: "where it cannot be mended, the profile is written as the best static
configuration and the tune says why"). Once the mend has had its turn, where a level is
still below the goal on any host, the tuned profile is written as the best single static
configuration measured beside it (no drafting, the profile's own static speculation, each
static depth), the one keeping the most of each level's best static at its worst level on
any host; the words give both worst shares, and where the table kept more than that static
they say so and leave the table's file where it is, for a launch by hand."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from gpufleet.control.tune import files as tunefiles
from gpufleet.control.tune.goal import share_text
from gpufleet.control.tune.levels import objective
from gpufleet.control.tune.verify import VerdictRow, beside_arms, shortfalls


@dataclass(frozen=True)
class Decision:
    """The table below the goal against the best single static: whether that static is
    written instead (`fall_back`), its label, both worst shares and the words."""

    fall_back: bool
    static: str
    static_worst: float
    table_worst: float
    why: str


def static_worst_shares(verdicts: list[Any]) -> dict[str, float]:
    """Each static server of the verification: the least share of its level's best static
    it kept at any level on any host (0 where it missed a level)."""
    worst: dict[str, float] = {}
    for v in verdicts:
        base, static, _tuned, *others = v.arms
        statics = [base, static, *others]
        for row in v.rows:
            c = row.concurrency
            figures = {a.label: objective(a.levels[c].row)[0] if c in a.levels else 0.0
                       for a in statics}  # fmt: skip
            top = max(figures.values(), default=0.0)
            for label, figure in figures.items():
                share = figure / top if top else 0.0
                worst[label] = min(worst.get(label, math.inf), share)
    return worst


def table_worst_share(rows: list[VerdictRow]) -> float | None:
    """The least share of each level's best static the table kept (None: never judged)."""
    shares = [r.kept_best for r in rows if r.kept_best is not None]
    return min(shares) if shares else None


def decide(verdicts: list[Any], when: str = "after the mend") -> Decision | None:
    """None where the table reached the goal at every level on every host (or was never
    judged); else the best single static (by its worst share) to be written instead."""
    short = [f"{v.host} {s}" for v in verdicts for s in shortfalls(v.rows)]
    table = [w for v in verdicts if (w := table_worst_share(v.rows)) is not None]
    statics = static_worst_shares(verdicts)
    if not short or not table or not statics:
        return None
    label = max(statics, key=lambda k: statics[k])
    static_worst, table_worst = statics[label], min(table)
    why = (f"the table was below the goal {when} ({'; '.join(short)}), so it is not "
           f"the tuned profile; the best single static, {label}, keeps "
           f"{share_text(static_worst)} of each level's best static at its worst level "
           f"against the table's {share_text(table_worst)}: the tuned profile is written as "
           f"{label}")  # fmt: skip
    return Decision(True, label, static_worst, table_worst, why)


def settle(profile: str, checks: list[Any], outcome: Any) -> Decision | None:
    """Decide (`decide`), and write the tuned profile as the best single static (the arm the
    verification launched under its label); where the table kept more at its worst level,
    the words say where its file stays. The decision's words join the tune's notes."""
    decision = decide(outcome.verdicts)
    if decision is None:
        return None
    if decision.table_worst > decision.static_worst and outcome.config_path is not None:
        decision = dataclasses.replace(
            decision,
            why=(f"{decision.why}; the table stays in {outcome.config_path} for a launch by hand"),
        )
    outcome.result.notes.append(decision.why)
    if decision.fall_back:
        arm = static_arm(profile, checks, outcome, decision.static)
        if arm is None:  # not a server this tune can write (cannot happen: it was launched)
            return None
        name = outcome.profile_path.stem
        tunefiles.write_static(profile, name, arm, decision.why)
    return decision


def static_arm(profile: str, checks: list[Any], outcome: Any, label: str) -> Any:
    """The verification's static server of that label (None: not one it launched)."""
    arms = beside_arms(profile, checks, outcome.result.measured, 1)
    return next((a for a in arms if a.label == label), None)
