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

import statistics
from dataclasses import dataclass, field

from gpufleet.errors import UserError
from gpufleet.fleet import estimate as est
from gpufleet.fleet.estimate import Estimate, estimate, ratio
from gpufleet.fleet.index import PROMPT_SET, Index, IndexedRun, Row
from gpufleet.fleet.outliers import (
    DEFAULT_METRIC,
    DEFAULT_THRESHOLD,
    client_mark,
    damaged_said,
    metric_named,
    ok_values,
    rounds_by_host,
    run_noise,
)
from gpufleet.report import catalogue
from gpufleet.report.fingerprint import Fact


class Verdict:
    FASTER = "faster"
    SLOWER = "slower"
    SAME = "no difference"
    UNKNOWN = "no interval"
    SUSPECT = "suspect"  # "suspect slower": one round, nothing recorded changed
    UNJUDGED = "not judged"  # the client marked the newest round's level late or bound


OWN_ROUNDS = 4  # baseline rounds that give a host's own run-to-run spread (three changes)


@dataclass
class HistoryLevel:
    concurrency: int
    before: Estimate
    after: Estimate
    ratio: float
    interval: tuple[float, float] | None
    verdict: str
    change: float  # signed, better is positive: +0.03 = 3% better
    note: str | None = None  # why no verdict: the client's mark, no run-to-run spread


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

    def suspects(self) -> list[HistoryLevel]:
        """Levels off in the newest round only, nothing recorded changed (measure again)."""
        return [lv for lv in self.levels if lv.verdict.startswith(Verdict.SUSPECT)]

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


class FleetNoise:
    """The fleet's between-round spread at each level (estimate.between_rounds_sd), from
    every host's rounds of one profile of the asked run's prompt set and GPU model: read
    once for all the histories of a profile."""

    def __init__(self, runs: list[IndexedRun]) -> None:
        self.runs = [r for r in runs if r.usable and r.rows]
        self.found: dict[tuple, tuple[float, int] | None] = {}

    def at(self, newest: IndexedRun, c: int, key: str) -> tuple[float, int] | None:
        kind = (newest.prompt_set, newest.gpu_model, c, key)
        if kind not in self.found:
            same = [r for r in self.runs if (r.prompt_set, r.gpu_model) == kind[:2]]
            self.found[kind] = run_noise(rounds_by_host(same), c, key)[1]
        return self.found[kind]


def host_history(
    index: Index,
    host: str,
    profile: str,
    metric: str = DEFAULT_METRIC,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    noise: FleetNoise | None = None,
) -> HostHistory | None:
    """The newest round of `profile` on `host` against its baseline; None with fewer than
    two comparable rounds."""
    runs = [r for r in index.runs(profile=profile, host=host) if r.usable and r.rows]
    if not runs:
        return None
    if noise is None:
        noise = FleetNoise(index.runs(profile=profile))
    return history_of(runs, profile, metric_named(metric), threshold, noise)


def history_of(
    runs: list[IndexedRun],
    profile: str,
    m: catalogue.Metric,
    threshold: float,
    noise: FleetNoise,
) -> HostHistory:
    """One host's usable runs (oldest first) as a history (host_history)."""
    host = runs[-1].host
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
    same = ([r for r in g if r.fingerprint == settled] for g in earlier)
    baseline_rounds = [g for g in same if g]
    baseline = [r for g in baseline_rounds for r in g]
    levels, judge = [], _Judge(m, threshold, noise)
    concurrencies = sorted({row[catalogue.CONCURRENCY] for r in newest for row in r.rows})
    for c in concurrencies:
        changed = bool(changed_fields(baseline[-1], newest[-1]))
        level = judge.level(newest, baseline_rounds, c, changed=changed)
        if level is not None:
            levels.append(level)
    changes = changed_fields(baseline[-1], newest[-1])
    return HostHistory(host, profile, m, newest, baseline, levels, changes, left_out)


def _rows_at(runs: list[IndexedRun], c: int) -> list[Row]:
    return [row for r in runs for row in r.rows if row[catalogue.CONCURRENCY] == c]


