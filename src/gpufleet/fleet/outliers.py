"""`inv fleet`: which host is off the fleet, at which level, and what differs on it.

Per level, the fleet's figure is the median across hosts and its spread the MAD (scaled
by 1.4826 to a standard deviation): one bad host moves neither, so it cannot hide by
dragging the fleet with it, as it would a mean. A host is off the fleet when it is off both
significantly (beyond `critical_z(n)` robust deviations of the fleet, and its own 95%
interval, widened by run-to-run noise (estimate.with_run_noise), excludes the fleet's
median) and materially (its ratio to the median beyond `threshold`, 5% by default). With
few hosts the MAD is itself uncertain, so the bar rises as Student's t does for a spread
from n - 1 degrees of freedom (its 99.5% quantile: 5.8 robust deviations for 4 hosts, 4.0
for 6, 3.5 for 8), never below 3. Fewer than `MIN_HOSTS` hosts name nobody.

One round is not enough evidence by itself: on a busy fleet one or two stock hosts read
12% slow in one round of nine (a shared slow moment). A host off the fleet is named when
a fingerprint field differs from the fleet's majority, or when its previous round was off
on the same side too; otherwise it is a suspect ("measure again"), which exits 0. A level
the client marked late or client-bound (results.jsonl's client_late, client_bound) is not
judged: its figure says more about the client than the host (when most hosts' levels are
late, that is the fleet's condition, and they are judged together). Only runs of the majority's
prompt set and GPU model are compared; the rest are left out by name.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from gpufleet.errors import UserError
from gpufleet.fleet import estimate as est
from gpufleet.fleet.estimate import Estimate, estimate, scaled
from gpufleet.fleet.index import Index, IndexedRun, Row
from gpufleet.report import catalogue
from gpufleet.report.fingerprint import Fact

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


CLIENT_MARKS = (("client_late", "the client's timers fired late"),
                ("client_bound", "the client set the pace"))  # fmt: skip


@dataclass
class HostFigure:
    """One host at one level: its figure, its ratio to the fleet's median, the verdict."""

    host: str
    estimate: Estimate
    ratio: float
    interval: tuple[float, float] | None
    robust_z: float | None  # None: the fleet has no spread at this level
    off: bool = False  # off the fleet in this round (named or suspect)
    named: bool = False
    side: str = ""  # slower or faster, when off
    unjudged: str | None = None  # why this level is not judged (the client's mark)


@dataclass
class FleetLevel:
    concurrency: int
    median: float
    spread: float  # 1.4826 x MAD across hosts
    hosts: list[HostFigure]


@dataclass
class NamedHost:
    """A host off the fleet: named (a field differs, or its previous round agrees) or a
    suspect (this round only)."""

    host: str
    levels: list[int]
    worst: HostFigure
    differences: list[tuple[str, Fact, Fact]]  # (field, this host's, the fleet majority's)
    confirmed_by: str | None = None  # the previous round's run that was off the same way


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
    suspect: list[NamedHost] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)  # "host at C=10: why"


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


def comparable_runs(runs: list[IndexedRun]) -> tuple[list[IndexedRun], list[str]]:
    """The runs of the prompt set and GPU model most hosts' newest runs have, and a line
    for each run left out (history's rule: never compared silently)."""
    newest = {r.host: r for r in runs if r.usable and r.rows}
    kinds = Counter((r.prompt_set, r.gpu_model) for r in newest.values())
    if len(kinds) <= 1:
        return runs, []
    (prompts, gpu), count = max(kinds.items(), key=lambda kv: (kv[1], str(kv[0])))
    kept, left_out = [], []
    for r in runs:
        pairs = (("prompt set", r.prompt_set, prompts), ("GPU model", r.gpu_model, gpu))
        why = [
            f"another {label} ({mine or 'unrecorded'}; fleet: {common or 'unrecorded'} on "
            f"{count} of {len(newest)} hosts)"
            for label, mine, common in pairs
            if mine != common
        ]
        if not why:
            kept.append(r)
        elif r.usable and r.rows:
            left_out.append(f"{r.host}: run {r.run_id}: {'; '.join(why)}")
    return kept, left_out


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
    judged = [h for h in level.hosts if h.unjudged is None]
    bar = critical_z(len(judged))
    for h in judged:
        off = h.estimate.value - level.median
        if level.spread > 0:
            h.robust_z = off / level.spread
            beyond = abs(h.robust_z) > bar
        else:
            beyond = off != 0
        excludes = h.interval is None or not (h.interval[0] <= 1.0 <= h.interval[1])
        material = abs(h.ratio - 1.0) >= threshold
        h.off = len(judged) >= MIN_HOSTS and beyond and excludes and material
        if h.off:
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
            + damaged_said(index.broken_lines(profile))
        )
    view = view_of(runs, profile, m, threshold, latest=latest)
    view.left_out += index.broken_lines(profile)
    return view


