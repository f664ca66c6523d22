"""`inv tune` as one orchestration: measure every depth (a sweep), choose the table, write
the tuned profile, verify it (a second sweep) and archive the tune record.

The sweeps themselves run through the caller's `Experiment` (control/sweep/experiment.py: hosts,
Ctrl-C's token, the console), so this module holds the order of steps and the record, and
no output.
The record is saved once measured and again with the verification: a tune interrupted
during its verification keeps its table (`--resume` finishes it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.archive import store
from gpufleet.archive.kept import TuneRecord
from gpufleet.archive.layout import Archive
from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.server.profiles import load_profile
from gpufleet.control.sweep.cells import ArmSpec, interleaved
from gpufleet.control.sweep.cells import profile_label as profile_label_of
from gpufleet.control.sweep.experiment import Experiment
from gpufleet.control.sweep.sweep_state import SweepState
from gpufleet.control.tune import budget as tunebudget
from gpufleet.control.tune import depth_cells as tunecells
from gpufleet.control.tune import fallback as tunefallback
from gpufleet.control.tune import files as tunefiles
from gpufleet.control.tune import fixed as tunefixed
from gpufleet.control.tune import mend as tunemend
from gpufleet.control.tune import shapes as tuneshapes
from gpufleet.control.tune import table as tuning
from gpufleet.control.tune import ties as tunetie
from gpufleet.control.tune import unverified as tuneunverified
from gpufleet.control.tune import verify as tuneverify
from gpufleet.control.tune.measurement import Measurement
from gpufleet.errors import UserError
from gpufleet.kinds import CellStatus
from gpufleet.report import select


def save_record(record: TuneRecord, path: Path) -> None:
    """Write the tune's record atomically."""
    store.make_dirs(path.parent)
    store.write_private_file(path, record.to_json().encode())


@dataclass
class Verdict:
    """One host's verification: the tuned server beside no drafting and static speculation, level
    by level, and its sentence."""

    host: str
    arms: list[Any]
    rows: list[tuneverify.VerdictRow]
    sentence: str


@dataclass
class TuneOutcome:
    """Everything a tune produced: the table, the files written, the record and the verdicts."""

    result: tuning.TuneResult
    config_path: Path | None  # SGLang's adaptive table (None: an engine with one depth)
    profile_path: Path
    record: TuneRecord
    record_path: Path
    verdicts: list[Verdict] = field(default_factory=list)
    steps: list[tuneshapes.StepVerdict] = field(default_factory=list)
    fallback: tunefallback.Decision | None = None  # a table below the goal against a static
    demoted: bool = False  # a stop in the mend demoted the mended table (not the first)
    spent: str = ""  # what the tune spent beside what it gained (its closing line)


@dataclass(frozen=True)
class TuneAsk:
    """What `inv tune` was asked: the profile and the depths to measure, the least request
    speed a depth must keep (`floor`, None: none), the tuned profile's name, whether to
    verify the table, whether to resume the latest tune of the same cells, and the time
    budget in seconds (None: none)."""

    profile: str
    depths: list[int]
    floor: float | None = None
    name: str | None = None
    verify: bool = True
    resume: bool = False
    budget_s: float | None = None
    may_drop_depths: bool = False  # --budget-may-drop depths
    shape_rounds: int = tuneshapes.SHAPE_ROUNDS  # each server's runs of the step and bursts
    verify_trace: str | None = None  # the user's trace, replayed in the verification


def _clock(
    ask: TuneAsk, request: BenchRequest, experiment: Experiment, arms: list[ArmSpec], *,
    checks: list[ArmSpec], tuned: str,
) -> tunebudget.TimeKeeper:  # fmt: skip
    """The tune's clock: what it plans (measurement, verification, shapes, the user's
    trace), the pace of this profile's archived cells on these hosts and model, and the
    cells an interrupted run already did (`--resume`)."""
    profile, verify, root = ask.profile, ask.verify, request.archive
    switches = tunecells.drafting_of(load_profile(profile)).adaptive
    replay = tuneshapes.replay_cost(ask.verify_trace, request, verify, switches)
    pace = tunebudget.archived_pace(root, profile, 3, experiment.fleet.names,
                                    load_profile(profile).model_path)  # fmt: skip
    return tunebudget.TimeKeeper.for_tune(
        tunebudget.TuneArms(arms, checks, verify, switches, ask.may_drop_depths,
                            ask.shape_rounds, replay),
        request, ask.budget_s, experiment.console.line, pace=pace,
        finished=_finished_cells(root, profile, tuned, arms, checks) if ask.resume else set(),
    )  # fmt: skip


