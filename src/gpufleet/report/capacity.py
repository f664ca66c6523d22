"""Words for `inv bench --find-max` answers: per run, and side by side in `inv compare`."""

from __future__ import annotations

from gpufleet.archive.kept import FindMaxRecord


def describe(answer: FindMaxRecord) -> str:
    """`holds the SLO up to C=13 (C=14: 62% within SLO); 6 probes`."""
    by_concurrency = answer.by == "concurrency"
    unit = "C=" if by_concurrency else "rate "
    fmt = (lambda v: f"{int(v)}") if by_concurrency else (lambda v: f"{v:g}/s")
    probes = answer.probes
    low, high = answer.holds_up_to, answer.fails_from
    failing = next((p for p in probes if p.load == high), None)
    tail = f" ({unit}{fmt(high)}: {failing.attainment:.0%} within SLO)" if failing else ""
    if low is None:
        return f"does not hold the SLO even at {unit}{fmt(probes[0].load)}{tail}"
    limit = " (the search limit)" if high is None else ""
    return f"holds the SLO up to {unit}{fmt(low)}{limit}{tail}; {len(probes)} probes"


def slo_text(slo: dict[str, float], target: float) -> str:
    bounds = ", ".join(f"{k.replace('_ms', '')} <= {v:g} ms" for k, v in slo.items())
    return f"{bounds} for {target:.0%} of requests"


def compare_line(answers: dict[str, FindMaxRecord]) -> str:
    """`SLO capacity (tpot <= 30 ms for 99% of requests): baseline up to C=13, eagle3 up
    to C=6` for the arms that have a --find-max answer (the same SLO: the first's)."""
    first = next(iter(answers.values()))
    parts = []
    for label, answer in answers.items():
        if answer.slo != first.slo or answer.by != first.by:
            parts.append(f"{label}: searched with another SLO")
            continue
        low = answer.holds_up_to
        by_concurrency = answer.by == "concurrency"
        value = "none" if low is None else (f"C={int(low)}" if by_concurrency else f"{low:g} req/s")
        parts.append(f"{label} up to {value}")
    return f"SLO capacity ({slo_text(first.slo, first.target)}): " + ", ".join(parts)
