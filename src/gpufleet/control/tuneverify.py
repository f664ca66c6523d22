"""The tune's verification, level by level: the tuned server against the better of no
drafting and the profile's own static speculation (control/tunestep.py judges the load
step and the bursts); control/tune.py chooses the table it verifies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.control.arms import ArmSpec, profile_label
from gpufleet.control.tune import PLAIN, SPEC_FLAGS


def verification_arms(profile: str, tuned_profile: str) -> list[ArmSpec]:
    """Tuned against both things it must match: no drafting, and the profile's own static
    speculation (the profile without its adaptive flags)."""
    name = profile_label(profile)
    return [
        ArmSpec(profile, {}, 1, f"{name}[{PLAIN}]", remove=list(SPEC_FLAGS)),
        ArmSpec(profile, {}, 1, f"{name}-static",
                remove=["speculative-adaptive", "speculative-adaptive-config"]),
        ArmSpec(tuned_profile, {}, 1, profile_label(tuned_profile)),
    ]  # fmt: skip


@dataclass
class VerdictRow:
    concurrency: int
    winner: str  # "speculation" or "no drafting": which the tuned server must match
    per_request: dict[str, float]  # arm -> median per-request tok/s
    throughput: dict[str, float]  # arm -> output tok/s
    kept: float  # tuned / winner on the winner's figure


def verdict(arms: list[Any]) -> tuple[list[VerdictRow], str]:
    """Per level: the tuned server against the better of no drafting and static
    speculation, on the figure where that one wins (per-request speed for speculation,
    total throughput for no drafting); and the one-sentence answer."""
    base, static, tuned = arms
    levels = sorted(set(base.levels) & set(static.levels) & set(tuned.levels))
    rows = []
    for c in levels:
        per = {a.label: float(a.levels[c].row.median_per_request_output_tps or 0) for a in arms}
        tput = {a.label: float(a.levels[c].row.output_throughput or 0) for a in arms}
        if per[static.label] > per[base.label]:
            winner, kept = "speculation", per[tuned.label] / per[static.label]
        else:
            winner, kept = "no drafting", tput[tuned.label] / tput[base.label]
        rows.append(VerdictRow(c, winner, per, tput, kept))
    spec = [r for r in rows if r.winner == "speculation"]
    plain = [r for r in rows if r.winner == "no drafting"]
    parts = []
    if spec:
        r = spec[0]
        parts.append(f"{r.kept:.0%} of static speculation's per-request speed at C={r.concurrency}")
    if plain:
        r = plain[-1]
        parts.append(f"{r.kept:.0%} of no-drafting throughput at C={r.concurrency}")
    worst = min(rows, key=lambda r: r.kept) if rows else None
    text = f"{tuned.label} keeps " + " and ".join(parts) if parts else "no common levels"
    if worst is not None:
        text += f"; its worst level is C={worst.concurrency} at {worst.kept:.0%}"
    return rows, text + "."
