"""What the server's GPUs did during a level: power, energy, utilisation, clocks, sampled.

A child process reads NVML every `interval_s` (default 0.5 s) for the GPUs the server uses:
outside the load generator's process, so the instrument does not disturb the client whose
self-certification (host/bench/clientcert.py) judges the level. A thread inside it did: its
event-loop lag p99 crossed the client-bound mark on every unstarved C=64 level (issue 35).
The first and last readings are taken in this process, before and after the level. Energy
comes from NVML's total-energy counter (mJ since the driver loaded), which integrates
power in hardware; the sampled power is kept to check it and for the peak. Standard
library at import time: this module ships in the agent.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

from gpufleet.host.agent import childenv, safewrite

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


ROOT = str(Path(__file__).resolve().parents[3])  # the zipapp, or src/
CHILD = (
    f"import sys; sys.path.insert(0, {ROOT!r}); "
    "from gpufleet.host.bench.telemetry import child_main; child_main()"
)


class Sampler:
    """Samples the given GPUs until stopped; `rows` holds every reading. The readings between
    the first and the last come from a child process (`child_main`), never from a thread
    of the process that times the requests."""

    def __init__(
        self, nvml: Any, indexes: list[int], interval_s: float = 0.5, spool: Path | None = None
    ) -> None:
        """`spool`: where the child writes its readings (the run's own directory on a host,
        where root writes nothing outside the workdir); an unnamed temporary file without."""
        self.nvml = nvml
        self.spool = spool
        self.indexes = list(indexes)
        self.handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in indexes]
        self.interval_s = interval_s
        self.rows: list[GpuSample] = []
        self.round = 0  # one reading of every GPU per round
        self._child: subprocess.Popen[bytes] | None = None
        self._out: Any = None

    def __enter__(self) -> Sampler:
        self._sample_all()  # a reading at the start, whatever the interval
        # a file, never a pipe: a full pipe would stall the child
        self._out = safewrite.open_fresh(self.spool) if self.spool else tempfile.TemporaryFile()
        ready_r, ready_w = os.pipe()
        job = {"indexes": self.indexes, "interval_s": self.interval_s, "first_round": 2,
               "shim": _shim_path(), "ready_fd": ready_w}  # fmt: skip
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", CHILD],  # NVML from the zip
                stdin=subprocess.PIPE,
                stdout=self._out,
                stderr=subprocess.DEVNULL,
                env=_child_env(),
                pass_fds=(ready_w,),
            )
            assert self._child.stdin is not None
            self._child.stdin.write(json.dumps(job).encode() + b"\n")
            self._child.stdin.flush()
        except OSError:
            self._child = None  # no child: the level keeps its first and last readings
        finally:
            os.close(ready_w)
        _wait_ready(ready_r)
        return self

    def __exit__(self, *exc: object) -> None:
        child, out = self._child, self._out
        if child is not None and child.stdin is not None:
            try:
                child.stdin.close()  # end of stdin is the child's signal to stop
                child.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                child.kill()
                child.wait()
        if out is not None:
            if self.spool is not None:  # written through a write-only handle: read by name
                out.close()
                text = self.spool.read_text(errors="replace")
                self.spool.unlink(missing_ok=True)
            else:
                out.seek(0)
                text = out.read().decode(errors="replace")
                out.close()
            for line in text.splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and "gpu" in row:
                    self.rows.append(row)  # type: ignore[arg-type]
                    self.round = max(self.round, int(row.get("round", 0)))
        self._sample_all()  # and one at the end, so the counter spans the whole level

    def _sample_all(self) -> None:
        self.round += 1
        for index, handle in self.handles:
            self.rows.append(sample_gpu(self.nvml, handle, index, self.round))


# The child's start (an interpreter, NVML's library, every GPU's handle: ~0.1 s of CPU) is
# paid before the level begins, never beside the client it would disturb (beside a CPU hog
# on 2 cores the sampled levels' loop lag p99 read 2.9 ms against 0.9 ms unsampled; before
# this wait, the child's whole start ran inside the level).
CHILD_READY_TIMEOUT_S = 10.0


def _wait_ready(ready: int) -> None:
    """Until the child says it is ready (or dies, or takes longer than any start should)."""
    try:
        if select.select([ready], [], [], CHILD_READY_TIMEOUT_S)[0]:
            os.read(ready, 1)
    finally:
        os.close(ready)


def _shim_path() -> str | None:
    """The rehearsal's `pynvml` folder when this process reads simulated GPUs (the child runs
    with -I, which ignores PYTHONPATH)."""
    from gpufleet.host.agent import simulation

    rehearsal = simulation.installed()
    shim = rehearsal.shim_dir() if rehearsal else None
    return shim if shim in sys.path else None


def _child_env() -> dict[str, str]:
    return childenv.child_env()


def child_main() -> None:
    """The sampling process: a job line on stdin, one JSON line per GPU reading on stdout
    until stdin ends (the level is over, or the load generator is gone)."""
    job = json.loads(sys.stdin.readline())
    if job.get("shim"):
        sys.path.insert(0, job["shim"])
    try:
        # below the load generator, should both share a core; not far below: at nice 10
        # its readings came late enough beside a CPU hog that the sampled power's integral
        # missed the energy counter by 5.4% (the energy test's bound is 5%)
        os.nice(5)
    except OSError:
        pass
    from gpufleet.host.gpu.nvml import load_pynvml

    nvml = load_pynvml()
    handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in job["indexes"]]
    if job.get("ready_fd") is not None:  # the level may begin
        os.write(job["ready_fd"], b"1")
        os.close(job["ready_fd"])
    stop = threading.Event()

    def wait_for_end() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_end, daemon=True).start()
    round_ = int(job["first_round"])
    while not stop.wait(float(job["interval_s"])):
        lines = [json.dumps(sample_gpu(nvml, h, i, round_)) for i, h in handles]
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        round_ += 1


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
