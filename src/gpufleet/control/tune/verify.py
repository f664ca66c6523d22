"""The tune's verification, level by level, against two bars: the better of no drafting and
the profile's own static speculation, measured beside the tuned server; and the best static
server the tune itself measured at that level (plain, or any depth), on the objective the
tune chose by (control/tune.objective). control/tune/step.py judges the load step and the
bursts; control/tune/table.py chooses the table it verifies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.control.server.profiles import load_profile
from gpufleet.control.sweep.cells import ArmSpec, interleaved, profile_label
from gpufleet.control.tune.depth_cells import (
    PLAIN,
    SKIP,
    arm_depth,
    depth_arms,
    drafting_of,
    plain_arm,
)
from gpufleet.control.tune.goal import GOAL, goal_text, share_text
from gpufleet.control.tune.levels import ArmKey, Cells, objective
from gpufleet.report import catalogue


def verification_arms(profile: str, tuned_profile: str) -> list[ArmSpec]:
    """Tuned against both things it must match: no drafting, and the profile's own static
    speculation (the profile without its adaptive flags)."""
    base = load_profile(profile)
    drafting = drafting_of(base)
    return [
        plain_arm(profile, base, drafting),
        ArmSpec(profile, {}, 1, f"{profile_label(profile)}-static",
                remove=list(drafting.static_remove) if drafting.adaptive else []),
        ArmSpec(tuned_profile, {}, 1, profile_label(tuned_profile)),
    ]  # fmt: skip


@dataclass
class VerdictRow:
    """One level of the verification: the side the tuned server must match, the figures and how
    much of it the tuned server kept."""

    concurrency: int
    winner: str  # "speculation" or "no drafting": which the tuned server must match
    per_request: dict[str, float]  # arm -> median per-request tok/s
    throughput: dict[str, float]  # arm -> output tok/s
    kept: float  # tuned / winner on the winner's figure
    best_static: str | None = None  # the best static cell the tune measured at this level
    best_static_tps: float | None = None  # its objective (steady-window output tok/s)
    kept_best: float | None = None  # the tuned server's objective / that


def _cell_name(key: ArmKey) -> str:
    return {PLAIN: "plain", SKIP: "depth 0 (skip)"}.get(key, f"depth {key}")


def best_static(measured: Cells, c: int) -> tuple[str, float] | None:
    """The best cell the tune measured at level c that it could have kept (not rejected):
    its name and objective figure."""
    key = _best_key(measured, c)
    if key is None:
        return None
    return _cell_name(key), float(measured[key][c][catalogue.THROUGHPUT])


def beside_arms(profile: str, checks: list[ArmSpec], measured: Cells,
                repeats: int = 2) -> list[ArmSpec]:  # fmt: skip
    """The verification's cells: the checks, and the static depth the tune measured best
    at each level (where the checks lack it), all launched `repeats` times, interleaved, so
    the tuned server is judged beside the server it must match, not against a figure from
    another hour."""
    levels = sorted({c for cells in measured.values() for c in cells})
    best = {key for c in levels if (key := _best_key(measured, c)) is not None and key != PLAIN}
    depths = sorted(k for k in best if isinstance(k, int) and k > 0)
    extra = [a for a in depth_arms(profile, depths) if arm_depth(a) in best]
    arms = [*checks, *extra]
    return interleaved(arms, repeats)


def _best_key(measured: Cells, c: int) -> ArmKey | None:
    """The key of the best cell measured at level c, a rejected one only if all are."""
    cells = {k: levels[c] for k, levels in measured.items() if c in levels}
    usable = {k: cell for k, cell in cells.items() if not cell.get("rejected")} or cells
    return max(usable, key=lambda k: usable[k][catalogue.THROUGHPUT]) if usable else None


def verdict(arms: list[Any], measured: Cells | None = None) -> tuple[list[VerdictRow], str]:
    """Per level: the tuned server against the better of no drafting and static
    speculation, on the figure where that one wins (per-request speed for speculation,
    total throughput for no drafting), and against the best static server measured beside
    it (the arms after the third), else the best cell of the tune's own `measured` figures;
    and the one-sentence answer, both bars said, and every level below GOAL named."""
    base, static, tuned, *statics = arms
    levels = sorted(set(base.levels) & set(static.levels) & set(tuned.levels))
    rows = [_row(c, base, static, tuned, statics=statics, measured=measured) for c in levels]
    return rows, _sentence(tuned.label, rows)


def _row(c: int, base: Any, static: Any, tuned: Any, *, statics: list[Any],
         measured: Cells | None) -> VerdictRow:  # fmt: skip
    """One level of the verification."""
    arms = [base, static, tuned]
    per = {a.label: float(a.levels[c].row.median_per_request_output_tps or 0) for a in arms}
    tput = {a.label: float(a.levels[c].row.output_throughput or 0) for a in arms}
    if per[static.label] > per[base.label]:
        winner, kept = "speculation", per[tuned.label] / per[static.label]
    else:
        winner, kept = "no drafting", tput[tuned.label] / tput[base.label]
    row = VerdictRow(c, winner, per, tput, kept)
    beside = [a for a in (base, static, *statics) if c in a.levels]
    if statics and beside:
        top = max(beside, key=lambda a: objective(a.levels[c].row)[0])
        bar: tuple[str, float] | None = (top.label, objective(top.levels[c].row)[0])
    else:
        bar = best_static(measured, c) if measured else None
    if bar is not None and bar[1]:
        row.best_static, row.best_static_tps = bar
        row.kept_best = objective(tuned.levels[c].row)[0] / bar[1]
    return row


def shortfalls(rows: list[VerdictRow]) -> list[str]:
    """Each level where the tuned server kept less than GOAL of the best static, with both
    figures."""
    return [
        f"C={r.concurrency}: {share_text(r.kept_best)} of {r.best_static} ({objective_text(r)})"
        for r in rows
        if r.kept_best is not None and r.kept_best < GOAL
    ]


def below_goal(rows: list[VerdictRow]) -> str:
    """The sentence's and the last line's words for the levels below the goal ("" if none)."""
    short = shortfalls(rows)
    return f"below the {goal_text()} goal at " + "; ".join(short) if short else ""


def objective_text(r: VerdictRow) -> str:
    """The tuned server's objective beside the best static's, as the shortfall says them."""
    tuned = (r.kept_best or 0.0) * (r.best_static_tps or 0.0)
    return f"tuned {tuned:.0f} vs {r.best_static_tps:.0f} tok/s"


def _at_worst(rows: list[VerdictRow], kept: Any, name: Any, sep: str) -> tuple[str, str]:
    """(the worst share as printed, every level printed at it): ties at the printed
    precision are all named, so no level as bad as the one named goes unsaid."""
    low = share_text(min(kept(r) for r in rows))
    return low, sep.join(name(r) for r in rows if share_text(kept(r)) == low)


def _sentence(label: str, rows: list[VerdictRow]) -> str:
    spec = [r for r in rows if r.winner == "speculation"]
    plain = [r for r in rows if r.winner == "no drafting"]
    parts = []
    if spec:
        r = spec[0]
        parts.append(f"{share_text(r.kept)} of static speculation's per-request speed at "
                     f"C={r.concurrency}")  # fmt: skip
    if plain:
        r = plain[-1]
        parts.append(f"{share_text(r.kept)} of no-drafting throughput at C={r.concurrency}")
    text = f"{label} keeps " + " and ".join(parts) if parts else "no common levels"
    if rows:
        low, where = _at_worst(rows, lambda r: r.kept, lambda r: f"C={r.concurrency}", ", ")
        text += f"; its worst level is {where} at {low}"
    judged = [r for r in rows if r.kept_best is not None]
    if judged:
        low, where = _at_worst(judged, lambda r: r.kept_best,
                               lambda r: f"C={r.concurrency}, {r.best_static}", "; ")  # fmt: skip
        text += f". Against the best static server at each level it keeps {low} at worst ({where})"
    short = below_goal(rows)
    if short:
        text += ". " + short[0].upper() + short[1:]
    return text + "."
