"""The fleet view on noisy fleets: a seeded census of simulated rounds with shared slow
moments (one to three stock hosts at a time, some marked late by the client), where a
stock host is named at most once in 100 rounds and a 10% slow host of eight in at least
95 of 100; and the rules behind it, one by one."""

from __future__ import annotations

import random

from fleetdata import level_row
from gpufleet.fleet import outliers
from gpufleet.fleet.index import IndexedRun

LEVELS = (1, 10, 64)
BASE = {1: 60.0, 10: 380.0, 64: 780.0}
METRIC = outliers.metric_named("output_throughput")


def _run(host: str, rnd: int, figures: dict[int, float], marks: dict[int, str]) -> IndexedRun:
    rows = []
    for c, value in figures.items():
        row = level_row(c, value, spread=0.05, completed=200)
        if c in marks:
            row["client_late"] = marks[c]
        rows.append(row)
    run_id = f"202611{rnd + 1:02d}T000000Z-baseline-{host}"
    return IndexedRun(host, run_id, "baseline", "done", False, f"2026-11-{rnd + 1:02d}",
                      "sglang", "0.5.23", "coding", "NVIDIA H200", {}, run_id, None,
                      rows)  # type: ignore[arg-type]  # fmt: skip


def noisy_rounds(
    rng: random.Random, hosts: int, rounds: int, slow: dict[str, float], drifts: bool = True
):
    """`rounds` rounds of a fleet: every figure with 1% run-to-run noise; in one round of
    four a shared slow moment takes 7-15% off one to three hosts at one or two adjacent
    levels, marked late by the client half the time (as the issue's round was); in one of
    five (with `drifts`) the whole fleet moves by up to 6% (a shared cause: the ratios keep
    still)."""
    names = [f"gpu{i:02d}" for i in range(hosts)]
    runs = []
    for rnd in range(rounds):
        moved = rng.uniform(0.94, 1.06) if rng.random() < 0.2 else 1.0
        drift = moved if drifts else 1.0
        hit: dict[str, dict[int, float]] = {}
        marked: set[str] = set()
        if rng.random() < 0.25:
            first = rng.randrange(len(LEVELS))
            at = LEVELS[first : first + rng.choice((1, 2))]
            for name in rng.sample(names, rng.randint(1, 3)):
                hit[name] = {c: rng.uniform(0.85, 0.93) for c in at}
                if rng.random() < 0.5:
                    marked.add(name)
        for name in names:
            figures = {
                c: BASE[c] * drift * slow.get(name, 1.0) * hit.get(name, {}).get(c, 1.0)
                * rng.gauss(1.0, 0.01)
                for c in LEVELS
            }  # fmt: skip
            marks = {c: "loop lag p99 41 ms" for c in hit.get(name, {})} if name in marked else {}
            runs.append(_run(name, rnd, figures, marks))
    return runs


def census(seed: int, trials: int = 100, hosts: int = 8) -> dict[str, int]:
    """Rounds judged (each the newest of 2-4), stock hosts named (false names, in rounds
    of stock fleets and of fleets with one slow host), and the slow host named."""
    rng = random.Random(seed)
    found = {"rounds": 0, "false_stock": 0, "false_with_slow": 0, "slow_named": 0,
             "suspects": 0}  # fmt: skip
    for _ in range(trials):
        for slow in ({}, {"gpu05": 0.90}):
            view = outliers.view_of(noisy_rounds(rng, hosts, rng.randint(2, 4), slow),
                                    "baseline", METRIC)  # fmt: skip
            named = {n.host for n in view.named}
            false = bool(named - set(slow))
            found["rounds"] += 1
            found["false_with_slow" if slow else "false_stock"] += false
            found["slow_named"] += "gpu05" in named
            found["suspects"] += len(view.suspect)
    return found


def test_the_noisy_fleet_census_names_the_slow_host_and_no_stock_one():
    """100 fleets of eight without a slow host and 100 with one at 0.90x, each judged on
    its newest round of two to four: stock hosts named in at most 1 of 100 rounds, the slow
    host in at least 95 of 100 (the figures are docs/RELIABILITY.md's)."""
    got = census(seed=81)
    assert got["false_stock"] <= 1, got
    assert got["false_with_slow"] <= 1, got
    assert got["slow_named"] >= 95, got
    assert got["suspects"] > 0, got  # the slow moments were there, and said so


def _round(rnd, slow_at_10, marks=None, hosts=8):
    """One round of eight hosts with +-0.6% spread; the hosts in `slow_at_10` slowed by
    that factor at C=10."""
    return [
        _run(f"gpu{i:02d}", rnd,
             {c: BASE[c] * (slow_at_10.get(f"gpu{i:02d}", 1.0) if c == 10 else 1.0)
              * (1 + 0.003 * ((i * 7 + rnd) % 5 - 2)) for c in LEVELS},
             (marks or {}).get(f"gpu{i:02d}", {}))
        for i in range(hosts)
    ]  # fmt: skip


