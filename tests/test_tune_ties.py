"""`inv tune` resolves its ties by measuring, follows the physics unless the data insists,
and holds the tuned server to the best static depth measured beside it (issue 53).

On the lent machine a surface where depth 4 was best at every level got the table 4, 3, 4:
C=2 took depth 3 within its noise of depth 4 on ten requests, and the note said "4.9%
behind ... within the cells' noise (4.8%)", a comparison its own numbers contradict."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.control.tune import depth_cells as tunecells
from gpufleet.control.tune import table as tune
from gpufleet.control.tune import ties, verify
from gpufleet.control.tune.measurement import Measurement
from gpufleet.records import ResultRow

SPEC = (
    "model_path: /m\nflags:\n  speculative-algorithm: EAGLE3\n  speculative-num-steps: 3\n"
    "  speculative-eagle-topk: 1\n  speculative-num-draft-tokens: 4\n"
)


def _rows(
    table: dict[int, dict[int, tuple]], p10_share: float = 0.8, completed: int = 40
) -> Measurement:
    """depth -> C -> (throughput, per-request) as one run's rows (noise 2.5% at 40 requests
    with p10 at 0.8 of the median)."""
    return Measurement({
        d: {c: [ResultRow(c, completed, 0, f[0], median_per_request_output_tps=f[1],
                          p10_per_request_output_tps=f[1] * p10_share)]
            for c, f in levels.items()}
        for d, levels in table.items()
    })  # fmt: skip


# depth 4 best at every level; at C=2 depth 3 is 1.6% behind (inside 2.5% noise)
DEEP_WINS = {
    0: {1: (60, 60), 2: (110, 55), 8: (300, 37)},
    3: {1: (90, 90), 2: (172.2, 86.1), 8: (330, 41)},
    4: {1: (100, 100), 2: (175, 87.5), 8: (360, 45)},
}


def test_the_physics_lifts_a_low_level_tie_to_the_depth_more_load_measured_ahead():
    """4, 3, 4 was written: C=2's tie went to the shallower depth while C=8 measured depth 4
    ahead beyond its noise. Deeper speculation pays less as the batch grows, so depth 4 is
    at least as good at C=2: the table reads 4, 4, 4, and the reason is said."""
    result = tune.choose(_rows(DEEP_WINS))
    assert [c.depth for c in result.choices] == [4, 4, 4]
    assert "more load (C=8) chose depth 4" in result.choices[1].why
    assert result.ties == []  # settled by the physics: nothing to measure again
    assert not [n for n in result.notes if "drafts deeper" in n]


def test_a_tie_is_listed_for_measuring_and_a_retest_settles_it_either_way():
    flat = {1: {2: (172.2, 86.1)}, 4: {2: (175, 87.5)}}  # 1.6% apart, noise 2.5%
    first = tune.choose(_rows(flat))
    assert first.choices[0].depth == 1
    [tie] = first.ties
    assert (tie.concurrency, tie.shallow, tie.deep) == (2, 1, 4)
    # measured again with 8x the requests: the noise falls to ~0.9%, depth 4 stands ahead
    again = _rows(flat, completed=320)
    deeper = tune.choose(_rows(flat), retests={2: tune.Retest({1: again.at(1, 2), 4: again.at(4, 2)},
                                                              320, 1)})  # fmt: skip
    assert deeper.choices[0].depth == 4 and deeper.ties == []
    assert "measured again, interleaved (1 round(s), 320 requests per depth)" in (
        deeper.choices[0].why
    )
    # the retest finds them equal: the tie survives, the shallower keeps it, still open
    same = _rows({1: {2: (175, 87.5)}, 4: {2: (175.5, 87.7)}}, completed=320)
    kept = tune.choose(_rows(flat), retests={2: tune.Retest({1: same.at(1, 2), 4: same.at(4, 2)},
                                                            320, 1)})  # fmt: skip
    assert kept.choices[0].depth == 1 and len(kept.ties) == 1
    assert "still within the noise: the shallower" in kept.choices[0].why


def test_a_rise_at_more_load_is_kept_only_where_it_is_measured_beyond_the_noise():
    real = tune.choose(_rows({
        1: {1: (77, 77), 8: (320, 40)},
        3: {1: (70, 70), 8: (360, 45)},
    }))  # fmt: skip
    assert [c.depth for c in real.choices] == [1, 3]
    [note] = [n for n in real.notes if "drafts deeper" in n]
    assert "because depth 1 scored 11.1% behind depth 3 here, beyond that cell's measured " in note


NOTE_FIGURES = re.compile(r"(\d+\.\d)% behind depth \d+(?:.s \d+)?(?: here| at C=\d+)?, (within|beyond) "
                          r"that cell's (?:measured )?noise \((\d+\.\d)%\)")  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 0.12), min_size=3, max_size=3),
    completed=st.sampled_from([10, 40, 160]),
    spread=st.sampled_from([0.6, 0.8, 0.95]),
)
def test_no_note_states_a_comparison_its_own_numbers_contradict(gaps, completed, spread):
    """Cells generated on both sides of the noise bound, at three levels: every note that
    says a gap is within (or beyond) a noise has the gap on that side of it, and the chosen
    depth never rises with load unless a note says why."""
    table = {4: {1: (100, 100), 2: (175, 87.5), 8: (360, 45)}}
    table[2] = {c: (t * (1 - g), p * (1 - g)) for (c, (t, p)), g in
                zip(table[4].items(), gaps, strict=True)}  # fmt: skip
    result = tune.choose(_rows(table, p10_share=spread, completed=completed))
    for note in result.notes:
        for gap, side, noise in NOTE_FIGURES.findall(note):
            assert (float(gap) <= float(noise)) == (side == "within"), note
    depths = [c.depth for c in result.choices]
    rises = [later for earlier, later in zip(result.choices, result.choices[1:], strict=False)
             if later.depth > earlier.depth]  # fmt: skip
    for rise in rises:
        assert any(n.startswith(f"C={rise.concurrency}: depth {rise.depth} drafts deeper")
                   for n in result.notes), (depths, result.notes)  # fmt: skip


def test_the_tie_rounds_launch_the_two_depths_interleaved_with_more_requests(tmp_path):
    profile = tmp_path / "spec.yaml"
    profile.write_text(SPEC)
    tie = tune.Tie(2, 4, 3, 0.016, 0.025, 175.0, 172.2)
    arms = ties.tie_arms(str(profile), [tie])
    assert [a.key for a in arms] == ["spec[depth=3]", "spec[depth=4]",
                                     "spec[depth=3]#2", "spec[depth=4]#2"]  # fmt: skip
    request = BenchRequest([1, 2, 8], output_len=32)
    first, second = (ties.tie_request(request, [tie], k) for k in (1, 2))
    assert first.concurrency == [2] and first.fixed_levels == [
        {"concurrency": 2, "num_prompts": 20}]  # fmt: skip
    assert second.fixed_levels[0]["num_prompts"] == 40  # twice the round before


def test_the_verification_launches_the_best_static_depths_beside_the_tuned_server(tmp_path):
    profile = tmp_path / "spec.yaml"
    profile.write_text(SPEC)
    checks = [ArmSpec(str(profile), {}, 1, "spec[plain]"), ArmSpec(str(profile), {}, 1, "spec-static"),
              ArmSpec(str(profile), {}, 1, "spec-tuned")]  # fmt: skip
    measured = {
        tunecells.PLAIN: {1: {"output_throughput": 60.0}, 16: {"output_throughput": 700.0}},
        2: {1: {"output_throughput": 90.0}, 16: {"output_throughput": 500.0}},
        4: {1: {"output_throughput": 100.0}, 16: {"output_throughput": 400.0}},
    }
    arms = verify.beside_arms(str(profile), checks, measured, repeats=2)
    assert [a.key for a in arms] == [
        "spec[plain]", "spec-static", "spec-tuned", "spec[depth=4]",
        "spec[plain]#2", "spec-static#2", "spec-tuned#2", "spec[depth=4]#2",
    ]  # fmt: skip


@pytest.mark.parametrize(("kept", "said"), [(0.99, False), (0.975, True)])
def test_a_level_below_the_goal_is_said_and_one_above_it_is_not(kept, said):
    from gpufleet.report.compare import Arm
    from helpers import level

    def arm(label, tput):
        return Arm(label, [], {4: level(4, median_per_request_output_tps=tput / 4,
                                        output_throughput=tput, steady_output_throughput=tput)})  # fmt: skip

    arms = [arm("p[plain]", 200), arm("p-static", 190), arm("p-tuned", 400 * kept),
            arm("p[depth=4]", 400)]  # fmt: skip
    [row], sentence = verify.verdict(arms)
    assert row.best_static == "p[depth=4]" and row.kept_best == pytest.approx(kept)
    assert ("Below the 98% goal at C=4" in sentence) == said
    assert bool(verify.shortfalls([row])) == said


def test_a_tie_at_depth_0_is_measured_again_at_its_better_variant(tmp_path):
    """On the lent machine a C=64 tie of depth 0 (counted at its skip variant, 733 tok/s)
    against depth 4 was measured again with the pinned depth 0 (665): the retest compared
    another server than the tie. Both variants are launched again; the better one counts."""
    profile = tmp_path / "spec.yaml"
    profile.write_text(SPEC)
    tie = tune.Tie(64, 4, 0, 0.01, 0.02, 760.0, 733.0)
    keys = [a.key for a in ties.tie_arms(str(profile), [tie])]
    assert "spec[depth=0,skip]" in keys and "spec[depth=0]" in keys
    rows = {d: {64: [ResultRow(64, 512, 0, tput)]} for d, tput in
            ((0, 665.0), (tunecells.SKIP, 733.0), (4, 763.0))}  # fmt: skip
    [retest] = ties.add_round({}, [tie], Measurement(rows)).values()
    assert retest.rows[0] == rows[tunecells.SKIP][64] and retest.rows[4] == rows[4][64]
    assert retest.requests == 512 and retest.rounds == 1


@pytest.mark.parametrize(
    ("kept", "printed", "below"),
    [(0.977, "97.7%", True), (0.9799, "97.99%", True), (0.97999, "97.99%", True),
     (0.98, "98%", False), (0.983, "98%", False), (0.975, "97.5%", True), (0.9, "90%", True),
     (1.0, "100%", False)],
)  # fmt: skip
def test_every_share_is_printed_at_the_precision_that_decides_the_goal(kept, printed, below):
    """Issue 63.3: "keeps 98% at worst" was printed of 0.977 against a 0.98 goal, and one
    level named where two were at 0.977. Records on both sides of 0.98, two levels at the
    worst: the sentence prints the share on its own side of the goal, names every level at
    the worst, and every level below the goal; the last line says the same words."""
    from gpufleet.control.tune.goal import share_text
    from gpufleet.report.compare import Arm
    from helpers import level

    assert share_text(kept) == printed
    assert (float(printed.rstrip("%")) >= 98) == (kept >= 0.98)

    def arm(label, tputs):
        return Arm(label, [], {c: level(c, median_per_request_output_tps=t / 4,
                                        output_throughput=t, steady_output_throughput=t)
                               for c, t in tputs.items()})  # fmt: skip

    arms = [arm("p[plain]", {2: 200, 8: 200, 16: 200}), arm("p-static", {2: 190, 8: 190, 16: 190}),
            arm("p-tuned", {2: 400 * kept, 8: 400, 16: 400 * kept}),
            arm("p[depth=4]", {2: 400, 8: 400, 16: 400})]  # fmt: skip
    rows, sentence = verify.verdict(arms)
    every = "; C=8, p[depth=4]" if kept == 1.0 else ""  # a tie at the worst: all named
    worst = f"keeps {printed} at worst (C=2, p[depth=4]{every}; C=16, p[depth=4])"
    assert worst in sentence, sentence
    said_below = verify.below_goal(rows)
    assert bool(said_below) == below
    if below:
        assert said_below == (f"below the 98% goal at C=2: {printed} of p[depth=4] "
                              f"(tuned {400 * kept:.0f} vs 400 tok/s); C=16: {printed} of "
                              f"p[depth=4] (tuned {400 * kept:.0f} vs 400 tok/s)")  # fmt: skip
        assert sentence.endswith(". B" + said_below[1:] + ".")
    # no percentage in the sentence rounds across the goal
    for shown in re.findall(r"(\d+(?:\.\d+)?)% (?:at worst|of p\[depth)", sentence):
        assert (float(shown) >= 98) == (not below), (shown, sentence)