def damaged_said(broken: list[str]) -> str:
    """`; 2 run(s) left out as damaged: gpu00: run R: why; ...`, or nothing: a view with
    nothing left to show says why when damage took it."""
    if not broken:
        return ""
    more = f"; and {len(broken) - 3} more (inv runs --verify)" if len(broken) > 3 else ""
    return f"; {len(broken)} run(s) left out as damaged: {'; '.join(broken[:3])}{more}"


def ok_values(rows: list[Row], c: int, key: str) -> list[float]:
    return [
        float(v)
        for r in rows
        if r[catalogue.CONCURRENCY] == c
        and r.get(catalogue.STATUS) in (None, "ok")
        and isinstance(v := r.get(key), int | float)
    ]


def client_mark(rows: list[Row], c: int) -> tuple[str, str] | None:
    """(mark, what it says) of the level's first row the client marked, else None."""
    for r in rows:
        if r[catalogue.CONCURRENCY] != c:
            continue
        for key, meaning in CLIENT_MARKS:
            if r.get(key):
                return key, f"{meaning} ({str(r.get(key))[:120]})"
    return None


def _unjudged(view: FleetView, c: int, marks: dict[str, tuple[str, str] | None]) -> dict[str, str]:
    """host -> why its level is not judged. A late client on a few hosts is a disturbed
    moment on those hosts; on most of them it is the fleet's condition (a busy rehearsal
    machine), where the hosts are still alike, so they are judged together, said once.
    A client-bound level is never judged: its figures are the client's."""
    late = [h for h, m in marks.items() if m and m[0] == "client_late"]
    if len(late) * 2 > len(marks):
        view.notes.append(
            f"C={c}: the client's timers fired late on {len(late)} of {len(marks)} hosts: "
            "judged together (the whole fleet's condition, not one host's)"
        )
        return {h: m[1] for h, m in marks.items() if m and m[0] != "client_late"}
    return {h: m[1] for h, m in marks.items() if m}


def rounds_by_host(runs: list[IndexedRun]) -> dict[str, list[list[IndexedRun]]]:
    """Each host's usable runs grouped by round (a sweep cell's repeats together), oldest
    first."""
    out: dict[str, dict[tuple[str, str | None], list[IndexedRun]]] = {}
    for r in runs:
        if r.usable and r.rows:
            key = (r.round_id, r.cell) if r.cell else (r.run_id, None)
            out.setdefault(r.host, {}).setdefault(key, []).append(r)
    return {h: list(groups.values()) for h, groups in out.items()}


def run_noise(
    rounds: dict[str, list[list[IndexedRun]]], c: int, key: str
) -> tuple[dict[str, list[float]], tuple[float, int] | None]:
    """Each host's figure at `c` per round, oldest first, and the fleet's between-round
    spread (estimate.between_rounds_sd)."""
    series: dict[str, list[float]] = {}
    for host, groups in rounds.items():
        for g in groups:
            values = ok_values([row for r in g for row in r.rows], c, key)
            if values:
                series.setdefault(host, []).append(statistics.fmean(values))
    return series, est.between_rounds_sd(list(series.values()))


def _widened(e: Estimate, mine: list[float], fleet: tuple[float, int] | None,
             across: tuple[float, int]) -> Estimate:  # fmt: skip
    """`e` with a run-to-run term: the larger of the host's own (its earlier rounds'
    changes) and the fleet's between-round spread, else the fleet's spread across hosts."""
    own = est.between_rounds_sd([mine[:-1]]) if len(mine) > 4 else None  # 4 earlier rounds
    terms = ((own, est.OWN_ROUNDS), (fleet, est.FLEET_ROUNDS))
    found = [(term[0], term[1], source) for term, source in terms if term is not None]
    if found:
        return est.with_run_noise(e, *max(found))
    return est.with_run_noise(e, *across, est.FLEET_SPREAD)


