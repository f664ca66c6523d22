"""inv bench --find-max: the highest load within an SLO, on the rehearsal engine where the
answer follows from the timing model; and the search's own rules."""

from __future__ import annotations

import json

import pytest

from gpufleet.control.bench.findmax import Probe, Search
from helpers import run_cli


def _fake(threshold: float):
    """A server that holds the SLO up to `threshold` (attainment falls off above it)."""

    def measure(load: float) -> Probe:
        return Probe(load, 1.0 if load <= threshold else 0.4, f"run-{load:g}", "done")

    return measure


def test_search_doubles_then_bisects_and_never_probes_twice():
    search = Search("concurrency", 0.99, 1.0, 1024.0, 20)
    assert search.run(_fake(38)) == (38.0, 39.0)
    loads = [p.load for p in search.probes]
    assert loads[:7] == [1, 2, 4, 8, 16, 32, 64]
    assert len(loads) == len(set(loads)) and len(loads) <= 12


def test_search_stops_at_the_limit_and_at_max_probes():
    assert Search("concurrency", 0.99, 1.0, 8.0, 20).run(_fake(100)) == (8.0, None)
    capped = Search("concurrency", 0.99, 1.0, 1024.0, 3)
    assert capped.run(_fake(38)) == (4.0, None) and len(capped.probes) == 3
    none = Search("concurrency", 0.99, 4.0, 64.0, 10)
    assert none.run(_fake(2)) == (None, 4.0)


def test_search_by_request_rate_brackets_within_5_percent():
    search = Search("request-rate", 0.99, 1.0, 1000.0, 30)
    low, high = search.run(_fake(37.3))
    assert low <= 37.3 < high and high / low <= 1.05


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--find-max"], "--find-max needs --slo"),
        (["--find-max", "--slo", "tpot_ms=30", "--by", "tokens"], "--by 'tokens'"),
        (["--find-max", "--slo", "tpot_ms=30", "--target", "2"], "--target 2: at most 1"),
    ],
)
def test_bad_find_max_options_are_one_line(fleet, args, message):
    out = fleet.cli("bench", *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_find_max_on_the_rehearsal_engine_matches_the_timing_model(fleet, tmp_path):
    """Baseline rehearsal steps cost 15.6 + 1.03 x batch ms (+ prefill of 64-token prompts,
    ~0.04 ms per running request with 32-token answers): TPOT <= 30 ms holds up to
    C = (30 - 15.6) / 1.07 = 13."""
    profile = fleet.profile("fm", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    archive = tmp_path / "a"
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h0").returncode == 0
    try:
        out = fleet.cli(
            "bench", "--profile", str(profile), "--hosts", "h0", "--find-max",
            "--slo", "tpot_ms=30", "--prompts", "random-ids", "--random-input-len", "64",
            "--output-len", "32", "--archive", str(archive), timeout=600,
        )  # fmt: skip
    finally:
        fleet.cli("stop", "--hosts", "h0")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    [path] = (archive / "findmax" / "h0").glob("*-fm.json")
    answer = json.loads(path.read_text())
    # the model's answer is 13 (12 with the prefill); a CPU-starved machine only slows the
    # simulated steps, so the answer can fall below it, never above (11 beside a CPU hog
    # and three workers in CI, stop 45). Far below it only where the probe that failed
    # caught the machine stalling: a token gap of ten decode steps or more (CI once saw
    # one of 319 ms at C=4, and the answer 2)
    assert answer["holds_up_to"] <= 13, answer
    if answer["holds_up_to"] < 9:
        failed = next(p for p in answer["probes"] if p["load"] == answer["fails_from"])
        gaps = [max(r["itl"], default=0.0)
                for f in (archive / "h0" / failed["run_id"]).glob("requests-*.jsonl")
                for r in map(json.loads, f.read_text().splitlines())]  # fmt: skip
        assert max(gaps) >= 0.16, (answer, gaps)
    assert answer["fails_from"] == answer["holds_up_to"] + 1
    assert len(answer["probes"]) <= 10
    assert f"holds the SLO up to C={int(answer['holds_up_to'])}" in out.stdout
    # every probe is an archived run
    runs = {p.name for p in (archive / "h0").iterdir()}
    assert {p["run_id"] for p in answer["probes"]} <= runs
    compared = run_cli("compare", "fm", "fm", "--archive", str(archive))
    assert "SLO capacity (tpot <= 30 ms for 99% of requests): fm up to C=" in compared.stdout
