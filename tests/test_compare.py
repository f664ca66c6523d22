"""compare on archived fixtures with known numbers; crossover edges; plots; sweeps."""

from __future__ import annotations

import json

import pytest
import yaml

from gpufleet.archive import store as archive
from gpufleet.archive.kept import Manifest
from gpufleet.archive.layout import Archive
from gpufleet.report import compare
from helpers import run_cli, unwrap


def _run(root, host, run_id, profile, per_level, status="done", argv=None, prompts="abc",
         started=None, **extra):  # fmt: skip
    results = [
        {
            **extra,
            "max_concurrency": c,
            "request_rate": float("inf"),  # as the real results.jsonl has it (not JSON)
            "output_throughput": tot,
            "median_per_request_output_tps": per,
            "median_ttft_ms": 50.0 * c,
            "p99_ttft_ms": 80.0 * c,
            "median_itl_ms": 1000 / per,
            "accept_length": None,
            "completed": 10,
            "failed": 0,
            "level_status": "ok",
        }
        for c, (tot, per) in per_level.items()
    ]
    files = {"results.jsonl": "".join(json.dumps(r) + "\n" for r in results).encode()}
    manifest = {
        "run_id": run_id,
        "host": host,
        "profile": profile,
        "status": status,
        "started_at": started or run_id,
        "reason": None if status == "done" else "crashed",
        "plan": {"run_id": run_id, "levels": [], "output_len": 256, "backend": "sglang"},
        "prompt_set": {"prompts_sha256": prompts},
        "server": {
            "argv": argv or ["python", "-m", "sglang.launch_server"],
            "engine_version": "0.5.3",
        },
        "host_facts": {"gpus": [{"name": "NVIDIA H200"}], "driver": "580"},
        "levels": [{"concurrency": c, "output_throughput": v[0]} for c, v in per_level.items()],
    }
    archive.write_run(Archive(root), host, run_id, files, Manifest.from_wire(manifest))


SEEDS = {  # the seeds' shape: EAGLE-3 ahead per request at C=1 only
    "baseline": {1: (60, 60), 10: (380, 38), 64: (780, 12)},
    "eagle3": {1: (80, 80), 10: (260, 26), 64: (350, 5.5)},
}


def test_crossover_interpolated_on_log_axis():
    kind, at = compare.crossover([1, 10, 64], [60, 38, 12], [80, 26, 5.5])
    assert kind == "cross"
    # +1/3 at C=1, -0.316 at C=10: zero at t = 0.513 of log(1)..log(10)
    assert at == pytest.approx(10 ** (0.3333 / (0.3333 + 0.3158)), rel=0.01)
    assert compare.crossover([1, 10, 64], [1, 1, 1], [2, 2, 2]) == ("never", None)
    assert compare.crossover([1, 10, 64], [2, 2, 2], [1, 1, 1]) == ("below", None)
    kind, at = compare.crossover([1, 10, 64], [1, 1, 1], [2, 2, 0.5])  # crossing at the last edge
    assert kind == "cross" and 10 < at < 64


def test_a_side_that_starts_below_and_crosses_upward_is_said_so(tmp_path):
    # B is slower at C=1 and faster from C=2 on: the table shows 1.07x at C=2, and the
    # sentence used to say "slower per request at every measured level"
    assert compare.crossover([1, 2, 4], [10, 10, 10], [9, 10.7, 12])[0] == "cross-up"
    _run(tmp_path, "gpu-a", "r1-a", "slowstart", {1: (100, 50), 2: (150, 40), 4: (200, 30)})
    _run(tmp_path, "gpu-a", "r2-b", "latebloom", {1: (90, 45), 2: (160, 43), 4: (240, 36)})
    out = run_cli("compare", "slowstart", "latebloom", "--archive", str(tmp_path), "--no-plots")
    assert out.returncode == 0, out.stderr
    said = next(ln for ln in unwrap(out.stdout).splitlines() if ln.startswith("gpu-a: latebloom"))
    assert "slower per request below C~" in said and "faster from there" in said, said
    assert "gains total throughput over slowstart from C~" in said
    assert "every measured level" not in said


