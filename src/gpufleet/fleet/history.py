"""`inv history`: did this host get slower (or faster) since its earlier runs, and what
changed between them.

For one host and profile, the newest round (its newest run and that sweep cell's
repeats) is set against a baseline: the earlier rounds that share the fingerprint of the
round just before the newest, i.e. the settled state before the last change ("last week,
before the upgrade"), pooled. Per level: the ratio newest / baseline with compare's
statistics (estimate.py) and a verdict; the fingerprint fields that changed between the
baseline and the newest round are named ("engine version: 0.5.22 -> 0.5.23"). Runs of
another prompt set or GPU model are never mixed in silently: they are listed as left out.
When most hosts of a round (three or more) moved the same way at a level, by half the
threshold or more, each history of that round says so (`fleet_moved`): a shared cause,
not this host's alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.errors import UserError
from gpufleet.fleet.estimate import Estimate, estimate, ratio
from gpufleet.fleet.index import PROMPT_SET, Index, IndexedRun
from gpufleet.fleet.outliers import DEFAULT_METRIC, DEFAULT_THRESHOLD, metric_named
from gpufleet.report import catalogue
from gpufleet.report.fingerprint import Fact


class Verdict:
    FASTER = "faster"
    SLOWER = "slower"
    SAME = "no difference"
    UNKNOWN = "no interval"


@dataclass
class HistoryLevel:
    concurrency: int
    before: Estimate
    after: Estimate
    ratio: float
    interval: tuple[float, float] | None
    verdict: str
    change: float  # signed, better is positive: +0.03 = 3% better


@dataclass
class HostHistory:
    host: str
    profile: str
    metric: catalogue.Metric
    newest: list[IndexedRun]
    baseline: list[IndexedRun]
    levels: list[HistoryLevel]
    changes: list[tuple[str, Fact, Fact]]  # (field, baseline's, newest's)
    left_out: list[str] = field(default_factory=list)
    fleet_moved: str | None = None  # most hosts of this round moved the same way

    def regressions(self, drop: float) -> list[HistoryLevel]:
        """Levels significantly worse by more than `drop` (0.05 = 5%)."""
        return [lv for lv in self.levels if lv.verdict == Verdict.SLOWER and -lv.change > drop]


def _rounds(runs: list[IndexedRun]) -> list[list[IndexedRun]]:
    """The runs grouped by round (a sweep cell's repeats together), oldest first."""
    groups: dict[tuple[str, str | None], list[IndexedRun]] = {}
    for run in runs:
        key = (run.round_id, run.cell) if run.cell else (run.run_id, None)
        groups.setdefault(key, []).append(run)
    return sorted(groups.values(), key=lambda g: g[-1].started_at)


def _comparable(newest: IndexedRun, run: IndexedRun) -> str | None:
    """Why `run` cannot be set against `newest`, or None."""
    for label, a, b in (
        (PROMPT_SET, newest.prompt_set, run.prompt_set),
        ("GPU model", newest.gpu_model, run.gpu_model),
    ):
        if a != b:
            return f"another {label} ({b or 'unrecorded'}, newest: {a or 'unrecorded'})"
    return None


def changed_fields(before: IndexedRun, after: IndexedRun) -> list[tuple[str, Fact, Fact]]:
    return [
        (label, before.fingerprint.get(label), value)
        for label, value in after.fingerprint.items()
        if before.fingerprint.get(label) != value
        and value is not None
        and before.fingerprint.get(label) is not None
    ]


def _verdict(
    value: float, interval: tuple[float, float] | None, threshold: float, higher: bool
) -> tuple[str, float]:
    change = (value - 1.0) if higher else (1.0 / value - 1.0)
    if interval is None:
        return Verdict.UNKNOWN, change
    if interval[0] <= 1.0 <= interval[1] or abs(value - 1.0) < threshold:
        return Verdict.SAME, change
    return (Verdict.FASTER if change > 0 else Verdict.SLOWER), change


def host_history(
    index: Index,
    host: str,
    profile: str,
    metric: str = DEFAULT_METRIC,
    threshold: float = DEFAULT_THRESHOLD,
) -> HostHistory | None:
    """The newest round of `profile` on `host` against its baseline; None with fewer than
    two comparable rounds."""
    m = metric_named(metric)
    runs = [r for r in index.runs(profile=profile, host=host) if r.usable and r.rows]
    if not runs:
        return None
    rounds = _rounds(runs)
    newest = rounds[-1]
    left_out, earlier = [], []
    for group in rounds[:-1]:
        why = _comparable(newest[-1], group[-1])
        if why:
            left_out += [f"{r.run_id}: {why}" for r in group]
        else:
            earlier.append(group)
    if not earlier:
        return HostHistory(host, profile, m, newest, [], [], [], left_out)
    settled = earlier[-1][-1].fingerprint
    baseline = [r for g in earlier for r in g if r.fingerprint == settled]
    levels = []
    concurrencies = sorted({row[catalogue.CONCURRENCY] for r in newest for row in r.rows})
    for c in concurrencies:
        after = estimate(
            [row for r in newest for row in r.rows if row[catalogue.CONCURRENCY] == c], m.key
        )
        before = estimate(
            [row for r in baseline for row in r.rows if row[catalogue.CONCURRENCY] == c], m.key
        )
        if after is None or before is None or before.value <= 0:
            continue
        value, interval = ratio(before, after)
        verdict, change = _verdict(value, interval, threshold, bool(m.higher_is_better))
        levels.append(HistoryLevel(c, before, after, value, interval, verdict, change))
    changes = changed_fields(baseline[-1], newest[-1])
    return HostHistory(host, profile, m, newest, baseline, levels, changes, left_out)


def known(index: Index, host: str | None, profile: str | None) -> tuple[list[str], list[str]]:
    """The archive's hosts and profiles; one line (UserError) for a --host or --profile
    the archive has no run of, naming what it has."""
    hosts, profiles = index.hosts(), index.profiles()
    if host is not None and host not in hosts:
        raise UserError(
            f"--host {host!r}: no archived run of that host in "
            f"{index.archive.root}/ (hosts there: {', '.join(hosts) or 'none'})"
        )
    if profile is not None and profile not in profiles:
        raise UserError(
            f"--profile {profile!r}: no archived run of that profile in "
            f"{index.archive.root}/ (profiles there: {', '.join(profiles) or 'none'})"
        )
    return hosts, profiles


def histories(
    index: Index,
    host: str | None = None,
    profile: str | None = None,
    metric: str = DEFAULT_METRIC,
    threshold: float = DEFAULT_THRESHOLD,
) -> list[HostHistory]:
    """Every (host, profile) with runs, filtered; a host or profile not in the archive is
    one line (UserError)."""
    hosts, profiles = known(index, host, profile)
    out = []
    for p in [profile] if profile else profiles:
        wanted = [host] if host else hosts
        asked = {h: host_history(index, h, p, metric, threshold) for h in wanted}
        mine = [f for f in asked.values() if f is not None]
        if any(abs(lv.change) >= threshold / 2 for f in mine for lv in f.levels):
            # did the rest of its round move with it? (read only when it moved)
            rest = [host_history(index, h, p, metric, threshold) for h in hosts if h not in asked]
            moved = _fleet_moves(mine + [f for f in rest if f is not None], threshold / 2)
        else:
            moved = {}
        for found in mine:
            found.left_out += index.broken_lines(p, found.host)
            found.fleet_moved = moved.get(found.newest[-1].round_id)
            out.append(found)
    return sorted(out, key=lambda h: (h.host, h.profile))


def _fleet_moves(found: list[HostHistory], least: float) -> dict[str, str]:
    """round id -> what most of its hosts (three or more) did alike at some level: moved
    by `least` or more the same way (significant or not: together they are)."""
    rounds: dict[str, list[HostHistory]] = {}
    for h in found:
        if h.levels:
            rounds.setdefault(h.newest[-1].round_id, []).append(h)
    out = {}
    for round_id, group in rounds.items():
        said = []
        for c in sorted({lv.concurrency for h in group for lv in h.levels}):
            for verdict, sign in ((Verdict.SLOWER, -1), (Verdict.FASTER, 1)):
                alike = [lv.change for h in group for lv in h.levels
                         if lv.concurrency == c and lv.change * sign >= least]  # fmt: skip
                if len(group) >= 3 and len(alike) * 2 > len(group):
                    median = sorted(alike)[len(alike) // 2]
                    said.append(f"C={c}: {len(alike)} of {len(group)} hosts {verdict} "
                                f"(median {median:+.1%})")  # fmt: skip
        if said:
            out[round_id] = "the whole fleet moved in this round: " + "; ".join(said)
    return out


def left_out_elsewhere(
    index: Index, found: list[HostHistory], host: str | None, profile: str | None
) -> list[str]:
    """The damaged runs (index.broken_lines) of hosts and profiles no history reads: a host
    whose only run is damaged is still named."""
    said = {line for h in found for line in h.left_out}
    return [line for line in index.broken_lines(profile, host) if line not in said]
