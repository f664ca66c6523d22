"""inv metrics: the exposition checked by promtool, its series bounded, and a real Prometheus
(Debian's package, started here on loopback with its own storage) scraping `--serve` and
answering a PromQL query with the figure `inv compare` prints."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from fleetdata import write_run
from gpufleet.archive.kept import Cell, SweepRecord
from gpufleet.archive.layout import Archive
from gpufleet.archive.store import write_private_file
from helpers import REPO, ended, run_cli

THROUGHPUT = "gpufleet_output_throughput_tokens_per_second"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: apt-get install --no-install-recommends "
                    "prometheus (scripts/test.sh does)")  # fmt: skip
    return path


def _archive(root: Path, old_runs: int) -> None:
    """Three hosts, two profiles, levels 1 and 10; `old_runs` older runs of each before."""
    for host in ("gpu1", "gpu2", "gpu3"):
        for profile, base in (("baseline", 380.0), ("eagle3", 260.0)):
            for n in range(old_runs + 1):
                write_run(root, host, f"2026110{n + 1}T000000Z-{profile}-{host}",
                          {1: base / 6 + n, 10: base + n}, profile=profile,
                          started=f"2026-11-0{n + 1}T00:00:00+00:00")  # fmt: skip


def _textfile(root: Path, out_file: Path) -> tuple[str, str]:
    """`inv metrics --output` of the archive at `root`, checked by promtool: (the textfile,
    what promtool said)."""
    got = run_cli("metrics", "--output", str(out_file), "--archive", str(root))
    assert got.returncode == 0, got.stderr
    text = out_file.read_text()
    check = subprocess.run([_tool("promtool"), "check", "metrics"], input=text,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    return text, check.stdout


def _series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_the_textfile_passes_promtool_and_its_series_are_bounded(tmp_path):
    root = tmp_path / "logs"
    _archive(root, old_runs=0)
    out_file = tmp_path / "gpufleet.prom"
    text, said = _textfile(root, out_file)
    assert not said.strip(), said
    # the bound: hosts x profiles x levels, whatever the archive's history
    assert len(_series(text, THROUGHPUT)) == 3 * 2 * 2
    longer = tmp_path / "longer"
    _archive(longer, old_runs=5)
    got = run_cli("metrics", "--output", str(out_file), "--archive", str(longer))
    assert got.returncode == 0, got.stderr
    text = out_file.read_text()
    series = _series(text, THROUGHPUT)
    assert len(series) == 3 * 2 * 2
    labels = series[0].split("{", 1)[1].split("}", 1)[0]
    assert {kv.split("=")[0] for kv in labels.split(",")} == {
        "host", "profile", "engine", "gpu_model", "concurrency"}  # fmt: skip
    # what changes every round is in one info series per host and profile
    info = _series(text, "gpufleet_run_info")
    assert len(info) == 3 * 2
    assert all('run_id="20261106T' in s for s in info)  # the newest run of each
    assert "gpufleet_runs_left_out 0.0" in text
    assert "gpufleet_requests_completed_total{" in text
    assert "gpufleet_time_to_first_token_median_seconds{" in text
    assert _series(text, "gpufleet_fleet_throughput_ratio")
    assert not [line for line in text.splitlines() if line.startswith("gpufleet_sweep_cells{")]


def test_a_running_sweep_shows_its_progress(tmp_path):
    root = tmp_path / "logs"
    _archive(root, old_runs=0)
    cells = {"baseline": {h: Cell(status=s) for h, s in
                          (("gpu1", "done"), ("gpu2", "done"), ("gpu3", "benching"))},
             "eagle3": {h: Cell() for h in ("gpu1", "gpu2", "gpu3")}}  # fmt: skip
    began = float(int(time.time()) - 120)
    state = SweepRecord(sweep_id="s1", profiles=["baseline", "eagle3"],
                        hosts=["gpu1", "gpu2", "gpu3"], concurrency=[1, 10], cells=cells,
                        created_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00",
                                                 time.gmtime(began)))  # fmt: skip
    write_private_file(Archive(root).sweep_state("s1"), state.to_json().encode())
    from gpufleet.fleet.openmetrics import sweep_progress

    families = {f.name: f for f in sweep_progress(Archive(root), now=began + 120)}
    done = [s for s in families["gpufleet_sweep_cells"].samples if s.labels["status"] == "done"]
    assert done[0].value == 2
    (eta,) = families["gpufleet_sweep_eta_seconds"].samples
    assert eta.value == pytest.approx(120 / 2 * 4)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _series_held(prom_port: int, since: float) -> tuple[int, int]:
    """(figure series, info series) Prometheus holds since `since`: every label set it
    stored, stale ones too (what grows the database), not only those scraped last."""
    url = f"http://127.0.0.1:{prom_port}/api/v1/series?" + urllib.parse.urlencode(
        {"match[]": '{__name__=~"gpufleet_.+"}', "start": f"{since:.0f}"}
    )
    names = [s["__name__"] for s in _get_json(url)["data"]]
    info = sum(n == "gpufleet_run_info" for n in names)
    return len(names) - info, info


def _wait_for(prom: subprocess.Popen, server: subprocess.Popen, url: str) -> list:
    deadline, result = time.monotonic() + 90, []
    while time.monotonic() < deadline and not result:
        assert prom.poll() is None, prom.stderr.read()[-2000:] if prom.stderr else ""
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        try:
            result = _get_json(url)["data"]["result"]
        except OSError:
            pass
        if not result:
            time.sleep(0.5)
    return result


def test_a_real_prometheus_scrapes_the_figure_compare_prints(tmp_path):
    """The PromQL figure equals compare's; then two more rounds (new runs, a new engine
    version) leave the series Prometheus holds as they were after the first: a round
    replaces values, it adds no series (only the info series, one per host and profile,
    takes the new run id)."""
    from gpufleet.sim.sshd import free_port

    prometheus = _tool("prometheus")
    root = tmp_path / "logs"
    write_run(root, "gpu1", "r-base", {1: 60.123456789, 10: 383.987654321}, profile="baseline")
    write_run(root, "gpu1", "r-eagle", {1: 80.5, 10: 260.25}, profile="eagle3")
    compared = run_cli("compare", "baseline", "eagle3", "--format", "json", "--no-plots",
                       "--archive", str(root))  # fmt: skip
    assert compared.returncode == 0, compared.stderr
    json_text = compared.stdout[: compared.stdout.rindex("}") + 1]
    figure = json.loads(json_text)["gpu1"]["levels"]["10"]["baseline"]["output_throughput"]
    table = run_cli("compare", "baseline", "eagle3", "--no-plots", "--archive", str(root))
    assert any(line.split()[:2] == ["10", f"{figure:.0f}"] for line in table.stdout.splitlines())

    began = time.time() - 5
    port, prom_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "metrics", "--serve", "--port", str(port),
         "--archive", str(root)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpufleet\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    prom = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    api = f"http://127.0.0.1:{prom_port}/api/v1/query?"
    query = f'{THROUGHPUT}{{host="gpu1",profile="baseline",concurrency="10"}}'
    try:
        result = _wait_for(prom, server, api + urllib.parse.urlencode({"query": query}))
        assert result, "Prometheus never scraped the figure"
        (sample,) = result
        assert float(sample["value"][1]) == figure
        assert sample["metric"]["job"] == "gpufleet"
        assert "run_id" not in sample["metric"] and "engine_version" not in sample["metric"]
        targets = _get_json(f"http://127.0.0.1:{prom_port}/api/v1/targets")
        assert targets["data"]["activeTargets"][0]["health"] == "up"
        held = [_series_held(prom_port, began)]
        for n in (2, 3):  # two more rounds: new runs of both profiles, a new engine
            for profile, base in (("baseline", 380.0), ("eagle3", 260.0)):
                write_run(root, "gpu1", f"r{n}-{profile}", {1: base / 6 + n, 10: base + n},
                          profile=profile, engine_version=f"0.5.{23 + n}",
                          started=f"2026-11-0{n}T00:00:00+00:00")  # fmt: skip
            info = f'gpufleet_run_info{{run_id="r{n}-eagle3"}}'
            assert _wait_for(prom, server, api + urllib.parse.urlencode({"query": info}))
            figures = _wait_for(prom, server, api + urllib.parse.urlencode(
                {"query": query.replace("}", "} == " + repr(380.0 + n))}))  # fmt: skip
            assert figures, f"round {n}'s figure was never scraped"
            held.append(_series_held(prom_port, began))
        print(f"series held after each round (figures, info): {held}")
        assert [f for f, _ in held] == [held[0][0]] * 3, held
        assert [i for _, i in held] == [2, 4, 6], held  # one per host and profile a round
    finally:
        for proc in (prom, server):
            ended(proc)


def test_a_suspect_host_is_exported_with_bounded_labels(tmp_path):
    """A host off the fleet in one round with nothing recorded differing is `inv fleet`'s
    suspect: the exposition says so (gpufleet_fleet_suspect 1 at its levels, 0 elsewhere),
    with the figures' bounded labels; a second round that agrees names it instead."""
    from fleetdata import fleet_archive

    root = tmp_path / "logs"
    fleet_archive(root, 6, slow={"gpu02": 0.8}, power_limit_w=700.0)
    out_file = tmp_path / "gpufleet.prom"
    text, _ = _textfile(root, out_file)
    series = _series(text, "gpufleet_fleet_suspect")
    assert len(series) == 6 * 3
    up = [s for s in series if s.endswith(" 1.0")]
    assert len(up) == 3 and all('host="gpu02"' in s for s in up), up
    labels = up[0].split("{", 1)[1].split("}", 1)[0]
    assert {kv.split("=")[0] for kv in labels.split(",")} == {
        "host", "profile", "engine", "gpu_model", "concurrency"}  # fmt: skip
    assert 'gpu_model="NVIDIA H200"' in up[0] and 'engine="sglang"' in up[0]
    fleet_archive(root, 6, slow={"gpu02": 0.8}, power_limit_w=700.0, day=2, seed=1)
    run_cli("metrics", "--output", str(out_file), "--archive", str(root))
    text = out_file.read_text()
    assert not [s for s in _series(text, "gpufleet_fleet_suspect") if s.endswith(" 1.0")]
    named = [s for s in _series(text, "gpufleet_fleet_outlier") if s.endswith(" 1.0")]
    assert len(named) == 3 and all('host="gpu02"' in s for s in named)


def test_a_failed_level_exports_its_failed_requests(tmp_path):
    """Issue 79, adversarial pass: a level is `failed` where any request failed, and only
    `ok` levels were exported, so gpufleet_requests_failed_total never read above 0: the
    worst outcome vanished from the exposition. Counts now count every level; its figures
    stay those of levels that did not fail."""
    root = tmp_path / "logs"
    write_run(root, "gpu1", "20261101T000000Z-baseline-gpu1", {1: 60.0, 10: 380.0},
              overrides={10: {"completed": 37, "failed": 3, "level_status": "failed"}})  # fmt: skip
    out_file = tmp_path / "gpufleet.prom"
    got = run_cli("metrics", "--output", str(out_file), "--archive", str(root))
    assert got.returncode == 0, got.stderr
    text = out_file.read_text()
    failed = {s.split('concurrency="')[1].split('"')[0]: s.rsplit(" ", 1)[1]
              for s in _series(text, "gpufleet_requests_failed_total")}  # fmt: skip
    assert failed == {"1": "0.0", "10": "3.0"}, failed
    assert 'concurrency="10"' in " ".join(_series(text, "gpufleet_requests_completed_total"))
    assert 'concurrency="10"' not in " ".join(_series(text, THROUGHPUT))
