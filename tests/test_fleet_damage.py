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

import pytest

from fleetdata import fleet_archive
from gpufleet.archive.layout import Archive
from gpufleet.errors import UserError
from gpufleet.fleet import history, outliers
from gpufleet.fleet.index import open_index
from helpers import REPO, ended, run_cli, unwrap

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
        # the index itself damaged inside (it opens, its rows do not read): answered 500
        for damage in ("UPDATE runs SET fingerprint = '{bad' WHERE host = 'gpu01'",
                       "DROP TABLE levels"):  # fmt: skip
            _damage_index(root, damage)
            text = scrape()
            assert "gpufleet_runs_left_out 1.0" in text and 'host="gpu01"' in text
    finally:
        ended(server)


def _hostile(root, bad: str) -> None:
    """gpu03's results.jsonl with `bad` as every level's throughput, its checksum updated:
    a file that verifies and parses, holding what no measurement gives."""
    import re

    from gpufleet.archive import store

    run = root / "gpu03" / RUN
    text = re.sub(r'"output_throughput": [0-9.e+]+', f'"output_throughput": {bad}',
                  (run / "results.jsonl").read_text())  # fmt: skip
    (run / "results.jsonl").write_text(text)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["files"]["results.jsonl"] = store.sha256(text.encode())
    (run / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "1e999", "-5", "1e308"])
def test_a_figure_no_measurement_gives_is_left_out_by_name(tmp_path, bad):
    """NaN, an infinity, a negative or a huge throughput (a checksum that agrees): the host
    was shown as '-' with no word (NaN, inf, -5) or called a suspect at 10^305x (1e308)."""
    fleet_archive(tmp_path, 6, power_limit_w=700.0)
    _hostile(tmp_path, bad)
    view = _view(tmp_path)
    assert "gpu03" not in view.runs and view.suspect == [] and view.named == []
    (why,) = view.left_out
    assert why.startswith(f"gpu03: run {RUN}: results.jsonl:1: output_throughput is ")
    assert "(expected a finite figure from 0 to 1e+12)" in why
    with open_index(Archive(tmp_path)) as index, pytest.raises(UserError) as said:
        history.histories(index, "gpu03")  # its only run: named, not "no run of that host"
    assert str(said.value).endswith(f"; 1 run(s) left out as damaged: {why}")


def test_a_hostile_figure_never_reaches_the_metrics_or_the_json(tmp_path):
    root = tmp_path / "logs"
    fleet_archive(root, 6, power_limit_w=700.0)
    _hostile(root, "NaN")
    out = tmp_path / "m.prom"
    got = run_cli("metrics", "--output", str(out), "--archive", str(root))
    assert got.returncode == 0, got.stderr
    text = out.read_text()
    assert "NaN" not in text and 'host="gpu03"' not in text
    assert "gpufleet_runs_left_out 1.0" in text
    got = run_cli("fleet", "--format", "json", "--archive", str(root))
    assert got.returncode == 0, got.stderr
    assert "NaN" not in got.stdout
    assert json.loads(got.stdout)[0]["left_out"][0].startswith("gpu03: run ")


def test_a_level_with_no_figure_is_said_not_shown_as_a_bare_dash(tmp_path):
    fleet_archive(tmp_path, 6, power_limit_w=700.0)
    _hostile(tmp_path, "0")
    view = _view(tmp_path)
    assert view.left_out == [] and view.suspect == []
    assert view.unjudged == [f"gpu03 at C={c}: not judged: no output tok/s above 0"
                             for c in (1, 10, 64)]  # fmt: skip


def test_every_run_damaged_is_said_when_nothing_is_left_to_show(tmp_path):
    root = tmp_path / "logs"
    fleet_archive(root, 4)
    for path in root.glob("gpu*/*/results.jsonl"):
        path.write_text("garbage\n")
    got = run_cli("fleet", "--archive", str(root))
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert got.stderr.count("\n") == 1, got.stderr
    assert "no profile was run on two or more hosts" in got.stderr
    assert "; 4 run(s) left out as damaged: gpu00: run " in got.stderr
    assert "and 1 more (inv runs --verify)" in got.stderr


def test_a_mistyped_archive_makes_no_folder(tmp_path):
    typo = tmp_path / "lgos"
    for args in (["fleet"], ["history"], ["metrics", "--output", str(tmp_path / "m.prom")]):
        got = run_cli(*args, "--archive", str(typo))
        assert "Traceback" not in got.stderr, got.stderr
    assert not typo.exists()


