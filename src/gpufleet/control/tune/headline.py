"""The figure a change request quotes (issue 83.1): over one load shape (the load step, the
bursts), the tuned server's output tokens a second and per-request speed against every
static server run on that shape, the best single static named, each ratio with its 95%
interval from the servers' interleaved rounds. The interval and the words come from the
compare report's own rules (report/stats.ratio_ci, report/verdicts.Verdict): a direction
is said only where the interval excludes 1.0; with too few rounds the ratio is given as
untested, never as a gain or a loss."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpufleet.records import ResultRow
from gpufleet.report.stats import MIN_REPEATS_FOR_INTERVAL, LevelFigures, ratio_ci, with_interval
from gpufleet.report.verdicts import Verdict

FIGURE = "figure"  # the rounds' figure as the report's repeats carry it (any one figure)


@dataclass(frozen=True)
class Round:
    """One server's run of a shape: output tokens a second over the whole shape, and the
    median per-request speed (each phase's, weighted by its requests)."""

    tokens_per_s: float
    per_request_tps: float


def round_of(rows: list[ResultRow], phases: int | None = None) -> Round | None:
    """A run of a shape from its result rows (its phases); None without figures, and None
    for a round short of the shape's `phases` or with a phase that failed requests or
    completed none: a part of a shape is not the shape, so it never gives a ratio."""
    if phases is not None and len(rows) != phases:
        return None
    if any(int(r.failed or 0) or not int(r.completed or 0) for r in rows):
        return None
    seconds = sum(float(r.duration or 0.0) for r in rows)
    tokens = sum(float(r.total_output_tokens or 0) for r in rows)
    weights = [(float(r.median_per_request_output_tps or 0.0), int(r.completed or 0))
               for r in rows]  # fmt: skip
    done = sum(n for _, n in weights)
    if seconds <= 0 or tokens <= 0 or not done or any(speed <= 0 for speed, _ in weights):
        return None  # a phase without a per-request speed is not measured (no 0 to divide by)
    return Round(tokens / seconds, sum(s * n for s, n in weights) / done)


@dataclass(frozen=True)
class Ratio:
    """The tuned server against one static on one figure: the ratio of their means, its 95%
    interval (None: too few rounds) and the verdict that interval gives."""

    value: float
    interval: tuple[float, float] | None
    verdict: Verdict

    def text(self) -> str:
        """`1.07x [1.05-1.09]`, `1.01x [0.98-1.04] n.s.`, or `1.03x (untested)`."""
        body = with_interval(self.value, self.interval, suffix="x")
        if self.verdict == Verdict.SAME:
            return body + " n.s."
        return body + (" (untested)" if self.verdict == Verdict.UNTESTED else "")


def ratio(static: list[float], tuned: list[float]) -> Ratio:
    """mean(tuned) / mean(static), its interval from the rounds (log scale, Student's t, as
    compare's), and the verdict: BETTER/WORSE only where the interval excludes 1.0."""
    a, b = _figures(static), _figures(tuned)
    value = statistics.fmean(tuned) / statistics.fmean(static)
    interval = ratio_ci(a, b, FIGURE)
    if interval is None:
        return Ratio(value, None, Verdict.UNTESTED)
    low, high = interval
    if low <= 1.0 <= high:
        return Ratio(value, interval, Verdict.SAME)
    return Ratio(value, interval, Verdict.BETTER if low > 1.0 else Verdict.WORSE)


def _figures(values: list[float]) -> LevelFigures:
    """Rounds as the report's repeats (samples only: ratio_ci reads nothing else)."""
    row = ResultRow(max_concurrency=1, completed=len(values), failed=0, output_throughput=0.0)
    return LevelFigures(row, repeats=len(values), samples={FIGURE: list(values)})


@dataclass(frozen=True)
class Headline:
    """One shape's headline on one host: the tuned server against each static (tokens and
    per-request speed), the best single static by tokens, and the sentence."""

    shape: str
    best: str
    tokens: dict[str, Ratio]
    speed: dict[str, Ratio]
    rounds: int
    sentence: str


def headline(shape: str, rounds: dict[str, list[Round]], tuned: str) -> Headline | None:
    """The headline of a shape from each server's rounds (label -> its whole rounds, the
    tuned server's under `tuned`); None where no server ran the shape. Where the tuned
    server or every static has no whole round, the headline has no figure (`best` empty)
    and its sentence says so: nothing measured never gives a ratio."""
    if not rounds:
        return None
    statics = {k: v for k, v in rounds.items() if k != tuned and v}
    mine = rounds.get(tuned) or []
    if not mine or not statics:
        who = "the tuned server" if not mine else "no static server"
        return Headline(shape, "", {}, {}, 0, f"over {shape} no figure: {who} ran a whole "
                        "round without failed requests, so nothing is compared")  # fmt: skip
    tokens = {k: ratio([r.tokens_per_s for r in v], [r.tokens_per_s for r in mine])
              for k, v in statics.items()}  # fmt: skip
    speed = {k: ratio([r.per_request_tps for r in v], [r.per_request_tps for r in mine])
             for k, v in statics.items()}  # fmt: skip
    best = max(statics, key=lambda k: statistics.fmean(r.tokens_per_s for r in statics[k]))
    n = min(len(v) for v in (*statics.values(), mine))
    text = _sentence(shape, best, tokens, speed, n)
    unmeasured = sorted(k for k, v in rounds.items() if k != tuned and not v)
    if unmeasured:
        text += f" ({', '.join(unmeasured)}: no whole round without failed requests, not compared)"
    return Headline(shape, best, tokens, speed, n, text)


def _sentence(shape: str, best: str, tokens: dict[str, Ratio], speed: dict[str, Ratio],
              n: int) -> str:  # fmt: skip
    """`over the load step the tuned server delivered 1.07x [1.05-1.09] the output tokens a
    second of the best single static, p[depth=2], and 1.02x [...] its per-request speed`,
    the verdict in words (no direction without a significant test)."""
    t, s = tokens[best], speed[best]
    text = (
        f"over {shape} the tuned server delivered {t.text()} the output tokens a second "
        f"of the best single static, {best}, and {s.text()} its per-request speed"
    )
    others = [f"{k} {tokens[k].text()}" for k in sorted(tokens) if k != best]
    if others:
        text += "; against the other statics: " + ", ".join(others)
    if n < MIN_REPEATS_FOR_INTERVAL:
        text += (
            f" ({n} round{'s' * (n != 1)} each: an interval needs "
            f"{MIN_REPEATS_FOR_INTERVAL}, so no direction is claimed)"
        )
    return text
