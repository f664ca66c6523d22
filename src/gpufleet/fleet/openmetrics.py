"""The archive's figures in Prometheus' text format: a file for node_exporter's textfile
collector (`inv metrics --output FILE`) or an endpoint Prometheus scrapes (`--serve`).

Written with prometheus-client's collector API (its exposition, escaping and atomic
textfile writer), fed from the fleet index on every scrape. Names follow Prometheus'
conventions: base units (`_seconds`, `_joules_per_token`), `_total` on counters, the
`gpufleet_` namespace. A figure's labels are host, profile, engine, gpu_model and
concurrency only, and only each host's newest finished run of each profile is exported, so
a metric has at most hosts x profiles x levels series (`series_bound`), per scrape and in
the database: a new round replaces the values, not the series. What changes every round
(run id, engine version) is in one info series per host and profile (`gpufleet_run_info`).
`gpufleet_runs_left_out` counts the runs no view serves (damaged files, no manifest: the
index keeps them aside), so a damaged run never fails a scrape. A running sweep adds its
cells by status and an ETA. `gpufleet_fleet_suspect` is `inv fleet`'s suspect (off the
fleet in one round only, nothing recorded differs), with the figures' bounded labels.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.archive.kept import SweepRecord
from gpufleet.archive.layout import Archive
from gpufleet.errors import UserError
from gpufleet.fleet.index import Index, IndexedRun, reading
from gpufleet.fleet.outliers import fleet_view
from gpufleet.kinds import CellStatus, SweepStatus
from gpufleet.report import catalogue

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

NAMESPACE = "gpufleet"
RUN_LABELS = ("host", "profile", "engine", "gpu_model", "concurrency")
INFO_LABELS = ("host", "profile", "run_id", "engine_version")


@dataclass(frozen=True)
class Exported:
    """One level figure as a metric: its name (without namespace), help, results.jsonl key,
    the factor to its base unit, and whether it is a counter."""

    name: str
    help: str
    key: str
    scale: float = 1.0
    counter: bool = False


# every exported figure is declared once, in the metric catalogue (report/catalogue.py)
EXPORTED = tuple(
    Exported(m.export, m.export_help, m.key, m.to_base, m.counter) for m in catalogue.exported()
)


def newest_runs(
    index: Index, profile: str | None = None, host: str | None = None
) -> list[IndexedRun]:
    """Each host's newest finished run of each profile (what is exported)."""
    newest: dict[tuple[str, str], IndexedRun] = {}
    for run in index.runs(profile=profile, host=host, rows=False):
        if run.usable and run.profile:
            newest[run.host, run.profile] = run
    runs = sorted(newest.values(), key=lambda r: (r.profile or "", r.host))
    index.load_rows(runs)
    return [r for r in runs if r.rows]


def series_bound(runs: list[IndexedRun]) -> int:
    """The most series one level metric can have: hosts x profiles x levels."""
    hosts = {r.host for r in runs}
    profiles = {r.profile for r in runs}
    levels = {row[catalogue.CONCURRENCY] for r in runs for row in r.rows}
    return len(hosts) * len(profiles) * len(levels)


def _level_values(run: IndexedRun, key: str, counter: bool) -> Iterator[tuple[int, float]]:
    """(concurrency, the mean of its repeats' values; their sum for a count). A count sums
    every repeat, a failed one too: a level is failed where a request failed, so counting
    only `ok` levels' never exported a failed request (requests_failed read 0 at worst)."""
    by_c: dict[int, list[float]] = {}
    for row in run.rows:
        value = row.get(key)
        counted = counter or row.get(catalogue.STATUS) in (None, "ok")
        if counted and isinstance(value, int | float):
            by_c.setdefault(row[catalogue.CONCURRENCY], []).append(float(value))
    for c, values in sorted(by_c.items()):
        yield c, (sum(values) if counter else statistics.fmean(values))


def _labels(run: IndexedRun, c: int | None = None) -> list[str]:
    """A figure's labels (RUN_LABELS); without `c`, all but the concurrency."""
    found = [run.host, run.profile or "", run.engine or "", run.gpu_model or ""]
    return found if c is None else [*found, str(c)]


