"""Was an open-loop level's load what it claims? Its arrivals (offered), its sends (sent)
and its answers (completed) per second over one window, the queue at its last arrival,
and the verdict: overloaded, kept up, or not judged (a level too short for its answers to
say). A server cannot answer more requests than were sent to it, so the completed rate
never reads above the sent one (the host path once read 41.3 completed against 38.1 sent)."""

from __future__ import annotations

import math
import statistics

from gpufleet.host.bench.level import RequestRecord
from gpufleet.records import Figures

# Under this share of the offered rate a level could not take its arrivals as they came: the
# queue grew for the whole level and its figures describe a backlog, not the offered load.
OVERLOADED_BELOW = 0.95
# A level's arrivals must span this many unqueued latencies for its answers to be judged:
# shorter, the level is mostly its ramp-up and drain.
JUDGED_LATENCIES = 4


def open_loop_rates(records: list[RequestRecord]) -> Figures:
    """An open-loop level's load, per second over one window: arrivals (offered: this
    level's own, so a short Poisson draw is not mistaken for a shortfall), sends (achieved)
    and completions, counted over the arrival window shifted by the median latency (a
    server that keeps up answers each request about that long after it came), with the
    queue (arrived, not yet answered) when the last request arrived. `overloaded`: the
    sends or the completions fell behind the arrivals, at any `-c`. Drain is left out: a
    finite level's last answers would otherwise lower every rate."""
    live = [r for r in records if not r.skipped and r.start]
    sent = sorted(r.start for r in live)
    arrived = sorted(r.due - r.queue_wait for r in live)
    if len(sent) < 3 or arrived[-1] <= arrived[0] or sent[-1] <= sent[0]:
        return _too_few(sent, arrived)
    window = arrived[-1] - arrived[0]
    offered = (len(arrived) - 1) / window
    achieved = (len(sent) - 1) / (sent[-1] - sent[0])
    # answered ok: a cut or aborted stream has an e2e too (all aborted read as keeping up)
    done = [r for r in live if r.ok and r.e2e > 0]
    answered = sorted(r.start + r.e2e for r in done)
    out = {"offered_request_rate": offered, "achieved_request_rate": achieved}
    if len(answered) >= 3:
        latencies = sorted(r.start + r.e2e - (r.due - r.queue_wait) for r in done)
        q1, median, q3 = (
            statistics.quantiles(latencies, n=4)
            if len(latencies) > 3
            else (latencies[0], statistics.median(latencies), latencies[-1])
        )
        half = (q3 - q1) / 2  # the window's ends widened by half the latencies' spread
        first, last = arrived[0] + median - half, arrived[-1] + median + half
        inside = sum(first <= t <= last for t in answered)
        # answers follow sends: a window that held more of them than the sends' own rate
        # (a -c cap stretched the sends past the arrivals) is bounded by what was sent
        out["completed_request_rate"] = min(achieved, max(0, inside - 1) / (window + 2 * half))
        out["queue_at_last_arrival"] = len(arrived) - sum(t <= arrived[-1] for t in answered)
        # A server that falls behind answers fewer requests in the window than arrived in it,
        # or its queue grows through the level; the bounds are a few standard deviations of
        # the Poisson noise a server that keeps up shows (arrivals ~ sqrt(n), what is in
        # flight ~ sqrt(rate x latency)), so a short level is not called overloaded by chance.
        n = len(arrived)
        expected = min(n, offered * (window + 2 * half) + 1)
        missed = expected - inside > max(3, 2 * math.sqrt(n))
        middle = arrived[n // 2]
        grew = out["queue_at_last_arrival"] - _queue_at(middle, arrived, answered)
        noise = max(3 * math.sqrt(offered * q1), 3 * math.sqrt(n / 2))
        # a level shorter than a few latencies (as its first requests saw them, before any
        # queue) holds mostly its ramp-up and drain: judged by its sends alone
        in_order = sorted(done, key=lambda r: r.due - r.queue_wait)
        by_arrival = [r.start + r.e2e - (r.due - r.queue_wait) for r in in_order]
        unqueued = statistics.median(by_arrival[: max(3, n // 10)])
        judged = window >= JUDGED_LATENCIES * unqueued
        behind = judged and (missed or grew > max(3, (1 - OVERLOADED_BELOW) * n, noise))
        if not judged:
            out["overload_unjudged"] = _unjudged(window, unqueued)
    else:
        behind = False
        out["overload_unjudged"] = f"{len(answered)} answered: too few to judge its answers"
    out["overloaded"] = behind or achieved < OVERLOADED_BELOW * offered
    if out["overloaded"]:
        out.pop("overload_unjudged", None)  # its sends alone said it
    return out


def _too_few(sent: list[float], arrived: list[float]) -> Figures:
    """A level of under 3 sends (or all sent at once): said, not silent (it read `ok`)."""
    if not sent:
        return {}
    span = arrived[-1] - arrived[0]
    return {"overload_unjudged": f"{len(sent)} sent over {span:.2f} s: too few to judge"}


def _unjudged(window: float, unqueued: float) -> str:
    """Why a level's answers were not judged, in the words a status shows."""
    return (
        f"shorter than {JUDGED_LATENCIES} latencies ({window:.2f} s of arrivals, "
        f"{unqueued:.2f} s a request before any queue): judged by its sends alone"
    )


def _queue_at(t: float, arrived: list[float], answered: list[float]) -> int:
    """Requests arrived by `t` and not answered by then."""
    return sum(a <= t for a in arrived) - sum(d <= t for d in answered)
