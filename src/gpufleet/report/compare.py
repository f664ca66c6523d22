"""Compare runs: per-host tables by concurrency, crossovers, and the notices that weaken a
comparison (report/answer.py builds the answer from them).

An arm is one run (a run id) or a profile (its latest archived run on each host), loaded
by report/select.py. Ratios
are against the first arm. Crossovers are interpolated on a log-concurrency axis between
measured levels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet import engine_facts
from gpufleet.archive.kept import Manifest
from gpufleet.report import catalogue
from gpufleet.report.fingerprint import PER_GPU, differences
from gpufleet.report.notes import said_once
from gpufleet.report.stats import LevelFigures, ratio_text
from gpufleet.report.tables import tokens_note


@dataclass
class Arm:
    label: str
    manifests: list[Manifest]
    levels: dict[int, LevelFigures] = field(default_factory=dict)

    @property
    def manifest(self) -> Manifest:
        return self.manifests[-1]


def figure(level: LevelFigures | None, key: str) -> float | None:
    """A figure of a level as a number, None where the level or the figure is missing."""
    value = None if level is None else level.get(key)
    return None if value is None else float(value)


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


def level_bound(arm: Arm, c: int, key: str, side: int) -> float:
    """The mean (side 0), or the low (-1) / high (+1) end of its interval with repeats."""
    row = arm.levels[c]
    ci = row.ci.get(key)
    if side and ci:
        return float(ci[0] if side < 0 else ci[1])
    return figure(row, key) or 0.0


def crossover_text(a: Arm, b: Arm, levels: list[int], key: str) -> tuple[Crossing, str]:
    """(kind, "C~4" or, with repeats, the interval "C~3-5") of where b crosses a."""
    mean = [[level_bound(arm, c, key, 0) for c in levels] for arm in (a, b)]
    kind, at = crossover(levels, *mean)
    if kind not in (Crossing.DOWN, Crossing.UP) or at is None:
        return kind, ""
    ends = []
    for side_a, side_b in ((1, -1), (-1, 1)):  # b falls earliest / latest
        got = crossover(
            levels,
            [level_bound(a, c, key, side_a) for c in levels],
            [level_bound(b, c, key, side_b) for c in levels],
        )
        ends.append(got[1] if got[0] == kind else None)
    low, high = ends
    if low is None or high is None or round(low) == round(high):
        return kind, f"C~{at:.0f}"
    low, high = sorted((low, high))
    return kind, f"C~{low:.0f}-{high:.0f}"


def client_bound(arm: Arm, levels: list[int]) -> list[tuple[int, str]]:
    """The levels where this arm's load generator was the bottleneck, with the reason."""
    return [(c, str(arm.levels[c].row.client_bound)) for c in levels
            if c in arm.levels and arm.levels[c].get("client_bound")]  # fmt: skip


def _flag(argv: list[str] | None, name: str) -> str | None:
    argv = argv or []
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def effective_max_running(manifest: Manifest) -> int | None:
    """The requests the server served at once: as its engine's adapter read them at launch
    (archived since issue 38), else, for an older run, SGLang's rule read from its argv."""
    if manifest.server.slots is not None:
        return manifest.server.slots
    argv = manifest.server.argv or []
    explicit = _flag(argv, "--max-running-requests")
    if explicit is not None:
        return int(explicit)
    return engine_facts.default_max_running(_flag(argv, "--speculative-algorithm"))


class Severity(StrEnum):
    """ERROR: the comparison itself is in doubt (unequal GPUs, another workload, a failed
    run): shown beside the answer. WARNING: a level's figures need reading with care."""

    ERROR = "error"
    WARNING = "warning"


@dataclass
class Notice:
    """One warning of a comparison: its severity, what it is about, and its words."""

    severity: Severity
    text: str
    topic: str = ""  # gpu, workload, run, client, queue, load
    subject: str = ""  # the fingerprint entry or fact that differs


GPU_FACTS = {*PER_GPU.values(), "GPU count"}  # fingerprint entries about the GPUs themselves