def test_compare_profiles_sentence_and_plots(tmp_path):
    eagle_argv = ["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3"]
    _run(tmp_path, "gpu-a", "r1-baseline", "baseline", SEEDS["baseline"])
    _run(tmp_path, "gpu-a", "r2-eagle3", "eagle3", SEEDS["eagle3"], argv=eagle_argv)
    out = run_cli("compare", "baseline", "eagle3", "--archive", str(tmp_path))
    assert out.returncode == 0, out.stderr
    stdout = unwrap(out.stdout)
    assert (
        "gpu-a: eagle3 is faster per request up to C~3; eagle3 loses total throughput from "
        "C~3; at C=64 baseline delivers 2.2x the total throughput; one run per arm, so no "
        "interval"
    ) in stdout
    assert "SGLang's silent cap of 48" in stdout and "C=64" in stdout
    pngs = sorted((tmp_path / "compare" / "baseline-vs-eagle3").glob("*.png"))
    assert [p.name for p in pngs] == [  # the catalogue's plots that have data
        "gpu-a-itl.png",
        "gpu-a-per_request.png",
        "gpu-a-throughput.png",
        "gpu-a-ttft.png",
    ]
    assert all(p.stat().st_size > 10_000 for p in pngs)
    [plots_line] = [ln for ln in out.stdout.splitlines() if ln.startswith("plots: ")]
    assert plots_line.endswith(f"({len(pngs)} PNG files)") and len(plots_line) < 120 + len(
        str(tmp_path)
    )

    data = json.loads(
        run_cli(
            "compare",
            "baseline",
            "eagle3",
            "--archive",
            str(tmp_path),
            "--format",
            "json",
            "--no-plots",
        ).stdout
    )
    assert data["gpu-a"]["levels"]["64"]["eagle3"]["output_throughput"] == 350
    csv_out = run_cli(
        "compare",
        "r1-baseline",
        "r2-eagle3",
        "--archive",
        str(tmp_path),
        "--format",
        "csv",
        "--no-plots",
    ).stdout
    # run ids are labelled by the profile their manifest names
    assert csv_out.splitlines()[0].startswith("host,C,baseline total tok/s")
    assert "0.45x" in csv_out  # 350 / 780 at C=64
    md = run_cli(
        "compare", "baseline", "eagle3", "--archive", str(tmp_path), "--format", "md", "--no-plots"
    ).stdout
    assert "| 64 | 780.0 | 350.0 | 0.45x |" in md


def test_no_crossover_and_fairness_warnings(tmp_path):
    _run(tmp_path, "h", "a1", "a", {1: (10, 10), 8: (50, 6)}, prompts="p1")
    _run(tmp_path, "h", "b1", "b", {1: (20, 20), 8: (90, 11)}, prompts="p2", status="failed")
    out = run_cli("compare", "a", "b", "--archive", str(tmp_path), "--no-plots")
    stdout = unwrap(out.stdout)
    assert "b is at least as fast per request at every measured level (C<=8)" in stdout
    assert "keeps total throughput at or above a's up to C=8; at C=8 b delivers 1.8x" in stdout
    assert "h: error: prompt set differs" in stdout
    assert "h: error: b: run b1 is failed" in stdout


def test_compare_bad_input(tmp_path):
    out = run_cli("compare", "nothing", "else", "--archive", str(tmp_path))
    assert out.returncode == 2 and "'nothing': no archived run or profile" in out.stderr
    out = run_cli("compare", "one", "--archive", str(tmp_path))
    assert (
        out.returncode != 0
        and "did not receive required positional arguments: 'second'" in out.stderr
    )


