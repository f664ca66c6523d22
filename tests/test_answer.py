"""One answer, rendered everywhere (issue 35): compare builds one structured answer and the
terminal, summary.md and report.html render it, so they carry the same facts; the sentence
claims only what is significant, gives the crossover with its interval and names what puts
it in doubt. The plots are matplotlib's, one renderer for the PNGs and the page."""

from __future__ import annotations

import html
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.archive import store as archive
from gpufleet.archive.kept import Manifest
from gpufleet.archive.layout import Archive
from gpufleet.report import answer, catalogue, figures, select
from helpers import level, requests_around, run_cli, unwrap

# Three repeats per level. At C=64 the two arms' total throughputs overlap (no significant
# difference); per-request speed crosses between C=1 and C=8.
REPEATS = {
    "baseline": {1: [(60, 60), (61, 61), (59, 59)], 8: [(380, 38), (385, 39), (375, 37)],
                 64: [(700, 12), (800, 12.5), (760, 11.5)]},
    "eagle3": {1: [(80, 80), (82, 81), (78, 79)], 8: [(300, 30), (310, 31), (290, 29)],
               64: [(650, 5.5), (820, 5.0), (720, 6.0)]},
}  # fmt: skip


def _repeated_run(root, host, run_id, profile, levels, power=(700, 700), extra=None, rate=None):
    extra = extra or {}
    rows = [
        {"max_concurrency": c, "repeat": k + 1, "request_rate": float("inf"),
         "output_throughput": tot, "median_per_request_output_tps": per,
         "median_ttft_ms": 40.0 * c + k, "p99_ttft_ms": 90.0 * c + k, "median_itl_ms": 1000 / per,
         "completed": 10, "failed": 0, "level_status": "ok", **extra.get(c, {})}
        for c, reps in levels.items() for k, (tot, per) in enumerate(reps)
    ]  # fmt: skip
    manifest = {
        "run_id": run_id, "host": host, "profile": profile, "status": "done",
        "started_at": "2026-11-30T14:02:00+00:00",
        "plan": {"run_id": run_id, "levels": [], "output_len": 256, "backend": "sglang",
                 "request_rate": rate},
        "prompt_set": {"prompts_sha256": "abc"},
        "server": {"argv": ["python", "-m", "sglang.launch_server"], "engine_version": "0.5.3"},
        "host_facts": {"gpus": [{"name": "NVIDIA H200", "power_limit_w": w} for w in power],
                       "driver": "580"},
        "levels": [{"concurrency": c, "output_throughput": v[0][0]} for c, v in levels.items()],
    }  # fmt: skip
    files = {"results.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()}
    for r in rows:
        tag = f"c{r['max_concurrency']}" + (f"-r{r['repeat']}" if r["repeat"] > 1 else "")
        files[f"requests-{tag}.jsonl"] = requests_around(
            r["median_per_request_output_tps"]
        ).encode()
    archive.write_run(Archive(root), host, run_id, files, Manifest.from_wire(manifest))


def _page_text(page: str) -> str:
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


@pytest.fixture
def doubtful(tmp_path):
    """baseline vs eagle3 with repeats; eagle3 ran with one GPU's power limit lowered and
    was overloaded at C=8 (an open-loop level that fell behind its arrivals)."""
    root = tmp_path / "logs"
    _repeated_run(root, "h0", "r1-baseline", "baseline", REPEATS["baseline"])
    overloaded = {8: {"overloaded": True, "offered_request_rate": 12.0,
                      "achieved_request_rate": 3.0, "median_queue_wait_ms": 4100.0,
                      "p99_queue_wait_ms": 8200.0}}  # fmt: skip
    _repeated_run(root, "h0", "r2-eagle3", "eagle3", REPEATS["eagle3"], power=(700, 500),
                  extra=overloaded)  # fmt: skip
    return root


def test_terminal_summary_and_page_carry_the_same_facts(doubtful):
    out = run_cli("compare", "baseline", "eagle3", "--archive", str(doubtful))
    assert out.returncode == 0, out.stderr
    folder = doubtful / "compare" / "baseline-vs-eagle3"
    renderings = {
        "terminal": " ".join(unwrap(out.stdout).split()),
        "summary.md": " ".join((folder / "summary.md").read_text().split()),
        "report.html": _page_text((folder / "report.html").read_text()),
    }
    data = select.report_for_runs(Archive(doubtful), ["baseline", "eagle3"])
    said = answer.build("h0", data.per_host["h0"])
    facts = said.facts()
    assert len(facts) >= 12  # 5 claims, 2 notices, 6 headline ratios
    for name, text in renderings.items():
        missing = [fact for fact in facts if " ".join(fact.split()) not in text]
        assert missing == [], (name, missing)
    # JSON carries the same object
    as_json = json.loads(run_cli("compare", "baseline", "eagle3", "--archive", str(doubtful),
                                 "--format", "json", "--no-plots").stdout)  # fmt: skip
    assert as_json["h0"]["sentence"] == said.sentence


def test_the_sentence_claims_only_what_is_significant_and_names_its_doubts(doubtful):
    data = select.report_for_runs(Archive(doubtful), ["baseline", "eagle3"])
    said = answer.build("h0", data.per_host["h0"])
    sentence = said.sentence
    # at C=64 the interval of the ratio includes 1.0: no winner is claimed
    assert "no significant difference in total throughput at C=64 (eagle3/baseline 0." in sentence
    assert "n.s.)" in sentence and "delivers" not in sentence
    # the crossover comes with its interval (C~lo-hi) from the repeats
    assert re.search(r"eagle3 is faster per request up to C~\d+-\d+", sentence), sentence
    # what puts the answer in doubt is in the sentence itself
    assert "unequal GPUs (power limits (W))" in sentence
    assert "eagle3 at C=8 could not keep up with the offered rate (overloaded)" in sentence
    assert [n.topic for n in said.errors] == ["gpu"]
    assert any("overloaded at C=8: sent 3.00 of 12.00 req/s" in n.text for n in said.warnings)
    ns = [r for r in said.ratios if r.level == 64 and r.key == "output_throughput"]
    assert ns[0].significant is False and ns[0].text.endswith(" n.s.")


def test_errors_stand_beside_the_answer_above_the_plots(doubtful):
    assert run_cli("compare", "baseline", "eagle3", "--archive", str(doubtful)).returncode == 0
    page = (doubtful / "compare" / "baseline-vs-eagle3" / "report.html").read_text()
    error = page.index("power limits (W) differs")
    assert page.index("The answer") < error < page.index("<svg")
    assert 'class="errors"' in page[page.index("The answer") : page.index("<svg")]
    # the open-loop level: offered against achieved, its queue, marked overloaded
    text = _page_text(page)
    assert "Open loop: offered, sent and completed" in text
    assert "8 eagle3 12.00 3.00 - - 4100 8200" in text and "overloaded" in text
    # a ratio that is not significant is not coloured as a win or a loss
    cell = re.search(r'<td class="num ratio ([a-z]*)">0\.9\dx \[[^<]*n\.s\.</td>', page)
    assert cell is not None and cell.group(1) == ""


def test_terminal_prose_wraps_to_100_columns_when_not_a_terminal(doubtful):
    out = run_cli("compare", "baseline", "eagle3", "--archive", str(doubtful), "--no-plots")
    prose = [ln for ln in out.stdout.splitlines() if not ln[:1].isdigit() and "  " not in ln[:3]]
    assert max(len(ln) for ln in out.stdout.splitlines() if ln.startswith(("h0:", "    "))) <= 100
    assert any(ln.startswith("    ") for ln in out.stdout.splitlines())  # it did wrap
    assert prose


def test_compare_by_run_id_labels_arms_by_profile_and_start_time(doubtful):
    out = run_cli("compare", "r1-baseline", "r2-eagle3", "--archive", str(doubtful),
                  "--format", "csv", "--no-plots")  # fmt: skip
    assert out.stdout.splitlines()[0].startswith("host,C,baseline 11-30 14:02 total tok/s")
    _repeated_run(doubtful, "h0", "r3-baseline", "baseline", REPEATS["baseline"])
    out = run_cli("compare", "r1-baseline", "r3-baseline", "--archive", str(doubtful),
                  "--format", "csv", "--no-plots")  # fmt: skip
    header = out.stdout.splitlines()[0].split(",")
    # two runs of one profile in one minute keep apart by their ids
    assert header[2:4] == ["r1-baseline total tok/s", "r3-baseline total tok/s"]


# -- the plots: one renderer, readable -----------------------------------------------------


def _arm(label, levels):
    from gpufleet.report.compare import Arm

    return Arm(label, [], levels)


def test_the_per_request_crossover_says_its_basis_where_decode_speed_crosses_elsewhere():
    """Issue 38: per-request speed is tokens over the whole request (TTFT included); by
    decode speed (TPOT) a 40% draft on llama.cpp stayed faster to C=8, end to end only to
    C~3, and the sentence did not say which. Both are said where they differ, neither
    where they agree."""

    def arm(label, per_request, tpot):
        rows = {c: level(c, median_per_request_output_tps=p, median_tpot_ms=t)
                for c, p, t in zip((1, 4, 16), per_request, tpot, strict=True)}  # fmt: skip
        return _arm(label, rows)

    base = arm("target", [50, 45, 30], [20.0, 22.0, 30.0])
    differ = arm("draft", [60, 40, 20], [15.0, 18.0, 35.0])  # e2e falls by 4, decode by 16
    [claim] = answer.claims(base, differ, [1, 4, 16], [])[:1]
    assert claim.text.startswith("draft is faster per request up to C~")
    assert (
        "end to end, TTFT included; by decode speed alone (1000/TPOT) draft is faster "
        "up to C~" in claim.text
    )
    agree = arm("draft", [60, 40, 20], [15.0, 24.0, 40.0])  # both fall between 1 and 4
    [claim] = answer.claims(base, agree, [1, 4, 16], [])[:1]
    assert "decode speed" not in claim.text
    no_tpot = _arm("draft", {c: level(c, median_per_request_output_tps=p)
                             for c, p in zip((1, 4, 16), (60, 40, 20), strict=True)})  # fmt: skip
    assert "decode speed" not in answer.claims(base, no_tpot, [1, 4, 16], [])[0].text


def test_a_prefix_cache_that_could_not_be_emptied_is_said_and_only_then():
    """Issue 38: llama-server has no /flush_cache; every level recorded cache_flushed false,
    its prompt cache served 54-98% after the first level and TTFT at C=1 fell from 157 to
    40 ms between rounds, and nothing warned."""
    from gpufleet.report.compare import Arm, notices

    def arm(label, flushed, hit):
        rows = {c: level(c, output_throughput=100.0, cache_flushed=flushed, cache_hit_rate=h)
                for c, h in zip((1, 4), hit, strict=True)}  # fmt: skip
        return Arm(label, [Manifest(f"r-{label}", "h", "done")], rows)

    said = [n.text for n in notices([arm("target", True, (0, 0)),
                                     arm("llama", False, (0.0, 0.54))], [1, 4])]  # fmt: skip
    [text] = [t for t in said if "prefix cache" in t]
    assert text.startswith("llama: the prefix cache could not be emptied before C=1,4")
    assert "served C=4 54% of prompt tokens" in text
    for flushed in (True, None):  # emptied, or not asked (--no-flush): nothing to say
        quiet = notices([arm("a", flushed, (0.5, 0.5)), arm("b", flushed, (0.5, 0.5))], [1, 4])
        assert not [n for n in quiet if "prefix cache" in n.text]
    # not emptied, but each level's prompts began with its own tag: no earlier level's
    # prompts can have served these (the real llama-server: 100% served became 12-13%)
    salted = arm("llama", False, (0.12, 0.13))
    for measured in salted.levels.values():
        measured.row.prompts_salted = True
    assert not [n for n in notices([arm("target", True, (0, 0)), salted], [1, 4])
                if "prefix cache" in n.text]  # fmt: skip


def test_an_itl_that_reads_the_streams_framing_is_said_and_only_then():
    """Issue 38: llama.cpp's server streams each accepted draft token as its own chunk, so
    the draft arm's ITL median read 0.0-0.2 ms against 34-53 ms for the target (TPOT was
    right). Said where ITL is under a quarter of TPOT; silent where they agree."""
    from gpufleet.report.compare import Arm, notices

    def arm(label, itl, tpot):
        rows = {c: level(c, output_throughput=100.0, median_itl_ms=i, median_tpot_ms=t)
                for c, i, t in zip((1, 4), itl, tpot, strict=True)}  # fmt: skip
        return Arm(label, [Manifest(f"r-{label}", "h", "done")], rows)

    said = notices([arm("target", (34.0, 53.0), (35.0, 54.0)),
                    arm("draft", (0.1, 0.2), (20.0, 30.0))], [1, 4])  # fmt: skip
    [text] = [n.text for n in said if "ITL p50" in n.text]
    assert text.startswith("draft: ITL p50 is a small part of TPOT p50 (C=1 0.1 vs 20.0 ms")
    quiet = notices([arm("a", (20.0, 30.0), (21.0, 31.0)), arm("b", (8.0, 9.0), (10.0, 11.0))],
                    [1, 4])  # fmt: skip
    assert not [n for n in quiet if "ITL p50" in n.text]


def test_a_profile_keeps_its_colour_whatever_the_argument_order():
    a, b = _arm("baseline", {}), _arm("eagle3", {})
    assert figures.colours([a, b]) == list(reversed(figures.colours([b, a])))
    assert figures.colours([_arm("eagle3 11-30 14:02", {})])[0] == figures.colour_of("eagle3")
    assert len(set(figures.colours([_arm(f"p{i}", {}) for i in range(8)]))) == 8


def test_each_figure_is_drawn_once_for_its_png_and_the_pages_svg(tmp_path, monkeypatch):
    """`inv sweep` and `inv compare` write both: drawing is most of a report's time, and it
    was done twice (the PNGs, then report.html's SVGs)."""
    import dataclasses

    from gpufleet.report import html as report_html
    from gpufleet.report.compare import Arm
    from gpufleet.report.html import ReportInput

    rows = {c: level(c, median_ttft_ms=40.0 * c, p99_ttft_ms=90.0 * c) for c in (1, 2, 3)}
    data = ReportInput("t", {"h": [Arm("baseline", [Manifest("r1", "h", "done")], rows)]})
    drawn = []

    def counted(*args):
        figure = real(*args)
        if figure is not None:  # a plot without data is skipped, not drawn
            drawn.append(args[2].name)
        return figure

    real = figures.draw
    monkeypatch.setattr(figures, "draw", counted)
    svgs, written = figures.write_all(data.per_host, tmp_path)
    assert len(written) == len(svgs["h"]) == len(drawn) >= 2
    monkeypatch.setattr(report_html, "_provenance", lambda data, out_dir: "")  # runs without files
    page = report_html.render(dataclasses.replace(data, plots=svgs), tmp_path)
    assert len(drawn) == len(written), "report.html drew the figures again"
    assert page.count('<svg class="plot"') == len(written)
    assert report_html.render(data, tmp_path).count('<svg class="plot"') == len(written)  # alone


def test_plot_marks_ticks_error_bars_and_slo():
    rows = {c: level(c, median_ttft_ms=40.0 * c, p99_ttft_ms=90.0 * c,
                     goodput_output_throughput=92.3 * c, slo={"ttft_ms": 500.0, "tpot_ms": 50.0},
                     ci={"goodput_output_throughput": (-30.0, 92.3 * c + 40)})
            for c in (1, 2, 3)}  # fmt: skip
    arms = [_arm("baseline", rows)]
    spec = {s.name: s for s in catalogue.PLOTS}
    fig, points = figures.draw("h", arms, spec["ttft"])
    [ax] = fig.axes
    handles, labels = ax.get_legend_handles_labels()
    assert labels == ["baseline TTFT p50 ms", "baseline TTFT p99 ms"]
    assert (handles[0].get_linestyle(), handles[0].get_marker()) != (
        handles[1].get_linestyle(), handles[1].get_marker())  # fmt: skip
    assert len(points) == 6 and points[0] == "baseline TTFT p50 ms at C=1: 40.00 ms"
    fig, _ = figures.draw("h", arms, spec["goodput"])
    [ax] = fig.axes
    assert "SLO: TTFT <= 500 ms, TPOT <= 50 ms" in ax.get_title()
    ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** int(f"{step:e}".split("e")[1])
    assert mantissa in (1, 2, 2.5, 5), ticks  # round steps, never 92.3, 185, 277
    bars = [seg for coll in ax.collections for seg in coll.get_segments()]
    assert bars and min(y for seg in bars for _, y in seg) >= 0  # clipped at zero
    assert ax.get_ylim()[0] == 0


FIGURE_AND_INTERVAL = re.compile(r"(\d+(?:\.(\d+))?)x? \[(\d+(?:\.(\d+))?)-(\d+(?:\.(\d+))?)\]")


def _figures_inside_their_intervals(text: str) -> list[str]:
    """Every `figure [low-high]` printed: one precision for the three, the figure inside."""
    wrong = []
    found = FIGURE_AND_INTERVAL.findall(text)
    for value, places, low, low_places, high, high_places in found:
        same = len(places) == len(low_places) == len(high_places)
        if not same or not float(low) <= float(value) <= float(high):
            wrong.append(f"{value} [{low}-{high}]")
    return wrong if found else ["no figure with an interval printed"]


@pytest.mark.parametrize("gain", [1.02, 1.37, 1.9, 3.3])
def test_a_figure_and_its_interval_share_one_precision_in_every_rendering(tmp_path, gain):
    """Issue 52: `delivers 1.4x the total throughput [1.36-1.37]` printed the figure to one
    decimal and its interval to two, so the figure read as outside its own interval."""
    root = tmp_path / "logs"
    base = {1: [(100, 50), (101, 50.5), (99, 49.5)], 64: [(700, 10), (705, 10.1), (695, 9.9)]}
    other = {c: [(t * gain, p * gain) for t, p in reps] for c, reps in base.items()}
    _repeated_run(root, "h0", "r1-a", "a", base)
    _repeated_run(root, "h0", "r2-b", "b", other)
    data = select.report_for_runs(Archive(root), ["a", "b"])
    said = answer.build("h0", data.per_host["h0"])
    page = _page_text(select.write_report(data, tmp_path / "out").read_text())
    summary = select.write_summary(data, tmp_path / "out").read_text()
    for name, text in {"sentence": said.sentence, "summary.md": summary, "page": page}.items():
        assert _figures_inside_their_intervals(text) == [], (name, text[:600])


def _arms(root, kind: str, noise: float, seed: int) -> None:
    """Two arms of three repeats at C=1, 8, 64: identical, slightly different (inside the
    noise), clearly different, or crossing (B faster at C=1, slower at C=64)."""
    import random

    rng = random.Random(seed)
    factor = {"identical": [1.0, 1.0, 1.0], "slightly": [1.003, 0.998, 1.002],
              "clearly": [1.5, 1.5, 1.5], "crossing": [1.6, 1.0, 0.55]}[kind]  # fmt: skip
    base = {1: (100.0, 50.0), 8: (400.0, 40.0), 64: (800.0, 12.0)}

    def reps(scale: list[float]) -> dict[int, list[tuple[float, float]]]:
        out = {}
        for (c, (tot, per)), f in zip(base.items(), scale, strict=True):
            out[c] = [(tot * f * (1 + rng.uniform(-noise, noise)),
                       per * f * (1 + rng.uniform(-noise, noise))) for _ in range(3)]  # fmt: skip
        return out

    _repeated_run(root, "h0", "r1-a", "a", reps([1.0, 1.0, 1.0]))
    _repeated_run(root, "h0", "r2-b", "b", reps(factor))


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["identical", "slightly", "clearly", "crossing"]),
       noise=st.sampled_from([0.0, 0.01, 0.05]), seed=st.integers(0, 10_000))  # fmt: skip
