"""Open load measured on completions (issue 52): `-c 1000 --request-rate 60` against a
server that completes 13.6 requests a second read `offered 58.21, achieved 58.21, ok`:
achieved was the client's send rate, so `overloaded` fired only when the `-c` cap throttled
sending, never when the server fell behind. Completions over the arrival window (shifted by
the median latency) and the queue at the last arrival now say so, at any `-c`."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.host.bench.level import RequestRecord
from gpufleet.host.bench.metrics import open_loop_rates


def _level(arrivals: list[float], service_s: float | None, latency) -> list[RequestRecord]:
    """Requests sent at arrival (no cap); a FIFO server of `service_s` per request, or one
    that answers each after `latency()` seconds (it keeps up)."""
    out, free_at = [], 0.0
    for i, at in enumerate(arrivals):
        if service_s is not None:
            done = max(at, free_at) + service_s
            free_at = done
        else:
            done = at + latency()
        out.append(RequestRecord(index=i, ok=True, start=at, e2e=done - at, due=at))
    return out


def _poisson(rate: float, count: int, seed: int) -> list[float]:
    rng, at, out = random.Random(seed), 0.01, []
    for _ in range(count):
        out.append(at)
        at += rng.expovariate(rate)
    return out


def test_a_server_that_falls_behind_is_overloaded_whatever_the_cap():
    arrivals = _poisson(60.0, 200, seed=1)
    rates = open_loop_rates(_level(arrivals, 1 / 13.6, None))
    assert rates["achieved_request_rate"] == rates["offered_request_rate"]  # sent on time
    assert abs(rates["completed_request_rate"] - 13.6) < 1.5, rates
    assert rates["queue_at_last_arrival"] > 100 and rates["overloaded"] is True


def test_a_server_a_third_too_slow_is_overloaded():
    arrivals = _poisson(10.0, 200, seed=2)
    rates = open_loop_rates(_level(arrivals, 1 / 7.0, None))
    assert rates["overloaded"] is True and rates["completed_request_rate"] < 8.0, rates


@settings(max_examples=80, deadline=None)
@given(rate=st.sampled_from([0.8, 4.0, 10.0, 60.0]), count=st.sampled_from([20, 60, 200]),
       seed=st.integers(0, 10_000), jitter=st.sampled_from([0.0, 0.2, 0.5]))  # fmt: skip
def test_a_server_that_keeps_up_is_never_called_overloaded(rate, count, seed, jitter):
    rng = random.Random(seed)
    level = _level(_poisson(rate, count, seed), None,
                   lambda: 0.5 + rng.uniform(-jitter, jitter) * 0.5)  # fmt: skip
    rates = open_loop_rates(level)
    assert rates["overloaded"] is False, rates
    # (a level shorter than four latencies is judged by its sends alone: nothing to assert
    # on its completions' rate)
    if count >= 200:  # long enough that the window's ends are a small part of it
        assert rates["completed_request_rate"] >= 0.85 * rates["offered_request_rate"], rates
