"""What was not measured never reads as a figure (issue 79): a repeat, a level or an arm
whose every request failed adds no zero to a mean, a ratio or a sentence; an SLO that no
request met is shown as 0% and marked; every clause of the sentence rests on a test; a note
that repeats over repeats and levels is said once; archives written before all this still
read."""

from __future__ import annotations

import json
import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.archive import store
from gpufleet.archive.kept import Manifest
from gpufleet.archive.layout import Archive
from gpufleet.cli.output import repeat_lines
from gpufleet.per_request import RequestTimes
from gpufleet.records import ResultRow
from gpufleet.report import answer, compare, select, tables
from gpufleet.report.compare import Arm
from gpufleet.report.stats import aggregate
from helpers import requests_around, run_cli, unwrap

DIRECTIONAL = re.compile(
    r"\b(faster|slower|gains?|loses?|delivers|higher|lower|at least as|at or above|more|"
    r"fewer|better|worse|tokens per joule)\b"
)


def _row(c: int, repeat: int = 1, ok: bool = True, **figures) -> dict:
    """One results.jsonl line; a failed level's zeros as the runner writes them."""
    measured = {"output_throughput": 400.0, "median_per_request_output_tps": 40.0,
                "median_ttft_ms": 204.0, "median_itl_ms": 20.0}  # fmt: skip
    return {
        "max_concurrency": c, "repeat": repeat, "completed": 8 if ok else 0,
        "failed": 0 if ok else 8, "level_status": "ok" if ok else "failed",
        **({k: 0.0 for k in measured} if not ok else measured), **figures,
    }  # fmt: skip


