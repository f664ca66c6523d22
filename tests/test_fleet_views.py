"""What the fleet view shows besides who is named: every host that differs from the
majority in a fingerprint field (table, json, summary.md, page), only comparable runs set
side by side (the rest left out by name), and history saying when the whole fleet moved."""

from __future__ import annotations

import json

from fleetdata import write_run
from helpers import run_cli, unwrap

STOCK = {1: 60.0, 10: 380.0, 64: 780.0}


def _round(root, day: int, hosts: int = 8, factor: float = 1.0, shared: bool = False, **per):
    """One round of `hosts` stock hosts on November `day`; `per` gives a host its own
    write_run arguments. `shared`: one run id for all (as one `inv bench` on many hosts)."""
    for i in range(hosts):
        host = f"gpu{i:02d}"
        run_id = f"202611{day:02d}T000000Z-baseline-{'all' if shared else host}"
        figures = {c: v * factor * (1 + 0.002 * ((i * 3 + day) % 5 - 2)) for c, v in STOCK.items()}
        write_run(root, host, run_id, figures, started=f"2026-11-{day:02d}T00:00:00+00:00",
                  **per.get(host, {}))  # fmt: skip


def test_a_host_that_differs_but_is_not_slower_is_shown_in_every_output(tmp_path):
    root = tmp_path / "logs"
    _round(root, 1, gpu03={"engine_version": "0.5.22"})
    said = "gpu03: engine version 0.5.22 (fleet: 0.5.23 on 7 of 8 hosts); not off the fleet"
    table = run_cli("fleet", "--archive", str(root))
    assert table.returncode == 0, table.stderr
    assert said in unwrap(table.stdout)
    as_json = json.loads(run_cli("fleet", "--format", "json", "--archive", str(root)).stdout)
    assert as_json[0]["differences"] == [said]
    summary = root / "compare" / "fleet-baseline" / "summary.md"
    assert said in summary.read_text()
    got = run_cli("report", "--fleet", "baseline", "--archive", str(root))
    assert got.returncode == 0, got.stderr
    assert said in (summary.parent / "report.html").read_text()


def test_runs_of_another_prompt_set_or_gpu_model_are_left_out_not_compared(tmp_path):
    """Without --latest, gpu04's newest run (another prompt set, half as fast) and gpu06's
    (an H100) were set against the fleet and named; now they are left out by name and the
    hosts compared on their runs of the majority's kind, where they have one."""
    root = tmp_path / "logs"
    _round(root, 1, hosts=7)
    _round(root, 2, hosts=8, gpu04={"prompts": "q" * 64}, gpu06={"gpu": "NVIDIA H100"})
    write_run(root, "gpu04", "20261103T000000Z-baseline-gpu04", {c: v / 2 for c, v in
              STOCK.items()}, prompts="q" * 64, started="2026-11-03T00:00:00+00:00")  # fmt: skip
    got = run_cli("fleet", "--archive", str(root))
    assert got.returncode == 0, (got.stdout, got.stderr)
    out = unwrap(got.stdout)
    assert "gpu04: run 20261103T000000Z-baseline-gpu04: another prompt set (coding (qqqqqqqqqqqq)" \
        "; fleet: coding (pppppppppppp) on 6 of 8 hosts)" in out  # fmt: skip
    assert "gpu06: run 20261102T000000Z-baseline-gpu06: another GPU model (NVIDIA H100" in out
    view = json.loads(run_cli("fleet", "--format", "json", "--archive", str(root)).stdout)[0]
    assert view["runs"]["gpu04"] == ["20261101T000000Z-baseline-gpu04"]  # its comparable run
    assert view["runs"]["gpu06"] == ["20261101T000000Z-baseline-gpu06"]
    assert "gpu07" in view["runs"] and view["named"] == []


def test_history_says_when_the_whole_fleet_moved_in_the_same_round(tmp_path):
    """Every host 4-6% slower in one round (a shared cause): history of one host says the
    fleet moved with it, rather than reading as that host's regression alone."""
    root = tmp_path / "logs"
    for day in (1, 2, 3):
        _round(root, day, hosts=6, shared=True)
    _round(root, 4, hosts=6, factor=0.95, shared=True)
    got = run_cli("history", "--host", "gpu02", "--archive", str(root))
    assert got.returncode == 0, got.stderr
    assert "the whole fleet moved in this round: C=1: 6 of 6 hosts slower" in unwrap(got.stdout)
    as_json = json.loads(run_cli("history", "--format", "json", "--host", "gpu02",
                                 "--archive", str(root)).stdout)  # fmt: skip
    assert as_json[0]["fleet_moved"].startswith("the whole fleet moved in this round")
    alone = tmp_path / "alone"
    for day in (1, 2, 3):
        _round(alone, day, hosts=6, shared=True)
    _round(alone, 4, hosts=6, shared=True, gpu02={"power_limit_w": 500.0})
    got = run_cli("history", "--host", "gpu02", "--archive", str(alone))
    assert "whole fleet moved" not in got.stdout


def test_the_named_hosts_labels_never_overlap_on_the_plot(tmp_path):
    """Two or three hosts named at similar ratios ("pfd"): every pair of label bounding
    boxes, as drawn, is apart; a census over fleets with one to four named hosts."""
    import random

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from fleetdata import fleet_archive
    from gpufleet.archive.layout import Archive
    from gpufleet.fleet import outliers, page
    from gpufleet.fleet.index import open_index

    rng = random.Random(9)
    for case in range(6):
        root = tmp_path / f"a{case}"
        names = rng.sample([f"gpu{i:02d}" for i in range(12)], 1 + case % 4)
        level = rng.uniform(0.7, 0.85)
        fleet_archive(root, 12, slow={n: level + rng.uniform(-0.004, 0.004) for n in names})
        with open_index(Archive(root)) as index:
            view = outliers.fleet_view(index, "baseline")
        assert sorted(n.host for n in view.named) == sorted(names)
        fig, _ = page.draw(view)
        renderer = FigureCanvasAgg(fig).get_renderer()
        texts = fig.axes[0].texts
        assert len(texts) == len(names) * 3
        boxes = [t.get_window_extent(renderer) for t in texts]
        clashes = [(texts[i].get_text(), texts[j].get_text())
                   for i in range(len(boxes)) for j in range(i + 1, len(boxes))
                   if boxes[i].overlaps(boxes[j])]  # fmt: skip
        assert clashes == [], (case, clashes)


def test_the_fleet_benchmark_times_only_commands_that_worked(tmp_path):
    """benchmarks/fleet_index.py timed `inv fleet --no-plots` (a flag gone) and printed a
    usage error's 0.3 s as a figure: a failed command now prints its error, no figure, and
    the script exits non-zero; at a small size every command it times works."""
    import subprocess
    import sys

    from helpers import REPO

    script = REPO / "benchmarks" / "fleet_index.py"
    got = subprocess.run([sys.executable, str(script), "--hosts", "4", "--runs", "2"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)  # fmt: skip
    assert got.returncode == 0, got.stdout + got.stderr
    timings = [line for line in got.stdout.splitlines() if line.startswith("inv ")]
    assert len(timings) == 6 and all(line.endswith(" s") for line in timings), got.stdout
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import fleet_index
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    import pytest

    with pytest.raises(fleet_index.CommandFailed, match=r"exit 2, no figure: .*--no-plots"):
        fleet_index.timed(["fleet", "--no-plots", "--archive", str(tmp_path)], repeats=1)
