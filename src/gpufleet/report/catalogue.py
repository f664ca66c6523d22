"""The metric catalogue: every figure gpufleet shows, declared once.

Each entry names the results.jsonl key, its labels, unit, which direction is better, how it
is printed, whether it gets a 95% interval with repeats, and where it appears. The run table
and CSV (report/tables.py), compare's tables and ratios (report/compare.py), the intervals
(report/stats.py), the plots, PNG and inline SVG (report/figures.py), the HTML verdict table
(report/html.py) and the repeat lines all read it. To add a metric: write it in the runner's
summary (host/bench/), add one Metric here with its places; tests/test_metric_catalogue.py
fails until both are done.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from gpufleet import per_request

# the keys code decides by (a tune's throughput, a level's concurrency and status): spelled
# here and read by name everywhere else
THROUGHPUT = "output_throughput"
CONCURRENCY = "max_concurrency"
STATUS = "level_status"
COMPLETED = "completed"
FAILED = "failed"
STEADY_THROUGHPUT = "steady_output_throughput"  # the level at full load (a tune's objective)
PER_REQUEST = "median_per_request_output_tps"
TPOT = "median_tpot_ms"
ITL = "median_itl_ms"
TOKENS_PER_JOULE = "output_tokens_per_joule"
CACHE_HIT = "cache_hit_rate"
# an open-loop level's queue: what was offered, sent and completed, and the wait before TTFT
OFFERED_RATE = "offered_request_rate"  # present only on a level with a request rate
ACHIEVED_RATE = "achieved_request_rate"
COMPLETED_RATE = "completed_request_rate"
QUEUE_WAIT = "median_queue_wait_ms"
QUEUE_WAIT_P99 = "p99_queue_wait_ms"
QUEUE_AT_END = "queue_at_last_arrival"


class Place(StrEnum):
    RUN_TABLE = "run table"  # inv bench's table, summary.csv and summary.md
    OPTIONAL = "only when present"  # in the run table only if some level has it
    COMPARE = "compare"  # inv compare's full table (--wide, md, csv)
    RATIO = "ratio"  # ... with a B/A ratio column
    HEADLINE = "headline"  # inv compare's default terminal table
    REPEATS = "repeat line"  # the mean [95% CI] line printed with --repeat
    VERDICT = "verdict"  # the HTML report's verdict table
    OPEN_LOOP = "open-loop table"  # the HTML report's table of levels with a request rate


@dataclass(frozen=True)
class Metric:
    key: str
    label: str  # run table and HTML verdict heading
    unit: str
    higher_is_better: bool | None  # None: neither (a count, a status)
    fmt: str = "{:.1f}"
    short: str = ""  # compare's column name (default: label)
    headline: str = ""  # compare's default table column name
    headline_fmt: str = ""
    interval: bool = False  # gets a 95% t interval with --repeat
    open_loop_label: str = ""  # its heading in the open-loop table (default: label)
    places: frozenset[Place] = frozenset()
    # as an OpenMetrics metric (fleet/openmetrics.py): its name without the namespace, in
    # base units (`to_base` from the catalogue's unit), its help, whether it is a counter
    export: str = ""
    export_help: str = ""
    to_base: float = 1.0
    counter: bool = False
    # the per-request figure (ttft, tpot, itl, e2e_latency) whose std over mean is this
    # level figure's relative spread in results.jsonl (fleet/estimate.py)
    spread: str = ""

    @property
    def compare_label(self) -> str:
        return self.short or self.label


def _m(key: str, label: str, unit: str, higher: bool | None, fmt: str, *places: Place,
       **extra: object) -> Metric:  # fmt: skip
    return Metric(key, label, unit, higher, fmt, places=frozenset(places), **extra)  # type: ignore[arg-type]


R, OPT, C, X, H, P, V, QUEUED = (
    Place.RUN_TABLE, Place.OPTIONAL, Place.COMPARE, Place.RATIO, Place.HEADLINE,
    Place.REPEATS, Place.VERDICT, Place.OPEN_LOOP,
)  # fmt: skip

CATALOGUE: list[Metric] = [
    _m("max_concurrency", "concurrency", "requests", None, "{}", R),
    _m("completed", "completed", "requests", None, "{}", R,
       export="requests_completed", export_help="Requests completed at the level", counter=True),
    _m("failed", "failed", "requests", False, "{}", R,
       export="requests_failed", export_help="Requests failed at the level", counter=True),
    _m("output_throughput", "output tok/s", "tok/s", True, "{:.1f}", R, C, X, H, P, V,
       short="total tok/s", headline="tok/s", headline_fmt="{:.0f}", interval=True,
       export="output_throughput_tokens_per_second",
       export_help="Output tokens per second over the level",
       spread="e2e_latency"),
    _m("request_throughput", "requests/s", "req/s", True, "{:.2f}", interval=True,
       export="request_throughput_requests_per_second",
       export_help="Requests completed per second",
       spread="e2e_latency"),
    _m("median_per_request_output_tps", "per-request tok/s (median)", "tok/s", True, "{:.1f}",
       R, C, X, H, P, V, short="per-req tok/s p50", headline="req tok/s", headline_fmt="{:.1f}",
       interval=True,
       export="per_request_output_speed_median_tokens_per_second",
       export_help="Median over requests of each request's output tokens per second",
       spread="e2e_latency"),
    _m("mean_per_request_output_tps", "per-request tok/s (mean)", "tok/s", True, "{:.1f}",
       interval=True,
       spread="e2e_latency"),
    _m("p10_per_request_output_tps", "per-request tok/s (p10)", "tok/s", True, "{:.1f}", R),
    # the other per-request speed (issue 38): decoding only, TTFT left out; --wide shows it
    _m("median_per_request_decode_tps", "per-request decode tok/s (median)", "tok/s", True,
       "{:.1f}", C, short="decode tok/s p50", interval=True),
    _m("median_ttft_ms", "TTFT p50 ms", "ms", False, "{:.1f}", R, C, X, H, P, V, QUEUED,
       open_loop_label="TTFT p50 ms (after the queue)",
       headline="TTFT ms", headline_fmt="{:.0f}", interval=True,
       export="time_to_first_token_median_seconds",
       export_help="Median time to first token",
       to_base=0.001, spread="ttft"),
    _m("p99_ttft_ms", "TTFT p99 ms", "ms", False, "{:.1f}", R, C, V, interval=True,
       export="time_to_first_token_p99_seconds",
       export_help="99th percentile time to first token",
       to_base=0.001),
    _m("median_itl_ms", "ITL p50 ms", "ms", False, "{:.2f}", R, C, V, interval=True,
       export="inter_token_latency_median_seconds",
       export_help="Median inter-token latency, per token (a chunk of k tokens: k gaps of gap/k)",
       to_base=0.001, spread="itl"),
    _m("p99_itl_ms", "ITL p99 ms", "ms", False, "{:.2f}", interval=True,
       export="inter_token_latency_p99_seconds",
       export_help="99th percentile inter-token latency, per token",
       to_base=0.001),
    _m("median_tpot_ms", "TPOT p50 ms", "ms", False, "{:.2f}", R, interval=True,
       export="time_per_output_token_median_seconds",
       export_help="Median time per output token",
       to_base=0.001, spread="tpot"),
    _m("p99_tpot_ms", "TPOT p99 ms", "ms", False, "{:.2f}", interval=True),
    _m("median_e2e_latency_ms", "E2E p50 ms", "ms", False, "{:.0f}", R, interval=True,
       export="end_to_end_latency_median_seconds",
       export_help="Median request latency",
       to_base=0.001, spread="e2e_latency"),
    _m("accept_length", "accept length", "tokens/step", True, "{:.2f}", R, C,
       short="accept len"),
    _m("median_request_accept_length", "accept len p50 (per request)", "tokens/step", True,
       "{:.2f}", R, OPT, C, short="req accept p50"),
    _m("p10_request_accept_length", "accept len p10 (per request)", "tokens/step", True,
       "{:.2f}", C, short="req accept p10"),
    _m("p90_request_accept_length", "accept len p90 (per request)", "tokens/step", True,
       "{:.2f}", C, short="req accept p90"),
    _m("depth_switches", "depth switches", "switches", None, "{}", R, OPT, C,
       short="switches"),
    _m("cache_hit_rate", "cached", "share", None, "{:.0%}", R, OPT),
    _m("gpu_power_avg_w", "GPU W avg", "W", None, "{:.0f}", C),
    _m("output_tokens_per_joule", "output tok/J", "tok/J", True, "{:.2f}", C, X, V,
       short="tok/J", interval=True),
    _m("joules_per_output_token", "J/tok", "J/tok", False, "{:.3f}", C,
       export="output_energy_joules_per_token", export_help="GPU energy per output token (NVML)"),
    _m("slo_attainment", "SLO met", "share", True, "{:.1%}", R, OPT, C, interval=True),
    _m("goodput_output_throughput", "goodput tok/s", "tok/s", True, "{:.1f}", R, OPT, C, X,
       interval=True),
    _m("steady_output_throughput", "steady tok/s", "tok/s", True, "{:.1f}", C, X,
       short="steady tok/s", interval=True),
    _m("offered_request_rate", "offered req/s", "req/s", None, "{:.2f}", R, OPT, QUEUED, C,
       short="offered req/s"),
    # the client's sends per second (the key keeps its first name: archives hold it); what
    # the server answered is completed_request_rate
    _m("achieved_request_rate", "sent req/s", "req/s", True, "{:.2f}", R, OPT, QUEUED, C,
       short="sent req/s"),
    _m("completed_request_rate", "completed req/s", "req/s", True, "{:.2f}", R, OPT, QUEUED, C,
       short="completed req/s"),
    _m("queue_at_last_arrival", "queued at last arrival", "requests", False, "{:.0f}", R, OPT,
       QUEUED, C, short="queued at end"),
    _m("median_queue_wait_ms", "queue wait p50 ms", "ms", False, "{:.0f}", R, OPT, QUEUED, C,
       short="queue p50 ms"),
    _m("p99_queue_wait_ms", "queue wait p99 ms", "ms", False, "{:.0f}", R, OPT, QUEUED, C,
       short="queue p99 ms"),
    _m("level_status", "status", "", None, "{}", R),
]  # fmt: skip
BY_KEY = {m.key: m for m in CATALOGUE}

SLO_MET = "slo_attainment"
SLO_KEYS = (SLO_MET, "goodput_output_throughput")  # shown at 0 too: the worst outcome
# figures of what was sent, not of what completed: a level that completed none still has them
# (its SLO outcome above all: no request met it)
OF_SENDS = {*SLO_KEYS, OFFERED_RATE, ACHIEVED_RATE, "gpu_power_avg_w"}


def from_completions(key: str) -> bool:
    """A figure measured from completed requests (a speed, a latency, an energy per token),
    not a count, a status or a figure of the sends: a level (or a repeat) that completed no
    request has no such figure, and its 0 is never shown, averaged or compared."""
    metric = BY_KEY.get(key)
    if metric is None:
        return key.startswith(("median_", "mean_", "p99_", "p90_", "p95_", "std_", "steady_"))
    return metric.unit not in ("requests", "") and key not in OF_SENDS


@dataclass(frozen=True)
class PlotSpec:
    """One plot (a PNG file and an HTML figure): its series share a unit."""

    name: str  # file stem: <host>-<name>.png
    title: str
    keys: tuple[str, ...]  # the first solid, the others dashed (p99 beside p50)

    @property
    def unit(self) -> str:
        return BY_KEY[self.keys[0]].unit


PLOTS = [
    PlotSpec("throughput", "Total output throughput", ("output_throughput",)),
    PlotSpec("per_request", "Per-request speed (median)", ("median_per_request_output_tps",)),
    PlotSpec("ttft", "Time to first token", ("median_ttft_ms", "p99_ttft_ms")),
    PlotSpec("itl", "Inter-token latency", ("median_itl_ms", "p99_itl_ms")),
    PlotSpec("goodput", "SLO goodput", ("goodput_output_throughput",)),
    PlotSpec(
        "acceptance",
        "Per-request acceptance (p50; p10 and p90 dashed)",
        ("median_request_accept_length", "p10_request_accept_length", "p90_request_accept_length"),
    ),
    PlotSpec("tokens_per_joule", "Output tokens per joule", ("output_tokens_per_joule",)),
]

# What results.jsonl holds and no table shows (it stays in the archive): bench_serving's
# other statistics, bookkeeping and per-level details. A new numeric key that is neither
# here nor in the catalogue fails tests/test_metric_catalogue.py.
ARCHIVE_ONLY = re.compile(
    r"^((mean|median|std|p\d+)_(ttft|tpot|itl|e2e_latency)_ms"
    r"|(mean|std|p\d+|median|min|max)_per_request_output_tps"
    r"|total_\w+|input_throughput|good_requests"
    r"|duration|concurrency|request_rate|repeat|seed|output_len|random_\w+|warmup_errors"
    r"|gpu_\w+|energy_\w+|prom_\w+|sglang_\w+|max_\w+|mean_\w+|cached_tokens\w*"
    r"|goodput|goodput_\w+|slo_\w+|cache_\w+|\w+_count|\w+_s"
    r"|client_\w+|steady_\w+|(mean|std|p90|p95)_queue_wait_ms|overloaded|overload_unjudged|prompts_salted)$"
)


def exported() -> list[Metric]:
    """The metrics the archive's figures are exported as, for Prometheus."""
    return [m for m in CATALOGUE if m.export]


