"""The pace of `inv tune`'s cells (control/tune/budget.py's clock): a cell costs a fixed part
(clean, launch, stop) and its benchmark, about proportional to its decode rounds; the pace is
fitted to finished cells, this tune's or this profile's archived tune cells."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from gpufleet.archive import store
from gpufleet.archive.kept import Cell, SweepRecord
from gpufleet.archive.layout import Archive
from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.tune.stages import MEASURE
from gpufleet.errors import UserError
from gpufleet.kinds import CellStatus

FIXED_STEPS = ("clean", "launch", "stop")


def decode_rounds(request: BenchRequest) -> float:
    """Decode steps a closed-loop request's benchmark implies: per level, ceil(n / C)
    requests in a row, `output_len` tokens each (warm-up included), times the repeats."""
    per_level = sum(
        (math.ceil(level.num_prompts / level.concurrency) + request.warmup) * request.output_len
        for level in request.levels()
    )
    return per_level * (1 if request.fixed_levels else request.repeat)


@dataclass(frozen=True)
class PlannedCell:
    """A cell the tune plans to run: its stage, key and label, and its decode rounds (what its
    time is estimated from)."""

    stage: str  # the sweep's kind (MEASURE, VERIFY, STEP, BURST)
    key: str  # the arm's key in that sweep
    label: str
    rounds: float
    floor_s: float = 0.0


@dataclass
class Pace:
    """Seconds a cell costs: `fixed_s` + max(its wall floor, `round_s` x its rounds)."""

    fixed_s: float
    round_s: float
    basis: str

    def cell_s(self, cell: PlannedCell) -> float:
        """A cell's estimated seconds: the fixed cost of a launch plus its rounds at the fitted
        pace."""
        return self.fixed_s + max(cell.floor_s, self.round_s * cell.rounds)


def fit_pace(samples: list[tuple[dict[str, float], float]], basis: str) -> Pace | None:
    """The pace from finished cells: (steps_s, rounds) each; None without one that has its
    steps recorded."""
    usable = [(steps, rounds) for steps, rounds in samples
              if "bench" in steps and rounds > 0 and _sane(steps)]  # fmt: skip
    if not usable:
        return None
    fixed = statistics.median(sum(s.get(k, 0.0) for k in FIXED_STEPS) for s, _ in usable)
    round_s = sum(s["bench"] for s, _ in usable) / sum(r for _, r in usable)
    return Pace(fixed, round_s, basis)


MOST_STEP_S = 30 * 86400.0  # a step's seconds past this (or negative, or not a number) are damage


def _sane(steps: dict[str, float]) -> bool:
    """Whether a cell's step seconds can be a pace (the archive is untrusted: a negative,
    infinite or NaN figure would make a budget's least seconds negative or infinite)."""
    return all(isinstance(v, int | float) and 0.0 <= v <= MOST_STEP_S for v in steps.values())


def archived_pace(archive: Archive, profile: str, newest: int = 3, hosts: list[str] | None = None,
                  model: str | None = None) -> Pace | None:  # fmt: skip
    """The pace of this profile's last `newest` archived tune sweeps (their requests say
    each cell's rounds; each arm's slowest host counts, as the hosts run at once). Only the
    cells of `hosts` that served `model` count: another machine's or another model's pace
    would refuse a budget that fits here, or let one through that does not."""
    samples: list[tuple[dict[str, float], float]] = []
    records = 0
    for path in reversed(archive.sweep_states()):
        if records >= newest:
            break
        try:
            record = SweepRecord.load(path)
        except UserError:
            continue
        if record.profiles[:1] != [profile] or not record.kind.startswith(MEASURE):
            continue
        if record.request is None:
            continue
        request = BenchRequest.from_json(record.request, archive)
        found = len(samples)
        for cells in record.cells.values():
            here = {h: c for h, c in cells.items() if hosts is None or h in hosts}
            done = [c.steps_s for h, c in here.items()
                    if c.status == CellStatus.DONE and _served(archive, h, c, model)]  # fmt: skip
            if done:
                slowest = max(done, key=lambda s: sum(s.values()))
                samples.append((slowest, decode_rounds(request)))
        records += len(samples) > found
    return fit_pace(samples, f"{len(samples)} archived tune cells of {profile}")


def _served(archive: Archive, host: str, cell: Cell, model: str | None) -> bool:
    """Whether a cell's run served `model` (its manifest's resolved profile; any, if None)."""
    if model is None:
        return True
    if not cell.run_id:
        return False
    try:
        manifest = store.read_manifest(archive.run_dir(host, cell.run_id))
    except (UserError, OSError):
        return False
    return (manifest.resolved_profile or {}).get("model_path") == model