def test_a_symlinked_run_or_host_folder_is_not_served_as_this_hosts(tmp_path):
    """A run folder (or a host folder) that is a symbolic link served another host's run
    under this host's name, and `inv runs --verify` passed it; a results.jsonl linked to
    /dev/zero would never end a read."""
    root = tmp_path / "logs"
    fleet_archive(root, 4)
    other = tmp_path / "elsewhere"
    fleet_archive(other, 1, power_limit_w=300.0)
    (root / "gpu03" / "20261105T000000Z-baseline-gpu03").symlink_to(
        next((other / "gpu00").iterdir())
    )
    (root / "gpu09").symlink_to(other / "gpu00")
    zero = root / "gpu02" / "20261101T000000Z-baseline-gpu02" / "results.jsonl"
    zero.unlink()
    zero.symlink_to("/dev/zero")
    view = _view(root)
    assert sorted(view.runs) == ["gpu00", "gpu01", "gpu03"]
    assert [w.split(":")[0] for w in view.left_out] == ["gpu02", "gpu03", "gpu09"]
    assert "results.jsonl: not a regular file (a link or a device): not read" in view.left_out[0]
    assert "20261105T000000Z-baseline-gpu03: a symbolic link (to " in view.left_out[1]
    assert "gpu09: a symbolic link (to " in view.left_out[2]
    verify = run_cli("runs", "--verify", "--archive", str(root), timeout=60)
    assert verify.returncode == 1
    assert verify.stdout.count("a symbolic link (to ") == 2, verify.stdout
    assert "results.jsonl: not a regular file" in verify.stdout


def _damage_index(root, sql: str) -> None:
    import sqlite3

    conn = sqlite3.connect(root / "index" / "runs.sqlite3")
    conn.execute(sql)
    conn.commit()
    conn.close()


def test_an_index_damaged_inside_is_rebuilt_not_a_traceback(tmp_path):
    """An index file that opens but whose rows do not read (not JSON, a table gone): fleet
    and history exited 1 with a traceback; now the index is rebuilt from the run files,
    with a note, and the views answer."""
    root = tmp_path / "logs"
    fleet_archive(root, 4, slow={"gpu01": 0.8})
    for sql in ("UPDATE levels SET row = '[1' WHERE host = 'gpu02'", "DROP TABLE runs"):
        assert run_cli("runs", "--reindex", "--archive", str(root)).returncode == 0
        _damage_index(root, sql)
        got = run_cli("fleet", "--archive", str(root))
        assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
        assert "gpu01 is 2" in unwrap(got.stdout)
        assert (
            "its contents do not read" in got.stderr and "rebuilt from the run files" in got.stderr
        )
        _damage_index(root, sql)
        got = run_cli("history", "--archive", str(root))
        assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
        assert "gpu02 baseline: newest" in got.stdout


def test_a_control_character_from_the_archive_never_reaches_the_terminal(tmp_path):
    """A host folder named with an escape sequence or a newline, and a manifest whose
    engine version holds one, reached the table, the sentences, summary.md and the exit
    line raw (the terminal obeyed them); now each run is left out, its name escaped."""
    from fleetdata import write_run

    root = tmp_path / "logs"
    fleet_archive(root, 4)
    write_run(root, "red\x1b[31mX", "20261101T000000Z-baseline-red", {1: 48.0, 10: 300.0})
    write_run(root, "nl\nx", "20261101T000000Z-baseline-nl", {1: 48.0, 10: 300.0})
    write_run(root, "gpu09", "20261101T000000Z-baseline-gpu09", {1: 48.0, 10: 300.0},
              engine_version="0.5.23\x1b[2J")  # fmt: skip
    for args in (["fleet"], ["fleet", "--format", "md"], ["history"]):
        got = run_cli(*args, "--archive", str(root))
        assert got.returncode == 0, got.stderr
        assert "\x1b" not in got.stdout + got.stderr and "nl\nx" not in got.stdout
        assert "left out: red\\x1b[31mX: run 20261101T000000Z-baseline-red: its folder name " \
               "holds a control character: not read" in got.stdout  # fmt: skip
        assert "left out: nl\\nx: run " in got.stdout
        assert "gpu09: run 20261101T000000Z-baseline-gpu09: manifest.json: engine version " \
               "holds a control character (0.5.23\\x1b[2J): not read" in got.stdout  # fmt: skip
    summary = (root / "compare" / "fleet-baseline" / "summary.md").read_text()
    assert "\x1b" not in summary and "nl\nx" not in summary