def run(
    ask: TuneAsk,
    request: BenchRequest,
    experiment: Experiment,
    on_chosen: Callable[[TuneOutcome], None] | None = None,
) -> TuneOutcome:
    """The whole tune; `on_chosen` sees the table as soon as it is written (before the
    verification sweep, which takes as long again). The clock (control/tune/budget.py)
    says the time up front and as cells finish, and drops cells to fit the budget."""
    profile, floor, name, verify, resume = ask.profile, ask.floor, ask.name, ask.verify, ask.resume
    root = request.archive
    arms = tunecells.depth_arms(profile, ask.depths)
    tuned = tunefiles.tuned_reference(profile, name)
    checks = tuneverify.verification_arms(profile, tuned)
    clock = _clock(ask, request, experiment, arms, checks=checks, tuned=tuned)
    hooks = clock.hooks(tunebudget.MEASURE, root)
    state = experiment.sweep([profile], arms, "tune", resume, request=request, hooks=hooks)
    rows = tuning.rows_by_depth(arms, state.record, root)
    retests, tie_notes = _settle_ties(profile, rows, floor, request, experiment=experiment,
                                      clock=clock, resume=resume)  # fmt: skip
    result, outputs = _choose_and_write(profile, name, floor, rows, retests)
    tuneunverified.drop_candidate(profile, outputs[1])  # an earlier stop's: this table is newer
    result.notes += tie_notes + clock.notes
    record = _new_record(profile, ask.depths, request, floor,
                         state=state, result=result, outputs=outputs)  # fmt: skip
    record_path = root.tune_record(record.tune_id)
    save_record(record, record_path)
    outcome = TuneOutcome(result, *outputs, record, record_path)
    if on_chosen is not None:
        on_chosen(outcome)
    # a fixed depth 0 is the plain server, just measured: nothing new to verify
    if not verify or clock.stage_dropped(tunebudget.VERIFY) or result.fixed_depth == 0:
        if result.fixed_depth != 0:  # written unverified on purpose: the file says so too
            tuneunverified.mark_unverified(outcome, "--no-verify" if not verify else "--budget")
        outcome.spent = tuneshapes.spent_text(clock.spent(), [])
        record.notes = [*result.notes, f"the tune {outcome.spent}"]
        save_record(record, record_path)
        return outcome
    _judge(profile, tuned, checks, request, resume=resume, experiment=experiment,
           outcome=outcome, clock=clock)  # fmt: skip
    save_record(record, record_path)
    tunefiles.note_verification(
        outcome.profile_path, {v.host: v.sentence for v in outcome.verdicts}
    )
    static = outcome.fallback is not None and outcome.fallback.fall_back
    if result.fixed_depth is None and not static:  # they judge depth switching: none here
        shapes = tuneshapes.ShapeRun(profile, tuned, checks, arms, request, resume,
                                     ask.shape_rounds, ask.verify_trace)  # fmt: skip
        tuneshapes.run_shapes(shapes, experiment, outcome, clock)
        tuneshapes.note_headlines(outcome)
    outcome.spent = tuneshapes.spent_text(clock.spent(), outcome.steps)
    record.notes = result.notes + [n for n in clock.notes if n not in result.notes]
    record.notes.append(f"the tune {outcome.spent}")
    save_record(record, record_path)
    return outcome


def _judge(
    profile: str, tuned: str, checks: list[ArmSpec], request: BenchRequest,
    *, resume: bool, experiment: Experiment, outcome: TuneOutcome, clock: tunebudget.TimeKeeper,
) -> None:  # fmt: skip
    """The verification, and on SGLang's table the mend and the fallback; where `--budget`
    stops them, the table is not left as the tuned profile (control/tune/unverified.py):
    the record says so and the stop goes on with the line."""
    result, record = outcome.result, outcome.record
    try:
        _verify(profile, tuned, checks, request, resume=resume, experiment=experiment,
                outcome=outcome, clock=clock)  # fmt: skip
        if result.fixed_depth is None:  # SGLang's table: a level below the goal is mended
            _mend(profile, checks, request, resume, experiment=experiment, outcome=outcome,
                  clock=clock)  # fmt: skip
            _fall_back(profile, checks, outcome, experiment, result)
    except BaseException as exc:  # the budget, Ctrl-C or SIGTERM, a failure: all alike
        at = tuneunverified.stopped(clock, "the verification", "table", clock.resume_s(), exc)
        stop = exc if isinstance(exc, tuneunverified.Unverified) or outcome.demoted else (
            tuneunverified.demote(profile, checks, outcome, outcome.result, at))  # fmt: skip
        record.notes = result.notes + [n for n in clock.notes if n not in result.notes]
        save_record(record, outcome.record_path)
        if not isinstance(exc, tunebudget.BudgetStop):
            raise  # the interrupt or failure goes on as it came, its hints with it
        raise stop from None


