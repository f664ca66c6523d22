"""What a tune measured, declared: arm (a depth, or PLAIN / SKIP) -> concurrency level ->
the result rows of that cell over its hosts and repeats, with the questions the tuner asks
of it (which arms, which levels, one cell's rows, a part of it, its figures). The figures
of each cell (control/tune/levels.Cell) are what the choice reads; this is what it reads
them from."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator

from gpufleet.control.tune.levels import (
    SPREAD_BOUND,
    ArmKey,
    Cell,
    Cells,
    mad,
    objective,
    run_noise,
)
from gpufleet.records import ResultRow
from gpufleet.report import catalogue


class Measurement:
    """arm -> level -> result rows; built by `add` (control/tune/table.rows_by_depth) or
    from a mapping of that shape (a retest's rows, a test's table)."""

    def __init__(self, rows: dict[ArmKey, dict[int, list[ResultRow]]] | None = None) -> None:
        self._rows: dict[ArmKey, dict[int, list[ResultRow]]] = {
            arm: {c: list(found) for c, found in levels.items()}
            for arm, levels in (rows or {}).items()
        }

    def add(self, arm: ArmKey, row: ResultRow) -> None:
        """One result row of `arm`, at the level it ran (its max_concurrency)."""
        self._rows.setdefault(arm, {}).setdefault(row.max_concurrency, []).append(row)

    def arms(self) -> list[ArmKey]:
        """The arms measured, in the order first measured."""
        return list(self._rows)

    def __iter__(self) -> Iterator[ArmKey]:
        return iter(self._rows)

    def __contains__(self, arm: object) -> bool:
        return arm in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def levels(self, arm: ArmKey) -> list[int]:
        """The levels `arm` was measured at, in order."""
        return sorted(self._rows.get(arm, {}))

    def at(self, arm: ArmKey, c: int) -> list[ResultRow]:
        """One cell's rows (none: not measured there)."""
        return list(self._rows.get(arm, {}).get(c, []))

    def only(self, arms: Iterable[ArmKey]) -> Measurement:
        """The part measured for `arms`."""
        keep = set(arms)
        return Measurement({a: levels for a, levels in self._rows.items() if a in keep})

    def without(self, arms: Iterable[ArmKey]) -> Measurement:
        """Everything but `arms`."""
        drop = set(arms)
        return Measurement({a: levels for a, levels in self._rows.items() if a not in drop})

    def renamed(self, old: ArmKey, new: ArmKey) -> Measurement:
        """The same rows with arm `old` counted as `new` (an engine with one depth per
        launch measures depth 0 as its plain server)."""
        return Measurement({(new if a == old else a): v for a, v in self._rows.items()})

    def cells(self) -> Cells:
        """arm -> level -> the cell's figures over its hosts and repeats: medians of the
        objective, the spread (median absolute deviation), the relative noise (the larger
        of the spread and the runs' own standard error), `score` = median - MAD (a noisy
        cell pays for its noise), and `rejected` (why, or absent): failed requests, or a
        spread above SPREAD_BOUND."""
        return {
            arm: {c: _cell(rows) for c, rows in levels.items()}
            for arm, levels in self._rows.items()
        }


def _cell(rows: list[ResultRow]) -> Cell:
    """One cell's figures (see Measurement.cells)."""
    judged = [objective(r) for r in rows]
    tput = [figure for figure, _ in judged]
    middle, spread = statistics.median(tput), mad(tput)
    within = statistics.median(run_noise(r) for r in rows) / math.sqrt(len(rows))
    cell: Cell = {
        catalogue.THROUGHPUT: middle,
        "basis": "steady window" if all(b == "steady window" for _, b in judged) else "whole level",
        "per_request": statistics.median(r.median_per_request_output_tps or 0.0 for r in rows),
        "mad": spread,
        "noise": max(spread / middle if middle else 0.0, within),
        "score": middle - spread,
        "runs": len(rows),
    }
    failed = sum(r.failed for r in rows)
    if failed:
        cell["rejected"] = f"{failed} failed request(s)"
    elif middle and spread / middle > SPREAD_BOUND:
        cell["rejected"] = f"spread {spread / middle:.0%} (bound {SPREAD_BOUND:.0%})"
    return cell