def notices(arms: list[Arm], levels: list[int]) -> list[Notice]:
    """Everything that weakens a comparison, with its severity (see Severity): the arms'
    workloads and software against the first arm's, then each arm's own health, status,
    load and queue."""
    out = _differences(arms)
    for arm in arms:
        out += _arm_health(arm)
    for arm in arms:
        out += _arm_status(arm)
    for arm in arms:
        out += _arm_load(arm, levels)
    for arm in arms:
        out += _arm_queue(arm, levels)
    return out


def _workload(arm: Arm) -> dict[str, str | float | None]:
    m = arm.manifest
    return {
        "prompt set": m.prompt_set.prompts_sha256,
        "output length": m.plan.output_len if m.plan else None,
        "backend": m.plan.backend if m.plan else None,
        "offered load (--request-rate)": m.plan.request_rate if m.plan else None,
        "host": m.host,
    }


def _differences(arms: list[Arm]) -> list[Notice]:
    """Each arm's workload, GPU and software facts that differ from the first arm's."""
    out: list[Notice] = []
    base = arms[0]
    ref = _workload(base)
    for arm in arms[1:]:
        other = _workload(arm)
        for key, value in ref.items():
            if other[key] != value:
                severity = Severity.WARNING if key == "host" else Severity.ERROR
                out.append(Notice(severity, f"{key} differs: {base.label} {value!r} vs "
                                  f"{arm.label} {other[key]!r}", "workload", key))  # fmt: skip
        for label, a, b in differences(base.manifest, arm.manifest):
            topic = "gpu" if label in GPU_FACTS else "software"
            out.append(Notice(Severity.ERROR, f"{label} differs: {base.label} {_said(a)} vs "
                              f"{arm.label} {_said(b)}", topic, label))  # fmt: skip
    return out


def _arm_health(arm: Arm) -> list[Notice]:
    """A GPU the health gate did not call ok."""
    out: list[Notice] = []
    unhealthy = [h for h in arm.manifest.server.gpu_health or [] if ": ok" not in h]
    if unhealthy:
        launched = (
            " (launched with --allow-unhealthy)" if arm.manifest.server.allowed_unhealthy else ""
        )
        out.append(Notice(Severity.ERROR, f"{arm.label}: {'; '.join(unhealthy)}{launched}",
                          "gpu", "GPU health"))  # fmt: skip
    return out


def _arm_status(arm: Arm) -> list[Notice]:
    """A run that did not finish; the levels it measured nothing at (every request failed,
    in every repeat): named failed, with every failed request counted."""
    out: list[Notice] = []
    empty = [c for c, level in arm.levels.items() if not level.measured]
    if empty:
        failed = sum(int(arm.levels[c].get(catalogue.FAILED) or 0) for c in empty)
        sent = failed + sum(int(arm.levels[c].get(catalogue.COMPLETED) or 0) for c in empty)
        out.append(Notice(Severity.ERROR, f"{arm.label}: failed: measured nothing at "
                          f"C={','.join(map(str, empty))} ({failed} of {sent} requests failed)",
                          "run"))  # fmt: skip
    if arm.manifest.status != "done":
        out.append(Notice(Severity.ERROR, f"{arm.label}: run {arm.manifest.run_id} is "
                          f"{arm.manifest.status} ({arm.manifest.reason})", "run"))  # fmt: skip
    return out


