"""`inv fleet`: which host is off the fleet, at which level, and what differs on it.

Per level, the fleet's figure is the median across hosts and its spread the MAD (scaled
by 1.4826 to a standard deviation): one bad host moves neither, so it cannot hide by
dragging the fleet with it, as it would a mean. A host is named when it is off both
significantly (beyond `critical_z(n)` robust deviations of the fleet, and its own 95%
interval excludes the fleet's median) and materially (its ratio to the median beyond
`threshold`, 5% by default). With few hosts the MAD is itself uncertain, so the bar rises
as Student's t does for a spread from n - 1 degrees of freedom (its 99.5% quantile: 5.8
robust deviations for 4 hosts, 4.0 for 6, 3.5 for 8), never below 3: on a busy CI
machine four stock rehearsal hosts read 0.98-1.05x at C=1 and one was named at a bar
of 3. Fewer than `MIN_HOSTS` hosts name nobody: with two, which one is off cannot be
told. For a named host the fingerprint fields where it differs from the fleet's
majority are listed, or "no recorded difference".
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from gpufleet.errors import UserError
from gpufleet.fleet.estimate import Estimate, estimate, scaled
from gpufleet.fleet.index import Index, IndexedRun
from gpufleet.report import catalogue
from gpufleet.report.fingerprint import Fact
from gpufleet.report.stats import with_interval

DEFAULT_THRESHOLD = 0.05
ROBUST_Z = 3.0  # the least bar, for a large fleet (several hosts and levels are tested)
# Student's t 99.5% quantiles by degrees of freedom (1-30); beyond, the first terms of its
# expansion around the normal 2.576
T995 = [
    63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169,
    3.106, 3.055, 3.012, 2.977, 2.947, 2.921, 2.898, 2.878, 2.861, 2.845,
    2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763, 2.756, 2.750,
]  # fmt: skip
MAD_TO_SD = 1.4826  # a normal distribution's standard deviation over its MAD
MIN_HOSTS = 3
DEFAULT_METRIC = catalogue.THROUGHPUT


@dataclass
class HostFigure:
    """One host at one level: its figure, its ratio to the fleet's median, the verdict."""

    host: str
    estimate: Estimate
    ratio: float
    interval: tuple[float, float] | None
    robust_z: float | None  # None: the fleet has no spread at this level
    named: bool = False
    side: str = ""  # slower or faster, when named


@dataclass
class FleetLevel:
    concurrency: int
    median: float
    spread: float  # 1.4826 x MAD across hosts
    hosts: list[HostFigure]


@dataclass
class NamedHost:
    host: str
    levels: list[int]
    worst: HostFigure
    differences: list[tuple[str, Fact, Fact]]  # (field, this host's, the fleet majority's)


@dataclass
class FleetView:
    profile: str
    metric: catalogue.Metric
    threshold: float
    levels: list[FleetLevel]
    named: list[NamedHost]
    runs: dict[str, list[IndexedRun]]  # host -> the runs its figures come from
    left_out: list[str] = field(default_factory=list)  # "host: why"
    notes: list[str] = field(default_factory=list)


def metric_named(key: str) -> catalogue.Metric:
    """A catalogue metric with a direction (what `--metric` may name)."""
    for m in catalogue.CATALOGUE:
        if m.key == key and m.higher_is_better is not None:
            return m
    known = ", ".join(m.key for m in catalogue.CATALOGUE if m.higher_is_better is not None)
    raise UserError(
        f"--metric {key!r}: expected a figure of results.jsonl with a direction: {known}"
    )


def fleet_profiles(index: Index) -> list[str]:
    """Profiles with finished runs on at least two hosts (what `inv fleet` reads unasked)."""
    hosts: dict[str, set[str]] = {}
    for run in index.runs(rows=False):
        if run.usable and run.profile:
            hosts.setdefault(run.profile, set()).add(run.host)
    return sorted(p for p, h in hosts.items() if len(h) >= 2)


def host_runs(
    runs: list[IndexedRun], latest: bool
) -> tuple[dict[str, list[IndexedRun]], list[str]]:
    """host -> its newest run and that sweep cell's other repeats; with `latest`, only
    hosts whose newest run belongs to the newest round (sweep or bench) of all."""
    newest: dict[str, IndexedRun] = {}
    for run in runs:
        if run.usable and run.rows:
            newest[run.host] = run  # oldest first: the last one wins
    chosen = {
        host: [
            r
            for r in runs
            if r.host == host
            and r.usable
            and r.rows
            and (
                r.run_id == last.run_id
                or (last.cell and r.round_id == last.round_id and r.cell == last.cell)
            )
        ]
        for host, last in newest.items()
    }
    left_out = [
        f"{r.host}: run {r.run_id} {r.status}{' (superseded)' if r.superseded else ''}"
        for r in runs
        if not r.usable and r.host not in newest
    ]
    if latest and newest:
        top = max(newest.values(), key=lambda r: r.started_at).round_id
        for host, last in sorted(newest.items()):
            if last.round_id != top:
                left_out.append(
                    f"{host}: its newest run ({last.run_id}) is not of the newest round ({top})"
                )
                del chosen[host]
    return chosen, left_out