@dataclass(frozen=True)
class _Judge:
    """How one host's levels are judged: the metric, the verdict's threshold and the
    fleet's run-to-run noise (the same for every level and round of the history)."""

    m: catalogue.Metric
    threshold: float
    noise: FleetNoise

    def level(
        self, newest: list[IndexedRun], rounds: list[list[IndexedRun]], c: int, *, changed: bool
    ) -> HistoryLevel | None:
        """One level's verdict on the fleet view's evidence rule. A change with no recorded
        fingerprint field behind it is named only when the round before agrees (off the
        same way against the rounds before it, which then form the baseline); in one round
        alone it is a suspect ("measure again"), which --fail-on-regression does not count."""
        previous = self.compare(rounds[-1], rounds[:-1], c) if len(rounds) >= 2 else None
        confirmed = previous is not None and previous.verdict in (Verdict.SLOWER, Verdict.FASTER)
        level = self.compare(newest, rounds[:-1] if confirmed else rounds, c)
        if level is None or level.verdict not in (Verdict.SLOWER, Verdict.FASTER) or changed:
            return level
        if confirmed and previous is not None and previous.verdict == level.verdict:
            level.note = (f"its previous round ({rounds[-1][-1].run_id}) was "
                          f"{level.verdict} too ({previous.change:+.1%})")  # fmt: skip
            return level
        level.note = ("off in this round only and nothing recorded changed: measure again "
                      "(named when a second round agrees)")  # fmt: skip
        level.verdict = f"{Verdict.SUSPECT} {level.verdict}"
        return level

    def compare(
        self, newest: list[IndexedRun], baseline_rounds: list[list[IndexedRun]], c: int
    ) -> HistoryLevel | None:
        """`newest` against the pooled `baseline_rounds` at `c`: both figures widened by the
        run-to-run term (the larger of this host's own between-round spread, from four
        baseline rounds, and the fleet's); a level the client marked late or bound in the
        newest round is not judged; with no run-to-run term at all, a figure from its
        requests alone gets no interval (its spread is narrower than a relaunch's)."""
        m, threshold, noise = self.m, self.threshold, self.noise
        after = estimate(_rows_at(newest, c), m.key)
        before = estimate([row for g in baseline_rounds for row in _rows_at(g, c)], m.key)
        if after is None or before is None or before.value <= 0 or after.value <= 0:
            return None
        series = [
            statistics.fmean(v)
            for g in baseline_rounds
            if (v := ok_values(_rows_at(g, c), c, m.key))
        ]
        own = est.between_rounds_sd([series]) if len(series) >= OWN_ROUNDS else None
        terms = [(t[0], t[1], source) for t, source in ((own, est.OWN_ROUNDS),
                 (noise.at(newest[-1], c, m.key), est.FLEET_ROUNDS)) if t is not None]  # fmt: skip
        if terms:
            before, after = (est.with_run_noise(e, *max(terms)) for e in (before, after))
        value, interval = ratio(before, after)
        mark = client_mark(_rows_at(newest, c), c)
        verdict, change = _verdict(value, interval, threshold, bool(m.higher_is_better))
        note = None
        if mark is not None:
            verdict, note = Verdict.UNJUDGED, f"not judged: {mark[1]}"
        elif "requests" in (before.source, after.source):
            interval, verdict = None, Verdict.UNKNOWN
            note = (f"no run-to-run spread to judge by (fewer than {OWN_ROUNDS} baseline "
                    "rounds, no other host's rounds): --repeat 3 gives one")  # fmt: skip
        return HistoryLevel(c, before, after, value, interval, verdict, change, note)


def known(index: Index, host: str | None, profile: str | None) -> tuple[list[str], list[str]]:
    """The archive's hosts and profiles; one line (UserError) for a --host or --profile
    the archive has no run of, naming what it has."""
    hosts, profiles = index.hosts(), index.profiles()
    if host is not None and host not in hosts:
        raise UserError(
            f"--host {host!r}: no archived run of that host in "
            f"{index.archive.root}/ (hosts there: {', '.join(hosts) or 'none'})"
            + damaged_said(index.broken_lines(None, host))
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
        noise = FleetNoise(index.runs(profile=p))
        asked = {
            h: host_history(index, h, p, metric, threshold=threshold, noise=noise) for h in wanted
        }
        mine = [f for f in asked.values() if f is not None]
        if any(abs(lv.change) >= threshold / 2 for f in mine for lv in f.levels):
            # did the rest of its round move with it? (read only when it moved)
            rest = [host_history(index, h, p, metric, threshold=threshold, noise=noise)
                    for h in hosts if h not in asked]  # fmt: skip
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