def _arm_load(arm: Arm, levels: list[int]) -> list[Notice]:
    """Levels where the load was not what it claims: overloaded, not judged, client-bound,
    late timers, token counts said (disagreeing, approximated), unflushed cache, bursty
    chunks. Each note once per arm (said_once), naming its levels and its figures' range."""
    said: dict[str, list[tuple[int, str]]] = {"load": [], "client": [], "tokens": []}
    for c in levels:
        row = arm.levels[c]
        if row.get("overloaded"):
            said["load"].append((c, f"overloaded at C=@: sent "
                f"{row.get(catalogue.ACHIEVED_RATE, 0):.2f} of "
                f"{row.get(catalogue.OFFERED_RATE, 0):.2f} req/s offered{_answered(row)}, "
                f"queue wait p50 "
                f"{row.get(catalogue.QUEUE_WAIT, 0):.0f} ms, p99 "
                f"{row.get(catalogue.QUEUE_WAIT_P99, 0):.0f} ms before each TTFT"))  # fmt: skip
        if row.get(catalogue.SLO_MET) == 0:
            said["load"].append((c, "no request met the SLO at C=@ (goodput 0)"))
        if row.get("overload_unjudged"):
            said["load"].append((c, f"overload not judged at C=@ ({row.get('overload_unjudged')})"))
        if row.get("client_bound"):
            said["client"].append((c, f"client-bound at C=@ ({row.row.client_bound})"))
        if row.get("client_late"):
            said["client"].append((c, f"client timers late at C=@ ({row.row.client_late})"))
        if tokens_note(row):
            said["tokens"].append((c, f"at C=@ {tokens_note(row)}"))
    out = [
        Notice(Severity.WARNING, f"{arm.label}: {text.replace('C=@', f'C={where}')}", topic)
        for topic, notes in said.items()
        for where, text in said_once(notes)
    ]
    unflushed = _unflushed(arm, levels)
    if unflushed:
        out.append(Notice(Severity.WARNING, unflushed, "workload"))
    bursty = _bursty_itl(arm, levels)
    if bursty:
        out.append(Notice(Severity.WARNING, bursty, "client"))
    return out


def _answered(row: LevelFigures) -> str:
    """What an overloaded level's server answered, where it was measured."""
    completed, queued = row.get(catalogue.COMPLETED_RATE), row.get(catalogue.QUEUE_AT_END)
    said = f" ({completed:.2f} completed" if completed is not None else ""
    if queued:
        said += f"{', ' if said else ' ('}{queued:.0f} waiting at the last arrival"
    return said + ")" if said else ""


def _arm_queue(arm: Arm, levels: list[int]) -> list[Notice]:
    """Levels above what the server runs at once: the rest of the requests queue."""
    cap = effective_max_running(arm.manifest)
    over = [c for c in levels if cap is not None and c > cap]
    if not over:
        return []
    argv = arm.manifest.server.argv or []
    sglang = engine_facts.is_sglang(arm.manifest.server.engine)
    why = (
        f"SGLang's silent cap of {cap} for speculative decoding"
        if sglang and cap == engine_facts.SPEC_DEFAULT_MAX_RUNNING
        and _flag(argv, "--max-running-requests") is None
        else f"max-running-requests {cap}" if sglang
        else f"the server serves {cap} at once"
    )  # fmt: skip
    return [Notice(Severity.WARNING, f"{arm.label}: at C={','.join(map(str, over))} "
                   f"requests queue ({why})", "queue")]  # fmt: skip


BURSTY_ITL = 0.25  # median ITL under this share of TPOT: tokens arrive as back-to-back chunks


def _bursty_itl(arm: Arm, levels: list[int]) -> str | None:
    """Levels whose median inter-token gap is a small part of the time per token: the server
    streams a step's tokens as separate chunks back to back (llama.cpp's server does with a
    draft: its ITL read 0.0-0.2 ms against 34-53 ms for the target), so ITL there measures
    the stream's framing, and TPOT is the per-token figure to compare. SGLang sends a
    step's tokens in one chunk, which gpufleet spreads evenly: silent there."""
    bursty = []
    for c in levels:
        itl, tpot = arm.levels[c].get(catalogue.ITL), arm.levels[c].get(catalogue.TPOT)
        numbers = isinstance(itl, int | float) and isinstance(tpot, int | float)
        if numbers and tpot > 0 and itl < BURSTY_ITL * tpot:
            bursty.append(f"C={c} {itl:.1f} vs {tpot:.1f} ms")
    if not bursty:
        return None
    return (
        f"{arm.label}: ITL p50 is a small part of TPOT p50 ({', '.join(bursty)}): the server "
        "streams a step's tokens as separate chunks back to back, so compare TPOT, not ITL"
    )


