"""The verification's load step and bursty trace for `inv tune`.

The step: the lowest level of the ladder, its highest, then the lowest again, in one run
per server, so SGLang's adaptive state carries across a swing in load as it does in
production. The burst: an open-loop trace of quiet spells (one request at a time) broken by
bursts of the ladder's highest level arriving at once. Per phase the tuned server is held
against the better static of that phase, and the depth switches the server logged are
counted (a table that flips depth at a threshold every few steps shows up here, not in
steady levels).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from gpufleet.archive import store
from gpufleet.archive.kept import SweepRecord
from gpufleet.archive.layout import Archive
from gpufleet.control.bench.request import BenchRequest, default_num_prompts
from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.control.tune.goal import share_text
from gpufleet.kinds import CellStatus
from gpufleet.records import ResultRow

STEP_PHASES = ("low", "high", "low again")


def step_request(request: BenchRequest) -> BenchRequest:
    """The load step: the ladder's lowest level, its highest, then the lowest again, in one
    run on one server (SGLang's adaptive state carries across the phases, as it would under
    a real swing in traffic). Each phase is a level; the repeat number tells the two low
    phases apart in the run's files."""
    low, high = min(request.concurrency), max(request.concurrency)

    def count(c: int) -> int:
        return request.num_prompts or default_num_prompts(c, request.duration)

    phases = [(low, 1), (high, 1), (low, 2)]
    return replace(
        request,
        concurrency=[low, high],
        repeat=1,
        fixed_levels=[{"concurrency": c, "num_prompts": count(c), "repeat": r} for c, r in phases],
    )


def step_rows(
    arms: list[ArmSpec], state: SweepRecord, archive: Archive
) -> dict[str, dict[str, list[ResultRow]]]:
    """host -> arm label -> the step's result rows in the order they ran (its phases), of
    each server's first round."""
    rounds = shape_rounds(arms, state, archive)
    return {host: {label: runs[0] for label, runs in by.items()} for host, by in rounds.items()}


def shape_rounds(
    arms: list[ArmSpec], state: SweepRecord, archive: Archive
) -> dict[str, dict[str, list[list[ResultRow]]]]:
    """host -> arm label -> each finished round's result rows (its phases), rounds in the
    order they ran."""
    out: dict[str, dict[str, list[list[ResultRow]]]] = {}
    for arm in arms:
        for host, cell in state.cells[arm.key].items():
            if cell.status != CellStatus.DONE:
                continue
            rows = store.read_results(archive.run_dir(host, str(cell.run_id)))
            out.setdefault(host, {}).setdefault(arm.label, []).append(list(rows))
    return out


@dataclass
class StepPhase:
    """One phase of the load step: which side the tuned server must match, the figures and the
    depth switches it logged."""

    phase: str  # low | high | low again
    concurrency: int
    winner: str  # "speculation" or "no drafting", as in `verdict`
    per_request: dict[str, float]  # arm -> median per-request tok/s in this phase
    throughput: dict[str, float]  # arm -> output tok/s in this phase
    kept: float  # tuned / the phase's better static, on that one's figure
    switches: int | None  # depth switches the tuned server logged in this phase


def step_verdict(
    by_arm: dict[str, list[ResultRow]], labels: list[str]
) -> tuple[list[StepPhase], str]:
    """Per phase of the load step: the tuned server against the better static of that
    phase, and how often it switched depth; the one-sentence answer."""
    plain, static, tuned = labels
    if any(len(by_arm.get(label, [])) < len(STEP_PHASES) for label in labels):
        return [], "the load step did not finish on every server"
    phases = []
    for i, name in enumerate(STEP_PHASES):
        rows = {label: by_arm[label][i] for label in labels}
        per = {k: r.median_per_request_output_tps or 0.0 for k, r in rows.items()}
        tput = {k: r.output_throughput for k, r in rows.items()}
        if per[static] > per[plain]:
            winner, kept = "speculation", per[tuned] / (per[static] or 1.0)
        else:
            winner, kept = "no drafting", tput[tuned] / (tput[plain] or 1.0)
        switches = rows[tuned].depth_switches
        c = rows[tuned].max_concurrency
        phases.append(StepPhase(name, c, winner, per, tput, kept, switches))
    worst = min(phases, key=lambda p: p.kept)
    counted = [p.switches for p in phases if p.switches is not None]
    said = f"{sum(counted)} depth switches" if counted else "depth switches not in the log"
    text = (
        f"load step C={phases[0].concurrency} -> {phases[1].concurrency} -> "
        f"{phases[2].concurrency}: {tuned} keeps "
        + ", ".join(f"{share_text(p.kept)} ({p.phase})" for p in phases)
        + f" of each phase's better static; worst {worst.phase} at {share_text(worst.kept)}; "
        + said
    )
    return phases, text + "."


BURST_CYCLES = 3
QUIET_S, QUIET_EVERY_S = 2.0, 0.5  # a quiet spell: one request every half second, 2 s


def burst_trace(path: Path, high: int, output_len: int) -> Path:
    """A Mooncake-format trace (playbooks/traces/README.md): BURST_CYCLES times a quiet
    spell, then `high` requests at one instant; 256-token prompts, none shared."""
    lines, t, block = [], 0.0, 0
    for _ in range(BURST_CYCLES):
        for _ in range(int(QUIET_S / QUIET_EVERY_S)):
            lines.append((t, 1))
            t += QUIET_EVERY_S
        lines.append((t, high))
        t += QUIET_S
    rows = []
    for at, count in lines:
        for _ in range(count):
            rows.append({"timestamp": round(at * 1000), "input_length": 256,
                         "output_length": output_len, "hash_ids": [block]})  # fmt: skip
            block += 1
    store.make_dirs(path.parent)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def burst_request(request: BenchRequest, trace: Path) -> BenchRequest:
    """The tune's request replaying the burst trace (written to `trace`)."""
    return replay_request(request, burst_trace(trace, max(request.concurrency),
                                               request.output_len), 1.0)  # fmt: skip


def replay_request(request: BenchRequest, trace: Path, speedup: float) -> BenchRequest:
    """The tune's request replaying a trace's arrivals (the bursts, or the user's own
    `--verify-trace`), its concurrency capped at the ladder's highest level, each arrival
    carrying one of the tune's own prompts (a trace's token ids would judge a coding-tuned
    table on what an engine reads as chat)."""
    high = max(request.concurrency)
    own = None if request.trace or request.prompts == "random-ids" else request.prompts
    return replace(
        request, concurrency=[high], repeat=1, fixed_levels=None, num_prompts=None,
        trace=str(trace), trace_speedup=speedup, prompts=str(trace), trace_prompts=own,
        workload=None, request_rate=None, duration=None,
    )  # fmt: skip


def burst_verdict(by_arm: dict[str, list[ResultRow]], labels: list[str]) -> StepPhase | None:
    """The tuned server on the burst trace against the better static there, by median
    per-request speed (open loop: every server is offered the same requests, so total
    throughput tells them apart only when one falls behind)."""
    if any(not by_arm.get(label) for label in labels):
        return None
    plain, static, tuned = labels
    rows = {label: by_arm[label][0] for label in labels}
    per = {k: r.median_per_request_output_tps or 0.0 for k, r in rows.items()}
    tput = {k: r.output_throughput for k, r in rows.items()}
    winner = "speculation" if per[static] > per[plain] else "no drafting"
    best = per[static] if winner == "speculation" else per[plain]
    c = rows[tuned].max_concurrency
    kept = per[tuned] / (best or 1.0)
    return StepPhase("burst", c, winner, per, tput, kept, rows[tuned].depth_switches)
