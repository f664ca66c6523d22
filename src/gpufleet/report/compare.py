"""Compare runs: per-host tables by concurrency, the crossover, fairness warnings.

An arm is one run (a run id) or a profile (its latest archived run on each host), loaded
by archive/select.py. Ratios
are against the first arm. Crossovers are interpolated on a log-concurrency axis between
measured levels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet.archived import Manifest
from gpufleet.report import metrics
from gpufleet.report.fingerprint import differences
from gpufleet.report.stats import ratio_text

SPECULATIVE_CAP = 48


@dataclass
class Arm:
    label: str
    manifests: list[Manifest]
    levels: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def manifest(self) -> Manifest:
        return self.manifests[-1]


def _metric(row: dict[str, Any] | None, key: str) -> float | None:
    if row is None or row.get(key) is None:
        return None
    return float(row[key])


class Crossing(StrEnum):
    """How b compares with a along the levels (the first change of side counts)."""

    DOWN = "cross"  # b at or above a, then below from C
    UP = "cross-up"  # b below a, then at or above from C
    NEVER = "never"  # b at or above a at every level
    BELOW = "below"  # b below a at every level


def crossover(levels: list[int], a: list[float], b: list[float]) -> tuple[Crossing, float | None]:
    """Where b - a first changes sign, interpolated on log C; (kind, C or None)."""
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    for i in range(1, len(levels)):
        if (diffs[i] < 0) != (diffs[i - 1] < 0):
            x0, x1 = math.log(levels[i - 1]), math.log(levels[i])
            d0 = diffs[i - 1] / (a[i - 1] or 1.0)
            d1 = diffs[i] / (a[i] or 1.0)
            t = d0 / (d0 - d1) if d0 != d1 else 0.0
            kind = Crossing.DOWN if diffs[i] < 0 else Crossing.UP
            return kind, math.exp(x0 + t * (x1 - x0))
    return (Crossing.BELOW if diffs[0] < 0 else Crossing.NEVER), None


def _bound(arm: Arm, c: int, key: str, side: int) -> float:
    """The mean (side 0), or the low (-1) / high (+1) end of its interval with repeats."""
    row = arm.levels[c]
    ci = (row.get("ci") or {}).get(key)
    if side and ci:
        return float(ci[0] if side < 0 else ci[1])
    return _metric(row, key) or 0.0


def crossover_text(a: Arm, b: Arm, levels: list[int], key: str) -> tuple[Crossing, str]:
    """(kind, "C~4" or, with repeats, the interval "C~3-5") of where b crosses a."""
    mean = [[_bound(arm, c, key, 0) for c in levels] for arm in (a, b)]
    kind, at = crossover(levels, *mean)
    if kind not in (Crossing.DOWN, Crossing.UP) or at is None:
        return kind, ""
    ends = []
    for side_a, side_b in ((1, -1), (-1, 1)):  # b falls earliest / latest
        got = crossover(
            levels,
            [_bound(a, c, key, side_a) for c in levels],
            [_bound(b, c, key, side_b) for c in levels],
        )
        ends.append(got[1] if got[0] == kind else None)
    low, high = ends
    if low is None or high is None or round(low) == round(high):
        return kind, f"C~{at:.0f}"
    low, high = sorted((low, high))
    return kind, f"C~{low:.0f}-{high:.0f}"


def sentence(a: Arm, b: Arm, levels: list[int]) -> str:
    """The answer in one plain sentence, e.g. 'eagle3 is faster per request up to C~7 and
    loses total throughput from C~4; at C=64 baseline delivers 2.2x.' With repeats the
    crossovers carry their interval ('C~3-5')."""
    if len(levels) < 1:
        return "no common concurrency levels to compare"
    tot_a = [_metric(a.levels[c], "output_throughput") or 0 for c in levels]
    tot_b = [_metric(b.levels[c], "output_throughput") or 0 for c in levels]
    kind, where = crossover_text(a, b, levels, "median_per_request_output_tps")
    at = crossover(levels, *[[_bound(arm, c, "median_per_request_output_tps", 0)
                              for c in levels] for arm in (a, b)])[1]  # fmt: skip
    accepted = _acceptance_at(b, levels, at) or _acceptance_at(a, levels, at)
    first = {
        Crossing.DOWN: f"{b.label} is faster per request up to {where}",
        Crossing.UP: f"{b.label} is slower per request below {where} and faster from there",
        Crossing.NEVER: f"{b.label} is at least as fast per request at every measured level "
        f"(C<={levels[-1]})",
        Crossing.BELOW: f"{b.label} is slower per request at every measured level",
    }[kind]
    kind, where = crossover_text(a, b, levels, "output_throughput")
    second = {
        Crossing.DOWN: f"loses total throughput from {where}",
        Crossing.UP: f"gains total throughput over {a.label} from {where}",
        Crossing.NEVER: f"keeps total throughput at or above {a.label}'s up to C={levels[-1]}",
        Crossing.BELOW: f"has lower total throughput than {a.label} at every level",
    }[kind]
    top = levels[-1]
    ta, tb = tot_a[-1], tot_b[-1]
    if ta and tb:
        winner, ratio = (a.label, ta / tb) if ta >= tb else (b.label, tb / ta)
        last = f"; at C={top} {winner} delivers {ratio:.1f}x"
    else:
        last = ""
    if accepted:
        first += f" ({accepted})"
    clauses = _energy_clause(a, b, levels) + _client_clause(a, b, levels)
    return f"{first} and {second}{last}{clauses}."


def _acceptance_at(arm: Arm, levels: list[int], at: float | None) -> str:
    """The arm's per-request acceptance at the measured level nearest the crossover: the
    spread says whether the crossover holds for most requests or only on average."""
    if at is None:
        return ""
    c = min(levels, key=lambda level: abs(math.log(level) - math.log(max(at, 1e-9))))
    row = arm.levels.get(c) or {}
    p50, p10, p90 = (row.get(f"{q}_request_accept_length") for q in ("median", "p10", "p90"))
    if p50 is None:
        return ""
    spread = f", p10-p90 {p10:.2f}-{p90:.2f}" if p10 is not None and p90 is not None else ""
    return f"{arm.label}'s per-request acceptance at C={c}: p50 {p50:.2f} tokens a step{spread}"


def client_bound(arm: Arm, levels: list[int]) -> list[tuple[int, str]]:
    """The levels where this arm's load generator was the bottleneck, with the reason."""
    return [(c, str(arm.levels[c]["client_bound"])) for c in levels
            if c in arm.levels and arm.levels[c].get("client_bound")]  # fmt: skip