def _run(root, run_id: str, profile: str, rows: list[dict], requests: bool = False) -> None:
    manifest = {
        "run_id": run_id, "host": "h0", "profile": profile, "status": "done",
        "started_at": "2026-12-01T10:00:00+00:00",
        "plan": {"run_id": run_id, "levels": [], "output_len": 256, "backend": "sglang"},
        "prompt_set": {"prompts_sha256": "abc"},
        "server": {"argv": ["python", "-m", "sglang.launch_server"], "engine_version": "0.5.3"},
        "host_facts": {"gpus": [{"name": "NVIDIA H200", "power_limit_w": 700}], "driver": "580"},
        "levels": [{"concurrency": r["max_concurrency"], "output_throughput": 1.0} for r in rows],
    }  # fmt: skip
    files = {"results.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()}
    if requests:
        for r in rows:
            tag = f"c{r['max_concurrency']}" + (f"-r{r['repeat']}" if r["repeat"] > 1 else "")
            files[f"requests-{tag}.jsonl"] = requests_around(
                r["median_per_request_output_tps"]
            ).encode()
    store.write_run(Archive(root), "h0", run_id, files, Manifest.from_wire(manifest))


# -- 4. nothing measured nothing ---------------------------------------------------------


def test_a_repeat_whose_every_request_failed_is_counted_not_averaged():
    """The issue's repeat line read TTFT 135.8 ms where both measured repeats read 204 ms:
    the failed repeat's 0 was averaged in. Now the mean is over the measured repeats, and
    the line says how many there were."""
    rows = [ResultRow.from_wire(_row(4, k + 1, ok=k != 1)) for k in range(3)]
    [said] = repeat_lines(rows)
    assert said.startswith("C=4, 2 of 3 repeats measured, mean"), said
    assert "TTFT p50 ms 204.0" in said and "135.8" not in said
    level = aggregate(rows)
    assert (level.measured, level.repeats) == (2, 3)
    assert (level.get("completed"), level.get("failed")) == (16, 8)  # every request counted
    every = [ResultRow.from_wire(_row(4, k + 1, ok=False)) for k in range(3)]
    assert repeat_lines(every) == ["C=4, 0 of 3 repeats measured: every request failed, "
                                   "nothing to average"]  # fmt: skip
    assert aggregate(every).get("median_ttft_ms") is None


def test_compare_against_an_arm_that_measured_nothing_says_so_and_nothing_else(tmp_path):
    """The issue's compare printed `0` tok/s and `0.00x` for an arm whose every request
    failed, marked its TTFT ratio better and said it was "slower per request at every
    measured level"; its error said "8 request(s) failed" where 24 of 24 did."""
    root = tmp_path / "logs"
    _run(root, "r1-base", "base", [_row(c) for c in (1, 2, 4)])
    _run(root, "r2-broken", "broken", [_row(c, ok=False) for c in (1, 2, 4)])
    out = run_cli("compare", "base", "broken", "--archive", str(root), "--no-plots", "--wide")
    assert out.returncode == 0, out.stderr
    text = " ".join(unwrap(out.stdout).split())
    table = [ln.split() for ln in out.stdout.splitlines() if re.match(r"^[124]\s", ln)]
    assert len(table) == 3
    for cells in table:  # C, then base's and broken's figures and broken/base's ratios
        assert "0.00x" not in cells and "0.0" not in cells[2:] and "0" not in cells[2:], cells
        assert cells.count("-") >= 6, cells
    assert "nothing to compare: broken measured nothing (every request failed)" in text
    assert not DIRECTIONAL.search(text.split("h0: ", 2)[-1].split("h0: error")[0]), text
    assert "broken: failed: measured nothing at C=1,2,4 (24 of 24 requests failed)" in text
    data = select.report_for_runs(Archive(root), ["base", "broken"])
    assert answer.build("h0", data.per_host["h0"]).ratios == []  # no ratio, no direction


def test_the_run_error_counts_every_failed_request_at_every_level(tmp_path):
    """A server that refuses every request: the run's error line counted the last level's
    failures ("8 request(s) failed"); now every level's, with the first error."""
    archive = tmp_path / "a"
    out = run_cli("bench", "--client", "local", "--url", "http://127.0.0.1:9", "--archive",
                  str(archive), "--concurrency", "1,2,4", "--num-prompts", "4",
                  "--output-len", "8")  # fmt: skip
    assert out.returncode == 1
    assert (
        "FAILED: 12 of 12 requests failed (C=1: 4 of 4, C=2: 4 of 4, C=4: 4 of 4): first at C=1"
        in out.stderr
    ), out.stderr
    assert "request(s)" not in out.stderr


# -- 5. SLO outcomes always shown ----------------------------------------------------------


def test_an_slo_no_request_met_is_shown_as_0_and_marked():
    """`--slo` with 0% attained: the `SLO met` and goodput columns vanished (0.0 read as no
    value) and the level said `ok`."""
    slo = {"slo_attainment": 0.0, "goodput_output_throughput": 0.0}
    results = [ResultRow.from_wire(_row(1, **slo)), ResultRow.from_wire(_row(2, ok=False, **slo))]
    head = tables.headers(results)
    assert {"SLO met", "goodput tok/s"} <= set(head), head
    cells = [dict(zip(head, r, strict=True)) for r in tables.rows(results)]
    assert [c["SLO met"] for c in cells] == ["0.0%", "0.0%"]
    assert [c["goodput tok/s"] for c in cells] == ["0.0", "0.0"]
    assert cells[0]["status"] == "ok, SLO met by none"
    assert cells[1]["TTFT p50 ms"] == "-"  # the failed level's latency is still unmeasured
    assert tables.level_notes(results) == ["C=1,2: no request met the SLO: goodput 0"]
    met = [ResultRow.from_wire(_row(1, slo_attainment=0.5, goodput_output_throughput=9.0))]
    assert dict(zip(tables.headers(met), tables.rows(met)[0], strict=True))["status"] == "ok"
    assert "SLO met" not in tables.headers([ResultRow.from_wire(_row(1))])  # no SLO given
    # compare shows the 0% beside the other arm's and names the level
    none, half = ({c: aggregate([ResultRow.from_wire(_row(c, slo_attainment=share))])
                   for c in (1, 2)} for share in (0.0, 0.5))  # fmt: skip
    arms = [Arm(label, [Manifest(f"r-{label}", "h0", "done")], levels)
            for label, levels in (("met", half), ("missed", none))]  # fmt: skip
    said = answer.build("h0", arms)
    assert "missed: no request met the SLO at C=1,2 (goodput 0)" in [n.text for n in said.notices]
    headers, rows = compare.table(arms)
    assert [dict(zip(headers, r, strict=True))["missed SLO met"] for r in rows] == ["0.0%"] * 2


# -- 6. every clause from a verdict --------------------------------------------------------


def _level_repeats(rng: random.Random, c: int, repeats: int, scale: float) -> list[ResultRow]:
    rows = []
    for k in range(repeats):
        per = round(40.0 * scale * rng.uniform(0.9, 1.1) / c**0.3, 3)
        rows.append(ResultRow.from_wire({
            "max_concurrency": c, "repeat": k + 1, "completed": 11, "failed": 0,
            "level_status": "ok", "output_throughput": per * c * rng.uniform(0.95, 1.05),
            "median_per_request_output_tps": per,
            "output_tokens_per_joule": 2.0 * rng.uniform(0.8, 1.2),
        }))  # fmt: skip
    return rows


def _requests(rows: list[ResultRow]) -> list[list[RequestTimes]]:
    out = []
    for r in rows:
        lines = requests_around(r.get("median_per_request_output_tps")).splitlines()
        out.append([RequestTimes.of(json.loads(ln), False) for ln in lines])
    return out


def _arm(label: str, rows: dict[int, list[ResultRow]]) -> Arm:
    levels = {c: aggregate(found, _requests(found)) for c, found in rows.items()}
    return Arm(label, [Manifest(f"r-{label}", "h0", "done")], levels)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), repeats=st.sampled_from([1, 3, 4]),
       levels=st.sets(st.sampled_from([1, 2, 4, 8, 16, 64]), min_size=1, max_size=4))  # fmt: skip
