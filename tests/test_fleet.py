"""inv fleet and inv history on archives with known figures: who is named, who is not,
what differs, what changed, and the index they read (built, kept up to date, rebuilt)."""

from __future__ import annotations

import json
import random
import sqlite3

import pytest

from fleetdata import fleet_archive, level_row, tree_state, write_run
from gpufleet.archive.layout import Archive
from gpufleet.fleet import history, outliers, wording
from gpufleet.fleet.index import SCHEMA, IndexedRun, open_index
from helpers import run_cli, unwrap


def _view(root, profile="baseline", **kw):
    with open_index(Archive(root)) as index:
        return outliers.fleet_view(index, profile, **kw)


def test_identical_hosts_produce_no_name(tmp_path):
    fleet_archive(tmp_path, 8, noise=0.01)
    view = _view(tmp_path)
    assert [lv.concurrency for lv in view.levels] == [1, 10, 64]
    assert view.named == []
    assert all(len(lv.hosts) == 8 for lv in view.levels)


def test_a_slow_host_is_named_with_what_differs(tmp_path):
    fleet_archive(tmp_path, 8, slow={"gpu05": 0.85})
    view = _view(tmp_path)
    assert [n.host for n in view.named] == ["gpu05"]
    named = view.named[0]
    assert named.levels == [1, 10, 64]
    assert named.worst.side == "slower"
    assert 0.82 < named.worst.ratio < 0.88
    assert ("power limits (W)", (500.0, 500.0), (700.0, 700.0)) in named.differences
    sentence = wording.named_sentence(view, named)
    assert sentence.startswith("gpu05 is ") and "slower" in sentence
    assert "power limits (W) 500 x2 (fleet: 700 x2)" in sentence


def test_a_slow_host_with_nothing_recorded_different_is_suspect_until_a_second_round(tmp_path):
    """Off the fleet in one round with no differing field: a suspect (measure again), not
    named; a second round off the same way names it, saying which round agreed."""
    fleet_archive(tmp_path, 6, slow={"gpu02": 0.8}, power_limit_w=700.0)
    view = _view(tmp_path)
    assert view.named == [] and [n.host for n in view.suspect] == ["gpu02"]
    said = wording.named_sentence(view, view.suspect[0])
    assert said.startswith("suspect: gpu02 is ") and "measure again" in said
    assert "no recorded fingerprint field differs" in said
    fleet_archive(tmp_path, 6, slow={"gpu02": 0.8}, power_limit_w=700.0, day=2, seed=1)
    view = _view(tmp_path)
    assert [n.host for n in view.named] == ["gpu02"] and view.suspect == []
    assert view.named[0].differences == []
    said = wording.named_sentence(view, view.named[0])
    assert "no recorded fingerprint field differs" in said
    assert "its previous round (20261101T000000Z-baseline-gpu02) was slower too" in said


def test_a_suspect_exits_0_and_says_so_on_stderr(tmp_path):
    fleet_archive(tmp_path, 6, slow={"gpu02": 0.8}, power_limit_w=700.0)
    got = run_cli("fleet", "--archive", str(tmp_path))
    assert got.returncode == 0, got.stderr
    assert got.stderr.strip() == "gpufleet: suspect, measure again: gpu02"
    assert "suspect: gpu02 is 2" in unwrap(got.stdout)
    (row,) = [line for line in got.stdout.splitlines() if line.startswith("gpu02 ")]
    assert row.endswith("] ?") and row.count(" ? ") == 2, row


def test_the_threshold_decides_what_is_material(tmp_path):
    fleet_archive(tmp_path, 8, slow={"gpu03": 0.96}, noise=0.002)
    assert _view(tmp_path).named == []  # 4% off: not material at the default 5%
    assert [n.host for n in _view(tmp_path, threshold=0.03).named] == ["gpu03"]


def _indexed(host: str, value: float, spread: float) -> IndexedRun:
    return IndexedRun(host, f"r-{host}", "baseline", "done", False, "2026-11-01", "sglang",
                      "0.5.23", "coding", "NVIDIA H200", {}, f"r-{host}", None,
                      [level_row(10, value, spread)])  # fmt: skip