def _client_clause(a: Arm, b: Arm, levels: list[int]) -> str:
    """A crossover read from levels where the client set the pace is said to be one."""
    bound = sorted({c for arm in (a, b) for c, _ in client_bound(arm, levels)})
    if not bound:
        return ""
    where = ",".join(map(str, bound))
    return (
        f" (the client was the bottleneck at C={where}: figures there, and any crossover "
        "they place, measure the load generator as much as the server)"
    )


def _energy_clause(a: Arm, b: Arm, levels: list[int]) -> str:
    """Energy, where it changes the verdict: at a level where one side is faster per
    request but the other spends less energy per token, say so."""
    for c in levels:
        per_a = _metric(a.levels[c], "median_per_request_output_tps")
        per_b = _metric(b.levels[c], "median_per_request_output_tps")
        tpj_a = _metric(a.levels[c], "output_tokens_per_joule")
        tpj_b = _metric(b.levels[c], "output_tokens_per_joule")
        if None in (per_a, per_b, tpj_a, tpj_b) or not tpj_a or not tpj_b:
            continue
        faster, frugal = (b, a) if per_b > per_a else (a, b)  # type: ignore[operator]
        ratio = max(tpj_a, tpj_b) / min(tpj_a, tpj_b)  # type: ignore[type-var]
        if (tpj_b > tpj_a) != (faster is b) and ratio >= 1.05:
            return (
                f"; but at C={c}, where {faster.label} is faster per request, "
                f"{frugal.label} gets {ratio:.2f}x the tokens per joule"
            )
    return ""


def _flag(argv: list[str] | None, name: str) -> str | None:
    argv = argv or []
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def effective_max_running(manifest: Manifest) -> int | None:
    argv = manifest.server.argv or []
    explicit = _flag(argv, "--max-running-requests")
    if explicit is not None:
        return int(explicit)
    if _flag(argv, "--speculative-algorithm") in ("EAGLE", "EAGLE3", "STANDALONE"):
        return SPECULATIVE_CAP
    return None


def fairness(arms: list[Arm], levels: list[int]) -> list[str]:
    warnings = []
    base = arms[0]

    def facts(arm: Arm) -> dict[str, Any]:
        m = arm.manifest
        return {
            "prompt set": m.prompt_set.prompts_sha256,
            "output length": m.plan.output_len if m.plan else None,
            "backend": m.plan.backend if m.plan else None,
            "host": m.host,
        }

    ref = facts(base)
    for arm in arms[1:]:
        other = facts(arm)
        for key, value in ref.items():
            if other[key] != value:
                warnings.append(
                    f"{key} differs: {base.label} {value!r} vs {arm.label} {other[key]!r}"
                )
        for label, a, b in differences(base.manifest, arm.manifest):
            warnings.append(f"{label} differs: {base.label} {_said(a)} vs {arm.label} {_said(b)}")
    for arm in arms:
        unhealthy = [h for h in arm.manifest.server.gpu_health or [] if ": ok" not in h]
        if unhealthy:
            launched = (
                " (launched with --allow-unhealthy)"
                if arm.manifest.server.allowed_unhealthy
                else ""
            )
            warnings.append(f"{arm.label}: {'; '.join(unhealthy)}{launched}")
    for arm in arms:
        for c, reason in client_bound(arm, levels):
            warnings.append(f"{arm.label}: client-bound at C={c} ({reason})")
    for arm in arms:
        cap = effective_max_running(arm.manifest)
        over = [c for c in levels if cap is not None and c > cap]
        if over:
            why = (
                "SGLang's silent cap of 48 for speculative decoding"
                if cap == SPECULATIVE_CAP
                and _flag(arm.manifest.server.argv or [], "--max-running-requests") is None
                else f"max-running-requests {cap}"
            )
            warnings.append(f"{arm.label}: at C={','.join(map(str, over))} requests queue ({why})")
        if arm.manifest.status != "done":
            warnings.append(
                f"{arm.label}: run {arm.manifest.run_id} is {arm.manifest.status}"
                f" ({arm.manifest.reason})"
            )
    return warnings


