"""The tune's mend (issue 63): a level where the tuned server kept less than the goal of the
best static server measured beside it is explained from the tune's own measurement, changed
where a table can change, and verified again.

What the measurement can say about a level below the goal, in this order:
1. the best static server beside it drafts at another depth than the table's there: the
   mend gives that level's range the better depth;
2. the tuned server switched depth during the level (SGLang logs each switch): a closed-loop
   level at C spends steps at batches below C whenever a request finishes before its
   successor arrives, and the steps below its range's first batch run the depth of the range
   below (with the skip variable, from a cold draft). The mend begins that range right above
   the level below, so the level's dips stay in it;
3. the profile's own static speculation (its topk, its draft tokens) was best: SGLang's
   adaptive mode drafts a chain only, so no table holds it; said;
4. the table runs depth 0 there and no drafting was best: an EAGLE server at depth 0 still
   runs the draft model's extend every step (docs/FACTS.md, "What SGLang's adaptive mode
   costs"); no table changes that, and it is said with the tune's own figures;
5. none of these: said with the figures, as not explained.

control/tune/tune_run.py runs the mended server again beside the same static server,
interleaved, within `--budget`, and keeps the mend only where it measured better."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.control.tune import table as tuning
from gpufleet.control.tune.depth_cells import PLAIN, SKIP, arm_depth
from gpufleet.control.tune.goal import GOAL, share_text
from gpufleet.control.tune.levels import objective
from gpufleet.control.tune.verify import VerdictRow
from gpufleet.engine_facts import first_batch
from gpufleet.report import catalogue


@dataclass
class Finding:
    """One level below the goal: how much it kept of which static server, why, and what
    the mend changes (`depth` for the level's range, or `early`: the range begins right
    above the level below); neither where a table cannot mend it."""

    concurrency: int
    kept: float  # the tuned server's objective / the best static's, as verified
    best_static: str  # that server's label
    cause: str  # one clause with its figures
    depth: int | None = None
    early: bool = False

    @property
    def mendable(self) -> bool:
        """Whether a table can change what fell short (a depth, or where the range begins)."""
        return self.depth is not None or self.early

    def change(self, result: tuning.TuneResult) -> str:
        """The mend in words (empty where there is none)."""
        if self.depth is not None:
            return f"depth {self.depth} for the range holding C={self.concurrency}"
        if self.early:
            below = _level_below_range(result, self.concurrency)
            return f"the range holding C={self.concurrency} begins right above C={below}"
        return ""


OWN_STATIC = "own static"  # the profile's own static speculation (verify.verification_arms)
CELL_NAME = re.compile(r"depth (\d+)( \(skip\))?")  # verify._cell_name's words


def _depth_of_label(label: str) -> Any:
    """A static server's depth from its label (or the measurement's cell name, where the
    verification had no static depth beside it): d, PLAIN, OWN_STATIC (its topk or draft
    tokens a table slot cannot hold), or None (not known)."""
    if label.endswith("-static"):
        return OWN_STATIC
    named = CELL_NAME.fullmatch(label)
    if named:
        return int(named.group(1))
    depth = PLAIN if label == "plain" else arm_depth(ArmSpec("", label=label))
    return 0 if depth == SKIP else depth


def _choice_at(result: tuning.TuneResult, c: int) -> tuning.Choice | None:
    return next((ch for ch in result.choices if ch.concurrency == c), None)


def _range_first(result: tuning.TuneResult, c: int, sizes: list[int] | None,
                 early: frozenset[int] = frozenset()) -> tuple[int, int]:  # fmt: skip
    """(index of the first level of the range holding level c, that range's key)."""
    index = next(i for i, ch in enumerate(result.choices) if ch.concurrency == c)
    starts = tuning.range_starts(result.choices, sizes, early)
    return max((i, key) for i, key in starts if i <= index)


def _level_below_range(result: tuning.TuneResult, c: int) -> int | None:
    index = next(i for i, ch in enumerate(result.choices) if ch.concurrency == c)
    depth = result.choices[index].depth
    while index > 0 and result.choices[index - 1].depth == depth:
        index -= 1
    return result.choices[index - 1].concurrency if index > 0 else None


def diagnose(rows: list[VerdictRow], tuned: Any, result: tuning.TuneResult,
             sizes: list[int] | None, *, floor: float | None = None,
             own_static: int | None = None) -> list[Finding]:  # fmt: skip
    """Each verified level below the goal, with its cause and mend (the module's order).
    `tuned`: the tuned server's arm in the verification (its levels' depth switches);
    `floor`: the tune's per-request speed floor, which a mended depth must keep too;
    `own_static`: the depth of the profile's own static speculation where a table can
    hold it (a chain), else None (a tree)."""
    found = []
    for row in rows:
        if row.kept_best is None or row.kept_best >= GOAL or row.best_static is None:
            continue
        choice = _choice_at(result, row.concurrency)
        if choice is None:
            continue
        found.append(
            _finding(row, choice, tuned, result, sizes=sizes, floor=floor, own_static=own_static)
        )
    return found


def _finding(row: VerdictRow, choice: tuning.Choice, tuned: Any, result: tuning.TuneResult,
             *, sizes: list[int] | None, floor: float | None,
             own_static: int | None) -> Finding:  # fmt: skip
    c, label = row.concurrency, row.best_static or ""
    finding = Finding(c, row.kept_best or 0.0, label, "")
    theirs = _depth_of_label(label)
    if theirs == OWN_STATIC and own_static is not None:
        theirs = own_static  # a chain: a depth a table slot holds
    level = tuned.levels.get(c) if tuned is not None else None
    switches = level.row.depth_switches if level is not None else None
    if isinstance(theirs, int) and theirs != choice.depth:
        finding.cause = (f"the table runs depth {choice.depth} here and {label} (depth {theirs}) "
                         f"served {row.best_static_tps:.0f} tok/s beside it")  # fmt: skip
        speed = result.measured.get(theirs, {}).get(c, {}).get("per_request")
        if floor is not None and (speed is None or speed < floor):
            finding.cause += f", below the speed floor of {floor:g} tok/s per request"
        else:
            finding.depth = theirs
        return finding
    if theirs == OWN_STATIC:
        finding.cause = (f"{label}, the profile's own static speculation, served "
                         f"{row.best_static_tps:.0f} tok/s beside it; SGLang's adaptive mode "
                         "drafts a chain (topk 1) only, so no table holds it: measure deeper "
                         "depths (--depths), or serve that profile at this load")  # fmt: skip
        return finding
    if switches:
        index, key = _range_first(result, c, sizes)
        below = _level_below_range(result, c)
        lower = result.choices[index - 1].depth if index > 0 else None
        finding.cause = (f"the tuned server switched depth {switches:.0f} times during the "
                         "level: "
                         f"its batch dipped below {first_batch(key, sizes)}, where the table "
                         f"runs depth {lower}")  # fmt: skip
        if below is not None:
            first = frozenset({result.choices[index].concurrency})
            _, early_key = _range_first(result, c, sizes, first)
            finding.early = early_key < key
        if not finding.early:
            finding.cause += "; its range already begins right above the level below"
        return finding
    if theirs == PLAIN:  # no drafting was best: what depth 0 costs an adaptive server
        finding.cause = _depth0_cause(c, result)
        if choice.depth != 0:
            finding.cause = (f"no drafting served {row.best_static_tps:.0f} tok/s beside it, "
                             f"and the table runs depth {choice.depth} here, ahead of depth 0 "
                             f"as the tune measured it: {finding.cause}")  # fmt: skip
        return finding
    finding.cause = ("not explained by the tune's measurement: the table runs the depth of the "
                     "best static server here and the server logged no depth switch")  # fmt: skip
    return finding


def _depth0_cause(c: int, result: tuning.TuneResult) -> str:
    """Depth 0 on an EAGLE server against no drafting, in the tune's own figures."""
    measured = result.measured
    keys = ((SKIP,) if result.skip_extend else ()) + (0,)
    variants = [k for k in keys if c in measured.get(k, {})]
    plain = measured.get(PLAIN, {}).get(c)
    what = ("SGLang runs the draft model's extend every step at depth 0 "
            "(eagle_worker_v2._draft_extend_for_decode)")  # fmt: skip
    if result.skip_extend:
        what += (", or with the skip variable drafts from zeros after each upshift "
                 "(_stub_skipped_draft_extend)")  # fmt: skip
    if not variants or plain is None:
        return f"an adaptive server at depth 0 is not a server without speculation: {what}"
    ours = max(measured[k][c][catalogue.THROUGHPUT] for k in variants)
    theirs = plain[catalogue.THROUGHPUT]
    return (f"an adaptive server at depth 0 serves {1 - ours / theirs:.1%} less than one "
            f"without speculation here (the tune measured {ours:.0f} vs {theirs:.0f} tok/s): "
            f"{what}; no table changes that")  # fmt: skip


def mended(result: tuning.TuneResult, findings: list[Finding],
           sizes: list[int] | None) -> tuning.TuneResult:  # fmt: skip
    """The tune's result with the findings' mends applied: the choices' depths, the range
    starts, and the table and ranges rebuilt from them."""
    choices = [dataclasses.replace(ch) for ch in result.choices]
    early = set()
    for f in findings:
        if f.depth is not None:
            for ch in choices:
                if ch.concurrency == f.concurrency:
                    ch.depth = f.depth
                    ch.why = f"mended: {f.cause}"
        elif f.early:
            index, _ = _range_first(result, f.concurrency, sizes)
            early.add(result.choices[index].concurrency)
    table, ranges = tuning.table_and_ranges(choices, sizes, frozenset(early))
    return dataclasses.replace(result, table=table, ranges=ranges, choices=choices)


def shares(per_host: dict[str, list[Any]], findings: list[Finding],
           tuned: str) -> dict[str, dict[int, float]]:  # fmt: skip
    """From the mend's sweep (report arms per host): host -> level -> the tuned server's
    objective over the static server it fell short of there, both launched in that sweep."""
    out: dict[str, dict[int, float]] = {}
    for host, arms in per_host.items():
        by_label = {a.label: a for a in arms}
        ours = by_label.get(tuned)
        for f in findings:
            theirs = by_label.get(f.best_static)
            c = f.concurrency
            if ours is None or theirs is None or c not in ours.levels or c not in theirs.levels:
                continue
            bar = objective(theirs.levels[c].row)[0]
            if bar:
                out.setdefault(host, {})[c] = objective(ours.levels[c].row)[0] / bar
    return out


def outcome_text(f: Finding, result: tuning.TuneResult, again: float | None, kept: bool) -> str:
    """One level's mend in words: the shortfall, its cause, and what the mend measured."""
    head = f"C={f.concurrency}: {share_text(f.kept)} of {f.best_static}: {f.cause}"
    if not f.mendable:
        return head
    change = f.change(result)
    if again is None:
        return f"{head}; {change} was not measured again"
    if kept:
        return f"{head}; mended ({change}): {share_text(again)} measured again beside it"
    return (f"{head}; {change} measured {share_text(again)} beside it, no better: the table is "
            "kept as first written")  # fmt: skip
