"""inv bench --find-max: the highest load a server holds within an SLO.

"Holds" means at least `target` of the requests (default 99%) meet every bound of the SLO
(host/bench/slo.py). The search probes one load per run (each run archived like any
other): it doubles the load from `start` until a probe fails or `limit` is reached, then
bisects between the last load that held and the first that did not, never probing a load
twice, at most `max_probes` runs. Concurrency is searched in whole requests; a request
rate until the bracket is within 5%.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.archive import store
from gpufleet.archive.kept import FindMaxRecord
from gpufleet.archive.kept import ProbeRecord as Probe
from gpufleet.archive.layout import profile_label
from gpufleet.control.bench import run as benchrun
from gpufleet.control.bench.request import MAX_PROMPTS
from gpufleet.control.connect.base import Session
from gpufleet.control.connect.fanout import FleetResult
from gpufleet.control.connect.fleet import Fleet
from gpufleet.errors import UserError

RATE_PRECISION = 1.05
RATE_CAP = 4096  # in-flight cap while searching a request rate


@dataclass
class Search:
    """One find-max search: what it varies, the SLO attainment it must keep, its bounds and the
    probes so far."""

    by: str  # concurrency or request-rate
    target: float
    start: float
    limit: float
    max_probes: int
    probes: list[Probe] = field(default_factory=list)

    def passed(self, probe: Probe) -> bool:
        """A probe that finished and kept the target attainment."""
        return probe.status == "done" and probe.attainment >= self.target

    def run(self, measure: Callable[[float], Probe]) -> tuple[float | None, float | None]:
        """(highest load that held, lowest load that did not); None where unknown."""
        known: dict[float, Probe] = {}

        def probe(load: float) -> bool:
            if load not in known:
                known[load] = measure(load)
                self.probes.append(known[load])
            return self.passed(known[load])

        low, high = None, None
        load = self.start
        while len(self.probes) < self.max_probes:
            if probe(load):
                low = load
                if load >= self.limit:
                    return low, high
                load = min(self.limit, load * 2)
            else:
                high = load
                break
        while low is not None and high is not None and len(self.probes) < self.max_probes:
            if self.by == "concurrency":
                if high - low <= 1:
                    break
                mid = float((int(low) + int(high)) // 2)
            else:
                if high / low <= RATE_PRECISION:
                    break
                mid = round((low * high) ** 0.5, 3)
            if probe(mid):
                low = mid
            else:
                high = mid
        return low, high


def _request_for(request: benchrun.BenchRequest, by: str, load: float) -> benchrun.BenchRequest:
    if by == "concurrency":
        return replace(request, concurrency=[int(load)], fixed_levels=None)
    cap = max(request.concurrency or [RATE_CAP])
    count = request.num_prompts or max(50, int(load * 30))  # about 30 s of arrivals
    return replace(
        request,
        concurrency=[cap],
        request_rate=load,
        fixed_levels=[{"concurrency": cap, "num_prompts": min(count, MAX_PROMPTS)}],
    )


def find_on(
    session: Session,
    request: benchrun.BenchRequest,
    search: Search,
    progress: Any,
) -> FindMaxRecord:
    """The search on one host; every probe is a run archived under the host."""

    def measure(load: float) -> Probe:
        probe_request = _request_for(request, search.by, load)
        run_id = benchrun.make_run_id(probe_request, [session.host.name])
        value = benchrun.bench_on(session, probe_request, run_id, progress)
        attainment = min((r.slo_attainment or 0.0 for r in value.results), default=0.0)
        return Probe(load, attainment, run_id, value.status)

    low, high = search.run(measure)
    return FindMaxRecord(
        host=session.host.name,
        profile=profile_label(request.profile) if request.profile else None,
        by=search.by,
        slo=dict(request.slo),
        target=search.target,
        holds_up_to=low,
        fails_from=high,
        probes=list(search.probes),
        limit=search.limit,
        at=datetime.now(UTC).isoformat(),
    )


def find_max(
    fleet: Fleet,
    request: benchrun.BenchRequest,
    by: str,
    target: float,
    *,
    limit: float,
    max_probes: int,
    progress: Any = None,
) -> FleetResult[tuple[FindMaxRecord, Path]]:
    """Search every host in parallel; each host's answer is archived as
    `<archive>/findmax/<host>/<stamp>-<profile>.json`."""
    if not request.slo:
        raise UserError("--find-max needs --slo (e.g. --slo ttft_ms=500,tpot_ms=50)")
    if by not in ("concurrency", "request-rate"):
        raise UserError(f"--by {by!r}: expected concurrency or request-rate")
    start = float(request.concurrency[0]) if by == "concurrency" and request.concurrency else 1.0
    benchrun.build_plan(_request_for(request, by, start), "check")  # bad input: fail now

    def on_host(session: Session) -> tuple[FindMaxRecord, Path]:
        search = Search(by, target, start, limit, max_probes)
        answer = find_on(session, request, search, progress)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path = request.archive.findmax_record(session.host.name, stamp, answer.profile)
        store.make_dirs(path.parent)
        store.write_private_file(path, answer.to_json().encode())
        return answer, path

    return fleet.each(on_host)
