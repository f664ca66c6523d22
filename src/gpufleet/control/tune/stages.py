"""The stages of a tune, as its sweeps are named (their `kind`), and how often the
verification launches each server: what the clock (budget.py), its drop policy (drops.py)
and the orchestration (tune_run.py) share."""

from __future__ import annotations

MEASURE, VERIFY, STEP, BURST = "tune", "tune-verify", "tune-step", "tune-burst"
TRACE = "tune-trace"  # the user's trace replayed (--verify-trace, issue 83.2)
STAGE_NAMES = {MEASURE: "measurement", VERIFY: "verification", STEP: "load step",
               BURST: "bursts", TRACE: "trace replay"}  # fmt: skip
VERIFY_REPEATS = 2  # the verification launches each server this many times, interleaved