def _settle_ties(
    profile: str, rows: Measurement, floor: float | None, request: BenchRequest,
    *, experiment: Experiment, clock: tunebudget.TimeKeeper, resume: bool,
) -> tuple[dict[int, tuning.Retest], list[str]]:  # fmt: skip
    """On SGLang's table, the ties measured again (control/tune/ties.py); an engine with
    one depth for every load chooses by its worst level instead."""
    if not tunecells.drafting_of(load_profile(profile)).adaptive:
        return {}, []
    sizes = tunefiles.profile_capture_sizes(profile)
    return tunetie.settle(profile, rows, floor, sizes, request=request, experiment=experiment,
                          clock=clock, resume=resume)  # fmt: skip


def _choose_and_write(
    profile: str, name: str | None, floor: float | None, rows: Measurement,
    retests: dict[int, tuning.Retest],
) -> tuple[tuning.TuneResult, tuple[Path | None, Path]]:  # fmt: skip
    """The choice from the measured cells, and the files that ship it: SGLang's adaptive
    table and a profile using it, or on an engine with one depth (control/tune/fixed.py)
    a profile at that depth."""
    base = load_profile(profile)
    drafting = tunecells.drafting_of(base)
    if drafting.adaptive:
        result = tuning.choose(rows, floor, tunefiles.profile_capture_sizes(profile), retests)
        return result, tunefiles.write_outputs(profile, result, name)
    result = tunefixed.choose_fixed(rows, floor)
    flags = tunefixed.profile_flags(drafting, base.flags, result.fixed_depth or 0)
    return result, (None, tunefiles.write_fixed(profile, name, flags, result.ranges))


def _new_record(
    profile: str,
    depths: list[int],
    request: BenchRequest,
    floor: float | None,
    *,
    state: SweepState,
    result: tuning.TuneResult,
    outputs: tuple[Path | None, Path],
) -> TuneRecord:
    """The tune's record once measured and chosen, with the config and profile it wrote
    (the verification is added later)."""
    return TuneRecord(
        tune_id=state.sweep_id,
        profile=profile,
        depths=[0, *depths],
        concurrency=list(request.concurrency),
        min_request_speed=floor,
        sweep_state=str(state.path),
        measured={str(d): {str(c): v for c, v in m.items()} for d, m in result.measured.items()},
        choices=[dataclasses.asdict(ch) for ch in result.choices],
        table=result.table,
        ranges=result.ranges,
        notes=result.notes,
        config=str(outputs[0]) if outputs[0] else "",
        tuned_profile=str(outputs[1]),
        launches=sum(len(cells) for cells in state.record.cells.values()),
    )


def _verify(
    profile: str, tuned: str, checks: list[ArmSpec], request: BenchRequest, *, resume: bool,
    experiment: Experiment, outcome: TuneOutcome, clock: tunebudget.TimeKeeper,
) -> None:  # fmt: skip
    """The tuned server beside no drafting, static speculation and the best static depth
    of every level, each launched twice, interleaved; per host its verdict, in the record."""
    root = request.archive
    result, record = outcome.result, outcome.record
    beside = tuneverify.beside_arms(profile, checks, result.measured, tunebudget.VERIFY_REPEATS)
    clock.plan_more(tunebudget.VERIFY, beside, request)
    again = resume and tunebudget.has_state(root, [profile, tuned], beside, "tune-verify")
    check = experiment.sweep(
        [profile, tuned], beside, "tune-verify", again, request=request,
        hooks=clock.hooks(tunebudget.VERIFY, root),
    )  # fmt: skip
    data = select.report_for_sweep(root, check.path)
    for host, host_arms in data.per_host.items():
        rows, sentence = tuneverify.verdict(host_arms, result.measured)
        outcome.verdicts.append(Verdict(host, host_arms, rows, sentence))
        record.verify[host] = {
            "sweep_id": check.sweep_id,
            "rows": [dataclasses.asdict(r) for r in rows],
            "sentence": sentence,
            "shortfalls": tuneverify.shortfalls(rows),
        }


