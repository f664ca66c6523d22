"""A damaged archive: nothing damaged is served, nothing damaged stops the rest. The fleet
index tracks every file it reads (results.jsonl as well as the manifest), checks
results.jsonl against the manifest's checksum whenever it reads a run (every file at
--reindex), and keeps a run that fails aside with the reason; fleet, history and metrics
leave it out by name, `inv metrics --serve` keeps answering, `inv runs --verify` fails it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

from fleetdata import fleet_archive
from gpufleet.archive.layout import Archive
from gpufleet.fleet import outliers
from gpufleet.fleet.index import open_index
from helpers import REPO, run_cli, unwrap

RUN = "20261101T000000Z-baseline-gpu03"


def _results(root):
    return root / "gpu03" / RUN / "results.jsonl"


def _edit_keeping_size_and_mtime(path, old: bytes, new: bytes) -> None:
    """A figure changed in place (752 -> 352), size and mtime kept: only a checksum sees it."""
    st = path.stat()
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    path.write_bytes(data.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _view(root, **kw):
    with open_index(Archive(root), **kw) as index:
        return outliers.fleet_view(index, "baseline")


def test_a_truncated_results_file_is_left_out_by_name_not_served(tmp_path):
    fleet_archive(tmp_path, 6)
    assert _view(tmp_path).left_out == []  # indexed whole
    path = _results(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2].rsplit(b"\n", 1)[0] + b"\n")
    view = _view(tmp_path)
    assert "gpu03" not in view.runs
    assert view.left_out == [f"gpu03: run {RUN}: does not verify: results.jsonl: checksum mismatch"]


def test_a_same_size_edit_is_found_at_reindex_and_the_host_not_named(tmp_path):
    fleet_archive(tmp_path, 8)
    assert _view(tmp_path).named == []
    row = json.loads(_results(tmp_path).read_text().splitlines()[2])
    figure = f'"output_throughput": {row["output_throughput"]}'.encode()
    slower = figure.replace(b'"output_throughput": 7', b'"output_throughput": 3')
    _edit_keeping_size_and_mtime(_results(tmp_path), figure, slower)
    assert _view(tmp_path).left_out == []  # the index cannot see it without a checksum...
    view = _view(tmp_path, rebuild=True)  # ...and --reindex checks every file
    assert view.named == [] and view.suspect == [] and "gpu03" not in view.runs
    assert view.left_out == [f"gpu03: run {RUN}: does not verify: results.jsonl: checksum mismatch"]


def test_a_folder_without_its_manifest_stops_no_view_and_verify_fails_it(tmp_path):
    root = tmp_path / "logs"
    fleet_archive(root, 4, slow={"gpu01": 0.8})
    lost = root / "gpu03" / RUN / "manifest.json"
    lost.rename(tmp_path / "kept-manifest.json")
    why = f"gpu03: run {RUN}: a run folder without its manifest.json"
    for args in (["runs", "--reindex"], ["fleet"], ["history"], ["fleet", "--format", "json"]):
        got = run_cli(*args, "--archive", str(root))
        assert got.returncode in (0, 1), (args, got.stderr)
        assert "Traceback" not in got.stderr
        if args[0] != "runs":
            assert why in got.stdout, (args, got.stdout)
    fleet = run_cli("fleet", "--archive", str(root))
    assert "gpu01 is 20.8% slower" in unwrap(fleet.stdout) and fleet.returncode == 1
    metrics = run_cli("metrics", "--output", str(tmp_path / "m.prom"), "--archive", str(root))
    assert metrics.returncode == 0, metrics.stderr
    text = (tmp_path / "m.prom").read_text()
    assert "gpufleet_runs_left_out 1.0" in text and 'host="gpu02"' in text
    verify = run_cli("runs", "--verify", "--archive", str(root))
    assert verify.returncode == 1
    assert "no manifest.json" in verify.stdout and RUN in verify.stdout
    assert "1 run(s) failed verification" in verify.stderr


def test_metrics_serve_keeps_serving_when_a_run_is_damaged_meanwhile(tmp_path):
    """Damage a run while `inv metrics --serve` runs: every scrape still answers 200 with the
    other runs' figures and a gauge of runs left out (it answered 500 with a traceback)."""
    from gpufleet.sim.sshd import free_port

    root = tmp_path / "logs"
    fleet_archive(root, 4)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "metrics", "--serve", "--port", str(port),
         "--archive", str(root)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def scrape() -> str:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    assert r.status == 200
                    return r.read().decode()
            except ConnectionError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.3)
            except urllib.error.URLError as exc:
                assert isinstance(exc.reason, ConnectionError), exc
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.3)

    try:
        assert "gpufleet_runs_left_out 0.0" in scrape()
        (root / "gpu03" / RUN / "manifest.json").write_text("{not json")
        _results(root).write_text("truncated")
        text = scrape()
        assert "gpufleet_runs_left_out 1.0" in text
        assert 'host="gpu02"' in text and 'host="gpu03"' not in text
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