def test_identical_arms_get_no_directional_word_in_any_sentence(seed, repeats, levels):
    """Census: two arms of the same figures (a profile run twice, archived twice) and two
    arms drawn from the same figures where no ratio is significant: no sentence says one is
    faster, slower, gains, loses, delivers more or gets more tokens per joule. The issue's
    pair (0 of 14 ratios significant) ended "baseline gets 1.11x the tokens per joule"."""
    rng = random.Random(seed)
    rows = {c: _level_repeats(rng, c, repeats, 1.0) for c in sorted(levels)}
    same = answer.build("h0", [_arm("baseline", rows), _arm("twin", rows)])
    assert not DIRECTIONAL.search(" ".join(same.sentences)), same.sentences
    if repeats < 3:
        return
    other = {c: _level_repeats(rng, c, repeats, 1.0) for c in sorted(levels)}
    drawn = answer.build("h0", [_arm("baseline", rows), _arm("twin", other)])
    if not any(r.significant for r in drawn.ratios):
        assert not DIRECTIONAL.search(" ".join(drawn.sentences)), drawn.sentences


def test_the_energy_clause_is_said_only_where_both_tests_find_it():
    """Faster per request on one side, more tokens per joule on the other, both
    significant: said with its interval. The same point estimates with overlapping
    repeats, or without repeats: no clause."""

    def arm(label, per, tpj, spread):
        rows = {8: [ResultRow.from_wire({
            "max_concurrency": 8, "repeat": k + 1, "completed": 11, "failed": 0,
            "output_throughput": per * 8, "median_per_request_output_tps": per,
            "output_tokens_per_joule": tpj * (1 + spread * (k - 1))}) for k in range(3)]}  # fmt: skip
        return _arm(label, rows)

    fast, frugal = arm("eagle3", 60.0, 2.0, 0.01), arm("baseline", 40.0, 2.4, 0.01)
    said = answer.build("h0", [frugal, fast]).sentence
    assert re.search(r"where eagle3 is faster per request, baseline gets 1\.20x "
                     r"\[1\.\d\d-1\.\d\d\] the tokens per joule", said), said  # fmt: skip
    noisy = arm("baseline", 40.0, 2.4, 0.4)  # tok/J overlaps: n.s.
    assert "tokens per joule" not in answer.build("h0", [noisy, fast]).sentence
    one = [Arm(a.label, a.manifests, {8: aggregate([a.levels[8].row])}) for a in (frugal, fast)]
    assert "tokens per joule" not in answer.build("h0", one).sentence


