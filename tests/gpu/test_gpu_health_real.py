"""The health read (issue 25) on real NVML: every field answers or reads n/a, never an
error; an idle GPU the lent machine never changed is `ok`; the read is timed. Nothing here
changes a GPU setting."""

from __future__ import annotations

import time

import pynvml
from gpuhelpers import record

from gpufleet.host.gpu import health as gpuhealth
from gpufleet.host.gpu import nvml as nvmlread
from helpers import run_cli


def test_the_health_read_answers_every_field_or_na(gpu_host):
    started = time.perf_counter()
    nvml = nvmlread.load_pynvml()
    readings = nvmlread.snapshot(nvml)
    gpuhealth.attach(nvml, readings, remember_xids=False)
    total_ms = (time.perf_counter() - started) * 1000
    fields = {}
    for gpu in readings:
        h = gpu.health
        assert h is not None and h.verdict in ("ok", "warn", "bad")
        fields[gpu.index] = h.to_wire()
    record("health_read", {"gpus": fields, "total_ms_with_init": round(total_ms, 1)})
    na = sorted({k for f in fields.values() for k, v in f.items() if v is None})
    record("health_na_fields", na)
    h = readings[0].health
    # the lent machines are left as they were: full power limit, default clocks
    assert h.power_limit_w == h.power_default_w, h
    assert h.pcie_width is not None and h.temperature_c is not None
    pynvml.nvmlShutdown()


def test_status_shows_health_per_gpu(gpu_host):
    out = run_cli("status", "--inventory", str(gpu_host.inventory))
    assert out.returncode == 0, out.stdout + out.stderr
    header = next(ln for ln in out.stdout.splitlines() if ln.startswith("host"))
    assert header.rstrip().endswith("health")
    record("status_health_lines", [ln for ln in out.stdout.splitlines() if "GPU" in ln][:20])
