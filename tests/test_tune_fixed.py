"""inv tune on an engine with one draft depth for every load (issue 38): the engine's adapter
says how to set its depth (llama.cpp's --spec-draft-n-max) and which flags make it draft, the
plain server is depth 0, and the one depth written is the one whose worst level keeps the
most of that level's best. The real llama-server runs it in tests/engines."""

from __future__ import annotations

import pytest
import yaml

from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.control.tune import depth_cells as tunecells
from gpufleet.control.tune import fixed as tunefixed
from gpufleet.control.tune.measurement import Measurement
from gpufleet.errors import UserError
from gpufleet.records import ResultRow

DRAFT = {"model-draft": "/models/draft.gguf", "spec-type": "draft-simple",
         "spec-draft-n-max": 4, "spec-draft-n-min": 2, "threads-draft": 2, "parallel": 4}  # fmt: skip


def _profile(tmp_path, flags: dict, engine: str = "llamacpp") -> str:
    path = tmp_path / f"{engine}-draft.yaml"
    path.write_text(yaml.safe_dump({"engine": engine, "model_path": "/models/target.gguf",
                                    "flags": flags}))  # fmt: skip
    return str(path)


def test_llama_cpp_cells_set_its_depth_and_the_plain_cell_drops_every_draft_flag(tmp_path):
    arms = tunecells.depth_arms(_profile(tmp_path, DRAFT), [1, 3])
    assert [a.label for a in arms] == ["llamacpp-draft[plain]", "llamacpp-draft[depth=1]",
                                       "llamacpp-draft[depth=3]"]  # fmt: skip
    plain = arms[0].resolved_profile()
    assert plain.flags == {"parallel": 4}  # no draft model, type, depth or draft threads
    three = arms[2].resolved_profile()
    assert three.flags["spec-draft-n-max"] == 3 and "spec-draft-n-min" not in three.flags
    assert three.flags["model-draft"] == "/models/draft.gguf"
    assert [tunecells.arm_depth(a) for a in arms] == [tunecells.PLAIN, 1, 3]
    # an older llama.cpp's name for the same flag is kept where the profile uses it
    older = {**{k: v for k, v in DRAFT.items() if not k.startswith("spec-draft")},
             "draft-max": 8}  # fmt: skip
    deep = tunecells.depth_arms(_profile(tmp_path, older), [2])[1].resolved_profile()
    assert deep.flags["draft-max"] == 2 and "spec-draft-n-max" not in deep.flags


def test_a_profile_tune_cannot_set_the_depth_of_is_one_line(tmp_path):
    no_type = {k: v for k, v in DRAFT.items() if k != "spec-type"}
    with pytest.raises(UserError, match="draft is unused without spec-type"):
        tunecells.depth_arms(_profile(tmp_path, no_type), [1])
    with pytest.raises(UserError, match=r"needs a draft model \(model-draft\)"):
        tunecells.depth_arms(_profile(tmp_path, {"parallel": 4}), [1])
    vllm = _profile(tmp_path, {"speculative-config": '{"num_speculative_tokens": 3}'}, "vllm")
    with pytest.raises(UserError, match=r"cannot set engine vllm's draft depth \(it can for "
                                        r"sglang, sim, llamacpp\)"):  # fmt: skip
        tunecells.depth_arms(vllm, [1])


def _rows(table: dict) -> Measurement:
    return Measurement({
        d: {c: [ResultRow(c, 40, 0, tput, median_per_request_output_tps=tput / c,
                          p10_per_request_output_tps=tput / c * 0.9)]
            for c, tput in levels.items()}
        for d, levels in table.items()
    })  # fmt: skip


