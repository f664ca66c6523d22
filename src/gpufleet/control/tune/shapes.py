"""The verification's load shapes (the load step and the bursts, control/tune/step.py) as
`inv tune` runs them: the tuned server beside no drafting, the profile's own static
speculation and every static depth the tune measured, `rounds` times each, interleaved;
per phase the tuned server against its better static (from the first round), and per
shape the headline (control/tune/headline.py: its output tokens a second and per-request
speed against every static, with a 95% interval from the rounds; issue 83.1)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.bench.workloads import load_trace
from gpufleet.control.sweep.cells import ArmSpec, interleaved
from gpufleet.control.sweep.experiment import Experiment
from gpufleet.control.tune import budget as tunebudget
from gpufleet.control.tune import files as tunefiles
from gpufleet.control.tune import headline as hl
from gpufleet.control.tune import step as tunestep
from gpufleet.control.tune.drops import depth_of
from gpufleet.control.tune.goal import share_text
from gpufleet.control.tune.limit import BudgetStop, minutes
from gpufleet.errors import UserError

SHAPE_ROUNDS = 3  # each server's runs of a shape: Student's t needs three for an interval


@dataclass
class StepVerdict:
    """One host's load step: the tuned server through low, high and low load again, and its
    sentence; and each shape's headline against every static run on it."""

    host: str
    phases: list[tunestep.StepPhase]
    sentence: str
    headlines: list[hl.Headline] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)  # "<shape>: no figure: budget"


def shape_arms(checks: list[ArmSpec], depths: list[ArmSpec], rounds: int) -> list[ArmSpec]:
    """The servers a shape runs: the checks (no drafting, static speculation, the tuned
    server) and each static drafting depth, `rounds` times, interleaved."""
    statics = [a for a in depths if depth_of(a) is not None]
    return interleaved([*checks, *statics], rounds)


def step_text(request: BenchRequest) -> str:
    """The load step as the headline names it (`the load step 1 -> 64 -> 1`)."""
    low, high = min(request.concurrency), max(request.concurrency)
    return f"the load step {low} -> {high} -> {low}"


@dataclass(frozen=True)
class ShapeRun:
    """What the shapes run: the profile and the tuned one, the checks (no drafting, static
    speculation, the tuned server), the measurement's arms (its static depths join), the
    tune's request, whether resuming, each server's rounds, and the user's trace
    (`--verify-trace`, None: none)."""

    profile: str
    tuned: str
    checks: list[ArmSpec]
    depths: list[ArmSpec]
    request: BenchRequest
    resume: bool = False
    rounds: int = SHAPE_ROUNDS
    trace: str | None = None


def replay_cost(trace: str | None, request: BenchRequest, verify: bool = True,
                switches: bool = True) -> tuple[float, float] | None:  # fmt: skip
    """The user's trace as the clock plans it: its longest output (decode rounds: the
    requests decode side by side) and its span in seconds at `--trace-speedup`. A trace inv
    bench would refuse, or one the tune would not replay (`--no-verify`; an engine with one
    depth for every load, which runs no load shape), is one line before the first launch,
    naming --verify-trace."""
    if trace is None:
        return None
    if not verify:
        raise UserError(f"--verify-trace {trace}: the trace is replayed in the verification, "
                        "which --no-verify leaves out; drop one of them")  # fmt: skip
    if not switches:
        raise UserError(f"--verify-trace {trace}: this profile drafts one depth for every "
                        "load, so the tune runs no load shape to replay it in")  # fmt: skip
    try:
        rows = load_trace(trace, request.trace_speedup)
    except UserError as exc:  # inv bench's reader names its own flag
        raise UserError("--verify-" + str(exc).removeprefix("--")) from None
    return float(max(r.output_len or 0 for r in rows)), max(r.at or 0.0 for r in rows)


def run_shapes(run: ShapeRun, experiment: Experiment, outcome: Any,
               clock: tunebudget.TimeKeeper) -> None:  # fmt: skip
    """The load step (low -> high -> low in one run per server), the bursty trace and the
    user's trace: per phase, the tuned server against that phase's better static, its depth
    switches, and each shape's headline. A stage `--budget` dropped is not run (the notes
    say so)."""
    request = run.request
    if clock.stage_dropped(tunebudget.STEP):
        return  # the bursts went before it
    measured = outcome.result.measured  # a depth --budget dropped is not run here either
    arms = shape_arms(run.checks, [a for a in run.depths if depth_of(a) in measured], run.rounds)
    names = (step_text(request), "the bursts", f"your trace {Path(run.trace or '').name}")
    stopped: list[str] = []  # shapes the budget stopped or left no room for: no figure

    def shape(kind: str, name: str, shaped: BenchRequest) -> Any:
        """One shape's sweep, or None where the budget stopped it (or an earlier one)."""
        if not stopped:
            try:
                return _shape(run, arms, kind, shaped, experiment=experiment, clock=clock)
            except BudgetStop:
                pass
        spent = f"{clock.elapsed_s():.0f}s spent of --budget {clock.budget_s:g}s"
        stopped.append(f"{name}: no figure: budget ({spent} before its rounds finished)")
        return None

    stepped = shape(tunebudget.STEP, names[0], tunestep.step_request(request))
    bursts: dict[str, dict[str, list[list[Any]]]] = {}
    traced: dict[str, dict[str, list[list[Any]]]] = {}
    burst_id = trace_id = None
    if not clock.stage_dropped(tunebudget.BURST):
        trace = request.archive.tune_burst_trace(outcome.record.tune_id)
        burst = shape(tunebudget.BURST, names[1], tunestep.burst_request(request, trace))
        if burst is not None:
            bursts = tunestep.shape_rounds(arms, burst.record, request.archive)
            burst_id = burst.sweep_id
    if run.trace is not None and not clock.stage_dropped(tunebudget.TRACE):
        replay = tunestep.replay_request(request, Path(run.trace), request.trace_speedup)
        replayed = shape(tunebudget.TRACE, names[2], replay)
        if replayed is not None:
            traced = tunestep.shape_rounds(arms, replayed.record, request.archive)
            trace_id = replayed.sweep_id
    step_runs = (tunestep.shape_rounds(arms, stepped.record, request.archive) if stepped
                 else {v.host: {} for v in outcome.verdicts})  # fmt: skip
    ids = (stepped.sweep_id if stepped else None, burst_id, trace_id)
    _verdicts(run, outcome, (step_runs, bursts, traced), ids, stopped)