def spread_keys(key: str) -> tuple[str, str] | None:
    """The (std, mean) results.jsonl keys whose ratio is `key`'s relative spread."""
    metric = BY_KEY.get(key)
    if metric is None or not metric.spread:
        return None
    return f"std_{metric.spread}_ms", f"mean_{metric.spread}_ms"


def where(place: Place) -> list[Metric]:
    """The metrics shown in `place`, in catalogue order."""
    return [m for m in CATALOGUE if place in m.places]


def interval_keys() -> tuple[str, ...]:
    return tuple(m.key for m in CATALOGUE if m.interval)


def quantile_of(key: str) -> tuple[str, float] | None:
    """(per-request series, percentile) for a figure that is a percentile of one of
    gpufleet.per_request's series (`median_ttft_ms` -> ("ttft_ms", 50), `p99_itl_ms` ->
    ("itl_ms", 99)), else None: its interval is resampled request by request
    (report/resampling.py), never a t interval of the repeats' percentiles."""
    head, _, series = key.partition("_")
    if series not in per_request.SERIES:
        return None
    if head == "median":
        return series, 50.0
    if head[:1] == "p" and head[1:].isdigit():
        return series, float(head[1:])
    return None


def tick(value: float) -> str:
    """An axis label that stays readable at every magnitude (0.012 tok/J, 41,000 tok/s)."""
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"