def test_one_depth_for_every_load_is_the_one_that_costs_least_where_it_costs_most():
    """Depth 4 is best at C=1 and worst at C=8; plain the reverse; depth 2 keeps 90% and 92%
    of each level's best: it is written, and each level's own best is said."""
    result = tunefixed.choose_fixed(_rows({
        tunecells.PLAIN: {1: 50, 8: 300},
        2: {1: 72, 8: 276},
        4: {1: 80, 8: 200},
    }))  # fmt: skip
    assert result.fixed_depth == 2 and result.table == {}
    assert [(c.concurrency, c.depth) for c in result.choices] == [(1, 4), (8, 0)]
    assert result.ranges[0].startswith("depth 2 at every load")
    assert "keeps 90% of the best depth's output tok/s at its worst level (C=1)" in result.ranges[0]
    assert result.ranges[1] == "best depth per level: C=1: 4, C=8: 0"
    assert any("cannot follow it" in note for note in result.notes)
    # where one depth is best everywhere, that is the answer and no note says otherwise
    same = tunefixed.choose_fixed(_rows({tunecells.PLAIN: {1: 50, 8: 200}, 3: {1: 90, 8: 260}}))
    assert same.fixed_depth == 3 and not same.notes
    # within 1% the shallower depth: less drafting for the same result
    tie = tunefixed.choose_fixed(_rows({tunecells.PLAIN: {1: 50}, 2: {1: 99.5}, 5: {1: 100}}))
    assert tie.fixed_depth == 2


def test_the_fixed_depth_profile_extends_the_original_at_that_depth(tmp_path):
    from gpufleet.control.server import engines
    from gpufleet.control.tune import files as tunefiles

    profile = _profile(tmp_path, DRAFT)
    drafting = engines.engine("llamacpp").drafting
    assert drafting is not None
    for depth, expected in ((2, {"spec-draft-n-min": False, "spec-draft-n-max": 2}),
                            (0, {k: False for k in ("model-draft", "spec-type",
                                                    "spec-draft-n-max", "spec-draft-n-min",
                                                    "threads-draft")})):  # fmt: skip
        flags = tunefixed.profile_flags(drafting, DRAFT, depth)
        assert flags == expected
        written = tunefiles.write_fixed(profile, f"tuned{depth}", flags, [f"depth {depth}"])
        data = yaml.safe_load(written.read_text())
        assert data["extends"] == "llamacpp-draft" and data["flags"] == expected
        assert written.read_text().startswith(f"# Written by `inv tune`:\n# depth {depth}\n")
        resolved = ArmSpec(str(written)).resolved_profile()
        if depth:
            assert resolved.flags["spec-draft-n-max"] == 2
            assert resolved.speculative_algorithm == "draft model (draft-simple)"
        else:
            assert resolved.speculative_algorithm is None  # no drafting at all


def test_the_clock_plans_no_load_step_nor_bursts_for_one_depth_per_launch(tmp_path):
    """The load step and the bursts judge depth switching: a server with one depth per
    launch has none, so the tune neither runs them nor counts them in its estimate."""
    from gpufleet.control.bench.request import BenchRequest
    from gpufleet.control.tune import budget as tunebudget

    profile = _profile(tmp_path, DRAFT)
    arms = tunecells.depth_arms(profile, [1, 3])
    checks = [ArmSpec(profile, {}, 1, "p[plain]"), ArmSpec(profile, {}, 1, "p-static"),
              ArmSpec(profile, {}, 1, "p-tuned")]  # fmt: skip
    request = BenchRequest(concurrency=[1, 4], num_prompts=8, output_len=32)
    said: list[str] = []
    no_switching = tunebudget.TuneArms(arms, checks, verify=True, switches=False)
    clock = tunebudget.TimeKeeper.for_tune(no_switching, request, None, said.append, pace=None)
    assert {c.stage for c in clock.cells} == {tunebudget.MEASURE, tunebudget.VERIFY}
    assert said[0].startswith("tune: 13 launches (3 measurement, 10 verification);")
    adaptive = tunebudget.plan_cells(tunebudget.TuneArms(arms, checks), request)
    # SGLang's: the load step and the bursts too, each server (plain, static, tuned, depths
    # 1 and 3) in three rounds (issue 83.1)
    assert len(adaptive) == 13 + 2 * (3 + 2) * 3
