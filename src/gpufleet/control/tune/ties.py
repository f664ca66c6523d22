"""Ties measured again: where a level's best depth and a shallower one are within the
noise, the tune launches the two again, interleaved (A, B, A, B), with twice the requests
per run each round, until the retest tells them apart or the rounds or `--budget` run
out. Only a tie that survives goes to the shallower depth (control/tune/table.py says so in
its notes, with both figures, the noise and the requests it took).

On the lent machine a tune wrote depth 4, 3, 4 on a surface where depth 4 was best
everywhere: C=2 took depth 3 on ten requests of 32 tokens, 4.9% behind depth 4 (issue 53).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from gpufleet.control.bench.request import MAX_PROMPTS, BenchRequest
from gpufleet.control.sweep.cells import ArmSpec, interleaved
from gpufleet.control.sweep.experiment import Experiment
from gpufleet.control.tune import budget as tunebudget
from gpufleet.control.tune import depth_cells as tunecells
from gpufleet.control.tune import table as tuning
from gpufleet.control.tune.levels import Tie, objective
from gpufleet.control.tune.measurement import Measurement
from gpufleet.records import ResultRow

TIE_ROUNDS = 2  # each round launches each tied depth twice, interleaved
LAUNCHES_PER_ROUND = 2
STAGE = "tune-tie"  # the sweeps' kind; round k is `tune-tie-k`


def tie_arms(profile: str, ties: list[Tie]) -> list[ArmSpec]:
    """The depths the ties name, each launched LAUNCHES_PER_ROUND times, interleaved."""
    depths: set[Any] = {d for t in ties for d in (t.shallow, t.deep)}
    if 0 in depths:
        depths.add(tunecells.SKIP)  # depth 0 counts at its better variant (add_round)
    wanted = sorted(d for d in depths if isinstance(d, int) and d > 0)
    chosen = [a for a in tunecells.depth_arms(profile, wanted)
              if tunecells.arm_depth(a) in depths]  # fmt: skip
    return interleaved(chosen, LAUNCHES_PER_ROUND)


def tie_request(request: BenchRequest, ties: list[Tie], round_no: int) -> BenchRequest:
    """The tied levels only, each with 2^round times its requests per run."""
    return levels_request(request, [t.concurrency for t in ties], 2**round_no)


def levels_request(request: BenchRequest, concurrency: list[int], factor: int) -> BenchRequest:
    """Some levels of the tune's request only, each with `factor` times its requests per
    run, one run each (a tie's rounds, a mend's measurement)."""
    per_level = {level.concurrency: level.num_prompts for level in request.levels()}
    levels = [
        {"concurrency": c, "num_prompts": min(per_level[c] * factor, MAX_PROMPTS)}
        for c in sorted(set(concurrency))
    ]  # fmt: skip
    return dataclasses.replace(
        request, concurrency=[lv["concurrency"] for lv in levels], fixed_levels=levels, repeat=1
    )


def add_round(
    retests: dict[int, tuning.Retest], ties: list[Tie], rows: Measurement
) -> dict[int, tuning.Retest]:
    """The retests with one more round's rows: per tie, its two depths' rows at its level."""
    out = dict(retests)
    for t in ties:
        c = t.concurrency
        new = {d: rows.at(d, c) for d in (t.shallow, t.deep)}
        skip = rows.at(tunecells.SKIP, c)
        if 0 in new and skip and (not new[0] or _median(skip) > _median(new[0])):
            new[0] = skip  # depth 0 with the skip variable measured better: as choose counts it
        if not all(new.values()):
            continue  # a depth failed there: the round settles nothing
        old = out.get(c)
        merged = {d: (old.rows.get(d, []) if old else []) + new[d] for d in new}
        requests = min(sum(r.completed for r in rs) for rs in merged.values())
        out[c] = tuning.Retest(merged, requests, (old.rounds if old else 0) + 1)
    return out


def _median(rows: list[ResultRow]) -> float:
    return statistics.median(objective(r)[0] for r in rows)


def settle(
    profile: str, rows: Measurement, floor: float | None,
    sizes: list[int] | None, *, request: BenchRequest, experiment: Experiment,
    clock: tunebudget.TimeKeeper, resume: bool,
) -> tuple[dict[int, tuning.Retest], list[str]]:  # fmt: skip
    """Measure the ties again, round by round, while any is open and the budget allows;
    the retests for `tuning.choose`, and a note per round the budget left out."""
    retests: dict[int, tuning.Retest] = {}
    notes: list[str] = []
    for round_no in range(1, TIE_ROUNDS + 1):
        ties = tuning.choose(rows, floor, sizes, retests).ties
        if not ties:
            break
        arms, tied = tie_arms(profile, ties), tie_request(request, ties, round_no)
        kind = f"{STAGE}-{round_no}"
        short = clock.cannot_afford(kind, arms, tied)
        if short:
            where = ", ".join(f"C={t.concurrency} (depth {t.shallow} vs {t.deep})" for t in ties)
            notes.append(f"--budget: the ties at {where} were not measured again: {short}")
            experiment.console.line(f"tune: note: {notes[-1]}")
            break
        where = ", ".join(f"C={t.concurrency}: depth {t.shallow} vs {t.deep}" for t in ties)
        experiment.console.line(
            f"tune: measuring ties again (round {round_no}, {len(arms)} launches, "
            f"interleaved): {where}"
        )
        root = request.archive
        again = resume and tunebudget.has_state(root, [profile], arms, kind)
        state = experiment.sweep(
            [profile], arms, kind, again, request=tied, hooks=clock.hooks(kind, root)
        )
        retests = add_round(retests, ties, tuning.rows_by_depth(arms, state.record, root))
    return retests, notes
