"""A budget that stops `inv tune` before its verification accepted the table never leaves
that table as the tuned profile (issue 83: the tune "writes only a table its verification
accepts"; control/tune/unverified.py): the table is kept as a candidate named unverified,
the tuned profile is the best static measured, and the last line says what was not
verified, why and the command that finishes it. A budget that stops the load shapes after
the table was accepted keeps it, and says which headline has no figure.

The rehearsal holds a cell open (`--sim-hold-while`) while the tune runs, as a machine
slower than the tune's pace would: the budget then runs out at the stage the test picks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from gpufleet.control.tune import unverified
from gpufleet.control.tune.depth_cells import depth_arms
from gpufleet.report import catalogue
from helpers import QUICK_SIM, REPO, adaptive_flags

HOLD_S = 35.0  # under the profiles' health timeout (300 s): a launch waits, never fails


def _tune(fleet, argv: list[str], hold: Path, trigger: str | None,
          until_s: float | None = None) -> tuple[int, str]:  # fmt: skip
    """The tune through the real CLI; once a line matches `trigger`, the rehearsal holds
    every request for HOLD_S (the file exists), or until `until_s` after the start, then
    lets go."""
    began = time.monotonic()
    proc = fleet.popen(*argv)
    said: list[str] = []
    for text in proc.stdout:
        said.append(text)
        if trigger and re.search(trigger, text) and not hold.exists():
            hold.touch()
            hold_s = HOLD_S if until_s is None else until_s - (time.monotonic() - began)
            threading.Timer(hold_s, lambda: hold.unlink(missing_ok=True)).start()
            trigger = None
    return proc.wait(timeout=600), "".join(said)


def _least(fleet, argv: list[str]) -> int:
    """A fresh archive's first call: its first cell sets the pace and the tune stops with
    the least budget that holds the measurement and its verification."""
    out = fleet.cli(*argv, "--budget", "1", timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    found = re.search(r"give --budget (\d+) or more", out.stderr)
    assert found, out.stderr
    return int(found.group(1))


def _profile(fleet, name: str, steps: int, hold: Path) -> Path:
    """An EAGLE-3 profile whose own static speculation drafts `steps` deep, at an acceptance
    where depth 1 beats no drafting at C=1 and 4 (with `--depths 1`, a table of depth 1:
    its own static at steps 1, short of the chain at steps 3)."""
    sim = {**QUICK_SIM, "accept-rate": "0.8", "hold-while": str(hold)}
    return fleet.profile(name, tp=1, flags=adaptive_flags(steps), sim=sim, health_timeout=300)


def _argv(profile: Path, archive: Path) -> list[str]:
    return ["tune", "--profile", str(profile), "--depths", "1", "--concurrency", "1,4",
            "--num-prompts", "8", "--output-len", "16", "--hosts", "h0",
            "--archive", str(archive)]  # fmt: skip


def _paste(command: str) -> subprocess.CompletedProcess:
    """The printed command, run as a user pastes it (the virtual environment's `inv`)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("GPUFLEET_INVENTORY", None)
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def _sigterm_held(proc: subprocess.Popen, hold: Path, pattern: str) -> str:
    """At the first line matching `pattern`, the rehearsal holds its requests (the stage
    that follows waits) and the tune gets SIGTERM there; everything it printed."""
    import signal

    said: list[str] = []
    for text in proc.stdout:
        said.append(text)
        if re.search(pattern, text):
            hold.touch()
            os.kill(proc.pid, signal.SIGTERM)
            break
    said.append(proc.communicate(timeout=300)[0])
    hold.unlink(missing_ok=True)
    return "".join(said)


def test_the_best_static_the_measurement_measured_is_the_one_with_the_best_worst_level(tmp_path):
    """Depth 1 keeps 80% of C=1's best and all of C=4's; plain 60% at C=1: depth 1 (its worst
    80% against plain's 60%); depth 0's pinned cells are never a static to write, but on an
    engine with one depth for every load, depth 0 is the plain server."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"model_path": "/m", "flags": adaptive_flags(3)}))
    arms = depth_arms(str(spec), [1, 3])
    t = catalogue.THROUGHPUT
    measured = {"plain": {1: {t: 60.0}, 4: {t: 250.0}}, 0: {1: {t: 999.0}, 4: {t: 999.0}},
                1: {1: {t: 80.0}, 4: {t: 250.0}}, 3: {1: {t: 100.0}, 4: {t: 150.0}}}  # fmt: skip
    arm, share = unverified.best_measured(measured, arms)
    assert arm.label == "spec[depth=1]" and share == pytest.approx(0.8)
    assert unverified.best_measured({}, arms) is None
    one_depth = {0: {1: {t: 100.0}, 4: {t: 300.0}}, 1: {1: {t: 80.0}, 4: {t: 250.0}}}
    arm, share = unverified.best_measured(one_depth, arms)  # plain read as depth 0 (llama.cpp)
    assert arm.label == "spec[plain]" and share == 1.0
    stop = unverified.Unverified("x", 30.0, "the verification")
    assert stop.budget_hint == 90 and unverified.Unverified("x", 100.0, "v").budget_hint == 200


@pytest.mark.slow(minutes=4)
def test_a_budget_spent_during_the_verification_leaves_a_static_profile_and_a_command(
    fleet, tmp_path
):
    """Before: the budget stopped the verification (held 35 s) and the tuned profile stayed
    the unverified table (adaptive flags, its file), the line only "stopped after 5
    launches ... give --budget N". Now the profile is the best static measured, the table
    is a candidate named unverified, the line says so with the budget spent, and the
    command it prints, pasted, finishes the verification: the candidate goes, and the
    tuned profile is what the verification accepted."""
    hold = tmp_path / "hold"
    profile = _profile(fleet, "uspec", 1, hold)  # fmt: skip
    argv = _argv(profile, tmp_path / "a")
    least = _least(fleet, argv)
    code, said = _tune(fleet, [*argv, "--budget", str(least + 15)], hold,
                       r"^tune: wrote .*uspec-tuned\.yaml")  # fmt: skip
    assert code == 2, said[-4000:]
    last = said.strip().splitlines()[-1]
    print(last)
    assert last.startswith(f"gpufleet: --budget {least + 15}: the budget stopped the tune "
                           "during the verification (")  # fmt: skip
    assert "the table was not verified, so it is not the tuned profile" in last
    tuned = profile.parent / "uspec-tuned.yaml"
    written = yaml.safe_load(tuned.read_text())
    assert written["description"].startswith("uspec as uspec[")  # a static: plain or depth 1
    assert written["flags"].get("speculative-adaptive") is not True, written
    candidate = profile.parent / "uspec-tuned-unverified.yaml"
    assert f"the table is kept unverified as {candidate}" in last
    kept = candidate.read_text()
    assert kept.startswith("# UNVERIFIED") and yaml.safe_load(kept)["flags"]["speculative-adaptive"]
    assert not (profile.parent / "files" / "uspec-tuned.json").exists()
    [record_path] = (tmp_path / "a" / "tunes").glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["verify"] == {} and any("was not verified" in n for n in record["notes"])
    found = re.search(r"; finish the verification with `([^`]+)`$", last)
    assert found and "--resume" in found.group(1), last
    done = _paste(found.group(1))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    record = json.loads(record_path.read_text())
    assert list(record["verify"]) == ["h0"]
    assert not candidate.exists()  # the verification finished: no stale candidate
    written = yaml.safe_load(tuned.read_text())
    if record["verify"]["h0"]["shortfalls"]:  # the table measured below the goal: a static
        assert written["flags"].get("speculative-adaptive") is not True
    else:  # accepted: the verified table is the tuned profile
        assert written["flags"]["speculative-adaptive"] is True


@pytest.mark.slow(minutes=4)
def test_a_budget_spent_during_the_mend_never_leaves_the_mended_table_as_the_profile(
    fleet, tmp_path
):
    """A table of depth 1 where the profile's own depth-3 chain serves more: the mend writes
    depth 3 there and launches it again; the budget runs out during that (held 35 s).
    Before: the mended, unmeasured table stayed the tuned profile. Now the verification's
    best static is (the table as first written was below the goal), the mended table is
    the unverified candidate, and the line names the mend and the command, which, pasted,
    measures the mend and judges it."""
    hold = tmp_path / "hold"
    profile = _profile(fleet, "mspec", 3, hold)  # fmt: skip
    argv = _argv(profile, tmp_path / "a")
    least = _least(fleet, argv)
    budget = least + 20  # the mend's four launches fit by the estimate, not with the hold
    code, said = _tune(fleet, [*argv, "--budget", str(budget)], hold, r"^tune: mending \(")
    last = said.strip().splitlines()[-1]
    print(last)
    if "tune: mending (" not in said:  # the budget left no room for the mend: said, static
        assert code == 0 and "the mend was not measured" in said, said[-4000:]
        pytest.skip("this machine's pace left no room for the mend: nothing to stop in it")
    assert code == 2, said[-4000:]
    assert "the budget stopped the tune during the mend (" in last
    assert "the mended table was not verified, so it is not the tuned profile" in last
    assert "the table was below the goal as first written" in last
    found = re.search(r"; finish the mend with `(inv tune [^`]+--resume)`$", last)
    assert found, last
    written = yaml.safe_load((profile.parent / "mspec-tuned.yaml").read_text())
    assert written["flags"].get("speculative-adaptive") is not True, written
    candidate = profile.parent / "mspec-tuned-unverified.yaml"
    table = json.loads((profile.parent / "files" / "mspec-tuned-unverified.json").read_text())
    assert candidate.exists() and [3] in [slot["candidate_steps"] for slot in table.values()]
    done = _paste(found.group(1))  # the mend measured, then kept or put back, and judged
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert not candidate.exists() and "tune: mending (" in done.stdout
    [record_path] = (tmp_path / "a" / "tunes").glob("*.json")
    assert json.loads(record_path.read_text())["verify"]["h0"]["mend"]


@pytest.mark.slow(minutes=4)
def test_a_budget_spent_during_the_load_shapes_keeps_the_verified_table_and_says_no_figure(
    fleet, tmp_path
):
    """The verification accepted the table; the budget runs out during the load shapes
    (its first cell held until the budget is spent). Before: the tune ended with exit 2 and the line "stopped after N launches:
    the measurement and its verification need ~...", the record without its closing note.
    Now it ends 0, the verified table stays the tuned profile, and the shape the budget
    stopped has no figure, said as such: never a ratio from partial rounds."""
    hold = tmp_path / "hold"
    profile = _profile(fleet, "sspec", 1, hold)  # fmt: skip
    argv = [*_argv(profile, tmp_path / "a"), "--shape-rounds", "2"]
    least = _least(fleet, argv)
    budget = least * 3  # room for the load step's 8 launches by the estimate
    # the load step's first cell held until the budget is spent: a machine that slow
    code, said = _tune(fleet, [*argv, "--budget", str(budget)], hold, r"tune-verify: done",
                       until_s=budget + 5)  # fmt: skip
    [record_path] = (tmp_path / "a" / "tunes").glob("*.json")
    record = json.loads(record_path.read_text())
    if record["verify"]["h0"]["shortfalls"]:
        pytest.skip(f"the table fell short (a static profile): {record['verify']['h0']}")
    if "dropped load step" in said:
        pytest.skip(f"this machine's pace left no room for the load step: {said[-3000:]}")
    assert code == 0, said[-4000:]
    last = said.strip().splitlines()[-1]
    print(last)
    assert last.startswith("tune: spent ") and ": no figure: budget (" in last, last
    written = yaml.safe_load((profile.parent / "sspec-tuned.yaml").read_text())
    assert written["flags"]["speculative-adaptive"] is True
    headlines = record["step"]["h0"]["headline"]
    assert any(": no figure: budget (" in h for h in headlines), headlines
    assert record["notes"][-1].startswith("the tune spent ")


@pytest.mark.slow(minutes=2)
def test_an_interrupt_during_the_verification_never_leaves_the_table_as_the_profile(
    fleet, tmp_path
):
    """Before: SIGTERM (as Ctrl-C) once the table was written stopped the verification and
    left the unverified table as the tuned profile (only `--budget` stops demoted it). Now
    any stop before the verification accepted the table does: the tuned profile is the best
    static measured, the table a candidate named unverified, the record says why, and the
    interrupt goes on as it came (exit 130, the resume line)."""

    hold = tmp_path / "hold"
    profile = _profile(fleet, "ispec", 1, hold)
    proc = fleet.popen(*_argv(profile, tmp_path / "a"))
    text = _sigterm_held(proc, hold, r"^tune: wrote .*ispec-tuned\.yaml")
    assert proc.returncode == 130, text[-4000:]
    assert re.search(r"--resume`", text), text[-3000:]
    written = yaml.safe_load((profile.parent / "ispec-tuned.yaml").read_text())
    assert written["flags"].get("speculative-adaptive") is not True, written
    candidate = (profile.parent / "ispec-tuned-unverified.yaml").read_text()
    assert candidate.startswith("# UNVERIFIED") and yaml.safe_load(candidate)["flags"][
        "speculative-adaptive"]  # fmt: skip
    [record_path] = (tmp_path / "a" / "tunes").glob("*.json")
    notes = json.loads(record_path.read_text())["notes"]
    assert any(n.startswith("an interrupt (Ctrl-C, SIGTERM or SIGHUP) stopped the tune during "
                            "the verification") for n in notes), notes  # fmt: skip


@pytest.mark.slow(minutes=4)
def test_an_interrupt_during_the_mend_keeps_the_mended_table_and_its_resume_line_finishes(
    fleet, tmp_path
):
    """Before: SIGTERM once the mend's table was written was taken for a stop "during the
    verification" ("the table was not verified", the verification having finished), the
    table as first written kept as the candidate, and the mended one lost; the candidate's
    `inv launch --profile <stem>` named no profile where the tune's was a path. Now the
    note names the mend and the mended table, the candidate is it, its launch reference
    loads, and the interrupt's `--resume` line, pasted, measures the mend and removes it."""

    from gpufleet.control.server.profiles import load_profile

    hold = tmp_path / "hold"
    profile = _profile(fleet, "nspec", 3, hold)  # as the budget's mend test: a mend of depth 3
    proc = fleet.popen(*_argv(profile, tmp_path / "a"), "--shape-rounds", "1")  # shorter
    text = _sigterm_held(proc, hold, r"^tune: mending \(")
    assert "tune: mending (" in text, text[-4000:]
    assert proc.returncode == 130, text[-4000:]
    [record_path] = (tmp_path / "a" / "tunes").glob("*.json")
    notes = json.loads(record_path.read_text())["notes"]
    [note] = [n for n in notes if n.startswith("an interrupt (Ctrl-C")]
    print(note)
    assert "during the mend (" in note and "the mended table was not verified" in note, note
    table = json.loads((profile.parent / "files" / "nspec-tuned-unverified.json").read_text())
    assert [3] in [slot["candidate_steps"] for slot in table.values()]  # the mended table
    written = yaml.safe_load((profile.parent / "nspec-tuned.yaml").read_text())
    assert written["flags"].get("speculative-adaptive") is not True, written
    launch = re.search(r"\(inv launch --profile (\S+), by hand\)", note)
    assert launch and load_profile(launch.group(1)).flags["speculative-adaptive"], note
    found = re.search(r"`([^`]+--resume)`", text)
    assert found, text[-3000:]
    done = _paste(found.group(1))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert not (profile.parent / "nspec-tuned-unverified.yaml").exists()
    assert json.loads(record_path.read_text())["verify"]["h0"]["mend"]


@pytest.mark.slow(minutes=2)
def test_a_no_verify_tune_says_its_table_is_unverified_and_supersedes_an_earlier_candidate(
    fleet, tmp_path
):
    """Before: `--no-verify` wrote the table as the tuned profile with nothing in its header
    or the record to say it was never verified (a verified one says "Verified on"), the
    record without the closing line, and an earlier stop's `-unverified` candidate, an older
    table, stayed beside it as if it were the unverified one. Now the header and the notes
    say it, the record ends with what the tune spent, the table is not demoted, and the
    older candidate goes: any table this tune writes supersedes it."""
    profile = _profile(fleet, "vspec", 1, tmp_path / "hold")
    stale = profile.parent / "vspec-tuned-unverified.yaml"  # an earlier stop's candidate
    stale.write_text(f"{unverified.HEADER}\nextends: vspec\n")
    out = fleet.cli(*_argv(profile, tmp_path / "a"), "--no-verify", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    text = (profile.parent / "vspec-tuned.yaml").read_text()
    assert text.startswith("# NOT VERIFIED: --no-verify left the verification out"), text
    assert yaml.safe_load(text)["flags"]["speculative-adaptive"] is True  # not demoted
    assert not stale.exists()
    [record_path] = (tmp_path / "a" / "tunes").glob("*.json")
    notes = json.loads(record_path.read_text())["notes"]
    assert any(n.startswith("the tuned profile is not verified: --no-verify") for n in notes)
    assert notes[-1].startswith("the tune spent "), notes


def test_a_failures_words_reach_the_profiles_header_escaped_and_it_still_loads(tmp_path):
    """A failure's first line may carry a host's bytes: ESC in the demoted profile's header
    made it a file YAML refuses ("unacceptable character #x001b"); now escaped."""
    from gpufleet.control.tune import files as tunefiles

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"model_path": "/m", "flags": adaptive_flags(3)}))
    why = unverified.cause_of(RuntimeError("h0: server said \x1b[2J\x07gone\r\nsecond line"))
    assert why == "a failure stopped the tune (h0: server said \\x1b[2J\\x07gone)", why
    arm = depth_arms(str(spec), [1])[0]
    written = tunefiles.write_static(str(spec), "spec-tuned", arm, why)
    assert yaml.safe_load(written.read_text())["extends"] == "spec"
