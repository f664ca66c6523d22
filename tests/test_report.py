"""The HTML report, opened from disk in real headless Chromium; the 100-column terminal table."""

from __future__ import annotations

import json
import shutil

import pytest

from browser import CHROMIUM, visit
from gpufleet.archive import store
from gpufleet.archive.layout import Archive
from helpers import run_cli
from test_compare import SEEDS, _run

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium not installed")


def _sweep_archive(root):
    """Two hosts, baseline vs eagle3 (the seeds' numbers), and a sweep whose third cell
    failed with a server log to show."""
    runs = {}
    for host in ("h0", "h1"):
        for profile, levels in SEEDS.items():
            run_id = f"20261129T10000{len(runs)}Z-{profile}-{host}"
            _run(root, host, run_id, profile, levels)
            runs.setdefault(profile, {})[host] = run_id
    failed_id = "20261129T100009Z-crashy-h0"
    _run(root, "h0", failed_id, "crashy", {1: (50, 50)}, status="failed")
    state = {
        "sweep_id": "20261129T100000Z-baseline-vs-eagle3",
        "profiles": ["baseline", "eagle3", "crashy"],
        "hosts": ["h0", "h1"],
        "concurrency": [1, 10, 64],
        "status": "incomplete",
        "cells": {
            **{
                p: {h: {"status": "done", "run_id": r} for h, r in hs.items()}
                for p, hs in runs.items()
            },
            "crashy": {
                "h0": {"status": "failed", "run_id": failed_id, "error": "run failed: crashed"},
                "h1": {"status": "failed", "error": "preflight refused the launch: flag --bogus"},
            },
        },
    }
    (root / "sweeps").mkdir(parents=True)
    (root / "sweeps" / f"{state['sweep_id']}.json").write_text(json.dumps(state))
    return state


@needs_chromium
def test_sweep_report_in_chromium_offline_complete_and_readable(tmp_path):
    root = tmp_path / "logs"
    state = _sweep_archive(root)
    out = run_cli("report", "--sweep", state["sweep_id"], "--archive", str(root))
    assert out.returncode == 0, out.stderr
    page = root / "compare" / state["sweep_id"] / "report.html"
    assert out.stdout.strip() == f"report: {page}"

    seen = visit(page, 1300, 900)
    assert seen.errors == []
    assert all(u.startswith(("file:", "data:")) for u in seen.requests), seen.requests
    facts = seen.facts
    text = facts["text"]
    # the answer per host, in one sentence each
    assert text.count("eagle3 is faster per request up to C~") == 2
    # the verdict table: every number of the archive, ratios highlighted
    assert len(facts["tables"]) >= 2
    for table in facts["tables"][:2]:  # one verdict table per host
        for profile, levels in SEEDS.items():
            for c, (total, per) in levels.items():
                assert f"{total:.1f}" in table and f"{per:.1f}" in table
                assert f"{profile} at C={c}: {total:,.2f} tok/s" in facts["points"]
    assert "0.45x" in text  # eagle3/baseline total throughput at C=64 (350/780)
    # plots: throughput, per-request speed, TTFT, ITL for each host
    assert len(facts["plots"]) == 8 and "h1: Total output throughput" in facts["plots"]
    # failures with their error and log tail; provenance and raw-file links
    assert "run failed: crashed" in text and "preflight refused the launch" in text
    assert "Provenance and raw files" in text
    links = facts["links"]
    assert "../../h0/20261129T100000Z-baseline-h0/results.jsonl" in links
    assert all((page.parent / link).resolve().exists() for link in links)
    assert facts["data"]["h0"]["baseline"]["64"]["output_throughput"] == 780
    # not blank at 1280x800, and no sideways scrolling on a phone
    import io

    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(seen.screenshot), format="png")
    assert pixels.shape[:2] == (900, 1300) and pixels.std() > 0.05
    assert seen.phone_width <= 400
    # issue 35: every text a reader sees is at least 11 px, on a desk and on a phone (the
    # hand-drawn plots' ticks were about 7 px at 1300 and 5 px at 390)
    smallest = {width: sizes[0] for width, sizes in seen.text_px.items()}
    assert smallest[1300][0] >= 11 and smallest[390][0] >= 11, smallest
    phone = matplotlib.image.imread(io.BytesIO(seen.phone_screenshot), format="png")
    assert phone.shape[1] == 390 and phone.std() > 0.05
    # issue 67: numbers never break inside a cell; the hint is shown exactly where a table
    # scrolls (the verdict table does on a phone, not on a desk)
    for width, fit in seen.fit.items():
        assert fit["broken"] == [], (width, fit["broken"][:5])
        assert fit["scrolls"] and all(s["hint"] == s["wider"] for s in fit["scrolls"]), (
            width,
            fit["scrolls"],
        )
    assert any(s["wider"] for s in seen.fit[390]["scrolls"])
    assert not any(s["wider"] for s in seen.fit[1300]["scrolls"])
    from test_reliability import record

    record("report_text_px", {str(w): {"px": s[0], "text": s[1]} for w, s in smallest.items()})


