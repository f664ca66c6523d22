"""Issue 83.1: one headline per load shape, the tuned server against every static run on it,
with a 95% interval from the interleaved rounds and compare's verdict rules (no direction
without a significant test): a property test on synthetic rounds (control/tune/headline.py)."""

from __future__ import annotations

import dataclasses
import math
import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.control.tune import headline as hl
from gpufleet.records import ResultRow
from gpufleet.report.verdicts import Verdict


def _rounds(rng: random.Random, n: int, tokens: float, speed: float, noise: float):
    return [hl.Round(tokens * math.exp(rng.gauss(0, noise)), speed * math.exp(rng.gauss(0, noise)))
            for _ in range(n)]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 8), true_ratio=st.floats(0.7, 1.4), noise=st.floats(0.001, 0.1),
    seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_the_interval_holds_the_ratio_and_the_verdict_follows_the_interval(
    n, true_ratio, noise, seed
):
    """Whatever the rounds: the ratio lies inside its interval; BETTER only where the interval
    is above 1.0, WORSE only below, SAME where it holds 1.0; fewer than three rounds give no
    interval and no direction, and the sentence says so."""
    rng = random.Random(seed)
    statics = {"p[plain]": _rounds(rng, n, 100.0, 10.0, noise),
               "p[depth=2]": _rounds(rng, n, 110.0, 12.0, noise)}  # fmt: skip
    tuned = _rounds(rng, n, 110.0 * true_ratio, 12.0 * true_ratio, noise)
    found = hl.headline("the load step 1 -> 64 -> 1", {**statics, "p-tuned": tuned}, "p-tuned")
    assert found is not None and found.rounds == n
    for r in [*found.tokens.values(), *found.speed.values()]:
        if n < 3:
            assert r.interval is None and r.verdict == Verdict.UNTESTED
            continue
        low, high = r.interval
        assert low <= r.value <= high
        expected = Verdict.BETTER if low > 1 else Verdict.WORSE if high < 1 else Verdict.SAME
        assert r.verdict == expected
        assert r.text().endswith(" n.s.") == (expected == Verdict.SAME)
    means = {k: sum(x.tokens_per_s for x in v) / n for k, v in statics.items()}
    assert found.best == max(means, key=means.get)
    assert found.sentence.startswith(
        f"over the load step 1 -> 64 -> 1 the tuned server delivered {found.tokens[found.best].text()}"
        f" the output tokens a second of the best single static, {found.best}, and"
    )
    assert ("no direction is claimed" in found.sentence) == (n < 3)


def test_the_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    """Five rounds of each server, 2% noise a round, true ratio 1.05: over 400 seeded
    shapes the interval holds 1.05 in at least 90% (95% nominal), and calls a difference
    where there is none (true ratio 1.0) in at most 10%."""
    rng = random.Random(83)

    def once(true_ratio: float) -> hl.Ratio:
        static = [r.tokens_per_s for r in _rounds(rng, 5, 100.0, 1.0, 0.02)]
        tuned = [r.tokens_per_s for r in _rounds(rng, 5, 100.0 * true_ratio, 1.0, 0.02)]
        return hl.ratio(static, tuned)

    covered = sum(r.interval[0] <= 1.05 <= r.interval[1] for r in (once(1.05) for _ in range(400)))
    assert covered >= 360, covered
    false = sum(once(1.0).verdict != Verdict.SAME for _ in range(400))
    assert false <= 40, false


def test_a_round_is_the_shapes_tokens_over_its_time_and_its_requests_weighted_speed():
    rows = [ResultRow(max_concurrency=4, failed=0, output_throughput=0.0, duration=10.0, total_output_tokens=1000, completed=10,
                      median_per_request_output_tps=50.0),
            ResultRow(max_concurrency=64, failed=0, output_throughput=0.0, duration=30.0, total_output_tokens=5000, completed=30,
                      median_per_request_output_tps=30.0)]  # fmt: skip
    assert hl.round_of(rows) == hl.Round(150.0, 35.0)
    assert hl.round_of([ResultRow(1, 0, 0, 0.0, duration=0.0)]) is None