def test_no_sentence_claims_a_direction_its_verdicts_do_not(tmp_path_factory, kind, noise, seed):
    """Issue 52: two identical arms (every ratio `1.00x [1.00-1.00] n.s.`) read `[b] is
    slower per request below C~1 and faster from there ... slower at every measured level`:
    the words came from the sign of the means. Now each level's verdict comes from the test
    that draws its interval, and every direction word from a verdict."""
    from gpufleet.report.verdicts import Verdict, verdicts

    root = tmp_path_factory.mktemp("arms") / "logs"
    _arms(root, kind, noise, seed)
    arms = select.report_for_runs(Archive(root), ["a", "b"]).per_host["h0"]
    said = answer.build("h0", arms)
    levels = said.levels
    per = set(verdicts(arms[0], arms[1], levels, answer.PER_REQUEST))
    total = set(verdicts(arms[0], arms[1], levels, answer.TOTAL))
    per_request, throughput, top = (c.text for c in said.claims[:3])
    if Verdict.BETTER not in per:
        assert "faster" not in per_request.split(" (")[0], per_request
    if Verdict.WORSE not in per:
        assert "slower" not in per_request.split(" (")[0], per_request
    if Verdict.BETTER not in total:
        assert not re.search(r"gains|higher|at or above", throughput), throughput
    if Verdict.WORSE not in total:
        assert not re.search(r"loses|lower", throughput), throughput
    if per == {Verdict.SAME}:
        assert per_request.startswith("no difference measured in per-request speed")
    top_verdict = verdicts(arms[0], arms[1], levels[-1:], answer.TOTAL)[0]
    assert ("delivers" in top) == (top_verdict in (Verdict.BETTER, Verdict.WORSE)), top
    if kind == "identical" and noise == 0.0:  # with noise, a level may differ by chance (5%)
        assert not re.search(r"faster|slower|gains|loses|delivers", said.sentence), said.sentence


def test_runs_at_different_offered_loads_are_named_like_different_prompt_sets(tmp_path):
    """Issue 52: two open-loop runs at 0.8/s and 10/s compared with only "prompt set
    differs" said; the offered load is part of the workload, and a difference is an error."""
    root = tmp_path / "logs"
    _repeated_run(root, "h0", "r1-a", "a", REPEATS["baseline"], rate=0.8)
    _repeated_run(root, "h0", "r2-b", "b", REPEATS["eagle3"], rate=10.0)
    said = answer.build("h0", select.report_for_runs(Archive(root), ["a", "b"]).per_host["h0"])
    [error] = [n.text for n in said.errors if "offered load" in n.text]
    assert error == "offered load (--request-rate) differs: a 0.8 vs b 10.0"
    same = tmp_path / "same"
    _repeated_run(same, "h0", "r1-a", "a", REPEATS["baseline"], rate=4.0)
    _repeated_run(same, "h0", "r2-b", "b", REPEATS["eagle3"], rate=4.0)
    said = answer.build("h0", select.report_for_runs(Archive(same), ["a", "b"]).per_host["h0"])
    assert not [n for n in said.notices if "offered load" in n.text]