@needs_chromium
def test_report_survives_copying_the_archive_folder(tmp_path):
    root = tmp_path / "logs"
    state = _sweep_archive(root)
    run_cli("report", "--latest", "--archive", str(root))
    copy = tmp_path / "elsewhere" / "logs"
    shutil.copytree(root, copy)
    shutil.rmtree(root)
    page = copy / "compare" / state["sweep_id"] / "report.html"
    seen = visit(page)
    assert seen.errors == [] and seen.facts["links"]
    assert all((page.parent / link).resolve().exists() for link in seen.facts["links"])


def test_compare_table_fits_100_columns_unless_wide(tmp_path):
    root = tmp_path / "logs"
    _sweep_archive(root)
    out = run_cli("compare", "baseline", "eagle3", "--archive", str(root), "--no-plots")
    assert out.returncode == 0, out.stderr
    table = [line for line in out.stdout.splitlines() if line[:1].isdigit() or "tok/s" in line]
    assert table and max(len(line) for line in table) <= 100
    assert "h0: A=baseline vs B=eagle3" in out.stdout
    assert "report: " in out.stdout
    wide = run_cli("compare", "baseline", "eagle3", "--archive", str(root), "--wide", "--no-plots")
    assert (
        "TTFT p99 ms" in wide.stdout and max(len(line) for line in wide.stdout.splitlines()) > 100
    )


