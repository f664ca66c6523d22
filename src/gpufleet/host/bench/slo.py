"""Per-request SLOs and goodput, as vLLM's `--goodput ttft:X tpot:Y e2el:Z`: a request is
good when every bound given holds for it; goodput counts only good requests.

SLO text: `ttft_ms=500,tpot_ms=50,e2e_ms=20000` (any subset). Parsed on the control
machine; the host receives the dict in the plan.
"""

from __future__ import annotations

from typing import Any

from gpufleet.records import Figures

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft_ms=500,tpot_ms=50` -> {"ttft_ms": 500.0, "tpot_ms": 50.0}; ValueError with one
    line saying what is wrong (the caller adds the option's name)."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in SLO_KEYS:
            raise ValueError(
                f"{part!r}: expected KEY=MILLISECONDS with KEY one of {', '.join(SLO_KEYS)}"
            )
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{part!r}: {value!r} is not a number of milliseconds") from None
        if not 0 < number <= 86_400_000:
            raise ValueError(f"{part!r}: expected more than 0 and at most 86400000 ms")
        out[key] = number
    return out


def request_meets(record: Any, slo: dict[str, float]) -> bool:
    """One request against the SLO (seconds in the record, milliseconds in the SLO)."""
    if not record.ok:
        return False
    tokens = record.completion_tokens
    tpot = (record.e2e - record.ttft) / (tokens - 1) if tokens > 1 else 0.0
    figures = {"ttft_ms": record.ttft, "tpot_ms": tpot, "e2e_ms": record.e2e}
    return all(figures[key] * 1000 <= bound for key, bound in slo.items())


def goodput(records: list[Any], duration: float, slo: dict[str, float]) -> Figures:
    """The level's SLO figures: attainment counts every request sent (a failed request is
    not good), goodput divides by the level's duration like throughput does."""
    if not slo:
        return {}
    good = [r for r in records if request_meets(r, slo)]
    sent = len(records)
    return {
        "slo": dict(slo),
        "slo_attainment": len(good) / sent if sent else 0.0,
        "good_requests": len(good),
        "goodput_request_throughput": len(good) / duration if duration else 0.0,
        "goodput_output_throughput": sum(r.completion_tokens for r in good) / duration
        if duration
        else 0.0,
    }