MEND = "tune-mend"  # the sweep that measures a mended table again


def _mend(
    profile: str, checks: list[ArmSpec], request: BenchRequest, resume: bool,
    *, experiment: Experiment, outcome: TuneOutcome, clock: tunebudget.TimeKeeper,
) -> None:  # fmt: skip
    """Each level below the goal explained (control/tune/mend.py); where a table can mend
    it, the mended table is written, launched again beside the static server it fell short
    of at those levels (twice each, interleaved) within `--budget`, and kept only where it
    measured better on every host, else the table as first written is put back. Each
    level's words join its host's sentence, so the terminal, the record and the profile's
    note say it alike."""
    sizes = tunefiles.profile_capture_sizes(profile)
    own_static = tunecells.static_chain_depth(load_profile(profile))
    findings = {
        v.host: tunemend.diagnose(v.rows, v.arms[2] if len(v.arms) > 2 else None,
                                  outcome.result, sizes, floor=outcome.record.min_request_speed,
                                  own_static=own_static)
        for v in outcome.verdicts
    }  # fmt: skip
    if not any(findings.values()):
        return
    to_mend = _first_per_level(f for found in findings.values() for f in found if f.mendable)
    again: dict[str, dict[int, float]] = {}
    kept = False
    if to_mend:
        again, kept = _measure_mend(profile, checks, request, resume, experiment=experiment,
                                    outcome=outcome, clock=clock, to_mend=to_mend)  # fmt: skip
    for v in outcome.verdicts:
        texts = []
        for f in findings[v.host]:
            figure = again.get(v.host, {}).get(f.concurrency) if f.mendable else None
            texts.append(tunemend.outcome_text(f, outcome.result, figure, kept))
            if kept and figure is not None:
                row = next(r for r in v.rows if r.concurrency == f.concurrency)
                row.kept_best = figure
        if not texts:
            continue
        v.sentence += " Mend: " + "; ".join(texts) + "."
        entry = outcome.record.verify[v.host]
        entry["sentence"] = v.sentence
        entry["rows"] = [dataclasses.asdict(r) for r in v.rows]  # a kept mend's shares
        entry["shortfalls"] = tuneverify.shortfalls(v.rows)
        entry["mend"] = texts
    if kept:
        outcome.result = tunemend.mended(outcome.result, to_mend, sizes)
        outcome.record.table = outcome.result.table
        outcome.record.ranges = outcome.result.ranges
        outcome.record.choices = [dataclasses.asdict(ch) for ch in outcome.result.choices]


def _fall_back(
    profile: str, checks: list[ArmSpec], outcome: TuneOutcome, experiment: Experiment,
    result: tuning.TuneResult,
) -> None:  # fmt: skip
    """A table still below the goal after the mend, against the best single static
    (control/tune/fallback.py): said, noted, and the profile written as that static where
    it kept more at its worst level."""
    outcome.fallback = tunefallback.settle(profile, checks, outcome)
    if outcome.fallback is not None:
        if outcome.fallback.why not in result.notes:
            result.notes.append(outcome.fallback.why)
        experiment.console.line(f"tune: {outcome.fallback.why}")


def _first_per_level(found: Any) -> list[tunemend.Finding]:
    """One finding per level (the first host's), in level order."""
    by_level: dict[int, tunemend.Finding] = {}
    for f in found:
        by_level.setdefault(f.concurrency, f)
    return [by_level[c] for c in sorted(by_level)]