def test_report_bad_input_is_one_line(tmp_path):
    out = run_cli("report", "--archive", str(tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    out = run_cli("report", "--sweep", "nope", "--archive", str(tmp_path))
    assert out.returncode == 2 and "no sweep of that id" in out.stderr
    assert "Traceback" not in out.stderr
    assert store.list_runs(Archive(tmp_path)) == []


LONG = "eagle3-adaptive-rehearsal-baseline-speculative-num-steps-3-cuda-graph-max-bs-160"


@needs_chromium
def test_the_page_fits_its_figures_at_a_desk_and_on_a_phone(tmp_path):
    """Issue 52: legends and a title were cut off (`hearsal-baseline TTFT p50 ms`), the
    terminal printed matplotlib's "Tight layout not applied", an error box with a
    64-character hash made a 390 px page 675 px wide, and the warnings sat after all six
    plots. Measured in Chromium at 1300 and 390 px: the page no wider than the viewport,
    every legend and title inside its figure, the warnings and errors above the plots."""
    root = tmp_path / "logs"
    levels = {1: (60.0, 60.0), 8: (380.0, 38.0), 64: (780.0, 12.0)}
    _run(root, "h0", "20261203T100000Z-a", "baseline", levels, prompts="a" * 64)
    _run(root, "h0", "20261203T100001Z-b", LONG, {c: (t * 1.1, p * 1.1) for c, (t, p) in
                                                levels.items()}, prompts="b" * 64,
         overloaded=True, offered_request_rate=12.0, achieved_request_rate=3.0)  # fmt: skip
    _run(root, "h0", "20261203T100002Z-c", LONG + "-and-a-third-arm", levels, prompts="a" * 64)
    out = run_cli("compare", "baseline", LONG, "--more", LONG + "-and-a-third-arm",
                  "--archive", str(root))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Tight layout not applied" not in out.stdout + out.stderr
    [page] = (root / "compare").glob("*/report.html")
    seen = visit(page, 1300, 900)
    assert seen.errors == []
    for width, fit in seen.fit.items():
        assert fit["page"] <= fit["viewport"], (width, fit)
        assert fit["parts"] >= 4 and fit["clipped"] == [], (width, fit)
        assert fit["warning"] is not None and fit["warning"] < fit["plot"], (width, fit)
    from test_reliability import record

    record("report_fit", {str(w): {"page": f["page"], "viewport": f["viewport"],
                                   "warning_px": f["warning"], "plot_px": f["plot"]}
                          for w, f in seen.fit.items()})  # fmt: skip


def test_a_level_that_completed_nothing_prints_dashes_not_zeros():
    """Issue 67: a failed level printed 0.0 for TTFT and tok/s, figures never measured.
    Its counts and status stay; every measured figure reads "-"."""
    from gpufleet.report import tables
    from helpers import row

    failed = row(max_concurrency=8, completed=0, failed=8, output_throughput=0.0,
                 median_ttft_ms=0.0, level_status="failed")  # fmt: skip
    ok = row(max_concurrency=1, completed=4, failed=0, output_throughput=52.5,
             median_ttft_ms=0.0, level_status="ok")  # fmt: skip
    heads = tables.headers([failed, ok])
    cells = dict(zip(heads, tables.rows([failed])[0], strict=True))
    assert cells["output tok/s"] == "-" and cells["TTFT p50 ms"] == "-"
    assert cells["completed"] == "0" and cells["failed"] == "8" and cells["status"] == "failed"
    kept = dict(zip(heads, tables.rows([ok])[0], strict=True))
    assert kept["output tok/s"] == "52.5" and kept["TTFT p50 ms"] == "0.0"  # measured: shown


@needs_chromium
def test_no_number_or_word_breaks_in_any_cell_headers_included(tmp_path):
    """Issue 79: data cells were fixed, but header cells broke at 1300 px too: arm labels
    with dates split as `06:1`/`4`, `baseline` as `basel`/`ine`, ratio headers one letter
    per line. Three runs of one profile compared by run id (labels with their start
    times), measured in Chromium at 1300 and 390 px: no cell of any table, header or data,
    runs over two lines; where the table is too wide it scrolls, and says so."""
    root = tmp_path / "logs"
    levels = {1: (60.0, 60.0), 8: (380.0, 38.0), 64: (780.0, 12.0)}
    ids = [f"20261203T0614{i}0Z-baseline" for i in range(3)]
    for i, run_id in enumerate(ids):
        _run(root, "h0", run_id, "baseline", {c: (t * (1 + i / 10), p) for c, (t, p) in
                                              levels.items()}, overloaded=i == 1,
             offered_request_rate=12.0, achieved_request_rate=3.0,
             started=f"2026-12-03T06:1{4 + i}:00+00:00",
             client_late=f"event-loop lag p99 {3 + i}.{i} ms (bound 2.5 ms): TTFT and ITL "
                         f"may read up to {3 + i}.{i} ms high")  # fmt: skip
    out = run_cli("compare", ids[0], ids[1], "--more", ids[2], "--archive", str(root))
    assert out.returncode == 0, out.stderr
    [page] = (root / "compare").glob("*/report.html")
    assert "baseline 12-03 06:14" in page.read_text()  # the labels carry the start time
    seen = visit(page, 1300, 900)
    assert seen.errors == []
    for width, fit in seen.fit.items():
        assert fit["broken"] == [], (width, fit["broken"][:8])
        assert fit["page"] <= fit["viewport"], (width, fit)
        assert all(s["hint"] == s["wider"] for s in fit["scrolls"]), (width, fit["scrolls"])
    assert any(s["wider"] for s in seen.fit[390]["scrolls"])
    # issue 79, bullet 9: a late client at every level of every arm is one line per arm
    # (it was one per level), so the verdict table stays on the first screen at a desk
    desk = seen.fit[1300]
    assert desk["warnings"] == 4 and desk["table"] < 900, desk  # 3 late clients, 1 overload
    from test_reliability import record

    record("report_cells_unbroken", {str(w): {"broken": len(f["broken"]), "scrolls": [
        s["wider"] for s in f["scrolls"]], "warnings": f["warnings"], "table_px": f["table"]}
        for w, f in seen.fit.items()})  # fmt: skip