def _sweep_profiles(fleet, crash_second=False):
    a = fleet.profile("swa", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    port = yaml.safe_load(a.read_text())["port"]
    b_sim = {"load-seconds": 0.3, "warmup-seconds": 0.1}
    if crash_second:
        b_sim["crash-during-load"] = True
    fleet.profile(
        "swb",
        tp=1,
        port=port,
        sim=b_sim,
        flags={"speculative-algorithm": "EAGLE3", "max-running-requests": 16},
    )
    return a.parent


def test_sweep_records_failed_cell_and_resume_finishes(fleet, tmp_path):
    playbooks = _sweep_profiles(fleet, crash_second=True)
    args = [
        "sweep",
        "--profiles",
        f"{playbooks}/swa.yaml,{playbooks}/swb.yaml",
        "--hosts",
        "h0,h1",
        "--concurrency",
        "1,4",
        "--num-prompts",
        "4",
        "--output-len",
        "8",
        "--archive",
        str(tmp_path / "a"),
    ]
    out = fleet.cli(*args)
    assert out.returncode == 1
    assert "swa on h0: done" in out.stdout and "swb on h0: FAILED" in out.stdout
    [state_file] = (tmp_path / "a" / "sweeps").glob("*.json")
    state = json.loads(state_file.read_text())
    assert state["cells"]["swa"]["h1"]["status"] == "done"
    done_run = state["cells"]["swa"]["h0"]["run_id"]
    # where each cell's time went: every step of a finished cell, up to the failing one
    steps = state["cells"]["swa"]["h1"]["steps_s"]
    assert list(steps) == ["clean", "launch", "bench", "stop"] and min(steps.values()) >= 0
    assert list(state["cells"]["swb"]["h0"]["steps_s"]) == ["clean"]

    # fix the second profile, resume: the first is not redone
    data = yaml.safe_load((playbooks / "swb.yaml").read_text())
    data["sim"].pop("crash-during-load")
    (playbooks / "swb.yaml").write_text(yaml.safe_dump(data))
    out = fleet.cli(*args, "--resume")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "already done, skipped" in out.stdout
    assert (
        "swb is" in out.stdout or "faster per request" in out.stdout or "throughput" in out.stdout
    )
    state = json.loads(state_file.read_text())
    assert state["status"] == "done"
    assert state["cells"]["swa"]["h0"]["run_id"] == done_run
    assert len(list((tmp_path / "a" / "h0").iterdir())) == 2
    assert list((tmp_path / "a" / "compare").glob("*/h0-throughput.png"))


def test_sweep_dry_run_starts_nothing(fleet, tmp_path):
    playbooks = _sweep_profiles(fleet)
    out = fleet.cli(
        "sweep",
        "--profiles",
        f"{playbooks}/swa.yaml,{playbooks}/swb.yaml",
        "--concurrency",
        "1,10,64",
        "--dry-run",
        "--archive",
        str(tmp_path),
    )
    assert out.returncode == 0
    assert "gpu-clean -> launch -> bench [C=1 x 10, C=10 x 40, C=64 x 256" in out.stdout
    assert "dry run: nothing started" in out.stdout
    assert not (tmp_path / "sweeps").exists()


def test_a_manifest_from_a_newer_gpufleet_is_one_line(tmp_path):
    _run(tmp_path, "gpu-a", "r1-new", "newer", SEEDS["baseline"])
    _run(tmp_path, "gpu-a", "r2-old", "older", SEEDS["eagle3"])
    path = tmp_path / "gpu-a" / "r1-new" / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "schema": 99}))
    out = run_cli("compare", "r1-new", "r2-old", "--archive", str(tmp_path), "--no-plots")
    assert out.returncode == 2
    assert "archived by a newer gpufleet (manifest schema 99)" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_compare_says_its_figures_are_whole_levels_when_steady_ones_exist(tmp_path):
    _run(tmp_path, "h", "a1", "a", {1: (10, 10), 8: (50, 6)}, steady_output_throughput=55.0)
    _run(tmp_path, "h", "b1", "b", {1: (12, 12), 8: (40, 5)}, steady_output_throughput=44.0)
    out = run_cli("compare", "a", "b", "--archive", str(tmp_path), "--no-plots")
    assert out.returncode == 0, out.stderr
    stdout = unwrap(out.stdout)
    assert "figures over each whole level (ramp-up and drain included)" in stdout
    assert "`--wide` adds the steady window's throughput" in stdout
    wide = run_cli("compare", "a", "b", "--archive", str(tmp_path), "--no-plots", "--wide")
    assert "steady tok/s" in wide.stdout


