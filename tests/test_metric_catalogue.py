"""The metric catalogue (report/catalogue.py) against what runs really write and what the
report really shows: a metric asked for but never written, or written but neither shown
nor declared archive-only, fails here."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from gpufleet.records import ResultRow
from gpufleet.report import catalogue
from gpufleet.wire import WireError
from helpers import run_cli


def test_catalogue_matches_what_runs_write_and_the_report_shows(fleet, tmp_path):
    profile = fleet.profile(
        "cat", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1},
        flags={"speculative-algorithm": "EAGLE3", "max-running-requests": 16,
               "enable-metrics": True, "speculative-adaptive": True,
               "speculative-eagle-topk": 1},
    )  # fmt: skip
    archive = tmp_path / "a"
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h0").returncode == 0
    for rate in ([], ["--request-rate", "40"]):  # closed loop, then open (queue, rates)
        out = fleet.cli("bench", "--hosts", "h0", "-c", "1,4", "--num-prompts", "8",
                        "--output-len", "16", "--slo", "ttft_ms=5000,tpot_ms=500",
                        "--telemetry-interval", "0.1", "--archive", str(archive), *rate)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
    assert fleet.cli("stop", "--hosts", "h0").returncode == 0
    runs = sorted((archive / "h0").iterdir())
    rows = [json.loads(ln) for r in runs for ln in (r / "results.jsonl").read_text().splitlines()]
    written = {k for row in rows for k, v in row.items() if v is not None}

    # everything the catalogue shows is written by a run (the HTML report once plotted
    # `goodput_output_tps`, which nothing writes)
    missing = [m.key for m in catalogue.CATALOGUE if m.key not in written]
    assert missing == [], f"catalogue metrics no run writes: {missing}"
    # every number a run writes is shown somewhere or declared archive-only
    numeric = {k for row in rows for k, v in row.items() if isinstance(v, int | float)}
    undeclared = sorted(
        k for k in numeric if k not in catalogue.BY_KEY and not catalogue.ARCHIVE_ONLY.match(k)
    )
    assert undeclared == [], f"written but neither in the catalogue nor archive-only: {undeclared}"

    # the PNGs and the page show every catalogue plot, from the same data
    out = run_cli("compare", runs[0].name, runs[1].name, "--archive", str(archive))
    assert out.returncode == 0, out.stdout + out.stderr
    folder = next((archive / "compare").iterdir())
    pngs = {p.name for p in folder.glob("*.png")}
    assert pngs == {f"h0-{spec.name}.png" for spec in catalogue.PLOTS}
    page = (folder / "report.html").read_text()
    shown = set(re.findall(r'aria-label="h0: ([^"]+)"', page))
    assert shown == {spec.title for spec in catalogue.PLOTS}
    # tokens per joule is well under 10: its axis must not read 0, 0, 0, 0
    [energy] = re.findall(r'aria-label="h0: Output tokens per joule".*?</svg>', page, re.S)
    ticks = re.findall(r"<text[^>]*>([^<]+)</text>", energy)
    numbers = [t for t in ticks if re.fullmatch(r"[\d.,]+", t)]
    assert len(set(numbers)) >= 4, numbers


def test_every_catalogue_metric_is_a_declared_result_field():
    """A metric the report reads by name is a field of the row's declared type, so a
    renamed figure fails in a type check and on the host that writes it, not in a plot."""
    declared = {f.name for f in dataclasses.fields(ResultRow)} - {"extra"}
    undeclared = [m.key for m in catalogue.CATALOGUE if m.key not in declared]
    assert undeclared == []
    plotted = {key for spec in catalogue.PLOTS for key in spec.keys}
    assert plotted <= declared


def test_a_results_row_is_checked_and_keeps_other_tools_keys():
    row = {"max_concurrency": 4, "completed": 8, "failed": 0, "output_throughput": 100,
           "bench_serving_only": [1, 2]}  # fmt: skip
    checked = ResultRow.from_wire(row)
    assert checked.output_throughput == 100.0 and checked.get("bench_serving_only") == [1, 2]
    wire = checked.to_wire()
    assert {k: v for k, v in wire.items() if v is not None} == {
        **row,
        "output_throughput": 100.0,
        "repeat": 1,
        "error_messages": [],
        "warmup_errors": [],
    }
    assert {k for k, v in wire.items() if v is None} == ResultRow.BENCH_SERVING  # as it writes
    assert ResultRow.from_wire({**row, "cache_flushed": None}).to_wire()["cache_flushed"] is None
    with pytest.raises(WireError, match=r"row\.completed: 'eight' is not int"):
        ResultRow.from_wire({**row, "completed": "eight"}, "row")


def test_the_page_spells_no_metric_key_of_its_own():
    """Issue 64: `median_ttft_ms` was spelled in report/catalogue.py and again in
    report/html.py (the open-loop table's columns and headings). The page reads every
    column, heading and format from the catalogue (Place.OPEN_LOOP, open_loop_label)."""
    from pathlib import Path

    from gpufleet.report import catalogue, html

    page = Path(html.__file__).read_text()
    assert [m.key for m in catalogue.CATALOGUE if f'"{m.key}"' in page] == []
    assert html.OPEN_LOOP[-1] == "median_ttft_ms"  # measured after the queue: last
    assert html._open_loop_heading("median_ttft_ms") == "TTFT p50 ms (after the queue)"


# where a metric key may be spelled besides the catalogue: the declared result shapes
# (records.py), the writers (the bench runner, the rehearsal engine), the per-request
# definitions they share, and words that are not metric keys (a run's or a Slurm job's
# `failed` state)
SPELLED_BY_WRITERS = ("report/catalogue.py", "records.py", "per_request.py", "host/bench/", "sim/")
NOT_METRIC_WORDS = {("kinds.py", "failed"), ("control/inventory/slurm.py", "failed")}
# issue 64.4: 62 (module, key) spellings outside the catalogue before (fleet/openmetrics.py
# alone spelled 14: its export names now live on the catalogue's metrics, as do
# fleet/estimate.py's spreads), then 29 (the report's own tables); now none: name a key
# through report/catalogue.py (THROUGHPUT, TPOT, QUEUE_WAIT ...)
SPELLINGS_CEILING = 0


def test_metric_keys_are_spelled_in_the_catalogue_and_read_by_name_elsewhere():
    import ast
    from pathlib import Path

    src = Path(catalogue.__file__).resolve().parents[1]
    keys = {m.key for m in catalogue.CATALOGUE}
    found = set()
    for path in sorted(src.rglob("*.py")):
        rel = str(path.relative_to(src))
        if rel.startswith(SPELLED_BY_WRITERS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in keys:
                found.add((rel, node.value))
    found -= NOT_METRIC_WORDS
    exported = {m.key for m in catalogue.exported()}
    assert not {k for rel, k in found if rel.startswith("fleet/")} & exported, found
    assert len(found) <= SPELLINGS_CEILING, sorted(found)