def test_a_resumed_tune_counts_its_earlier_runs_in_what_it_spent(tmp_path):
    """Issue 83.5 one step away: a tune resumed twice on the lent machine closed with
    "spent 4 launches and 88s": the last run's alone, of 36 launches over three. The cells
    an earlier run finished now count, with their own seconds (launch to stop), and say so."""
    import yaml

    from gpufleet.control.tune.budget import TimeKeeper
    from gpufleet.control.tune.depth_cells import depth_arms
    from gpufleet.control.tune.shapes import spent_text
    from helpers import adaptive_flags

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"model_path": "/m", "flags": adaptive_flags(3)}))
    one, two, three = depth_arms(str(spec), [1, 2, 3])[-3:]
    clock = TimeKeeper([], [], [], None, lambda _: None)
    clock.finished("measure", one, {"launch": 30.0, "bench": 50.0}, said=False)
    clock.finished("measure", one, {"launch": 30.0, "bench": 50.0}, said=False)  # once
    clock.finished("measure", two, {"launch": 20.0, "bench": 40.0}, said=False)
    clock.finished("measure", three, {"launch": 5.0}, said=True)
    spend = clock.spent()
    assert (spend.launches, spend.earlier_launches, spend.earlier_s) == (3, 2, 140.0)
    assert spend.seconds >= 140.0
    said = spent_text(spend, [])
    assert re.match(r"spent 3 launches and 2\.\d min \(of them 2 launches and 2\.3 min of "
                    r"cells in earlier runs, before --resume\)", said), said  # fmt: skip
    fresh = TimeKeeper([], [], [], None, lambda _: None)
    fresh.finished("measure", three, {"launch": 5.0}, said=True)
    assert "earlier" not in spent_text(fresh.spent(), []) and fresh.spent().launches == 1


def test_the_closing_line_says_what_the_tune_spent_beside_what_it_gained():
    """Issue 83.5: launches and wall time, then per host and shape the headline's ratio
    against the best single static; with no shape run, it says there is no such figure."""
    from gpufleet.control.tune.budget import Spend
    from gpufleet.control.tune.shapes import StepVerdict, spent_text

    rng = random.Random(5)
    rounds = {"p[plain]": _rounds(rng, 3, 100.0, 10.0, 0.01),
              "p-tuned": _rounds(rng, 3, 107.0, 10.0, 0.01)}  # fmt: skip
    found = hl.headline("the bursts", rounds, "p-tuned")
    step = StepVerdict("h0", [], "", [found])
    said = spent_text(Spend(34, 372.0), [step])
    assert said == (f"spent 34 launches and 6.2 min to gain: h0, the bursts: "
                    f"{found.tokens['p[plain]'].text()} of p[plain]'s output tokens a second")  # fmt: skip
    assert spent_text(Spend(1, 9.0), []) == ("spent 1 launch and 9s; no load shape ran to say what it "
                                      "gained over the best single static")  # fmt: skip


