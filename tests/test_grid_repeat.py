"""Grid sweeps over server flags, repeats with confidence intervals, and compare on them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpufleet.control.sweep.cells import expand, parse_grid, short_names
from gpufleet.errors import UserError
from gpufleet.report import stats
from helpers import REPO, row, run_cli, unwrap


def test_grid_cells_are_named_readably_and_interleaved_by_repeat():
    grid = parse_grid(["speculative-num-steps=1,3", "--speculative-eagle-topk=1,4"])
    arms = expand(["eagle3", "playbooks/baseline.yaml"], grid, 2)
    assert len(arms) == 2 * 4 * 2
    assert [a.key for a in arms[:4]] == [
        "eagle3[steps=1,topk=1]",
        "eagle3[steps=1,topk=4]",
        "eagle3[steps=3,topk=1]",
        "eagle3[steps=3,topk=4]",
    ]
    assert arms[4].key == "baseline[steps=1,topk=1]"
    # the second round comes after every cell ran once: drift cannot favour one side
    assert [a.key for a in arms[8:10]] == ["eagle3[steps=1,topk=1]#2", "eagle3[steps=1,topk=4]#2"]
    assert arms[3].overrides == {"speculative-num-steps": 3, "speculative-eagle-topk": 4}
    profile = arms[3].resolved_profile()
    assert (
        profile.flags["speculative-num-steps"] == 3 and profile.flags["speculative-eagle-topk"] == 4
    )
    assert short_names(["a-tokens", "b-tokens", "c-x"]) == {
        "a-tokens": "a-tokens", "b-tokens": "b-tokens", "c-x": "x",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("speculative-num-steps", "expected FLAG=V1,V2"),
        ("=1,2", "expected FLAG=V1,V2"),
        ("bad flag=1", "expected FLAG=V1,V2"),
    ],
)
def test_bad_grid_is_one_line(entry, message):
    with pytest.raises(UserError, match=message):
        parse_grid([entry])
    out = run_cli("sweep", "--profiles", "rehearsal-baseline", "--concurrency", "1",
                  "--grid", entry, "--dry-run")  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_grid_dry_run_lists_every_cell(tmp_path):
    out = run_cli(
        "sweep", "--profiles", "rehearsal-eagle3", "--concurrency", "1,4",
        "--grid", "speculative-num-steps=1,3", "--repeat", "2", "--dry-run",
        "--inventory", "hosts/rehearsal.yaml", "--archive", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rehearsal-eagle3[steps=1] (sim)" in out.stdout
    assert "flags: --speculative-num-steps 3" in out.stdout
    assert "2 repeats: 4 cells, interleaved" in out.stdout
    assert not (tmp_path / "sweeps").exists()


def test_t_interval_and_ratio_interval():
    mean, _low, high = stats.mean_ci([10.0, 12.0, 11.0])
    assert mean == 11.0 and high - mean == pytest.approx(4.303 * 1.0 / 3**0.5)
    a = stats.aggregate([row(output_throughput=v, completed=4) for v in (100.0, 102.0, 98.0)])
    b = stats.aggregate([row(output_throughput=v, completed=4) for v in (150.0, 149.0, 151.0)])
    same = stats.aggregate([row(output_throughput=v, completed=4) for v in (99.0, 103.0, 97.0)])
    assert a.repeats == 3 and a.get("completed") == 12 and a.get("output_throughput") == 100.0
    assert stats.ratio_text(a, b, "output_throughput").startswith("1.50x [1.4")
    assert stats.ratio_text(a, same, "output_throughput").endswith(" n.s.")


def test_sweep_grid_with_repeats_on_the_rehearsal_engine(fleet, tmp_path):
    """Two depths x two repeats on one simulated host: four cells (four launches), then
    compare shows each ratio with its interval."""
    profile = fleet.profile(
        "spec", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1},
        flags={"speculative-algorithm": "EAGLE3", "speculative-eagle-topk": 1,
               "max-running-requests": 64},
    )  # fmt: skip
    out = fleet.cli(
        "sweep", "--profiles", str(profile), "--hosts", "h0", "--concurrency", "1,8",
        "--num-prompts", "8", "--output-len", "32", "--grid", "speculative-num-steps=1,5",
        "--repeat", "2", "--archive", str(tmp_path / "a"), timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    [state_file] = (tmp_path / "a" / "sweeps").glob("*.json")
    state = json.loads(state_file.read_text())
    assert list(state["cells"]) == [
        "spec[steps=1]", "spec[steps=5]", "spec[steps=1]#2", "spec[steps=5]#2",
    ]  # fmt: skip
    assert state["status"] == "done"
    assert len(list((tmp_path / "a" / "h0").iterdir())) == 4
    assert "A=spec[steps=1] vs B=spec[steps=5]" in out.stdout
    # two repeats give t one degree of freedom (12.7 x the standard error): no interval is
    # shown, and the answer says why (intervals from 3 repeats: the next test)
    assert "x [" not in out.stdout
    assert "2 runs per arm are too few, so no interval: --repeat 3 gives each figure one" in (
        unwrap(out.stdout)
    )


def test_intervals_need_three_repeats_and_never_reach_below_zero():
    """Issue 38: with --repeat 2 the 95% intervals included negative throughputs
    (`[-180.3-374.8]`) and ratios of `[0.00-997439.59]`."""
    from gpufleet.records import ResultRow
    from gpufleet.report.stats import aggregate, mean_ci, ratio_text

    def level(*tps):
        return aggregate([ResultRow(4, 8, 0, t, median_ttft_ms=t / 10) for t in tps])

    two, other_two = level(10.0, 400.0), level(20.0, 380.0)
    assert two.ci == {} and ratio_text(two, other_two, "output_throughput") == "0.98x"
    three = level(10.0, 400.0, 30.0)
    low, high = three.ci["output_throughput"]
    assert low == 0.0 and high > 400  # stopped at zero: a throughput is never negative
    assert "[" in ratio_text(three, level(20.0, 380.0, 50.0), "output_throughput")
    assert mean_ci([-5.0, 5.0, 1.0])[1] < 0  # a figure that can be negative keeps its low end


def test_bench_repeat_runs_rounds_and_prints_intervals(sim_server, tmp_path):
    server = sim_server()
    archive = tmp_path / "archive"
    out = run_cli(
        "bench", "--client", "local", "--url", server.url, "--concurrency", "1,4",
        "--num-prompts", "4", "--output-len", "16", "--repeat", "3", "--archive", str(archive),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    [host] = list(archive.iterdir())
    [run_dir] = list(host.iterdir())
    rows = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    # rounds: 1,4, 1,4, 1,4 (not 1,1,1, 4,4,4)
    assert [(r["max_concurrency"], r["repeat"]) for r in rows] == [
        (1, 1), (4, 1), (1, 2), (4, 2), (1, 3), (4, 3),
    ]  # fmt: skip
    assert (run_dir / "requests-c4-r3.jsonl").exists() and (run_dir / "requests-c4.jsonl").exists()
    assert "C=4, 3 repeats, mean [95% CI]: output tok/s" in out.stdout
    compared = run_cli("compare", run_dir.name, run_dir.name, "--archive", str(archive))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "1.00x [" in compared.stdout and "n.s." in compared.stdout
    # the runner's percentiles are reproduced from the archived requests, so each gets its
    # resampled interval (issue 67.4): closed loop here, open loop (latency from when each
    # request was due) below
    _every_percentile_has_its_interval(run_dir)
    out = run_cli(
        "bench", "--client", "local", "--url", server.url, "--concurrency", "2",
        "--request-rate", "40", "--num-prompts", "6", "--output-len", "8", "--repeat", "3",
        "--archive", str(archive),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    [open_loop] = [d for d in host.iterdir() if d != run_dir]
    _every_percentile_has_its_interval(open_loop)


def _every_percentile_has_its_interval(run_dir):
    from gpufleet.report import catalogue, select

    percentiles = {k for k in catalogue.interval_keys() if catalogue.quantile_of(k)}
    for c, figures in select.load_arm("a", [run_dir]).levels.items():
        assert percentiles <= set(figures.ci), (c, sorted(percentiles - set(figures.ci)))
        assert figures.ci["median_ttft_ms"][1] <= figures.ci["p99_ttft_ms"][1]


def test_resume_runs_the_request_the_sweep_was_started_with(tmp_path, monkeypatch):
    """The sweep's record keeps its request: `--resume` benches with it even when the flags
    are not repeated (or differ), so a resumed sweep measures what it started measuring."""
    from gpufleet.archive.layout import Archive
    from gpufleet.control.bench.request import BenchRequest
    from gpufleet.control.connect.fleet import Fleet
    from gpufleet.control.sweep import sweep_run as sweeps
    from gpufleet.control.sweep.cells import expand
    from gpufleet.control.sweep.experiment import Console, Experiment

    archive = Archive(tmp_path / "a")
    benched = []
    real_run = sweeps.run

    def run(state, setup):
        benched.append(setup.request)
        return real_run(state, setup)

    monkeypatch.setattr(sweeps, "run", run)
    said = []
    exp = Experiment(Fleet([]), Console(said.append, lambda data, path: None))
    arms = expand(["baseline"], [], 1)
    first = BenchRequest([2, 8], num_prompts=6, output_len=8, slo={"ttft_ms": 500.0},
                         seed=3, archive=archive)  # fmt: skip
    state = exp.sweep(["baseline"], arms, "sweep", False, request=first)
    assert state.record.request["num_prompts"] == 6
    exp.sweep(["baseline"], arms, "sweep", True, request=BenchRequest([64], archive=archive))
    assert [r.concurrency for r in benched] == [[2, 8], [2, 8]]
    kept = benched[1]
    assert (kept.num_prompts, kept.output_len, kept.slo, kept.seed) == (6, 8, first.slo, 3)
    assert kept.archive == archive
    assert any(line.startswith("resuming sweep") for line in said)


def test_rehearse_asks_for_the_seeds_experiment(tmp_path):
    """`inv rehearse` (the quick start's command) as typed: its one sweep is baseline vs
    eagle3, interleaved three times, at C=1,10,64 on the rehearsal engine, archived where
    --archive says. The sweep itself is the one every sweep test runs; here it is replaced
    by a line saying what it was asked, so the task's own wiring is what is tested."""
    script = (
        "import json, sys\n"
        "from gpufleet.control.sweep import experiment\n"
        "def sweep(self, profiles, arms, kind, resume, request):\n"
        "    print(json.dumps({'profiles': profiles, 'arms': [a.key for a in arms],\n"
        "        'levels': request.fixed_levels, 'archive': str(request.archive),\n"
        "        'engine': self.launch.engine, 'hosts': self.fleet.names, 'kind': kind}))\n"
        "experiment.Experiment.sweep = sweep\n"
        "from gpufleet.cli.console import program\n"
        "program.run(['gpufleet', *sys.argv[1:]])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, "rehearse", "--archive", str(tmp_path / "a")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    asked = json.loads(out.stdout.splitlines()[0])
    assert asked["profiles"] == ["baseline", "eagle3"] and asked["kind"] == "sweep"
    assert asked["arms"] == ["baseline", "eagle3", "baseline#2", "eagle3#2", "baseline#3",
                             "eagle3#3"]  # fmt: skip
    assert [lv["concurrency"] for lv in asked["levels"]] == [1, 10, 64]
    assert (asked["archive"], asked["engine"], asked["hosts"]) == (
        str(tmp_path / "a"),
        "sim",
        ["sim-h200"],
    )
    assert "rehearsal finished" in out.stdout
