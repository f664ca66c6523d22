"""What the fleet view says in words: fingerprint values, differences and changes, and the
sentence for each host named, suspected, or only different."""

from __future__ import annotations

from collections import Counter

from gpufleet.fleet.outliers import FleetView, NamedHost, fingerprint_differences
from gpufleet.report.fingerprint import Fact
from gpufleet.report.stats import with_interval


def fact_text(value: Fact) -> str:
    """A fingerprint value in few characters: `700 x8` for eight equal GPUs."""
    if isinstance(value, tuple):
        if value and len(set(value)) == 1:
            return f"{_one(value[0])} x{len(value)}"
        return ",".join(_one(v) for v in value)
    return _one(value)


def difference_text(label: str, mine: Fact, common: Fact) -> str:
    """`power limits (W) 500 x2 (fleet: 700 x2)`; where the GPUs differ one by one,
    only the ones that differ: `application clocks (MHz) 1600 on GPU 3 (fleet: 1980 x8)`."""
    if isinstance(mine, tuple) and isinstance(common, tuple) and len(mine) == len(common):
        odd = [i for i, (a, b) in enumerate(zip(mine, common, strict=True)) if a != b]
        if len(odd) < len(mine) and len(set(common)) == 1:
            where = ", ".join(f"{_one(mine[i])} on GPU {i}" for i in odd)
            return f"{label} {where} (fleet: {fact_text(common)})"
    return f"{label} {fact_text(mine)} (fleet: {fact_text(common)})"


def change_text(label: str, before: Fact, after: Fact) -> str:
    """`engine version 0.5.22 -> 0.5.23`; per GPU, only the GPUs that changed:
    `application clocks (MHz) on GPU 3 1980 -> 1600`."""
    if isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after):
        odd = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
        if len(odd) < len(before):
            return "; ".join(f"{label} on GPU {i} {_one(before[i])} -> {_one(after[i])}"
                             for i in odd)  # fmt: skip
    return f"{label} {fact_text(before)} -> {fact_text(after)}"


def _one(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "-" if value is None else str(value)


def _why(named: NamedHost) -> str:
    if named.differences:
        diff = "; ".join(difference_text(*d) for d in named.differences)
        return f"it differs from the fleet's majority in: {diff}"
    return "no recorded fingerprint field differs from the fleet's majority"


def named_sentence(view: FleetView, named: NamedHost) -> str:
    """`sim-d is 19.0% slower than the fleet's median at C=1,10 (0.810x [0.808-0.812] at
    C=10); it differs in: application clocks (MHz) 1600 x8 (fleet: 1980 x8)`; a host named
    on no differing field says which earlier round agreed, a suspect what to do."""
    w = named.worst
    pct = abs(w.ratio - 1.0) * 100
    at = ",".join(str(c) for c in named.levels)
    c = next(lv.concurrency for lv in view.levels if w in lv.hosts)
    ratio = with_interval(w.ratio, w.interval, places=3, suffix="x")
    said = (
        f"{named.host} is {pct:.1f}% {w.side} than the fleet's median "
        f"{view.metric.label} at C={at} ({ratio} at C={c}); {_why(named)}"
    )
    if named in view.suspect:
        return (
            f"suspect: {said}; off the fleet in this round only: measure again "
            "(named when a second round agrees)"
        )
    if named.confirmed_by and not named.differences:
        said += f"; its previous round ({named.confirmed_by}) was {w.side} too"
    return said


def difference_lines(view: FleetView) -> list[str]:
    """A line for every host whose newest run differs from the majority in a fingerprint
    field, named or not: `gpu03: engine version 0.5.22 (fleet: 0.5.23 on 7 of 8 hosts);
    not off the fleet`."""
    facts = {h: rs[-1].fingerprint for h, rs in view.runs.items()}
    named = {n.host: "named off the fleet" for n in view.named}
    named |= {n.host: "suspect" for n in view.suspect}
    out = []
    for host in sorted(view.runs):
        parts = []
        for label, mine, common in fingerprint_differences(host, view.runs):
            count = Counter(f.get(label) for f in facts.values())[common]
            parts.append(f"{label} {fact_text(mine)} (fleet: {fact_text(common)} on "
                         f"{count} of {len(facts)} hosts)")  # fmt: skip
        if parts:
            out.append(f"{host}: {'; '.join(parts)}; {named.get(host, 'not off the fleet')}")
    return out