class ArchiveCollector:
    """A prometheus-client collector reading the archive (through its index) when asked."""

    def __init__(
        self, archive: Archive, profile: str | None = None, host: str | None = None
    ) -> None:
        self.archive, self.profile, self.host = archive, profile, host

    def collect(self) -> Iterator[Metric]:
        families, _ = reading(self.archive, lambda index: list(self._families(index)))
        yield from families
        yield from sweep_progress(self.archive)

    def _families(self, index: Index) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        runs = newest_runs(index, self.profile, self.host)
        for ex in EXPORTED:
            kind = CounterMetricFamily if ex.counter else GaugeMetricFamily
            family = kind(f"{NAMESPACE}_{ex.name}", ex.help, labels=RUN_LABELS)
            for run in runs:
                for c, value in _level_values(run, ex.key, ex.counter):
                    family.add_metric(_labels(run, c), value * ex.scale)
            yield family
        yield from _run_families(runs)
        left_out = GaugeMetricFamily(
            f"{NAMESPACE}_runs_left_out",
            "Archived runs no view serves: files that do not parse or verify, no manifest",
        )
        left_out.add_metric([], len(index.broken()))
        yield left_out
        yield from self._fleet(index, runs)

    def _fleet(self, index: Index, runs: list[IndexedRun]) -> Iterator[Metric]:
        """Each host's ratio to its fleet and what `inv fleet` says of it per level: named
        off the fleet, or a suspect (off in this round only, nothing recorded differs)."""
        from prometheus_client.core import GaugeMetricFamily

        labels = ("host", "profile", "concurrency")
        ratio = GaugeMetricFamily(
            f"{NAMESPACE}_fleet_throughput_ratio",
            "The host's output throughput over the fleet's median (inv fleet)",
            labels=labels,
        )
        named = GaugeMetricFamily(
            f"{NAMESPACE}_fleet_outlier",
            "1 where inv fleet names the host off the fleet at that level",
            labels=labels,
        )
        suspect = GaugeMetricFamily(
            f"{NAMESPACE}_fleet_suspect",
            "1 where inv fleet finds the host off the fleet in this round only, with no "
            "fingerprint field differing (suspect: measure again)",
            labels=RUN_LABELS,
        )
        profiles = sorted({r.profile for r in runs if r.profile})
        for profile in profiles:
            if len({r.host for r in runs if r.profile == profile}) < 2:
                continue
            try:
                view = fleet_view(index, profile)
            except UserError:
                continue  # its runs went meanwhile: the next scrape has them or not
            for level in view.levels:
                for h in level.hosts:
                    if self.host is not None and h.host != self.host:
                        continue
                    at = [h.host, profile, str(level.concurrency)]
                    ratio.add_metric(at, h.ratio)
                    named.add_metric(at, float(h.named))
                    run = view.runs[h.host][-1]  # each figure's host has its runs
                    off = float(h.off and not h.named)
                    suspect.add_metric(_labels(run, level.concurrency), off)
        yield ratio
        yield named
        yield suspect


def _run_families(runs: list[IndexedRun]) -> Iterator[Metric]:
    """Each exported run's start time (bounded labels) and its info series: run id and
    engine version, the labels that change every round."""
    from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

    started = GaugeMetricFamily(
        f"{NAMESPACE}_run_start_timestamp_seconds",
        "When the newest run of the host and profile began (Unix time)",
        labels=RUN_LABELS[:-1],
    )
    info = InfoMetricFamily(
        f"{NAMESPACE}_run", "The newest run of the host and profile", labels=INFO_LABELS[:2]
    )
    for run in runs:
        at = _unix(run.started_at)
        if at is not None:
            started.add_metric(_labels(run), at)
        info.add_metric(
            [run.host, run.profile or ""],
            {"run_id": run.run_id, "engine_version": run.engine_version or ""},
        )
    yield started
    yield info


def _unix(stamp: str | None) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def sweep_progress(archive: Archive, now: float | None = None) -> Iterator[Metric]:
    """Every running sweep's cells by status and its ETA from the pace so far."""
    from prometheus_client.core import GaugeMetricFamily

    cells = GaugeMetricFamily(
        f"{NAMESPACE}_sweep_cells", "A running sweep's cells by status", labels=("sweep", "status")
    )
    eta = GaugeMetricFamily(
        f"{NAMESPACE}_sweep_eta_seconds",
        "Seconds until a running sweep ends, at its pace so far",
        labels=("sweep",),
    )
    now = time.time() if now is None else now
    for path in archive.sweep_states():
        try:
            state = SweepRecord.load(path)
        except UserError:
            continue
        if state.status != SweepStatus.RUNNING:
            continue
        counts: dict[str, int] = {}
        for per_host in state.cells.values():
            for cell in per_host.values():
                counts[str(cell.status)] = counts.get(str(cell.status), 0) + 1
        for status, n in sorted(counts.items()):
            cells.add_metric([state.sweep_id, status], n)
        ended = (CellStatus.DONE.value, CellStatus.FAILED.value)
        total, done = sum(counts.values()), sum(counts.get(s, 0) for s in ended)
        began = _unix(state.created_at)
        if began is not None and 0 < done < total:
            eta.add_metric([state.sweep_id], (now - began) / done * (total - done))
    yield cells
    yield eta


def registry_for(archive: Archive, profile: str | None = None, host: str | None = None):
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ArchiveCollector(archive, profile, host))  # type: ignore[arg-type]
    return registry


def write_file(
    archive: Archive, path: Path, profile: str | None = None, host: str | None = None
) -> int:
    """Write the exposition to `path` atomically (a temporary file renamed into place, as
    node_exporter's textfile collector needs); the number of samples written."""
    from prometheus_client import generate_latest

    registry = registry_for(archive, profile, host)
    data = generate_latest(registry)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"--output {path}: cannot write ({exc.strerror or exc})") from None
    return sum(1 for line in data.decode().splitlines() if line and not line.startswith("#"))


def serve(
    archive: Archive, addr: str, port: int, profile: str | None = None, host: str | None = None
):
    """Serve /metrics in a background thread; (server, thread) as prometheus-client
    returns them. A port in use is one line."""
    from prometheus_client import start_http_server

    try:
        return start_http_server(port, addr=addr, registry=registry_for(archive, profile, host))
    except OSError as exc:
        raise UserError(
            f"--port {port}: cannot listen on {addr}:{port} "
            f"({exc.strerror or exc}); pick another with --port"
        ) from None