def _measure_mend(
    profile: str, checks: list[ArmSpec], request: BenchRequest, resume: bool,
    *, experiment: Experiment, outcome: TuneOutcome, clock: tunebudget.TimeKeeper,
    to_mend: list[tunemend.Finding],
) -> tuple[dict[str, dict[int, float]], bool]:  # fmt: skip
    """The mended table (the tuned server is the checks' third) written and measured beside
    the static servers it fell short of:
    host -> level -> its share now, and whether it was kept (better at every mended level
    on every host); the table as first written is put back where not, or where `--budget`
    leaves no room (then nothing is measured)."""
    sizes = tunefiles.profile_capture_sizes(profile)
    tuned = checks[2].profile
    beside = tuneverify.beside_arms(profile, checks, outcome.result.measured, 1)
    statics = {a.label: a for a in beside}
    # only a level with a static server to stand beside is measured (the caller's list
    # narrows too: what is not measured is not applied)
    to_mend[:] = [f for f in to_mend if f.best_static in statics]
    if not to_mend:
        return {}, False
    wanted = {f.best_static: statics[f.best_static] for f in to_mend}  # each server once
    arms = interleaved([*wanted.values(), checks[2]], tunebudget.VERIFY_REPEATS)
    mend_request = tunetie.levels_request(request, [f.concurrency for f in to_mend], 1)
    short = clock.cannot_afford(MEND, arms, mend_request)
    if short:
        experiment.console.line(f"tune: note: --budget: the mend was not measured: {short}")
        outcome.result.notes.append(f"--budget: the mend was not measured: {short}")
        return {}, False
    config_path, profile_path = outcome.config_path, outcome.profile_path
    first = (config_path.read_bytes() if config_path else b"", profile_path.read_bytes())
    mended = tunemend.mended(outcome.result, to_mend, sizes)
    root = request.archive
    again_ok = resume and tunebudget.has_state(root, [profile, tuned], arms, MEND)
    try:  # from the mended table's writing, any stop is the mend's
        tunefiles.write_outputs(profile, mended, profile_path.stem)
        where = ", ".join(f"C={f.concurrency}: {f.change(outcome.result)}" for f in to_mend)
        experiment.console.line(f"tune: mending ({len(arms)} launches, interleaved): {where}")
        state = experiment.sweep([profile, tuned], arms, MEND, again_ok, request=mend_request,
                                 hooks=clock.hooks(MEND, root))  # fmt: skip
    except BaseException as exc:  # the budget, an interrupt, a failure: the mended table
        needed = clock.cost_s(MEND, arms, mend_request)  # is the unverified one now
        at = tuneunverified.stopped(clock, "the mend", "mended table", needed, exc)
        stop = tuneunverified.demote(profile, checks, outcome, mended, at)
        outcome.demoted = True
        if not isinstance(exc, tunebudget.BudgetStop):
            raise  # as it came; _judge saves the record's notes
        raise stop from None
    data = select.report_for_sweep(root, state.path)
    shares = tunemend.shares(data.per_host, to_mend, profile_label_of(tuned))
    hosts = [v.host for v in outcome.verdicts]
    kept = all(
        f.concurrency in shares.get(h, {}) and shares[h][f.concurrency] > _kept(outcome, h, f)
        for h in hosts for f in to_mend
    )  # fmt: skip
    if not kept:
        if config_path:
            tunefiles.restore(config_path, first[0])
        tunefiles.restore(profile_path, first[1])
    return shares, kept


def _kept(outcome: TuneOutcome, host: str, f: tunemend.Finding) -> float:
    """The share host's verification measured at the finding's level (the bar to beat)."""
    verdict = next(v for v in outcome.verdicts if v.host == host)
    row = next((r for r in verdict.rows if r.concurrency == f.concurrency), None)
    return row.kept_best if row is not None and row.kept_best is not None else f.kept


def _finished_cells(
    root: Archive, profile: str, tuned: str, arms: list[ArmSpec], checks: list[ArmSpec]
) -> set[tuple[str, str]]:
    """(stage, arm key) of the cells an interrupted tune finished on every host: what
    `--resume` will not run again, so the clock leaves them out."""
    later = [kind for kind in tunebudget.STAGE_NAMES if kind != tunebudget.MEASURE]
    Stage = tuple[str, list[str], list[ArmSpec] | None]
    stages: list[Stage] = [(tunebudget.MEASURE, [profile], arms)]
    # the verification's and the shapes' cells depend on what was measured (its static
    # depths): each stage's latest sweep of these profiles, whatever cells it had
    stages += [(kind, [profile, tuned], None) for kind in later]
    done = set()
    for kind, profiles, kind_arms in stages:
        try:
            state = SweepState.latest(root, profiles, kind_arms, kind)
        except UserError:
            continue
        for key, cells in state.record.cells.items():
            if cells and all(c.status == CellStatus.DONE for c in cells.values()):
                done.add((kind, key))
    return done