def _said(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join("n/a" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
                               for v in value) + ")"  # fmt: skip
    return repr(value)


def strict_refusal(arms: list[Arm]) -> str | None:
    """`--strict`: why these runs must not be compared (their fingerprints differ), or None."""
    base = arms[0]
    found = [
        f"{label} ({base.label} {_said(a)} vs {arm.label} {_said(b)})"
        for arm in arms[1:]
        for label, a, b in differences(base.manifest, arm.manifest)
    ]
    if not found:
        return None
    return "--strict: the runs differ in what changes speed: " + "; ".join(found)


TABLE_METRICS = [(m.compare_label, m.key, m.fmt) for m in metrics.where(metrics.Place.COMPARE)]
RATIO_KEYS = {m.key for m in metrics.where(metrics.Place.RATIO)}


def common_levels(arms: list[Arm]) -> list[int]:
    return sorted(set.intersection(*(set(a.levels) for a in arms)))


HEADLINE_METRICS = [  # the terminal's default: fits 100 columns for two arms
    (m.headline, m.key, m.headline_fmt or m.fmt, bool(m.higher_is_better))
    for m in metrics.where(metrics.Place.HEADLINE)
]


def letters(arms: list[Arm]) -> str:
    """`A=baseline vs B=eagle3`: the legend of the headline table's column names."""
    return " vs ".join(f"{chr(65 + i)}={arm.label}" for i, arm in enumerate(arms))


def table(arms: list[Arm], wide: bool = True) -> tuple[list[str], list[list[str]]]:
    """Headers and rows by concurrency: every metric (wide), or the headline columns with
    arms named A, B, ... (see `letters`) so two arms fit a 100-column terminal."""
    if not wide:
        return _headline_table(arms)
    headers = ["C"]
    for name, key, _ in TABLE_METRICS:
        headers += [f"{arm.label} {name}" for arm in arms]
        if key in RATIO_KEYS:
            headers += [f"{arm.label}/{arms[0].label} {name.split()[0]}" for arm in arms[1:]]
    rows = []
    for c in common_levels(arms):
        row = [str(c)]
        for _, key, fmt in TABLE_METRICS:
            values = [_metric(arm.levels[c], key) for arm in arms]
            row += [fmt.format(v) if v is not None else "-" for v in values]
            if key in RATIO_KEYS:
                row += [ratio_text(arms[0].levels[c], arm.levels[c], key) for arm in arms[1:]]
        rows.append(row)
    return headers, rows


def _headline_table(arms: list[Arm]) -> tuple[list[str], list[list[str]]]:
    names = [chr(65 + i) for i in range(len(arms))]
    headers = ["C"]
    shown = HEADLINE_METRICS if len(arms) <= 2 else HEADLINE_METRICS[:2]
    for name, _, _, higher in shown:
        headers += [f"{n} {name}" for n in names]
        if higher:  # ratios where more is better; TTFT's would not fit 100 columns
            headers += [f"{n}/A" for n in names[1:]]
    rows = []
    for c in common_levels(arms):
        row = [str(c)]
        for _, key, fmt, higher in shown:
            values = [_metric(arm.levels[c], key) for arm in arms]
            row += [fmt.format(v) if v is not None else "-" for v in values]
            if higher:
                row += [ratio_text(arms[0].levels[c], arm.levels[c], key) for arm in arms[1:]]
        rows.append(row)
    return headers, rows


def as_json(per_host: dict[str, list[Arm]]) -> dict[str, Any]:
    out = {}
    for host, arms in per_host.items():
        levels = common_levels(arms)
        out[host] = {
            "arms": [{"label": a.label, "run_ids": [m.run_id for m in a.manifests]} for a in arms],
            "levels": {str(c): {a.label: a.levels[c] for a in arms} for c in levels},
            "sentence": sentence(arms[0], arms[1], levels) if len(arms) > 1 and levels else None,
            "warnings": fairness(arms, levels),
        }
    return out
