"""Issue 80, bullet 2, adversarial pass: what a run's folder on the host may hold that the
fetch must not trust. A run's files are named by whoever wrote them (a runner, a process
it left, the run_as user): a name the archive would refuse (its own `manifest.json`), a
name carrying a newline or an escape, thousands of files. Each is driven through `inv
bench` over the real loopback sshd; a fetch killed mid-file (SIGKILL) leaves its staging
folder, which the next write of the host's archive removes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import test_fetch_streamed
from gpufleet.archive.incoming import Incoming
from gpufleet.control.connect.base import PIECE
from gpufleet.errors import HostError
from helpers import REPO, run_cli
from test_fetch_streamed import _bench, _planting
from test_reliability import record

session = test_fetch_streamed.session  # each connection's open session, a fixture

MANY = 3000


@pytest.mark.slow(minutes=2)
def test_files_a_run_may_not_bring_stay_on_the_host_and_the_rest_is_archived(fleet, tmp_path):
    """A file named as the archive's manifest, names with a newline and an escape, and
    3000 empty files: before, the first refused the whole run (nothing archived), the
    newline forged a line of the warning, and every empty file was fetched."""
    profile = fleet.profile("names", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr

    def plant(run: Path, _stop) -> None:
        (run / "manifest.json").write_text('{"files": {}}')
        (run / "two\nh0: FAILED: forged").write_text("x")
        (run / "esc\x1b[2Jape").write_text("x")
        for i in range(MANY):
            (run / f"empty-{i:05d}").touch()

    thread, planted, _ = _planting(fleet.workdir("h0") / "runs", plant)
    try:
        began = time.monotonic()
        out = fleet.cli(*_bench(fleet, tmp_path, profile))
        took = time.monotonic() - began
        thread.join()
        said = out.stdout + out.stderr
        assert out.returncode == 0 and planted, said
        archived = tmp_path / "archive" / "h0" / planted[0].name
        assert (archived / "results.jsonl").stat().st_size > 0, said
        kept = sorted(p.name for p in archived.iterdir())
        record("fetch_hostile names", {"files_archived": len(kept), "bench_s": round(took, 1)})
        assert len(kept) < 300, len(kept)  # the run's own files, not the 3000
        assert not [n for n in kept if "\n" in n or "\x1b" in n]
        assert "\nh0: FAILED: forged" not in said and "two\\nh0: FAILED: forged" in said, said
        assert "esc\\x1b[2Jape" in said
        named, many = (archived / "not-fetched.txt").read_text().splitlines()
        assert named.startswith("not fetched, named as the archive keeps no file") and all(
            x in named for x in ("manifest.json", "two\\nh0: FAILED: forged", "esc\\x1b[2Jape")
        ), named
        assert many.startswith("not fetched, past the archive's 256 files a run: empty-")
        assert len(many) < 500 and many.count(", ") == 10 and " and 2" in many, many
        assert named in said and many in said
        out = run_cli("runs", "--verify", "--reindex", "--archive", str(tmp_path / "archive"))
        assert out.returncode == 0 and archived.name in out.stdout, out.stdout + out.stderr
    finally:
        fleet.cli("stop", "--hosts", "h0", "--grace", "1")


@pytest.mark.slow(minutes=2)
def test_a_fetch_killed_mid_file_leaves_a_folder_the_next_write_removes(fleet, tmp_path):
    """`inv bench` SIGKILLed while it fetches a 100 MiB file: its `.tmp-RUN-PID` folder
    stays (nothing can remove it then); before, it stayed for good, never listed, never
    removed. Now a run archived on that host once it has been left 10 minutes (its writer
    may be on another machine sharing the archive) removes it, said once."""
    profile = fleet.profile("killed", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    data = os.urandom(100 << 20)
    hosts = tmp_path / "archive" / "h0"

    def plant(run: Path, _stop) -> None:
        (run / "big.bin").write_bytes(data)

    thread, _, _ = _planting(fleet.workdir("h0") / "runs", plant)
    argv = [sys.executable, "-m", "gpufleet", *_bench(fleet, tmp_path, profile),
            "--inventory", str(fleet.inventory)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        staged: list[Path] = []
        while time.monotonic() < deadline and proc.poll() is None:
            staged = list(hosts.glob(".tmp-*/.big.bin.part")) if hosts.exists() else []
            if staged and staged[0].stat().st_size > (1 << 20):
                break
            time.sleep(0.01)
        assert staged, "the fetch of big.bin was never seen"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        thread.join()
        [left] = [p for p in hosts.iterdir() if p.name.startswith(".tmp-")]
        left_mib = sum(p.stat().st_blocks * 512 for p in left.iterdir()) / (1 << 20)
        out = run_cli("runs", "--verify", "--archive", str(tmp_path / "archive"))
        assert out.returncode == 0, out.stdout + out.stderr
        out = fleet.cli(*_bench(fleet, tmp_path, profile))  # at once: it may be another's
        assert out.returncode == 0 and left.exists(), out.stdout + out.stderr
        hour_ago = time.time() - 3600  # as if killed an hour ago
        for path in [*left.iterdir(), left]:
            os.utime(path, (hour_ago, hour_ago))
        out = fleet.cli(*_bench(fleet, tmp_path, profile))
        said = out.stdout + out.stderr
        assert out.returncode == 0, said
        assert not left.exists(), said
        assert said.count(left.name) == 1, said
        record("fetch_hostile killed", {"left_mib": round(left_mib, 1)})
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        fleet.cli("stop", "--hosts", "h0", "--grace", "1")


@pytest.mark.unit
def test_any_name_a_host_lists_is_taken_whole_or_said_in_a_clean_line(tmp_path):
    """A fuzz of names built from the characters a filesystem takes: what `fetchable` keeps
    the staging takes (no name refuses a whole run), and every line it says is one line
    with no control character, of bounded length, whatever was listed."""
    import random

    from gpufleet.archive.layout import Archive
    from gpufleet.archive.store import RunStaging
    from gpufleet.control.bench import intake
    from gpufleet.terminal import CONTROL

    rng = random.Random(80)
    alphabet = [chr(c) for c in range(1, 0xA0) if c != ord("/")] + ["\u202e", "\u2066", "é"]
    names = {"manifest.json", "x" * 256, "."} | {
        "".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(2000)
    }
    listed = [{"name": n, "size": 0} for n in sorted(names)]
    answer = {"status": "done", "reason": None, "files": listed, "run_dir": "/r\nx",
              "tail": None, "offset": 0}  # fmt: skip
    kept, said = intake.fetchable(answer)
    assert 0 < len(kept) <= intake.FETCH_COUNT and said
    for line in said:
        assert "\n" not in line and not CONTROL.search(line) and len(line) < 4000, line
    with RunStaging(Archive(tmp_path), "h0", "r1") as staging:
        for f in kept:
            staging.add(f["name"], b"")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder every connection's session can read (the srun node is this machine)."""
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-hostile-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder)