def critical_z(hosts: int) -> float:
    """How many robust deviations off the median name a host in a fleet of `hosts`."""
    dof = max(1, hosts - 1)
    z = 2.5758293035489
    t = T995[dof - 1] if dof <= len(T995) else z + (z**3 + z) / (4 * dof)
    return max(ROBUST_Z, t)


def _judge(level: FleetLevel, threshold: float, higher_is_better: bool) -> None:
    bar = critical_z(len(level.hosts))
    for h in level.hosts:
        off = h.estimate.value - level.median
        if level.spread > 0:
            h.robust_z = off / level.spread
            beyond = abs(h.robust_z) > bar
        else:
            beyond = off != 0
        excludes = h.interval is None or not (h.interval[0] <= 1.0 <= h.interval[1])
        material = abs(h.ratio - 1.0) >= threshold
        h.named = len(level.hosts) >= MIN_HOSTS and beyond and excludes and material
        if h.named:
            h.side = "slower" if (h.ratio < 1.0) == higher_is_better else "faster"


def majority(values: list[Fact]) -> Fact:
    """The value more than half the hosts share, else None."""
    counted = Counter(v for v in values if v is not None).most_common(1)
    return counted[0][0] if counted and counted[0][1] * 2 > len(values) else None


def fingerprint_differences(
    host: str, runs: dict[str, list[IndexedRun]]
) -> list[tuple[str, Fact, Fact]]:
    facts = {h: rs[-1].fingerprint for h, rs in runs.items()}
    out = []
    for label, value in facts[host].items():
        common = majority([f.get(label) for f in facts.values()])
        if value is not None and common is not None and value != common:
            out.append((label, value, common))
    return out


def fleet_view(
    index: Index,
    profile: str,
    metric: str = DEFAULT_METRIC,
    threshold: float = DEFAULT_THRESHOLD,
    latest: bool = False,
) -> FleetView:
    """The fleet's table for one profile (module docstring)."""
    m = metric_named(metric)
    runs = index.runs(profile=profile)
    if not runs:
        raise UserError(
            f"no archived run of profile {profile!r} in {index.archive.root}/ "
            f"(profiles there: {', '.join(index.profiles()) or 'none'})"
        )
    return view_of(runs, profile, m, threshold, latest)


def view_of(
    runs: list[IndexedRun],
    profile: str,
    m: catalogue.Metric,
    threshold: float = DEFAULT_THRESHOLD,
    latest: bool = False,
) -> FleetView:
    """The fleet view of these runs of one profile (oldest first, with their rows)."""
    chosen, left_out = host_runs(runs, latest)
    view = FleetView(profile, m, threshold, [], [], chosen, left_out)
    concurrencies = sorted(
        {r[catalogue.CONCURRENCY] for rs in chosen.values() for x in rs for r in x.rows}
    )
    for c in concurrencies:
        figures = []
        for host, rs in sorted(chosen.items()):
            e = estimate([r for x in rs for r in x.rows if r[catalogue.CONCURRENCY] == c], m.key)
            if e is not None and e.value > 0:
                figures.append((host, e))
        if not figures:
            continue
        values = [e.value for _, e in figures]
        median = statistics.median(values)
        spread = MAD_TO_SD * statistics.median(abs(v - median) for v in values)
        hosts = [HostFigure(h, e, *scaled(e, median), None) for h, e in figures]
        level = FleetLevel(c, median, spread, hosts)
        _judge(level, threshold, bool(m.higher_is_better))
        view.levels.append(level)
    if len(chosen) < MIN_HOSTS:
        view.notes.append(
            f"{len(chosen)} host(s) of {profile}: at least {MIN_HOSTS} are needed "
            "to tell which one is off (inv compare sets two side by side)"
        )
    for host in sorted(chosen):
        mine = [h for lv in view.levels for h in lv.hosts if h.host == host and h.named]
        if mine:
            worst = max(mine, key=lambda h: abs(h.ratio - 1.0))
            levels = [
                lv.concurrency for lv in view.levels for h in lv.hosts if h.host == host and h.named
            ]
            view.named.append(NamedHost(host, levels, worst, fingerprint_differences(host, chosen)))
    return view


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


def named_sentence(view: FleetView, named: NamedHost) -> str:
    """`sim-d is 19.0% slower than the fleet's median at C=1,10 (0.810x [0.808-0.812] at
    C=10); it differs in: application clocks (MHz) 1600 x8 (fleet: 1980 x8)`."""
    w = named.worst
    pct = abs(w.ratio - 1.0) * 100
    at = ",".join(str(c) for c in named.levels)
    c = next(lv.concurrency for lv in view.levels if w in lv.hosts)
    ratio = with_interval(w.ratio, w.interval, places=3, suffix="x")
    if named.differences:
        diff = "; ".join(difference_text(*d) for d in named.differences)
        why = f"it differs from the fleet's majority in: {diff}"
    else:
        why = "no recorded fingerprint field differs from the fleet's majority"
    return (
        f"{named.host} is {pct:.1f}% {w.side} than the fleet's median "
        f"{view.metric.label} at C={at} ({ratio} at C={c}); {why}"
    )