def view_of(
    runs: list[IndexedRun],
    profile: str,
    m: catalogue.Metric,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    latest: bool = False,
    confirm: bool = True,
) -> FleetView:
    """The fleet view of these runs of one profile (oldest first, with their rows); with
    `confirm`, a host off the fleet with no differing field is named only when the view
    of the rounds before agrees (module docstring)."""
    runs, other_kind = comparable_runs(runs)
    chosen, left_out = host_runs(runs, latest)
    view = FleetView(profile, m, threshold, [], [], chosen, left_out + other_kind)
    rounds = rounds_by_host(runs)
    concurrencies = sorted(
        {r[catalogue.CONCURRENCY] for rs in chosen.values() for x in rs for r in x.rows}
    )
    for c in concurrencies:
        level = _level(view, c, rounds)
        if level is not None:
            view.levels.append(level)
    if len(chosen) < MIN_HOSTS:
        view.notes.append(
            f"{len(chosen)} host(s) of {profile}: at least {MIN_HOSTS} are needed "
            "to tell which one is off (inv compare sets two side by side)"
        )
    before = _previous(runs, chosen, profile, m, threshold) if confirm else {}
    for host in sorted(chosen):
        mine = [h for lv in view.levels for h in lv.hosts if h.host == host and h.off]
        if not mine:
            continue
        worst = max(mine, key=lambda h: abs(h.ratio - 1.0))
        levels = [lv.concurrency for lv in view.levels for h in lv.hosts if h in mine]
        found = NamedHost(host, levels, worst, fingerprint_differences(host, chosen))
        agree = before.get((host, worst.side), ("", set()))
        found.confirmed_by = agree[0] if agree[1] & set(levels) else None
        if found.differences or found.confirmed_by or not confirm:
            view.named.append(found)
        else:
            view.suspect.append(found)
        for h in mine:
            h.named = found in view.named
    return view


def _level(view: FleetView, c: int, rounds: dict[str, list[list[IndexedRun]]]) -> FleetLevel | None:
    key = view.metric.key
    series, fleet = run_noise(rounds, c, key)
    figures, marks = [], {}
    for host, rs in sorted(view.runs.items()):
        rows = [r for x in rs for r in x.rows if r[catalogue.CONCURRENCY] == c]
        e = estimate(rows, key)
        if e is not None and e.value > 0:
            figures.append((host, e))
            marks[host] = client_mark(rows, c)
        elif rows:  # a "-" in the table says why in words
            failed = [str(r.get(catalogue.STATUS)) for r in rows
                      if r.get(catalogue.STATUS) not in (None, "ok")]  # fmt: skip
            why = f"the level {failed[0]}" if failed else f"no {view.metric.label} above 0"
            view.unjudged.append(f"{host} at C={c}: not judged: {why}")
    why = _unjudged(view, c, marks)
    view.unjudged += [f"{h} at C={c}: not judged: {text}" for h, text in why.items()]
    judged = [e.value for h, e in figures if h not in why]
    if not judged:
        return None
    median = statistics.median(judged)
    spread = est.MAD_TO_SD * statistics.median(abs(v - median) for v in judged)
    across = (spread / median, max(1, len(judged) - 1))
    hosts = []
    for h, e in figures:
        e = _widened(e, series.get(h, []), fleet, across)
        hosts.append(HostFigure(h, e, *scaled(e, median), None, unjudged=why.get(h)))
    level = FleetLevel(c, median, spread, hosts)
    _judge(level, view.threshold, bool(view.metric.higher_is_better))
    return level


def _previous(
    runs: list[IndexedRun],
    chosen: dict[str, list[IndexedRun]],
    profile: str,
    m: catalogue.Metric,
    threshold: float,
) -> dict[tuple[str, str], tuple[str, set[int]]]:
    """(host, side) -> the run and levels of each host off the fleet in the rounds before
    these (a second round confirms a suspect at one of the same levels)."""
    now = {(r.host, r.run_id) for rs in chosen.values() for r in rs}
    earlier = [r for r in runs if (r.host, r.run_id) not in now]
    if not earlier:
        return {}
    view = view_of(earlier, profile, m, threshold, confirm=False)
    return {
        (n.host, n.worst.side): (view.runs[n.host][-1].run_id, set(n.levels)) for n in view.named
    }
