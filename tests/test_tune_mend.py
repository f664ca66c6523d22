"""Issue 63.2: a level where the tuned server kept less than the goal of the best static
server beside it is explained from the tune's own measurement, mended where a table can
change, and said with its cause and figure where it cannot (control/tune/mend.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpufleet.control.tune import files as tunefiles
from gpufleet.control.tune import mend
from gpufleet.control.tune.depth_cells import PLAIN, SKIP
from gpufleet.control.tune.table import Choice, TuneResult, table_and_ranges
from gpufleet.control.tune.verify import VerdictRow
from gpufleet.report.compare import Arm
from helpers import QUICK_SIM, adaptive_flags, level, unwrap

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 64]


def _result(depths: dict[int, int], skip: bool = False) -> TuneResult:
    """A tune's result choosing `depths` (C -> depth), measured: depth 0 at 471 tok/s with
    the skip (pinned 390), plain at 482, depth 3 and 4 at every level."""
    choices = [Choice(c, d, "measured") for c, d in depths.items()]
    table, ranges = table_and_ranges(choices, SIZES)
    cells = {c: {"output_throughput": 0.0, "per_request": 30.0} for c in depths}
    measured = {
        0: {c: {**cells[c], "output_throughput": 390.0} for c in depths},
        SKIP: {c: {**cells[c], "output_throughput": 471.0} for c in depths},
        PLAIN: {c: {**cells[c], "output_throughput": 482.0} for c in depths},
        3: {c: {**cells[c], "per_request": 40.0} for c in depths},
        4: {c: {**cells[c], "per_request": 20.0} for c in depths},
    }
    return TuneResult(table, choices, ranges, measured=measured, skip_extend=skip)


def _row(c: int, kept: float, best: str, tps: float = 480.0) -> VerdictRow:
    return VerdictRow(c, "no drafting", {}, {}, kept, best, tps, kept)


def _tuned(switches: dict[int, int]) -> Arm:
    return Arm("p-tuned", [], {c: level(c, depth_switches=n) for c, n in switches.items()})


def test_a_level_whose_batch_dips_cross_its_switch_point_begins_its_range_lower():
    """The issue's case: {"1":[3],"6":[4],"12":[0]} kept 97.7% of plain at C=16, where the
    tuned server switched depth as its batch dipped below the key. The range holding C=16
    then begins right above C=8 (key 10, from batch 9): the dips between 9 and 11 stay at
    depth 0; the table is otherwise unchanged."""
    result = _result({1: 3, 4: 4, 8: 4, 16: 0, 64: 0}, skip=True)
    assert result.table == {"1": {"candidate_steps": [3]}, "2": {"candidate_steps": [4]},
                            "12": {"candidate_steps": [0]}}  # fmt: skip
    rows = [_row(1, 1.0, "p[depth=3]"), _row(16, 0.977, "p[plain]"), _row(64, 0.99, "p[plain]")]
    [found] = mend.diagnose(rows, _tuned({1: 0, 16: 7, 64: 0}), result, SIZES)
    assert found.concurrency == 16 and found.early and found.depth is None
    assert "switched depth 7 times during the level: its batch dipped below 11" in found.cause
    assert "where the table runs depth 4" in found.cause
    fixed = mend.mended(result, [found], SIZES)
    assert fixed.table == {"1": {"candidate_steps": [3]}, "2": {"candidate_steps": [4]},
                           "10": {"candidate_steps": [0]}}  # fmt: skip
    assert [ch.depth for ch in fixed.choices] == [3, 4, 4, 0, 0]
    said = mend.outcome_text(found, result, 0.994, kept=True)
    assert said.startswith("C=16: 97.7% of p[plain]: the tuned server switched depth 7 times")
    assert said.endswith("mended (the range holding C=16 begins right above C=8): 99% "
                         "measured again beside it")  # fmt: skip
    worse = mend.outcome_text(found, result, 0.975, kept=False)
    assert worse.endswith("measured 97.5% beside it, no better: the table is kept as first "
                          "written")  # fmt: skip


def test_a_level_where_another_depth_served_more_beside_it_takes_that_depth():
    result = _result({1: 3, 4: 3, 16: 0})
    rows = [_row(4, 0.95, "p[depth=4]", 300.0)]
    [found] = mend.diagnose(rows, _tuned({4: 0}), result, SIZES)
    assert found.depth == 4 and not found.early
    assert (
        found.cause
        == "the table runs depth 3 here and p[depth=4] (depth 4) served 300 tok/s beside it"
    )
    assert mend.mended(result, [found], SIZES).table == {
        "1": {"candidate_steps": [3]}, "2": {"candidate_steps": [4]},
        "8": {"candidate_steps": [0]},
    }  # fmt: skip
    # the speed floor holds for a mend as for the table: depth 4 runs 20 tok/s a request
    [floored] = mend.diagnose(rows, _tuned({4: 0}), result, SIZES, floor=25.0)
    assert not floored.mendable and "below the speed floor of 25 tok/s per request" in floored.cause


def test_depth_0_below_no_drafting_is_said_with_the_tunes_own_figures_not_mended():
    result = _result({1: 3, 16: 0, 64: 0}, skip=True)
    rows = [_row(64, 0.977, "p[plain]")]
    [found] = mend.diagnose(rows, _tuned({64: 0}), result, SIZES)
    assert not found.mendable
    assert found.cause.startswith(
        "an adaptive server at depth 0 serves 2.3% less than one without speculation here "
        "(the tune measured 471 vs 482 tok/s): SGLang runs the draft model's extend every "
        "step at depth 0 (eagle_worker_v2._draft_extend_for_decode), or with the skip variable "
        "drafts from zeros after each upshift"
    )
    assert (
        mend.outcome_text(found, result, None, kept=False)
        == f"C=64: 97.7% of p[plain]: {found.cause}"
    )
    # without the skip variable the pinned depth 0 is the figure
    assert (
        "(the tune measured 390 vs 482 tok/s)"
        in mend.diagnose(rows, _tuned({64: 0}), _result({1: 3, 16: 0, 64: 0}), SIZES)[0].cause
    )


def test_a_range_that_already_begins_above_the_level_below_is_not_moved():
    """Switches at the first level of a range whose key is already right above the level
    below: no earlier start exists, so the cause is said and nothing is mended."""
    result = _result({8: 3, 9: 0})
    [found] = mend.diagnose([_row(9, 0.96, "p[plain]")], _tuned({9: 5}), result, SIZES)
    assert not found.mendable
    assert found.cause.endswith("its range already begins right above the level below")


def test_levels_at_or_above_the_goal_and_unexplained_ones():
    result = _result({1: 3, 16: 0})
    rows = [_row(1, 0.98, "p[depth=3]"), _row(16, 0.97, "p[depth=0]")]
    [found] = mend.diagnose(rows, _tuned({1: 0, 16: 0}), result, SIZES)
    assert found.concurrency == 16 and not found.mendable  # 0.98 itself meets the goal
    assert found.cause.startswith("not explained by the tune's measurement")


def test_the_profiles_own_static_speculation_is_said_as_beyond_any_table():
    """The seeds' EAGLE-3 drafts a tree (topk 4, 16 draft tokens); SGLang's adaptive mode
    drafts a chain only, so where that server was best no table can match it."""
    result = _result({1: 1, 16: 0})
    [found] = mend.diagnose([_row(1, 0.85, "p-static", 101.0)], _tuned({1: 0}), result, SIZES)
    assert not found.mendable
    assert found.cause.startswith("p-static, the profile's own static speculation, served 101 "
                                  "tok/s beside it; SGLang's adaptive mode drafts a chain")  # fmt: skip


def test_the_measurements_cell_names_read_as_depths():
    """Without a static depth beside it the verification's bar is the measurement's best
    cell, named `depth 3`, `depth 0 (skip)` or `plain` (verify._cell_name)."""
    result = _result({1: 4, 16: 0})
    [found] = mend.diagnose([_row(1, 0.95, "depth 3", 90.0)], _tuned({1: 0}), result, SIZES)
    assert found.depth == 3
    [zero] = mend.diagnose([_row(16, 0.97, "plain")], _tuned({16: 0}), result, SIZES)
    assert zero.cause.startswith("an adaptive server at depth 0 serves")


@pytest.mark.slow(minutes=2)
def test_a_tune_says_why_a_level_fell_short_in_its_sentence_record_and_note(fleet, tmp_path):
    """The seeds' shape, end to end on the rehearsal: a profile whose own static
    speculation drafts a tree (topk 4, 16 draft tokens) tuned over depth 1 only, at C=1,
    where the tree serves well ahead of any chain the table can hold. The verification
    names the shortfall, and the mend's words say why in the terminal, the record and the
    tuned profile's note alike."""
    profile = fleet.profile(
        "tree",
        tp=1,
        sim={**QUICK_SIM, "accept-rate": "0.8"},
        flags=adaptive_flags(3, topk=4, draft_tokens=16),
    )
    archive = tmp_path / "a"
    out = fleet.cli(
        "tune", "--profile", str(profile), "--depths", "1", "--concurrency", "1",
        "--num-prompts", "8", "--output-len", "32", "--hosts", "h0", "--archive", str(archive),
        timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    [record_path] = (archive / "tunes").glob("*.json")
    record = json.loads(record_path.read_text())
    verified = record["verify"]["h0"]
    [row] = verified["rows"]
    assert row["best_static"] == "tree-static" and row["kept_best"] < 0.95, row
    [said] = verified["mend"]
    assert said.startswith("C=1: ") and "tree-static, the profile's own static speculation" in said
    sentence = verified["sentence"]
    assert sentence.endswith(f"Mend: {said}.")
    assert f"h0: {sentence}" in unwrap(out.stdout)
    tuned = profile.parent / "tree-tuned.yaml"
    assert tunefiles.verification_notes(tuned) == {"h0": sentence}
    assert record["table"] == {"1": {"candidate_steps": [1]}}  # nothing a table could mend
    # issue 83.3: that table, below the goal where the tree was not, is not written as the
    # tuned profile: the tree is, and the last lines say why
    written = yaml.safe_load(tuned.read_text())  # the tree: the profile, adaptive flags off
    assert written["extends"] == "tree" and written["flags"] == {
        "speculative-adaptive": False, "speculative-adaptive-config": False}  # fmt: skip
    assert "the tuned profile is written as tree-static" in unwrap(out.stdout)
    assert any(n.endswith("the tuned profile is written as tree-static") for n in record["notes"])


@pytest.mark.slow(minutes=2)
def test_a_mend_is_measured_beside_its_static_server_and_kept_only_where_better(fleet, tmp_path):
    """The mend's own measurement on the rehearsal (a tune on 2 cores met it and crashed
    there: its servers were collected in a dict by ArmSpec, which is not hashable): the
    mended table is written and launched beside the static server it fell short of, twice
    each, interleaved, at that level only; a mend that measured better stays, one that did
    not puts the table as first written back, byte for byte."""
    from gpufleet.archive.kept import SweepRecord, TuneRecord
    from gpufleet.archive.layout import Archive
    from gpufleet.control.bench.request import BenchRequest
    from gpufleet.control.connect.fleet import Fleet as Hosts
    from gpufleet.control.inventory.model import load_inventory
    from gpufleet.control.sweep.experiment import Console, Experiment
    from gpufleet.control.tune import budget as tunebudget
    from gpufleet.control.tune import depth_cells as tunecells
    from gpufleet.control.tune import tune_run
    from gpufleet.control.tune import verify as tuneverify

    profile = fleet.profile("mendme", tp=1, sim=QUICK_SIM, flags=adaptive_flags(1))
    archive = tmp_path / "a"
    out = fleet.cli(
        "tune", "--profile", str(profile), "--depths", "1", "--concurrency", "1,8",
        "--num-prompts", "8", "--output-len", "16", "--hosts", "h0", "--archive", str(archive),
        "--no-verify", timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    [record_path] = (archive / "tunes").glob("*.json")
    record = TuneRecord.load(record_path)
    measured = {(int(k) if k.isdigit() else k): {int(c): v for c, v in m.items()}
                for k, m in record.measured.items()}  # fmt: skip
    choices = [Choice(ch["concurrency"], ch["depth"], ch["why"]) for ch in record.choices]
    result = TuneResult(record.table, choices, record.ranges, measured=measured)
    config, tuned_yaml = Path(record.config), Path(record.tuned_profile)
    first = (config.read_bytes(), tuned_yaml.read_bytes())
    request = BenchRequest.from_json(SweepRecord.load(Path(record.sweep_state)).request,
                                     Archive.at(archive))  # fmt: skip
    spec = str(profile)
    checks = tuneverify.verification_arms(spec, tunefiles.tuned_reference(spec, None))
    inventory = load_inventory(str(fleet.inventory))
    said: list[str] = []
    hosts = Hosts(inventory.select("h0"), 1, inventory.source, frozenset(inventory.hosts), ())
    experiment = Experiment(hosts, Console(said.append, lambda data, path: None))
    arms = tunecells.depth_arms(spec, [1])
    clock = tunebudget.TimeKeeper.for_tune(tunebudget.TuneArms(arms, checks), request, None,
                                           said.append, pace=None)  # fmt: skip
    at_8 = next(ch for ch in choices if ch.concurrency == 8)
    other = 1 if at_8.depth != 1 else 0
    static = "mendme[depth=1]" if other == 1 else "mendme[plain]"

    def mend_at_8(kept: float) -> tuple[dict, bool]:
        finding = mend.Finding(8, kept, static, "a test's", depth=other)
        row = _row(8, kept, static)
        outcome = tune_run.TuneOutcome(result, config, tuned_yaml, record, record_path,
                                       [tune_run.Verdict("h0", [], [row], "s")])  # fmt: skip
        return tune_run._measure_mend(spec, checks, request, False, experiment=experiment, outcome=outcome,
                                      clock=clock, to_mend=[finding])  # fmt: skip

    shares, kept = mend_at_8(5.0)  # no server keeps 5x: measured, and put back
    assert not kept and set(shares["h0"]) == {8}, shares
    assert (config.read_bytes(), tuned_yaml.read_bytes()) == first
    states = sorted((archive / "sweeps").glob(f"*{tune_run.MEND}*.json"))
    [state] = [json.loads(p.read_text()) for p in states]
    assert [a["key"] for a in state["arms"]] == [static, "mendme-tuned", f"{static}#2",
                                                 "mendme-tuned#2"]  # fmt: skip
    assert [lv["concurrency"] for lv in state["request"]["fixed_levels"]] == [8]
    shares, kept = mend_at_8(0.01)  # any measurement beats that: the mend stays
    assert kept and shares["h0"][8] > 0.01
    table = json.loads(config.read_text())
    assert table != json.loads(first[0].decode())
    assert any(slot["candidate_steps"] == [other] for slot in table.values())


def test_no_drafting_best_beside_a_drafting_depth_says_what_depth_0_costs():
    """Met on 2 cores: the table ran depth 2 at C=16, ahead of depth 0 as the tune measured
    it (the draft extend), while no drafting served more beside it."""
    result = _result({1: 3, 16: 3})
    [found] = mend.diagnose([_row(16, 0.96, "p[plain]", 482.0)], _tuned({16: 0}), result, SIZES)
    assert not found.mendable
    assert found.cause.startswith("no drafting served 482 tok/s beside it, and the table runs "
                                  "depth 3 here, ahead of depth 0 as the tune measured it: an "
                                  "adaptive server at depth 0 serves 19.1% less")  # fmt: skip


def test_the_profiles_own_static_chain_is_a_depth_the_mend_can_give():
    """On the lent machine `--budget 420` dropped depths 2-4, the table ran depth 1, and the
    profile's own static speculation (depth 3, topk 1: a chain) served 12% more at C=1: a
    depth a table slot holds, so the mend gives it to that range. Its switch counts are
    means over the verification's two launches (7.0): said as whole switches."""
    from gpufleet.control.server.profiles import Profile
    from gpufleet.control.tune.depth_cells import static_chain_depth

    result = _result({1: 1, 16: 1})
    rows = [_row(1, 0.88, "p-static", 89.0)]
    [found] = mend.diagnose(rows, _tuned({1: 0}), result, SIZES, own_static=3)
    assert found.depth == 3
    assert (
        found.cause
        == "the table runs depth 1 here and p-static (depth 3) served 89 tok/s beside it"
    )
    chain = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": 3,
             "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 4}  # fmt: skip
    assert static_chain_depth(Profile(name="p", model_path="/m", flags=chain)) == 3
    tree = {**chain, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 16}
    assert static_chain_depth(Profile(name="p", model_path="/m", flags=tree)) is None
    tuned = _tuned({16: 7})
    tuned.levels[16].row.depth_switches = 7.0  # the repeats' mean, as the report gives it
    [switched] = mend.diagnose([_row(16, 0.9, "p[depth=1]")], tuned,
                               _result({1: 3, 4: 1, 16: 1}), SIZES)  # fmt: skip
    assert "switched depth 7 times" in switched.cause
