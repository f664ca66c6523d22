"""inv tune on an engine with one draft depth for every load (llama.cpp's server: its
`--spec-draft-n-max` is fixed at launch; issue 38). The cells are the same as SGLang's tune
(a plain server, which is depth 0 here, and each static depth, over the ladder), and each
level's best depth is chosen the same way (control/tune/levels.choose_level). The server cannot
follow those choices, so the one depth written is the one whose worst level keeps the most
of that level's best: the depth that costs least where it costs most. Within 1% of that,
the shallower depth (less drafting work for the same result)."""

from __future__ import annotations

from gpufleet.control.server.engines import Drafting, Flags
from gpufleet.control.tune.depth_cells import PLAIN
from gpufleet.control.tune.goal import share_text
from gpufleet.control.tune.levels import choose_level
from gpufleet.control.tune.measurement import Measurement
from gpufleet.control.tune.table import Choice, TuneResult
from gpufleet.errors import UserError
from gpufleet.report import catalogue

TIE = 0.01  # depths whose worst share is within this of the best's: the shallowest wins


def choose_fixed(per_depth: Measurement, min_request_speed: float | None = None) -> TuneResult:
    """The one depth from measurements: depth (or PLAIN, as 0) -> concurrency -> rows."""
    measured = per_depth.renamed(PLAIN, 0).cells()
    ladder = sorted(set.intersection(*(set(levels) for levels in measured.values())))
    if not ladder:
        raise UserError("inv tune: the depths share no measured concurrency level")
    choices, best_at = [], {}
    for c in ladder:
        figures = {d: measured[d][c] for d in sorted(measured)}
        best, why, _ = choose_level(figures, min_request_speed)
        choices.append(Choice(c, best, why))
        best_at[c] = figures[best][catalogue.THROUGHPUT]
    worst = {
        d: min(
            (measured[d][c][catalogue.THROUGHPUT] / best_at[c] if best_at[c] else 0.0, c)
            for c in ladder
        )
        for d in sorted(measured)
        if not any(measured[d][c].get("rejected") for c in ladder)
    } or {d: (0.0, ladder[0]) for d in sorted(measured)}
    top = max(share for share, _ in worst.values())
    depth = min(d for d, (share, _) in worst.items() if share >= top - TIE)
    share, at = worst[depth]
    by_level = ", ".join(f"C={ch.concurrency}: {ch.depth}" for ch in choices)
    ranges = [
        f"depth {depth} at every load: this engine sets one draft depth at launch; "
        f"it keeps {share_text(share)} of the best depth's output tok/s at its worst level "
        f"(C={at})" + ("" if depth else " (depth 0: no drafting)"),
        f"best depth per level: {by_level}",
    ]
    notes = []
    if len({ch.depth for ch in choices}) > 1:
        notes.append(
            "the best depth changes with load, and this engine cannot follow it: an engine "
            "with a depth per batch size (SGLang's adaptive table) would keep each level's best"
        )
    return TuneResult({}, choices, ranges, notes, measured, fixed_depth=depth)


def profile_flags(drafting: Drafting, flags: Flags, depth: int) -> Flags:
    """The flags a profile extending the tuned one sets for `depth` (false drops a flag):
    that depth, with the static cells' removals; depth 0 drops every drafting flag."""
    if depth == 0:
        return dict.fromkeys(drafting.flags(flags), False)
    dropped = {k: False for k in drafting.static_remove if k in flags}
    return {**dropped, **drafting.depth(flags, depth)}
