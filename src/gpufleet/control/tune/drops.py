"""What `--budget` may drop from a tune, least informative first (budget.py's module
docstring has the order and why): the bursts, the load step, the replay of the user's
trace, depth 0's skip variant, then
drafting depths, deepest first, or every depth past one that measured below the depth
before it at every level. The verification is never among them."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.control.tune import depth_cells as tunecells
from gpufleet.control.tune.stages import BURST, MEASURE, STAGE_NAMES, STEP, TRACE


@dataclass(frozen=True)
class DropUnit:
    """Cells `--budget` drops together, and the reason it gives."""

    keys: tuple[tuple[str, str], ...]  # (stage, arm key)
    what: str
    why: str


def depth_of(arm: ArmSpec) -> int | None:
    """A drafting measurement cell's static depth (None for plain and depth 0's cells)."""
    depth = tunecells.arm_depth(arm)
    return depth if isinstance(depth, int) and depth > 0 else None


def drop_order(
    measure: list[ArmSpec], stages: Iterable[tuple[str, list[str]]],
    falling_from: int | None = None, depths: bool = True,
) -> list[DropUnit]:  # fmt: skip
    """The units `--budget` may drop, least informative first (the module's list; the
    verification is not among them).
    `falling_from`: the first depth that measured below the depth before it at every
    level, if any (the depths deeper than it go before the others). `depths`: whether
    the user let the budget drop drafting depths they asked for (`--budget-may-drop
    depths`, issue 83); without it every requested depth is measured or the tune is
    refused."""
    by_stage = dict(stages)
    units = []
    for stage, why in (
        (BURST, "the verification's burst replay: an extra verdict on a table the "
                "verification judges level by level"),
        (STEP, "the load step: an extra verdict on a table the verification judges level "
               "by level"),
        (TRACE, "the replay of your trace: an extra verdict on a table the verification "
                "judges level by level"),
    ):  # fmt: skip
        if by_stage.get(stage):
            keys = tuple((stage, key) for key in by_stage[stage])
            units.append(DropUnit(keys, STAGE_NAMES[stage], why))
    skip = [a for a in measure if a.env and depth_of(a) is None]
    units += [
        DropUnit(((MEASURE, a.key),), a.label,
                 "depth 0 stays measured as SGLang runs it by default")
        for a in skip
    ]  # fmt: skip
    drafting = sorted((d, a) for a in measure if (d := depth_of(a)) is not None)
    if not depths:
        return units
    keep = drafting[:1]  # the shallowest drafting depth: the table needs one
    deepest_first = sorted(drafting[1:], key=lambda da: -da[0])
    if falling_from is not None:
        falling = [(d, a) for d, a in deepest_first if d > falling_from]
        others = [(d, a) for d, a in deepest_first if d <= falling_from]
        deepest_first = falling + others
    for d, a in deepest_first:
        if (d, a) in keep:
            continue
        why = (
            f"depth {falling_from} measured below the depth before it at every level, so a "
            "longer draft only adds cost"
            if falling_from is not None and d > falling_from
            else "the deepest left: deep drafts pay off only at the lowest loads"
        )
        units.append(DropUnit(((MEASURE, a.key),), a.label, why))
    return units


def falling_depth(measured: dict[int, dict[int, float]]) -> int | None:
    """The first drafting depth whose objective measured below the previous depth's at
    every shared level (depth -> C -> output tok/s), or None."""
    depths = sorted(d for d in measured if d >= 1)
    for shallower, deeper in itertools.pairwise(depths):
        shared = set(measured[shallower]) & set(measured[deeper])
        if shared and all(measured[deeper][c] < measured[shallower][c] for c in shared):
            return deeper
    return None
