"""What `inv tune` prints: the measured depths and the chosen table, then each host's
verification (tuned vs no drafting vs static) and load-step verdicts."""

from __future__ import annotations

import json
from typing import Any

from gpufleet.cli.output import line, table
from gpufleet.control.tune.goal import share_text
from gpufleet.report import catalogue


def print_choice(outcome: Any) -> None:
    """The measured output tok/s (and per-request tok/s) by depth, the chosen depth per load,
    and the files written."""
    from gpufleet.control.tune.depth_cells import measured_columns

    result = outcome.result
    columns = measured_columns(result.measured)

    def cell(depth: int, concurrency: int) -> str:
        figures = result.measured[depth].get(concurrency)
        if figures is None:
            return "-"
        return f"{figures[catalogue.THROUGHPUT]:.0f} ({figures['per_request']:.1f})"

    table(
        "measured: output tok/s (per-request tok/s) by depth",
        ["C", *(title for _, title in columns), "chosen"],
        [
            [str(ch.concurrency), *(cell(d, ch.concurrency) for d, _ in columns), str(ch.depth)]
            for ch in result.choices
        ],
    )
    for text in result.ranges:
        line(f"tune: {text}")
    for text in result.notes:
        line(f"tune: note: {text}")
    if outcome.config_path is not None:
        line(f"tune: wrote {outcome.config_path} {json.dumps(result.table)}")
    line(f"tune: wrote {outcome.profile_path} (inv launch --profile {outcome.profile_path.stem})")


def print_verdicts(outcome: Any) -> None:
    """Per host: tuned against the better of no drafting and static, by load; then the load
    step and bursts, phase by phase; then where the record is archived."""
    for v in outcome.verdicts:
        table(
            f"{v.host}: tuned vs the better of no drafting and static speculation, and vs the "
            "best static depth measured beside it",
            ["C", "wins", *(f"{a.label} req tok/s" for a in v.arms[:3]),
             *(f"{a.label} tok/s" for a in v.arms[:3]), "tuned kept", "best static",
             "its tok/s", "tuned kept"],
            [
                [str(r.concurrency), r.winner,
                 *(f"{x:.1f}" for x in r.per_request.values()),
                 *(f"{x:.0f}" for x in r.throughput.values()), share_text(r.kept),
                 r.best_static or "-",
                 "-" if r.best_static_tps is None else f"{r.best_static_tps:.0f}",
                 "-" if r.kept_best is None else share_text(r.kept_best)]
                for r in v.rows
            ],
        )  # fmt: skip
        line(f"{v.host}: {v.sentence}")
    for st in outcome.steps:
        if not st.phases:  # the budget stopped the load step: its words are in the headline
            continue
        labels = list(st.phases[0].per_request)
        table(
            f"{st.host}: load step and bursts, each phase against its better static",
            ["phase", "C", "wins", *(f"{label} req tok/s" for label in labels),
             *(f"{label} tok/s" for label in labels), "tuned kept", "depth switches"],
            [
                [p.phase, str(p.concurrency), p.winner,
                 *(f"{x:.1f}" for x in p.per_request.values()),
                 *(f"{x:.0f}" for x in p.throughput.values()), share_text(p.kept),
                 "-" if p.switches is None else str(p.switches)]
                for p in st.phases
            ],
        )  # fmt: skip
        line(f"{st.host}: {st.sentence}")
    line(f"tune: archived {outcome.record_path}")
    from gpufleet.control.tune.verify import below_goal

    for v in outcome.verdicts:  # the last word: where the tuned server missed its goal
        short = below_goal(v.rows)
        if short:
            line(f"tune: {v.host}: {short}")
    if outcome.fallback is not None:  # and what the tune did about it (issue 83.3)
        line(f"tune: {outcome.fallback.why}")
    if outcome.spent:  # what it cost beside what it gained (issue 83.5)
        line(f"tune: {outcome.spent}")