# -- 9. notes said once --------------------------------------------------------------------


def _late(ms: float) -> str:
    return (f"event-loop lag p99 {ms:.1f} ms (bound 2.5 ms): TTFT and ITL may read up to "
            f"{ms:.1f} ms high")  # fmt: skip


def test_a_note_over_repeats_and_levels_is_one_line_naming_its_levels_and_range(tmp_path):
    """A sweep's page opened with six orange bullets, each "client timers late ..." three
    times over; now one line per arm with the levels and the range of the figures."""
    lags = {(1, 1): 3.1, (1, 2): 4.0, (4, 1): 7.2, (4, 2): 5.5, (16, 1): 2.9, (16, 2): 3.3}
    rows = [ResultRow.from_wire(_row(c, k, client_late=_late(ms))) for (c, k), ms in lags.items()]
    assert tables.level_notes(rows, steady=False) == [
        "C=1,4,16: client timers late: event-loop lag p99 2.9-7.2 ms (bound 2.5 ms): TTFT "
        "and ITL may read up to 2.9-7.2 ms high"
    ]
    root = tmp_path / "logs"
    _run(root, "r1-base", "base", [_row(c, k) for c, k in lags])
    _run(root, "r2-late", "late", [r.to_wire() for r in rows])
    data = select.report_for_runs(Archive(root), ["base", "late"])
    found = [n.text for n in answer.build("h0", data.per_host["h0"]).notices]
    assert [n for n in found if "late" in n] == [
        "late: client timers late at C=1,4,16 (event-loop lag p99 2.9-7.2 ms (bound 2.5 ms): "
        "TTFT and ITL may read up to 2.9-7.2 ms high)"
    ], found  # every repeat's figure, one line


# -- 10. archives written before this change ----------------------------------------------


def test_an_archive_from_before_reads_with_its_keys_as_they_were(tmp_path):
    """A run archived before issue 79: no `overload_unjudged`, the send rate under its first
    name `achieved_request_rate`, a failed level's zeros, an SLO of 0 without the newer
    marks. It reads, compares and renders as before, with the new rules applied."""
    old = [
        _row(1, offered_request_rate=8.0, achieved_request_rate=7.9, completed_request_rate=7.8,
             overloaded=False, slo_attainment=0.0, goodput_output_throughput=0.0),
        _row(4, ok=False, offered_request_rate=30.0, achieved_request_rate=12.0,
             overloaded=True),
    ]  # fmt: skip
    root = tmp_path / "logs"
    _run(root, "r1-old", "old", old)
    _run(root, "r2-new", "new", [_row(1), _row(4)])
    [run] = [r for r in store.list_runs(Archive(root)) if r.run_id == "r1-old"]
    results = store.read_results(run.path)
    assert results[0].achieved_request_rate == 7.9 and results[0].get("overload_unjudged") is None
    cells = [dict(zip(tables.headers(results), r, strict=True)) for r in tables.rows(results)]
    assert cells[0]["sent req/s"] == "7.90" and cells[0]["status"] == "ok, SLO met by none"
    assert cells[1]["status"] == "failed, overloaded" and cells[1]["sent req/s"] == "12.00"
    out = run_cli("compare", "old", "new", "--archive", str(root), "--format", "csv")
    assert out.returncode == 0, out.stderr
    head, *lines = out.stdout.splitlines()
    assert "old sent req/s" in head and lines[0].split(",")[head.split(",").index(
        "old sent req/s")] == "7.90"  # fmt: skip