def _unflushed(arm: Arm, levels: list[int]) -> str | None:
    """Levels whose server's prefix cache could not be emptied before them (asked, and the
    server has no /flush_cache, or refused): an earlier level's prompts may have warmed
    them. Silent where nothing was asked (--no-flush), every flush succeeded, or the
    level's prompts began with a tag of their own (`prompts_salted`: what the cache served
    there was shared within the level, never an earlier level's)."""
    missed = [
        c for c in levels
        if arm.levels[c].get("cache_flushed") is False and not arm.levels[c].get("prompts_salted")
    ]  # fmt: skip
    if not missed:
        return None
    hits = [
        f"C={c} {rate:.0%}"
        for c in missed
        if isinstance(rate := arm.levels[c].get(catalogue.CACHE_HIT), int | float) and rate > 0
    ]
    served = f"; its prefix cache served {', '.join(hits)} of prompt tokens" if hits else ""
    return (
        f"{arm.label}: the prefix cache could not be emptied before C={','.join(map(str, missed))}"
        f" (the server has no /flush_cache, or refused it){served}: an earlier level's prompts "
        "may have made these faster (TTFT above all)"
    )


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


TABLE_METRICS = [(m.compare_label, m.key, m.fmt) for m in catalogue.where(catalogue.Place.COMPARE)]
RATIO_KEYS = {m.key for m in catalogue.where(catalogue.Place.RATIO)}


def common_levels(arms: list[Arm]) -> list[int]:
    return sorted(set.intersection(*(set(a.levels) for a in arms)))


HEADLINE_METRICS = [  # the terminal's default: fits 100 columns for two arms
    (m.headline, m.key, m.headline_fmt or m.fmt, bool(m.higher_is_better))
    for m in catalogue.where(catalogue.Place.HEADLINE)
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
            values = [figure(arm.levels[c], key) for arm in arms]
            row += [fmt.format(v) if v is not None else "-" for v in values]
            if key in RATIO_KEYS:
                row += [ratio_text(arms[0].levels[c], arm.levels[c], key) for arm in arms[1:]]
        rows.append(row)
    return headers, rows


TERMINAL_COLUMNS = 100  # the default table's width, as the plain table prints it


def _plain_width(headers: list[str], rows: list[list[str]]) -> int:
    """The widest line of the table as cli/output.py prints it (two spaces between)."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    return sum(widths) + 2 * (len(widths) - 1)


def _headline_table(arms: list[Arm]) -> tuple[list[str], list[list[str]]]:
    """The headline columns, as many as fit TERMINAL_COLUMNS: the ratios keep their
    intervals while fewer metrics fit; only then they go (the n.s. mark stays)."""
    headline = HEADLINE_METRICS if len(arms) <= 2 else HEADLINE_METRICS[:2]
    tries = [(headline[:n], i) for i in (True, False) for n in range(len(headline), 0, -1)]
    for shown, intervals in tries:
        headers, rows = _headline_columns(arms, shown, intervals)
        if _plain_width(headers, rows) <= TERMINAL_COLUMNS:
            break
    return headers, rows


def _headline_columns(
    arms: list[Arm], shown: list[tuple[str, str, str, bool]], intervals: bool
) -> tuple[list[str], list[list[str]]]:
    names = [chr(65 + i) for i in range(len(arms))]
    headers = ["C"]
    for name, _, _, higher in shown:
        headers += [f"{n} {name}" for n in names]
        if higher:  # ratios where more is better; TTFT's would not fit 100 columns
            headers += [f"{n}/A" for n in names[1:]]
    rows = []
    for c in common_levels(arms):
        row = [str(c)]
        for _, key, fmt, higher in shown:
            values = [figure(arm.levels[c], key) for arm in arms]
            row += [fmt.format(v) if v is not None else "-" for v in values]
            if higher:
                row += [
                    ratio_text(arms[0].levels[c], arm.levels[c], key, intervals) for arm in arms[1:]
                ]
        rows.append(row)
    return headers, rows