def test_a_level_the_client_marked_late_is_not_judged_and_says_so():
    """The issue's round: two stock hosts 12% slow at C=10, both levels marked late by the
    client. Neither is named nor suspect; the view says which levels it did not judge."""
    late = {"gpu02": {10: "loop lag p99 41 ms"}, "gpu06": {10: "loop lag p99 38 ms"}}
    view = outliers.view_of(_round(0, {"gpu02": 0.884, "gpu06": 0.881}, late), "baseline",
                            METRIC)  # fmt: skip
    assert view.named == [] and view.suspect == []
    assert view.unjudged == [
        "gpu02 at C=10: not judged: the client's timers fired late (loop lag p99 41 ms)",
        "gpu06 at C=10: not judged: the client's timers fired late (loop lag p99 38 ms)",
    ]
    (c10,) = [lv for lv in view.levels if lv.concurrency == 10]
    assert 0.99 < c10.median / 380.0 < 1.01  # the marked figures are not in the median


def test_one_noisy_round_makes_a_suspect_and_a_second_round_decides():
    slow = {"gpu02": 0.884}
    one = outliers.view_of(_round(0, slow), "baseline", METRIC)
    assert one.named == [] and [n.host for n in one.suspect] == ["gpu02"]
    recovered = outliers.view_of(_round(0, slow) + _round(1, {}), "baseline", METRIC)
    assert recovered.named == [] and recovered.suspect == []
    again = outliers.view_of(_round(0, slow) + _round(1, slow), "baseline", METRIC)
    assert [n.host for n in again.named] == ["gpu02"]
    assert again.named[0].confirmed_by == "20261101T000000Z-baseline-gpu02"


def test_the_interval_holds_run_to_run_noise_not_only_the_requests():
    """With one run a host, the requests alone gave +-1.4% here; the interval now holds
    the fleet's round-to-round changes (2% a run), so it is wider than the requests'."""
    runs = []
    rng = random.Random(3)
    for rnd in range(3):
        runs += [_run(f"gpu{i:02d}", rnd, {10: 380.0 * rng.gauss(1.0, 0.02)}, {})
                 for i in range(8)]  # fmt: skip
    view = outliers.view_of(runs, "baseline", METRIC)
    for h in view.levels[0].hosts:
        assert h.estimate.source == "fleet rounds"
        requests_only = 0.05 / 200**0.5
        assert h.estimate.rel_se > 3 * requests_only, h.estimate


def test_a_ttft_read_high_in_one_round_is_a_suspect_or_not_judged():
    """`--metric median_ttft_ms` named a stock host 44% slower from one round: now one round
    makes it a suspect, and a level the client marked late is not judged at all."""
    ttft = outliers.metric_named("median_ttft_ms")

    def fleet(rnd, high, late):
        runs = _round(rnd, {})
        for run in runs:
            for row in run.rows:
                row["median_ttft_ms"] = (
                    50.0
                    * (1.44 if run.host == high else 1.0)
                    * (1 + 0.004 * (int(run.host[-2:]) % 3 - 1))
                )
                if run.host == high and late:
                    row["client_late"] = "loop lag p99 52 ms"
        return runs

    one = outliers.view_of(fleet(0, "gpu04", late=False), "baseline", ttft)
    assert one.named == [] and [(n.host, n.worst.side) for n in one.suspect] == [
        ("gpu04", "slower")
    ]
    marked = outliers.view_of(fleet(0, "gpu04", late=True), "baseline", ttft)
    assert marked.named == marked.suspect == [] and len(marked.unjudged) == 3
    moved = outliers.view_of(fleet(0, "gpu04", False) + fleet(1, "gpu06", False), "baseline",
                             ttft)  # fmt: skip
    assert moved.named == [] and [n.host for n in moved.suspect] == ["gpu06"]


def test_a_late_client_on_most_hosts_is_the_fleets_condition_and_judged_together():
    """On a busy rehearsal machine every host's client is late at every level (seen: lag
    p99 4-16 ms on all six): the hosts are still alike, so they are judged together and a
    slow host with a differing field is named; the view says why once per level."""
    late = {f"gpu{i:02d}": {c: "loop lag p99 6 ms" for c in LEVELS} for i in range(8)}
    runs = _round(0, {"gpu05": 0.81}, late)
    runs[5].fingerprint = {"application clocks (MHz)": 1600}
    for run in runs[:5] + runs[6:]:
        run.fingerprint = {"application clocks (MHz)": 1980}
    view = outliers.view_of(runs, "baseline", METRIC)
    assert [n.host for n in view.named] == ["gpu05"] and view.unjudged == []
    assert "C=10: the client's timers fired late on 8 of 8 hosts: judged together" in view.notes[1]
    bound = {h: {10: "cpu 0.97 cores"} for h in list(late)[:5]}
    for run in (runs := _round(0, {}, {})):
        for row in run.rows:
            if run.host in bound and row["max_concurrency"] == 10:
                row["client_bound"] = "cpu 0.97 cores"
    view = outliers.view_of(runs, "baseline", METRIC)
    assert len(view.unjudged) == 5 and all("the client set the pace" in u for u in view.unjudged)
