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
from gpufleet.host.bench.overload import open_loop_rates


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


# -- issue 79: judged on completions for every level length --------------------------------


def _capped(rate: float, count: int, cap: int, service_s: float, seed: int) -> list[RequestRecord]:
    """Poisson arrivals under a `-c cap` client: each request goes when a slot frees and
    takes `service_s` +-30%, so the sends fall behind the arrivals."""
    import heapq

    rng, slots, out = random.Random(seed), [0.0] * cap, []
    for i, at in enumerate(_poisson(rate, count, seed)):
        send = max(at, heapq.heappop(slots))
        e2e = service_s * rng.uniform(0.7, 1.3)
        heapq.heappush(slots, send + e2e)
        out.append(RequestRecord(index=i, ok=True, start=send, e2e=e2e, due=send,
                                 queue_wait=send - at))  # fmt: skip
    return out


def test_completed_never_reads_above_sent():
    """The host path read `completed req/s` 41.3 above `sent` 38.1: under a `-c` cap the
    sends stretch past the arrival window the answers were counted over. Here the same
    shape read 33.20 completed against 31.79 sent; a server cannot answer more than it was
    sent, so the completed rate is bounded by the sends over every draw."""
    rates = open_loop_rates(_capped(40.0, 240, 32, 1.0, seed=22))
    assert rates["completed_request_rate"] <= rates["achieved_request_rate"], rates
    for seed in range(12):
        for cap, service in ((8, 0.5), (32, 1.0), (16, 0.2)):
            found = open_loop_rates(_capped(40.0, 240, cap, service, seed))
            assert found["completed_request_rate"] <= found["achieved_request_rate"], found


def test_a_level_too_short_to_judge_says_so_instead_of_ok():
    """240 prompts at ~40/s against a server of 58 slots of 2 s (29/s): 6 s of arrivals is
    shorter than four latencies, so its answers cannot say whether it kept up. It read `ok`
    with nothing said; now its status and its note say it was not judged, and why."""
    import heapq

    from gpufleet.report.tables import headers, level_notes, rows

    slots, records = [0.0] * 58, []
    for i, at in enumerate(_poisson(40.0, 240, 3)):
        done = max(at, heapq.heappop(slots)) + 2.0
        heapq.heappush(slots, done)
        records.append(RequestRecord(index=i, ok=True, start=at, e2e=done - at, due=at))
    rates = open_loop_rates(records)
    assert rates["overloaded"] is False and rates["completed_request_rate"] < 31.0, rates
    assert rates["overload_unjudged"].startswith("shorter than 4 latencies ("), rates
    level = {**rates, "max_concurrency": 1000, "level_status": "ok", "completed": 240}
    table = dict(zip(headers([level]), rows([level])[0], strict=True))
    assert table["status"] == "ok, overload not judged"
    assert level_notes([level], steady=False) == [
        f"C=1000: overload not judged: {rates['overload_unjudged']}"
    ]
    # a level long enough is judged, and says nothing of it
    long = open_loop_rates(_level(_poisson(10.0, 400, 4), None, lambda: 0.5))
    assert "overload_unjudged" not in long and long["overloaded"] is False


def test_a_server_that_aborts_every_request_completes_none():
    """Adversarial pass (issue 79.7): a stream cut or aborted after its tokens has an e2e,
    and was counted as completed: a server aborting every request read as keeping up
    (completed 10.0 req/s of 10.0 offered). Completed is answered ok."""
    level = _level(_poisson(10.0, 200, seed=3), None, lambda: 0.3)
    for r in level:
        r.ok, r.error = False, "the stream ended with finish_reason abort"
    rates = open_loop_rates(level)
    assert rates.get("completed_request_rate", 0.0) == 0.0, rates
    assert "too few to judge" in rates["overload_unjudged"]


def test_a_level_too_small_to_judge_says_so():
    """Two requests (or all sent at once) gave no figures and no word: the level read ok."""
    for arrivals in ([0.1, 0.6], [0.1, 0.1, 0.1, 0.1]):
        rates = open_loop_rates(_level(arrivals, None, lambda: 0.3))
        assert "too few to judge" in rates["overload_unjudged"], rates
    assert open_loop_rates([]) == {}