def _verdicts(run: ShapeRun, outcome: Any, shaped: tuple[Any, ...],
              ids: tuple[str | None, ...], stopped: list[str]) -> None:  # fmt: skip
    """Per host: the load step's phases and the bursts' against their better static, each
    shape's headline, and the shapes the budget stopped (no figure), in the record."""
    step_runs, bursts, traced = shaped
    names = (step_text(run.request), "the bursts", f"your trace {Path(run.trace or '').name}")
    labels = [arm.label for arm in run.checks]
    for host, by_label in step_runs.items():
        first = {label: runs[0] for label, runs in by_label.items()}
        phases, sentence = tunestep.step_verdict(first, labels) if by_label else ([], "")
        burst_runs = bursts.get(host, {})
        spike = tunestep.burst_verdict({k: v[0] for k, v in burst_runs.items()}, labels)
        if spike is not None:
            phases.append(spike)
            switches = "-" if spike.switches is None else spike.switches
            sentence += (
                f" Bursts of {spike.concurrency}: {share_text(spike.kept)} of the better static's "
                f"per-request speed, {switches} depth switches."
            )
        shapes = zip(names, (by_label, burst_runs, traced.get(host, {})), strict=True)
        heads = [h for name, runs in shapes if (h := _headline(name, runs, labels[2])) is not None]
        outcome.steps.append(StepVerdict(host, phases, sentence.strip(), heads, list(stopped)))
        outcome.record.step[host] = {
            "sweep_id": ids[0],
            "burst_sweep_id": ids[1],
            "trace_sweep_id": ids[2],
            "phases": [dataclasses.asdict(p) for p in phases],
            "sentence": sentence.strip(),
            "headline": [h.sentence for h in heads] + stopped,
        }


def _shape(run: ShapeRun, arms: list[ArmSpec], kind: str, request: BenchRequest,
           *, experiment: Experiment, clock: tunebudget.TimeKeeper) -> Any:  # fmt: skip
    """One shape's sweep: planned with the clock, resumed where an earlier run got to it."""
    profiles = [run.profile, run.tuned]
    clock.plan_more(kind, arms, request)
    again = run.resume and tunebudget.has_state(request.archive, profiles, arms, kind)
    return experiment.sweep(profiles, arms, kind, again, request=request,
                            hooks=clock.hooks(kind, request.archive))  # fmt: skip


def _headline(shape: str, runs: dict[str, list[list[Any]]], tuned: str) -> hl.Headline | None:
    """A shape's headline from each server's runs (label -> its rounds' result rows)."""
    phases = max((len(rows) for each in runs.values() for rows in each), default=0)
    rounds = {label: [r for rows in each if (r := hl.round_of(rows, phases)) is not None]
              for label, each in runs.items()}  # fmt: skip
    return hl.headline(shape, rounds, tuned)


def note_headlines(outcome: Any) -> None:
    """Each host's headlines end its verification sentence, so the terminal, the record and
    the tuned profile's header say them alike (the profile's note is written again)."""
    for st in outcome.steps:
        said = [h.sentence for h in st.headlines] + st.missing
        if not said:
            continue
        v = next((v for v in outcome.verdicts if v.host == st.host), None)
        if v is None:
            continue
        v.sentence += " Headline: " + "; ".join(said) + "."
        outcome.record.verify[v.host]["sentence"] = v.sentence
    if any(st.headlines or st.missing for st in outcome.steps):
        tunefiles.note_verification(
            outcome.profile_path, {v.host: v.sentence for v in outcome.verdicts}
        )


def spent_text(spend: tunebudget.Spend, steps: list[StepVerdict]) -> str:
    """What the tune spent beside what it gained (issue 83.5): its launches and wall time
    (a resumed tune's earlier runs included, and said), and per host and shape the tuned
    server's output tokens a second against the best single static (or why there is no
    such figure)."""
    n = spend.launches
    spent = f"spent {n} launch{'es' * (n != 1)} and {minutes(spend.seconds)}"
    if spend.earlier_launches:
        spent += (f" (of them {spend.earlier_launches} launches and {minutes(spend.earlier_s)}"
                  " of cells in earlier runs, before --resume)")  # fmt: skip
    gains = [f"{st.host}, {h.shape}: {h.tokens[h.best].text()} of {h.best}'s output tokens a "
             "second" for st in steps for h in st.headlines if h.best]  # fmt: skip
    missing = list(dict.fromkeys(m for st in steps for m in st.missing))  # said once a shape
    if not gains:
        return (f"{spent}; no load shape ran to say what it gained over the best single static"
                + "".join(f"; {m}" for m in missing))  # fmt: skip
    return f"{spent} to gain: " + "; ".join(gains + missing)
