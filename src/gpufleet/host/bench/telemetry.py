"""What the server's GPUs did during a level: power, energy, utilisation, clocks, sampled.

A daemon thread reads NVML every `interval_s` (default 0.5 s) for the GPUs the server uses,
off the load generator's event loop (NVML calls run in C with the GIL released). Energy
comes from NVML's total-energy counter (mJ since the driver loaded), which integrates
power in hardware; the sampled power is kept to check it and for the peak. Standard
library at import time: this module ships in the agent.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, TypedDict

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0


class GpuSample(TypedDict):
    """One reading of one GPU: a line of telemetry-c<N>.jsonl. None: NVML could not say."""

    round: int  # every GPU is read once per round (the summed power of a round is the peak)
    t: float  # wall clock
    gpu: int
    power_w: float | None
    energy_mj: int | None  # NVML's total-energy counter, mJ since the driver loaded
    sm_util: int | None
    mem_util: int | None
    used_mib: int | None
    sm_clock_mhz: int | None
    temp_c: int | None
    throttle_reasons: int | None


class EnergyFigures(TypedDict, total=False):
    """A level's telemetry figures, merged into its result row (records.py's GPU fields)."""

    gpu_energy_j: float
    gpu_energy_source: str  # "counter" or "integrated power"
    gpu_energy_integrated_j: float
    gpu_power_avg_w: float | None
    gpu_power_peak_w: float | None
    gpu_util_avg: float | None
    gpus_sampled: list[int]
    output_tokens_per_joule: float
    joules_per_output_token: float


def _read(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # a field this GPU or driver does not report
        return None


def sample_gpu(nvml: Any, handle: Any, index: int, round_: int = 0) -> GpuSample:
    """One reading of one GPU; fields NVML cannot give are None."""
    util = _read(nvml.nvmlDeviceGetUtilizationRates, handle)
    memory = _read(nvml.nvmlDeviceGetMemoryInfo, handle, nvml.nvmlMemory_v2)
    power = _read(nvml.nvmlDeviceGetPowerUsage, handle)
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    return {
        "round": round_,
        "t": time.time(),
        "gpu": index,
        "power_w": power / 1000 if power is not None else None,
        "energy_mj": _read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle),
        "sm_util": util.gpu if util is not None else None,
        "mem_util": util.memory if util is not None else None,
        "used_mib": memory.used // 2**20 if memory is not None else None,
        "sm_clock_mhz": _read(nvml.nvmlDeviceGetClockInfo, handle, NVML_CLOCK_SM),
        "temp_c": _read(nvml.nvmlDeviceGetTemperature, handle, NVML_TEMPERATURE_GPU),
        "throttle_reasons": _read(reasons, handle) if reasons else None,
    }


class Sampler:
    """Samples the given GPUs until stopped; `rows` holds every reading."""

    def __init__(self, nvml: Any, indexes: list[int], interval_s: float = 0.5) -> None:
        self.nvml = nvml
        self.handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in indexes]
        self.interval_s = interval_s
        self.rows: list[GpuSample] = []
        self.round = 0  # one reading of every GPU per round
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpufleet-telemetry", daemon=True)

    def __enter__(self) -> Sampler:
        self._sample_all()  # a reading at the start, whatever the interval
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample_all()  # and one at the end, so the counter spans the whole level

    def _sample_all(self) -> None:
        self.round += 1
        for index, handle in self.handles:
            self.rows.append(sample_gpu(self.nvml, handle, index, self.round))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample_all()


def summarize(rows: list[GpuSample], output_tokens: int) -> EnergyFigures:
    """Per level: energy (J) from the counter (else the integral of power), average and peak
    power summed over the GPUs, utilisation, and energy per output token."""
    by_gpu: dict[int, list[GpuSample]] = {}
    for row in rows:
        by_gpu.setdefault(row["gpu"], []).append(row)
    if not by_gpu:
        return {}
    energy = integrated = 0.0
    counter_ok = True
    for readings in by_gpu.values():
        first, last = readings[0], readings[-1]
        if first["energy_mj"] is None or last["energy_mj"] is None:
            counter_ok = False
        else:
            energy += (last["energy_mj"] - first["energy_mj"]) / 1000
        for a, b in itertools.pairwise(readings):
            if a["power_w"] is not None and b["power_w"] is not None:
                integrated += (a["power_w"] + b["power_w"]) / 2 * (b["t"] - a["t"])
    joules = energy if counter_ok else integrated
    seconds = max(r["t"] for r in rows) - min(r["t"] for r in rows)
    totals: dict[int, float] = {}
    for row in rows:  # power of all GPUs in one sampling round
        if row["power_w"] is not None:
            totals[row["round"]] = totals.get(row["round"], 0.0) + row["power_w"]
    utils = [r["sm_util"] for r in rows if r["sm_util"] is not None]
    out: EnergyFigures = {
        "gpu_energy_j": round(joules, 3),
        "gpu_energy_source": "counter" if counter_ok else "integrated power",
        "gpu_energy_integrated_j": round(integrated, 3),
        "gpu_power_avg_w": round(joules / seconds, 1) if seconds > 0 else None,
        "gpu_power_peak_w": round(max(totals.values()), 1) if totals else None,
        "gpu_util_avg": round(sum(utils) / len(utils), 1) if utils else None,
        "gpus_sampled": sorted(by_gpu),
    }
    if joules > 0 and output_tokens:
        out["output_tokens_per_joule"] = output_tokens / joules
        out["joules_per_output_token"] = joules / output_tokens
    return out