def test_wide_shows_the_other_per_request_speed_decode_only(tmp_path):
    """Issue 38: the crossover's per-request speed is end to end (TTFT included); `--wide`
    shows the same requests' decode speed beside it, and the headline table leaves it out."""
    _run(tmp_path, "h", "a1", "a", {1: (10, 10), 8: (50, 6)}, median_per_request_decode_tps=31.5)
    _run(tmp_path, "h", "b1", "b", {1: (12, 12), 8: (40, 5)}, median_per_request_decode_tps=47.25)
    headline = run_cli("compare", "a", "b", "--archive", str(tmp_path), "--no-plots")
    assert headline.returncode == 0, headline.stderr
    assert "decode tok/s" not in headline.stdout
    wide = run_cli("compare", "a", "b", "--archive", str(tmp_path), "--no-plots", "--wide")
    assert "a decode tok/s p50" in wide.stdout and "b decode tok/s p50" in wide.stdout
    assert "31.5" in wide.stdout and "47.2" in wide.stdout


def test_the_queue_notice_reads_the_slots_the_engines_adapter_archived(tmp_path):
    """Issue 38: the report read SGLang's rule from the archived argv, so a llama-server run
    over its --parallel slots was never said to queue; now the slots its adapter read at
    launch are archived with the server and the notice names no SGLang flag."""
    _run(tmp_path, "h", "r1-t", "target", {1: (10, 10), 8: (50, 6)})
    _run(tmp_path, "h", "r2-d", "draft", {1: (12, 12), 8: (40, 5)})
    for run_id in ("r1-t", "r2-d"):
        path = tmp_path / "h" / run_id / "manifest.json"
        data = json.loads(path.read_text())
        data["server"] = {"argv": ["llama-server", "--parallel", "4"], "engine": "llamacpp",
                          "slots": 4}  # fmt: skip
        path.write_text(json.dumps(data))
    out = run_cli("compare", "target", "draft", "--archive", str(tmp_path), "--no-plots")
    assert out.returncode == 0, out.stderr
    stdout = unwrap(out.stdout)
    assert "draft: at C=8 requests queue (the server serves 4 at once)" in stdout
    assert "max-running-requests" not in stdout and "C=1 requests queue" not in stdout


def _repeated(c: int, scale: float, n: int = 3):
    """A level measured `n` times, its headline figures with their repeats' values."""
    from gpufleet.report.stats import LevelFigures
    from helpers import row

    figures = {"output_throughput": 1234.5 * scale, "median_per_request_output_tps": 45.6 * scale,
               "median_ttft_ms": 123.4 / scale}  # fmt: skip
    samples = {k: [v * (1 + 0.01 * i) for i in range(n)] for k, v in figures.items()}
    return LevelFigures(row(max_concurrency=c, **figures), repeats=n, samples=samples,
                        ci={k: (v * 0.99, v * 1.01) for k, v in figures.items()})  # fmt: skip


def test_the_headline_table_fits_100_columns_with_repeats_and_three_arms():
    """Issue 64: with repeats each ratio carried its interval and `inv compare` printed a
    table 173 columns wide. The default table fits 100 columns for any arm count, with or
    without repeats (intervals go where they do not fit; --wide keeps them all), and it
    keeps a ratio's significance mark."""
    from gpufleet.cli.output import _plain
    from gpufleet.report.compare import Arm, table

    for count in (2, 3, 4):
        arms = [Arm(f"arm{i}", [], {c: _repeated(c, 1 + 0.3 * i) for c in (1, 10, 64, 128)})
                for i in range(count)]  # fmt: skip
        headers, rows = table(arms, wide=False)
        text = _plain("", headers, rows)
        assert max(len(line) for line in text.splitlines()) <= 100, (count, text)
        assert "x" in rows[0][count + 1]  # the first ratio is there (after the C column)
    _, wide_rows = table(arms, wide=True)
    assert any("[" in cell for r in wide_rows for cell in r)  # intervals kept in --wide
