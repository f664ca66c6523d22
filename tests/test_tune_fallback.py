"""Issue 83.3: a table its own verification puts below the goal is not written as the tuned
profile where a single static server kept more at its worst level; the profile is written
as that static server and the tune says why (control/tune/fallback.py)."""

from __future__ import annotations

import yaml

from gpufleet.control.server.profiles import load_profile
from gpufleet.control.tune import fallback
from gpufleet.control.tune import files as tunefiles
from gpufleet.control.tune import verify as tuneverify
from gpufleet.control.tune.depth_cells import PLAIN
from gpufleet.control.tune.table import Choice, TuneResult, table_and_ranges
from gpufleet.control.tune.tune_run import TuneOutcome, Verdict
from gpufleet.report.compare import Arm
from helpers import adaptive_flags, level

LEVELS = (1, 8, 64)


def _arm(label: str, figures: tuple[float, ...]) -> Arm:
    """A server of the verification: output tok/s by level (its per-request speed a share
    of it, so the winner of each level is the same on both figures)."""
    return Arm(label, [], {c: level(c, output_throughput=x, median_per_request_output_tps=x / c)
                           for c, x in zip(LEVELS, figures, strict=True)})  # fmt: skip


def _verdict(plain, static, tuned, depth1) -> Verdict:
    arms = [_arm("p[plain]", plain), _arm("p-static", static), _arm("p-tuned", tuned),
            _arm("p[depth=1]", depth1)]  # fmt: skip
    rows, sentence = tuneverify.verdict(arms)
    return Verdict("h0", arms, rows, sentence)


# the case: the table (depth 1, then no drafting) kept 0.89, 0.99, 0.83 of the
# profile's own static speculation (depth 3), which was best at every level
BELOW = dict(plain=(60, 320, 740), static=(90, 340, 760), tuned=(80, 335, 630),
             depth1=(80, 330, 650))  # fmt: skip
# below the goal at C=1 (0.94), but every static is far worse somewhere
BETTER_THAN_ANY = dict(plain=(60, 320, 740), static=(90, 300, 500), tuned=(85, 318, 738),
                       depth1=(80, 310, 520))  # fmt: skip


def test_a_table_below_the_goal_where_a_static_kept_more_gives_way_to_it():
    decision = fallback.decide([_verdict(**BELOW)])
    assert decision is not None and decision.fall_back and decision.static == "p-static"
    assert decision.static_worst == 1.0 and round(decision.table_worst, 3) == 0.829
    assert decision.why.startswith("the table was below the goal after the mend (h0 C=1: ")
    assert "so it is not the tuned profile; the best single static, p-static, keeps 100% " in (
        decision.why
    )
    assert decision.why.endswith("the tuned profile is written as p-static")


def test_a_table_below_the_goal_is_never_the_tuned_profile_even_ahead_of_every_static():
    """Issue 83.3's words: where the mend cannot bring a table to the goal, the profile is
    written as the best static configuration. Before, a table below the goal that kept more
    at its worst level than any single static stayed the tuned profile; now the best static
    (by its worst share) is written, both shares said."""
    decision = fallback.decide([_verdict(**BETTER_THAN_ANY)])
    assert decision is not None and decision.fall_back and decision.static == "p[depth=1]"
    assert decision.why.startswith("the table was below the goal after the mend (h0 C=1: 94% "
                                   "of p-static")  # fmt: skip
    assert decision.why.endswith("keeps 70% of each level's best static at its worst level "
                                 "against the table's 94%: the tuned profile is written as "
                                 "p[depth=1]")  # fmt: skip


def test_a_table_at_the_goal_is_left_alone():
    at_goal = dict(BELOW, tuned=(90, 340, 760))
    assert fallback.decide([_verdict(**at_goal)]) is None


def _written(tmp_path, figures):
    """A tune's files as written (the table, depth 1 then none) and its verification."""
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"model_path": "/m", "flags": adaptive_flags(3)}))
    choices = [Choice(1, 1, "measured"), Choice(64, 0, "measured")]
    table, ranges = table_and_ranges(choices, [1, 2, 4, 8, 16, 32, 64])
    result = TuneResult(table, choices, ranges, measured={
        PLAIN: {c: {"output_throughput": 1.0, "per_request": 1.0} for c in LEVELS},
        1: {1: {"output_throughput": 2.0, "per_request": 2.0}}})  # fmt: skip
    config, written = tunefiles.write_outputs(str(profile), result, None)
    checks = tuneverify.verification_arms(str(profile), str(written))
    outcome = TuneOutcome(result, config, written, None, tmp_path / "r.json",  # type: ignore[arg-type]
                          [_verdict(**figures)])  # fmt: skip
    return profile, checks, outcome


def test_a_table_ahead_of_every_static_is_written_as_the_best_static_its_file_kept(tmp_path):
    """The table kept 94% at its worst level, no static more than 70%: the tuned profile is
    still the static (the issue's rule), and the words say where the table's file stays."""
    profile, checks, outcome = _written(tmp_path, BETTER_THAN_ANY)
    decision = fallback.settle(str(profile), checks, outcome)
    assert decision is not None and decision.static == "p[depth=1]"
    assert decision.why.endswith(f"; the table stays in {outcome.config_path} for a launch by hand")
    tuned = load_profile(str(outcome.profile_path))
    assert not tuned.flags.get("speculative-adaptive") and outcome.config_path.is_file()
    assert tuned.flags["speculative-num-steps"] == 1


def test_the_profile_written_is_the_static_server_with_the_reason(tmp_path):
    """The written profile launches what the verification launched as p-static: the
    profile without its adaptive flags; its header says why; the note of the verification
    still follows (the sentence is about the table it measured)."""
    profile, checks, outcome = _written(tmp_path, BELOW)
    result, written = outcome.result, outcome.profile_path
    before = written.read_text()
    assert "speculative-adaptive-config" in before
    decision = fallback.settle(str(profile), checks, outcome)
    assert decision is not None and decision.fall_back
    text = written.read_text()
    assert text.startswith("# Written by `inv tune`:\n# the table was below the goal")
    tuned = load_profile(str(written))
    assert not tuned.flags.get("speculative-adaptive")
    assert not tuned.flags.get("speculative-adaptive-config")
    assert tuned.flags["speculative-num-steps"] == 3 and "files" not in yaml.safe_load(text)
    assert decision.why in result.notes
    tunefiles.note_verification(written, {"h0": outcome.verdicts[0].sentence})
    assert tunefiles.verification_notes(written) == {"h0": outcome.verdicts[0].sentence}
    assert written.read_text().startswith("# Written by `inv tune`:\n# the table was below")
