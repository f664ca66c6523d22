"""The load generator certifies itself: did the client, not the server, set the pace, and
were its clocks on time?

Per level the generator records its own process CPU, each request's dispatch lag (from when
it was due to when it went out) and the event loop's lag (how late a 5 ms timer fires). Two
marks, each claiming only what its figure shows:

- `client_bound`: the client set the pace (its CPU near a core, or slots idle waiting for
  it): throughput and TTFT there are the client's as much as the server's.
- `client_late`: its timers fired late (event-loop lag p99 over LOOP_LAG_BOUND_MS): each
  token's timestamp, so TTFT and ITL, may read high by as much; throughput is not claimed.

The bounds come from a calibration (benchmarks/client_bound_calibration.py; README figures):
starved (one core shared with two busy loops) and unstarved clients, 10 runs each at C=1, 64
and 256, on 2 and 16 cores, telemetry on. Starving changed no throughput or TTFT (the client
needs 0.02-0.07 of a core), so `client_bound` must stay silent, and did in all 116 runs; it
moved the loop lag p99 from 0.51-1.59 ms to 3.61-6.46 ms and the dispatch lag p99 up (C=64:
2.9 to 10.1 ms median on 2 cores).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

# One Python process drives one core: at 90% of it the client cannot keep up with more.
CPU_BOUND_CORES = 0.9
# A slot waiting for the client to send its next request is load the server never saw:
# past this share of the requests' own time the client, not the server, set the pace. (Not
# the p99 alone: at C=64 with equal output lengths a whole cohort finishes on one step, and
# sending 64 requests back to back puts ~20 ms on the last one's lag, ~1% of its time.)
IDLE_SLOT_BOUND = 0.02
# A timer this late skews each token's timestamp by as much: far above the generator's own
# error (ITL error p99 0.12 ms, README figures). Between the calibration's unstarved runs
# (p99 at most 1.59 ms) and its starved ones (at least 3.61 ms), near their geometric mean;
# 5 ms, the bound before, missed every starved run at C=1 and on 16 cores (38 of 58).
LOOP_LAG_BOUND_MS = 2.5
LOOP_TICK_S = 0.005


@dataclass
class ClientClock:
    """What the generator measures about itself during one level."""

    cpu_start: float = field(default_factory=time.process_time)
    wall_start: float = field(default_factory=time.perf_counter)
    loop_lags: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    procs: int = 1  # generator processes (--client-procs); cpu_s is their sum
    busiest_cores: float | None = None  # the busiest process's share of a core

    @property
    def busiest(self) -> float:
        """The CPU bound is per process: each drives one event loop on one core."""
        if self.busiest_cores is not None:
            return self.busiest_cores
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @classmethod
    def merged(cls, clocks: list[ClientClock]) -> ClientClock:
        """Several processes' clocks as one level's."""
        return cls(
            cpu_start=0.0,
            wall_start=0.0,
            loop_lags=[lag for c in clocks for lag in c.loop_lags],
            cpu_s=sum(c.cpu_s for c in clocks),
            wall_s=max(c.wall_s for c in clocks),
            procs=sum(c.procs for c in clocks),
            busiest_cores=max(c.busiest for c in clocks),
        )

    async def watch_loop(self) -> None:
        """Sample the event loop's lag until cancelled."""
        while True:
            before = time.perf_counter()
            await asyncio.sleep(LOOP_TICK_S)
            self.loop_lags.append(max(0.0, time.perf_counter() - before - LOOP_TICK_S))

    def stop(self) -> None:
        self.cpu_s = time.process_time() - self.cpu_start
        self.wall_s = time.perf_counter() - self.wall_start


def verdict(cpu_cores: float, idle_share: float, dispatch_lag_p99_ms: float) -> str | None:
    """Why the client set the pace of a level, or None. `idle_share`: the requests' mean
    dispatch lag over their mean end-to-end latency."""
    reasons = []
    if cpu_cores >= CPU_BOUND_CORES:
        reasons.append(f"client CPU {cpu_cores:.2f} of a core (bound {CPU_BOUND_CORES})")
    if idle_share > IDLE_SLOT_BOUND:
        reasons.append(
            f"slots idle {idle_share:.1%} of the time waiting for the client (bound "
            f"{IDLE_SLOT_BOUND:.0%}; dispatch lag p99 {dispatch_lag_p99_ms:.1f} ms)"
        )
    return "; ".join(reasons) or None


def late(loop_lag_p99_ms: float) -> str | None:
    """Why the client's token timestamps may read late, or None."""
    if loop_lag_p99_ms <= LOOP_LAG_BOUND_MS:
        return None
    return (
        f"event-loop lag p99 {loop_lag_p99_ms:.1f} ms (bound {LOOP_LAG_BOUND_MS:g} ms): TTFT "
        f"and ITL may read up to {loop_lag_p99_ms:.1f} ms high"
    )