def test_inv_report_and_summary_md_show_a_tunes_headline_escaped(tmp_path):
    """Issue 83.1: the headline reached the terminal, the record and the profile's header,
    not `inv report`. A report on any of the tune's sweeps (here its load step) now gives
    each host's headline, the record's sentence word for word: escaped in report.html,
    inert in summary.md (a label from the archive is untrusted); any other sweep, none."""
    import html as htmllib

    from gpufleet.archive.kept import SweepRecord, TuneRecord
    from gpufleet.archive.layout import Archive
    from gpufleet.report import select

    archive = Archive.at(tmp_path / "logs")
    hostile = "p<script>alert(1)</script>[depth=2](javascript:x)*"
    rng = random.Random(7)
    found = hl.headline("the load step 1 -> 64 -> 1",
                        {hostile: _rounds(rng, 3, 100.0, 10.0, 0.01),
                         "p-tuned": _rounds(rng, 3, 105.0, 10.0, 0.01)}, "p-tuned")  # fmt: skip
    record = TuneRecord("t1-tune", "p", [0, 2], [1, 64], None, "", {}, [], {}, [], [], "", "", 0,
                        step={"h0": {"sweep_id": "t3-step", "sentence": "",
                                     "headline": [found.sentence]}})  # fmt: skip
    for sweep_id in ("t3-step", "other"):
        path = archive.sweep_state(sweep_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(SweepRecord(sweep_id, ["p"], ["h0"], [1], {}, kind="tune-step").to_json())
    archive.tune_record("t1-tune").parent.mkdir(parents=True)
    archive.tune_record("t1-tune").write_text(record.to_json())
    data = select.report_for_sweep(archive, archive.sweep_state("t3-step"))
    assert data.headlines == {"h0": [found.sentence]}
    page = select.write_report(data, tmp_path / "out").read_text()
    assert htmllib.escape(found.sentence) in page and "<script>alert" not in page
    summary = select.write_summary(data, tmp_path / "out").read_text()
    [said] = [line for line in summary.splitlines() if line.startswith("- **h0:**")]
    assert not re.search(r"(?<!\\)[<>\[\]*]", said.removeprefix("- **h0:**"))  # each escaped
    assert said.replace("\\", "") == f"- **h0:** {found.sentence}"  # the words, unchanged
    other = select.report_for_sweep(archive, archive.sweep_state("other"))
    assert other.headlines == {}
    assert "headline" not in select.write_summary(other, tmp_path / "o").read_text()


def _phase(c: int, completed: int, failed: int = 0, tokens: int = 1000) -> ResultRow:
    return ResultRow(max_concurrency=c, failed=failed, output_throughput=0.0, duration=10.0,
                     total_output_tokens=tokens, completed=completed,
                     median_per_request_output_tps=20.0)  # fmt: skip


def test_a_round_with_a_failed_or_missing_phase_is_no_round_and_nothing_measured_gives_no_ratio():
    """Adversarial (issue 83.1): the tuned server failed at one level of the load step.
    Before, its other phases made a round and a ratio against whole rounds of the statics
    (1,500 tokens in 30 s against 2,500: '0.60x', a loss nobody measured). Now a round with a failed
    or missing phase is none; with no whole round of the tuned server (or of any static)
    the shape's headline says there is no figure, and the closing line claims no gain."""
    from gpufleet.control.tune.budget import Spend
    from gpufleet.control.tune.shapes import StepVerdict, _headline, spent_text

    whole = [_phase(1, 8), _phase(64, 64), _phase(1, 8, tokens=500)]
    broken = [_phase(1, 8), _phase(64, 0, failed=64), _phase(1, 8, tokens=500)]
    short = [_phase(1, 8), _phase(64, 64)]
    assert hl.round_of(broken) is None and hl.round_of(short, 3) is None
    assert hl.round_of([_phase(64, 60, failed=4)]) is None
    no_speed = dataclasses.replace(_phase(1, 8), median_per_request_output_tps=None)
    assert hl.round_of([no_speed]) is None  # was a speed of 0: a ZeroDivisionError in ratio
    runs = {"p[plain]": [whole] * 3, "p[depth=2]": [whole] * 3, "p-tuned": [broken, short]}
    found = _headline("the load step 1 -> 64 -> 1", runs, "p-tuned")
    assert found is not None and not found.best and not found.tokens
    assert found.sentence == ("over the load step 1 -> 64 -> 1 no figure: the tuned server ran "
                              "a whole round without failed requests, so nothing is compared")  # fmt: skip
    none_static = _headline("the bursts", {"p[plain]": [broken], "p-tuned": [whole]}, "p-tuned")
    assert none_static is not None and "no figure: no static server ran" in none_static.sentence
    assert _headline("the bursts", {}, "p-tuned") is None  # not run at all: no headline
    said = spent_text(Spend(9, 60.0), [StepVerdict("h0", [], "", [found, none_static])])
    assert said.endswith("no load shape ran to say what it gained over the best single static")
    one_failed = _headline("the bursts", {"p[plain]": [whole], "p[depth=2]": [broken],
                                          "p-tuned": [whole]}, "p-tuned")  # fmt: skip
    assert one_failed.best == "p[plain]" and "p[depth=2]" not in one_failed.tokens
    assert one_failed.sentence.endswith(
        "(p[depth=2]: no whole round without failed requests, not compared)"
    )
    assert "(untested)" in one_failed.sentence  # one round: no interval, no direction
