"""The load generator certifies itself: was the client, not the server, setting the pace?

Per level the generator records its own process CPU, each request's dispatch lag (from when
it was due to when it went out) and the event loop's lag (how late a 5 ms timer fires). A
level is `client-bound` when one of them crosses its bound: a figure from it says as much
about this machine's client as about the server.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

# One Python process drives one core: at 90% of it the client cannot keep up with more.
CPU_BOUND_CORES = 0.9
# A request that goes out this late (p99), or a timer this late, skews TTFT and ITL by as
# much: far above the generator's own error (ITL error p99 0.12 ms, README figures).
DISPATCH_LAG_BOUND_MS = 5.0
LOOP_LAG_BOUND_MS = 5.0
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


def verdict(cpu_cores: float, dispatch_lag_p99_ms: float, loop_lag_p99_ms: float) -> str | None:
    """Why the client was the bottleneck of a level, or None."""
    reasons = []
    if cpu_cores >= CPU_BOUND_CORES:
        reasons.append(f"client CPU {cpu_cores:.2f} of a core (bound {CPU_BOUND_CORES})")
    if dispatch_lag_p99_ms > DISPATCH_LAG_BOUND_MS:
        reasons.append(
            f"dispatch lag p99 {dispatch_lag_p99_ms:.1f} ms (bound {DISPATCH_LAG_BOUND_MS:g})"
        )
    if loop_lag_p99_ms > LOOP_LAG_BOUND_MS:
        reasons.append(f"event-loop lag p99 {loop_lag_p99_ms:.1f} ms (bound {LOOP_LAG_BOUND_MS:g})")
    return "; ".join(reasons) or None