@pytest.mark.slow(minutes=1)
def test_a_pipe_where_a_file_was_listed_is_refused_by_each_connection(session, scratch):
    """A run's file swapped for a named pipe after it was listed: over SSH, SFTP opened
    it and the server blocked in its open for good (the fetch hung past 20 s, for ever);
    each connection now refuses it in one line."""
    os.mkfifo(scratch / "pipe")
    box: list[object] = []

    def fetch() -> None:
        try:
            with open(scratch / "got", "wb") as fh:
                box.append(session.download_to(str(scratch / "pipe"), Incoming(fh, 100), 100))
        except HostError as exc:
            box.append(exc)

    began = time.monotonic()
    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    thread.join(20)
    hung = thread.is_alive()
    if hung:  # unblock it: a writer opens the pipe
        with open(scratch / "pipe", "wb"):
            thread.join(10)
    assert not hung, "the fetch of a pipe blocked"
    [refused] = box
    assert isinstance(refused, HostError) and "not a regular file" in str(refused), refused
    assert str(scratch / "pipe") in str(refused)
    record(f"fetch_hostile pipe {session.host.connection}",
           {"refused_s": round(time.monotonic() - began, 2)})  # fmt: skip


def _descendants(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children] + [d for c in children for d in _descendants(int(c))]


@pytest.mark.slow(minutes=2)
@pytest.mark.parametrize("session", ["ssh"], indirect=True)
def test_an_sftp_server_that_stops_answering_mid_file_fails_the_fetch_in_bounded_time(
    session, scratch, sshd_hosts
):
    """The host's SSH server stopped (SIGSTOP) after the first piece of a file: before, the
    fetch waited on the SFTP answer for good; now it is refused after STALL_S in one line,
    and the next fetch over the same session (the server running again) works."""
    from gpufleet.control.connect.ssh import STALL_S

    data = os.urandom(4 * PIECE)
    (scratch / "f").write_bytes(data)
    stopped: list[int] = []

    class Stops(Incoming):
        def write(self, piece: bytes) -> int:
            if not stopped:
                stopped.extend(_descendants(sshd_hosts[0].proc.pid))
                for pid in stopped:
                    os.kill(pid, signal.SIGSTOP)
            return super().write(piece)

    began = time.monotonic()
    try:
        with open(scratch / "got", "wb") as fh, pytest.raises(HostError) as refused:
            session.download_to(str(scratch / "f"), Stops(fh, len(data)), len(data))
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    took = time.monotonic() - began
    assert stopped and f"answered nothing for {STALL_S} s" in str(refused.value)
    assert STALL_S <= took < 3 * STALL_S, took
    with open(scratch / "again", "wb") as fh:
        assert session.download_to(str(scratch / "f"), Incoming(fh, len(data)), len(data))
    assert (scratch / "again").read_bytes() == data
    record("fetch_hostile stall", {"refused_s": round(took, 1)})


@pytest.mark.unit
def test_a_file_the_archive_writes_itself_is_never_taken_from_the_host():
    """A run's folder holding `not-fetched.txt` (or a summary) where nothing was refused:
    before, it was archived as the archive's own note (a forged "not fetched" line)."""
    from gpufleet.control.bench import intake

    files = [{"name": n, "size": 5} for n in ("results.jsonl", *sorted(intake.WRITTEN_HERE))]
    answer = {"status": "done", "reason": None, "files": files, "run_dir": "/r", "tail": None,
              "offset": 0}  # fmt: skip
    kept, [said] = intake.fetchable(answer)
    assert [f["name"] for f in kept] == ["results.jsonl"]
    assert said.startswith("not fetched, named as the archive keeps no file") and all(
        n in said for n in intake.WRITTEN_HERE
    ), said
