"""The rehearsal engine's GPU power: what an H200 draws for the work the engine does.

Model (docs/REHEARSAL.md, "Power and energy"): an idle H200 holding weights draws
`IDLE_W` (~80 W; a real one read 123.8 W with 4 GiB held and no kernels, 70-90 W idle).
During a decode step every GPU of the server draws `IDLE_W + DYNAMIC_W * intensity`, where
intensity grows with the batch (0.25 for one request, 1.0 from 64: small batches leave SMs
idle); a speculative step's draft and verify kernels keep the SMs busier (x1.2, capped at
1.0). At a full batch that is ~640 W, under an H200's 700 W limit. Energy above idle is
accumulated per step from the timing model's own step time and published to the simulated
GPU state, where the simulated NVML reads it; the energy counter only grows.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpufleet.sim import gpustate

IDLE_W = 80.0
DYNAMIC_W = 560.0
PUBLISH_EVERY_S = 0.2
DEFAULT_LIMIT_W = 700.0  # the simulated NVML's default power limit (sim/nvml_sim.py)
DEFAULT_CLOCK_MHZ = 1980  # ... and default application clock


def step_power_w(batch: int, speculative: bool) -> float:
    intensity = 0.25 + 0.75 * min(batch, 64) / 64
    if speculative:
        intensity = min(1.0, intensity * 1.2)
    return IDLE_W + DYNAMIC_W * intensity


def gpu_slowdown(gpus: list[int], speculative: bool) -> Callable[[int], float] | None:
    """How much longer a step takes on these GPUs than on stock ones, by batch; None when
    every GPU is stock. A tensor-parallel step waits for its slowest GPU. Lower application
    clocks stretch every step by default / set clock. A power limit below what the step
    draws holds the clocks down until the dynamic power fits (dynamic power taken as
    proportional to clock): a step drawing 640 W under a 500 W limit runs at 420/560 of
    its speed. `inv fleet` must name such a host (docs/REHEARSAL.md)."""
    faults = (gpustate.read_topology().get("faults") or {}) if gpus else {}
    mine = [faults.get(str(g)) or {} for g in gpus]
    clocks = [float(f.get("sm_clock_app_mhz") or DEFAULT_CLOCK_MHZ) for f in mine]
    limits = [float(f.get("power_limit_w") or DEFAULT_LIMIT_W) for f in mine]
    if not mine or (min(clocks) >= DEFAULT_CLOCK_MHZ and min(limits) >= DEFAULT_LIMIT_W):
        return None
    clock_factor = DEFAULT_CLOCK_MHZ / min(clocks)
    limit = min(limits)

    def factor(batch: int) -> float:
        demand = step_power_w(batch, speculative)
        capped = (demand - IDLE_W) / max(1.0, limit - IDLE_W) if demand > limit else 1.0
        return max(clock_factor, capped, 1.0)

    return factor


class ActivityMeter:
    """Energy above idle per GPU of one server, published to the simulated GPU state."""

    def __init__(self, gpus: list[int], speculative: bool) -> None:
        self.gpus = gpus
        self.speculative = speculative
        self.extra_j = {g: gpustate.read_activity(g).get("extra_j", 0.0) for g in gpus}
        self.window_start = time.monotonic()
        self.busy_s = 0.0
        self.power_w = IDLE_W
        self.batch = 0

    def step(self, seconds: float, batch: int, speculative: bool | None = None) -> None:
        """One decode step; `speculative` says whether it drafted (adaptive depth 0 does not)."""
        power = step_power_w(batch, self.speculative if speculative is None else speculative)
        for gpu in self.gpus:
            self.extra_j[gpu] += (power - IDLE_W) * seconds
        self.busy_s += seconds
        self.power_w, self.batch = power, batch
        now = time.monotonic()
        if now - self.window_start >= PUBLISH_EVERY_S:
            util = min(1.0, self.busy_s / (now - self.window_start))
            for gpu in self.gpus:
                gpustate.write_activity(
                    gpu,
                    {
                        "t": time.time(),
                        "extra_j": self.extra_j[gpu],
                        "power_w": IDLE_W + (self.power_w - IDLE_W) * util,
                        "sm_util": round(100 * util),
                        "mem_util": round(min(95.0, 20 + 1.2 * self.batch) * util),
                    },
                )
            self.window_start, self.busy_s = now, 0.0