def test_the_census_of_fleets_names_exactly_the_slow_hosts():
    """A property over 3,000 random fleets (3-60 hosts, up to 3 slow ones, host-to-host
    noise up to 1.5%, or up to 3% as on a busy machine with the slow ones at 0.5-0.8x,
    per-request spread 0.5-20%): no stock host is ever named, and every slow host is in a
    fleet of 6 or more where at most one host in six is slow (with fewer hosts the bar
    rises, outliers.critical_z; with more slow ones they widen the MAD). A bad host cannot hide by
    moving the fleet's figure, as it could with a mean and standard deviation instead of
    the median and MAD."""
    rng = random.Random(62)
    metric = outliers.metric_named("output_throughput")
    for case in range(3000):
        hosts = rng.randint(3, 60)
        busy = rng.random() < 0.3
        slow_count = min(rng.choice([0, 0, 1, 2, 3]), (hosts - 1) // 2)
        names = [f"gpu{i:02d}" for i in range(hosts)]
        slowest = (0.5, 0.8) if busy else (0.5, 0.93)
        slow = {n: rng.uniform(*slowest) for n in rng.sample(names, slow_count)}
        noise = rng.uniform(0.0, 0.03 if busy else 0.015)
        spread = rng.uniform(0.005, 0.2)
        runs = [_indexed(n, 380 * slow.get(n, 1.0) * (1 + rng.uniform(-noise, noise)), spread)
                for n in names]  # fmt: skip
        view = outliers.view_of(runs, "baseline", metric)
        named = {n.host for n in view.named + view.suspect}  # one round: no field differs
        said = (case, hosts, slow, noise, spread, named)
        assert named <= set(slow), said
        if hosts >= 6 and len(slow) * 6 <= hosts:
            assert named == set(slow), said


def test_the_bar_rises_for_a_small_fleet():
    """Four stock hosts on a busy machine read 0.98-1.05x at C=1 (seen in CI): at a bar of
    three robust deviations the 1.05x one was named. The bar is Student's t at 99.5% for
    n - 1 degrees of freedom, never under 3."""
    assert outliers.critical_z(4) == pytest.approx(5.841)
    assert outliers.critical_z(6) == pytest.approx(4.032)
    assert outliers.critical_z(200) == 3.0
    metric = outliers.metric_named("output_throughput")
    seen = {"sim-a": 1.0, "sim-b": 0.981, "sim-c": 1.052, "sim-d": 1.0}
    runs = [_indexed(h, 54.7 * v, 0.05) for h, v in seen.items()]
    assert outliers.view_of(runs, "baseline", metric).named == []


def test_two_hosts_name_nobody_and_say_why(tmp_path):
    fleet_archive(tmp_path, 2, slow={"gpu01": 0.5})
    view = _view(tmp_path)
    assert view.named == []
    assert any("at least 3 are needed" in n for n in view.notes)


def test_repeats_give_the_interval_and_latest_keeps_the_newest_round(tmp_path):
    for i in range(4):
        write_run(tmp_path, f"h{i}", "20261101T000000Z-bench-aaaaaa", {10: 380.0 + i},
                  started="2026-11-01T00:00:00+00:00")  # fmt: skip
    for i in range(3):  # a later inv bench on three of them
        write_run(tmp_path, f"h{i}", "20261102T000000Z-bench-bbbbbb", {10: 380.0 - i},
                  started="2026-11-02T00:00:00+00:00")  # fmt: skip
    all_hosts = _view(tmp_path)
    assert sorted(all_hosts.runs) == ["h0", "h1", "h2", "h3"]
    latest = _view(tmp_path, latest=True)
    assert sorted(latest.runs) == ["h0", "h1", "h2"]
    assert any(w.startswith("h3: its newest run") for w in latest.left_out)
    # one run each: the interval takes the fleet's round-to-round changes (h0-h2) too
    assert all(h.estimate.source == "fleet rounds" for h in latest.levels[0].hosts)


def _history(root, host="gpu1", **kw):
    with open_index(Archive(root)) as index:
        return history.host_history(index, host, "baseline", **kw)


def _upgrade_archive(root, after=342.0, prompts_changed=False):
    """Four weekly runs on 0.5.22 around 380 tok/s, then one on 0.5.23 at `after`."""
    for week, value in enumerate([380.0, 383.0, 378.0, 381.0]):
        write_run(root, "gpu1", f"2026110{week + 1}T000000Z-baseline-w{week}", {10: value},
                  started=f"2026-11-0{week + 1}T00:00:00+00:00", engine_version="0.5.22")  # fmt: skip
    write_run(root, "gpu1", "20261108T000000Z-baseline-other", {10: 200.0},
              started="2026-11-08T00:00:00+00:00", engine_version="0.5.22", prompts="q" * 64)  # fmt: skip
    write_run(root, "gpu1", "20261109T000000Z-baseline-new", {10: after},
              started="2026-11-09T00:00:00+00:00", engine_version="0.5.23")  # fmt: skip


def test_history_names_the_upgrade_and_its_verdict(tmp_path):
    _upgrade_archive(tmp_path)
    h = _history(tmp_path)
    assert [r.run_id for r in h.newest] == ["20261109T000000Z-baseline-new"]
    assert len(h.baseline) == 4
    (level,) = h.levels
    assert level.verdict == "slower"
    assert level.ratio == pytest.approx(342 / 380.5, rel=1e-3)
    assert level.interval[1] < 1.0
    assert ("engine version", "0.5.22", "0.5.23") in h.changes
    # another prompt set is never mixed in silently
    assert any(w.startswith("20261108T000000Z-baseline-other: another prompt set")
               for w in h.left_out)  # fmt: skip
    assert h.regressions(0.05) and not h.regressions(0.15)


def test_history_without_a_change_says_no_difference(tmp_path):
    _upgrade_archive(tmp_path, after=380.0)
    (level,) = _history(tmp_path).levels
    assert level.verdict == "no difference"


def test_history_and_fleet_through_the_cli(tmp_path):
    _upgrade_archive(tmp_path)
    args = ("--archive", str(tmp_path))
    gate = run_cli("history", "--host", "gpu1", "--fail-on-regression", "5", *args)
    assert gate.returncode == 1, gate.stderr
    assert "engine version 0.5.22 -> 0.5.23" in gate.stdout
    assert "slower (-10.1%)" in gate.stdout
    assert "slower by more than 5%: gpu1 baseline C=10 -10.1%" in gate.stderr
    loose = run_cli("history", "--host", "gpu1", "--fail-on-regression", "20", *args)
    assert loose.returncode == 0, loose.stderr
    as_json = json.loads(run_cli("history", "--format", "json", *args).stdout)
    assert as_json[0]["levels"][0]["verdict"] == "slower"

    root = tmp_path / "f"
    fleet_archive(root, 8, slow={"gpu05": 0.85})
    out = run_cli("fleet", "--archive", str(root))
    assert out.returncode == 1
    said = unwrap(out.stdout)
    assert "gpu05 is 15." in said and "power limits (W) 500 x2 (fleet: 700 x2)" in said
    assert out.stderr.strip().endswith("off the fleet: gpu05")
    assert max(len(line) for line in out.stdout.splitlines() if "summary:" not in line) <= 100
    page = root / "compare" / "fleet-baseline"
    assert {p.name for p in page.iterdir()} == {"summary.md"}
    assert "| gpu05 |" in (page / "summary.md").read_text()
    report = run_cli("report", "--fleet", "baseline", "--archive", str(root))
    assert report.returncode == 0, report.stderr
    assert {p.name for p in page.iterdir()} == {"summary.md", "ratios.png", "report.html"}
    html = (page / "report.html").read_text()
    assert html.count('class="named"') == 3 and "gpu05 at C=64" in html
    fine = tmp_path / "ok"
    fleet_archive(fine, 8)
    ok = run_cli("fleet", "--archive", str(fine))
    assert ok.returncode == 0 and "no host of 8 is off" in ok.stdout


def test_the_index_follows_the_files(tmp_path):
    fleet_archive(tmp_path, 3)
    archive = Archive(tmp_path)
    with open_index(archive) as index:
        assert len(index.runs()) == 3 and index.notes == []
    write_run(tmp_path, "gpu00", "20261102T000000Z-baseline-x", {10: 1.0},
              started="2026-11-02T00:00:00+00:00")  # fmt: skip
    with open_index(archive) as index:
        assert [r.run_id for r in index.runs(host="gpu00")][-1] == "20261102T000000Z-baseline-x"
    import shutil

    shutil.rmtree(tmp_path / "gpu02")
    with open_index(archive) as index:
        assert index.hosts() == ["gpu00", "gpu01"]


def test_a_corrupt_index_is_rebuilt_from_the_files(tmp_path):
    fleet_archive(tmp_path, 4, slow={"gpu01": 0.7})
    before = _view(tmp_path)
    archive = Archive(tmp_path)
    archive.index_path.write_bytes(b"this is not a database" * 100)
    runs = tree_state(tmp_path)
    with open_index(archive) as index:
        assert len(index.notes) == 1 and "rebuilt from the run files" in index.notes[0]
        assert str(archive.index_path) in index.notes[0]
        after = outliers.fleet_view(index, "baseline")
    assert [n.host for n in after.named] == [n.host for n in before.named] == ["gpu01"]
    assert tree_state(tmp_path) == runs
    conn = sqlite3.connect(archive.index_path)
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone() == (4,)


def _one_line_refusal(root, args, said):
    before = tree_state(root)
    out = run_cli(*args, "--archive", str(root))
    assert out.returncode == 2, (args, out.stdout, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
    assert said in out.stderr, (args, out.stderr)
    assert "Traceback" not in out.stderr
    assert tree_state(root) == before


def test_bad_input_is_one_line_and_changes_nothing(tmp_path):
    root = tmp_path / "logs"
    fleet_archive(root, 3)
    cases = {
        ("history", "--host", "nosuch"): "--host 'nosuch': no archived run of that host",
        ("history", "--profile", "nosuch"): "--profile 'nosuch': no archived run of that profile",
        ("fleet", "--profile", "nosuch"): "no archived run of profile 'nosuch'",
        ("fleet", "--threshold", "-3"): "--threshold '-3': expected a positive number",
        ("fleet", "--metric", "colour"): "--metric 'colour': expected a figure",
        ("metrics",): "metrics needs exactly one of --output FILE or --serve",
        ("metrics", "--serve", "--output", "x.prom"): "metrics needs exactly one of",
        ("metrics", "--output", "x.prom", "--host", "nosuch"): "--host 'nosuch': no archived",
    }
    for args, said in cases.items():
        _one_line_refusal(root, args, said)
    other = tmp_path / "other"
    write_run(other, "a", "r1", {1: 1.0}, profile="p1")
    write_run(other, "b", "r2", {1: 1.0}, profile="p2")
    _one_line_refusal(other, ["fleet"], "no profile was run on two or more hosts")


def test_reindex_says_its_cost(tmp_path):
    fleet_archive(tmp_path, 5)
    out = run_cli("runs", "--reindex", "--archive", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "index: " in out.stdout and ": 5 runs in " in out.stdout and "ms a run" in out.stdout


def test_the_fleet_page_reads_on_a_phone(tmp_path):
    """The ratio plot and table in real Chromium: no wider than a 390 px phone, no text
    under 11 px there, the named host marked in the table and on the plot."""
    from browser import CHROMIUM, visit

    assert CHROMIUM, "chromium is not installed (scripts/test.sh installs it)"
    fleet_archive(tmp_path, 12, slow={"gpu07": 0.8})
    got = run_cli("report", "--fleet", "baseline", "--archive", str(tmp_path))
    assert got.returncode == 0, got.stderr
    seen = visit(tmp_path / "compare" / "fleet-baseline" / "report.html", width=1300)
    assert seen.errors == [] and all(r.startswith("file:") for r in seen.requests)
    assert seen.phone_width <= 390
    assert seen.text_px[390][0][0] >= 11, seen.text_px[390][:3]
    assert seen.facts["plots"] == ["baseline: ratio to the fleet median"]
    assert sum("gpu07 at C=" in p for p in seen.facts["points"]) == 3
    assert seen.facts["data"][0]["named"][0]["host"] == "gpu07"
    assert "gpu07 is 19.8% slower" in seen.facts["text"]


@pytest.mark.parametrize(
    ("fault", "at_1", "at_64"),
    [
        ({}, None, None),  # stock GPUs: no slowdown at all
        ({"sm_clock_app_mhz": 1600}, 1980 / 1600, 1980 / 1600),
        # a 640 W step under a 500 W limit: clocks held to (500 - 80) / (640 - 80)
        ({"power_limit_w": 500.0}, 1.0, (640 - 80) / (500 - 80)),
        ({"power_limit_w": 500.0, "sm_clock_app_mhz": 1800}, 1980 / 1800, 560 / 420),
    ],
)
def test_the_rehearsal_slows_a_step_by_its_slowest_gpu(tmp_path, monkeypatch, fault, at_1, at_64):
    """What makes the rehearsal's slowed host slow (sim/power.gpu_slowdown): one GPU of a
    tensor-parallel server held down slows every step, by clocks always, by the power limit
    only where the step would draw more than it allows."""
    from gpufleet.sim import gpustate
    from gpufleet.sim.power import gpu_slowdown

    gpustate.ensure_topology(tmp_path, count=8, host="h", faults={"3": fault} if fault else {})
    monkeypatch.setenv(gpustate.STATE_ENV, str(tmp_path))
    slowdown = gpu_slowdown(list(range(8)), speculative=False)
    if at_1 is None:
        assert slowdown is None
        return
    assert slowdown(1) == pytest.approx(at_1)
    assert slowdown(64) == pytest.approx(at_64)
    assert gpu_slowdown([0, 1, 2], speculative=False) is None  # a server without GPU 3


@pytest.mark.parametrize("when", ["after the listing", "after the stat"])
def test_a_run_removed_while_the_index_reads_is_gone_not_broken(tmp_path, monkeypatch, when):
    """The world changes between two steps: a run folder removed after the index listed
    it (or stat'ed its manifest) is dropped as gone, never refused as a folder without its
    manifest; the next open agrees with the files."""
    import shutil

    from gpufleet.fleet import runfiles

    fleet_archive(tmp_path, 3)
    victim = tmp_path / "gpu01"
    if when == "after the listing":
        listed = Archive.run_dirs

        def run_dirs(self):
            found = listed(self)
            shutil.rmtree(victim, ignore_errors=True)
            return found

        monkeypatch.setattr(Archive, "run_dirs", run_dirs)
    else:
        read = runfiles._read_run

        def read_run(run_dir):
            if run_dir.parent == victim:
                shutil.rmtree(victim, ignore_errors=True)
            return read(run_dir)

        monkeypatch.setattr(runfiles, "_read_run", read_run)
    with open_index(Archive(tmp_path)) as index:
        assert index.hosts() == ["gpu00", "gpu02"]
    monkeypatch.undo()
    with open_index(Archive(tmp_path)) as index:
        assert index.hosts() == ["gpu00", "gpu02"]


def test_a_latency_figure_names_the_host_whose_latency_is_higher_as_slower():
    """`--metric median_ttft_ms`: lower is better, so a host at 1.6x the fleet's TTFT is
    named slower (the catalogue's direction), and one at 0.6x faster."""
    metric = outliers.metric_named("median_ttft_ms")
    runs = []
    for n in range(8):
        ttft = {3: 80.0, 5: 30.0}.get(n, 50.0 + n * 0.1)
        run = _indexed(f"gpu{n}", 380.0, 0.02)
        run.rows[0].update(median_ttft_ms=ttft, mean_ttft_ms=ttft, std_ttft_ms=ttft * 0.05)
        runs.append(run)
    view = outliers.view_of(runs, "baseline", metric)
    sides = {n.host: n.worst.side for n in view.named + view.suspect}
    assert sides == {"gpu3": "slower", "gpu5": "faster"}


def test_an_index_of_another_schema_is_rebuilt_and_an_unwritable_one_kept_in_memory(tmp_path):
    fleet_archive(tmp_path, 3)
    archive = Archive(tmp_path)
    with open_index(archive):
        pass
    conn = sqlite3.connect(archive.index_path)
    conn.execute("UPDATE meta SET value = '0' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    with open_index(archive) as index:
        assert f"index schema '0', this gpufleet writes {SCHEMA}; rebuilt" in index.notes[0]
        assert len(index.runs()) == 3
    archive.index_path.unlink()
    archive.index_path.mkdir()  # something in the index's place that is not a file
    with open_index(archive) as index:
        assert "built in memory for this command" in index.notes[0]
        assert len(index.runs()) == 3
    assert archive.index_path.is_dir() and not any(archive.index_path.iterdir())
