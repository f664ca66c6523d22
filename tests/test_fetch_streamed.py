"""Issue 80, bullet 2 (files fetched into the archive): a run's files are streamed from the
host to the archive's staging folder a piece at a time, counted as they come against the
size they were listed with and the run's bound, their holes kept (control/bench/intake.py,
archive/incoming.py). Every connection streams its own way (Session._pieces): the census
finds the next connection that does not, and each one is driven over its real transport
(sshd on loopback, a Slurm step, this machine). Over sshd, `inv bench` fetches a run that
holds 100 MiB of data and 480 MiB of holes with its peak memory in tens of MiB; a file that
grows while it is fetched is cut off, named in one line, and nothing of it is archived."""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpufleet.archive.incoming import BLOCK, Incoming, OverLimit
from gpufleet.control.connect.base import PIECE, Session
from gpufleet.control.connect.pool import open_session
from gpufleet.control.inventory import connections
from gpufleet.control.inventory.model import load_inventory
from gpufleet.errors import HostError
from helpers import run_cli
from test_bounded_reads import GROWTH, MIB, _cli_peak
from test_reliability import record


# -- the census: every connection streams, none reads a file whole --------------------------
@pytest.mark.unit
def test_every_connection_streams_a_file_in_pieces_and_none_reads_one_whole():
    """A connection's Session gives a file as pieces (`_pieces`, behind the one
    `download_to` that counts them); a `download` that returns a file's bytes whole is
    what let a fetch cost the control plane a file's size in memory (issue 80)."""
    assert not hasattr(Session, "download")
    for name in connections.names():
        entry = connections.CONNECTIONS[name]
        cls = getattr(importlib.import_module(entry.module), entry.session)
        assert cls._pieces is not Session._pieces, f"connection {name} does not stream"
        assert cls.download_to is Session.download_to, f"connection {name} counts its own way"
        whole = [k.__name__ for k in cls.__mro__ if "download" in vars(k)]
        assert whole == [], f"connection {name}: a whole-file download in {whole}"


@pytest.mark.unit
def test_a_piece_of_zeros_is_a_hole_and_the_bytes_are_counted(tmp_path):
    data = os.urandom(5000) + bytes(3 * BLOCK + 17) + b"end" + bytes(BLOCK)
    with open(tmp_path / "f", "wb") as fh:
        incoming = Incoming(fh, len(data))
        for at in range(0, len(data), 7000):  # pieces that do not fall on the blocks
            incoming.write(data[at : at + 7000])
        digest = incoming.finish()
    assert (tmp_path / "f").read_bytes() == data
    assert digest == hashlib.sha256(data).hexdigest() and incoming.size == len(data)
    assert incoming.written < len(data) - 2 * BLOCK  # the whole blocks of zeros: holes
    with open(tmp_path / "g", "wb") as fh, pytest.raises(OverLimit):
        Incoming(fh, 10).write(b"x" * 11)
    assert (tmp_path / "g").stat().st_size == 0  # refused before a byte was written


# -- each connection, over its real transport ---------------------------------------------
def _inventory(tmp_path: Path, fields: dict) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"h": {"workdir": str(tmp_path / "work"),
                                                    "gpus": {"count": 8, "simulated": True},
                                                    **fields}}}))  # fmt: skip
    return path


@pytest.fixture(params=sorted(connections.names()))
def session(request, tmp_path, host_python) -> Iterator[Session]:
    """An open session of each registered connection, to this machine."""
    name = request.param
    fields: dict = {"connection": name, "python": host_python}
    if name == "ssh":
        sshd = request.getfixturevalue("sshd_hosts")[0]
        keys = request.getfixturevalue("ssh_keys")
        known = tmp_path / "known_hosts"
        known.write_text(sshd.known_hosts_line())
        fields |= {"address": "127.0.0.1", "port": sshd.port, "user": "root",
                   "identity_file": str(keys), "known_hosts": str(known)}  # fmt: skip
    elif name == "srun":
        cluster = request.getfixturevalue("slurm_cluster")
        request.getfixturevalue("monkeypatch").setenv("SLURM_CONF", str(cluster.conf))
        job = cluster.submit("-N1")
        fields |= {"address": cluster.wait_running(job), "slurm_job": job}
        request.addfinalizer(lambda: cluster.cancel(job))
    elif name not in ("local",):
        pytest.fail(f"connection {name}: this test does not know how to reach it yet")
    [host] = load_inventory(_inventory(tmp_path, fields)).select("all")
    opened = open_session(host)
    yield opened
    opened.close()


class Pieces:
    """An Incoming that notes the largest piece it was given."""

    def __init__(self, fh, limit: int) -> None:
        self.incoming = Incoming(fh, limit)
        self.largest = 0

    def write(self, piece: bytes) -> int:
        self.largest = max(self.largest, len(piece))
        return self.incoming.write(piece)


@pytest.mark.slow(minutes=1)
def test_each_connection_streams_a_file_with_a_hole_to_its_bound(session, tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-fetch-", dir="/tmp"))
    try:
        source = folder / "run.bin"
        head, tail = os.urandom(3 * MIB + 5), os.urandom(MIB)
        with open(source, "wb") as fh:
            fh.write(head)
            fh.seek(20 * MIB, os.SEEK_CUR)  # a 20 MiB hole
            fh.write(tail)
        size = source.stat().st_size
        dest = tmp_path / "got"
        with open(dest, "wb") as fh:
            pieces = Pieces(fh, size)
            assert session.download_to(str(source), pieces, size) == size
            digest = pieces.incoming.finish()
        assert digest == hashlib.sha256(source.read_bytes()).hexdigest()
        assert pieces.largest <= PIECE
        assert dest.stat().st_blocks * 512 < 6 * MIB  # the hole kept: 4 MiB of data
        record(f"fetch_streamed {session.host.connection}",
               {"largest_piece_kib": pieces.largest >> 10})  # fmt: skip

        with open(tmp_path / "cut", "wb") as fh:  # listed smaller than it is: it grew
            cut = Pieces(fh, 2 * MIB)
            with pytest.raises(OverLimit):
                session.download_to(str(source), cut, 2 * MIB)
        assert cut.incoming.size <= 2 * MIB

        (folder / "link").symlink_to(source)
        with open(tmp_path / "link", "wb") as fh, pytest.raises(HostError) as refused:
            session.download_to(str(folder / "link"), Pieces(fh, size), size)
        assert "cannot fetch" in str(refused.value) and str(folder / "link") in str(refused.value)
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


# -- inv bench over sshd: the control plane's memory and the archive -----------------------
def _bench(fleet, tmp_path: Path, profile: Path) -> list[str]:
    return ["bench", "--profile", str(profile), "--hosts", "h0", "-c", "1", "--num-prompts", "6",
            "--output-len", "64", "--archive", str(tmp_path / "archive")]  # fmt: skip


def _planting(runs: Path, plant) -> tuple[threading.Thread, list[Path], threading.Event]:
    """A thread that calls `plant(run_dir)` once a new run appears under `runs` (while the
    runner runs, as a runner's leftovers would be); then `stop` ends it."""
    listed = lambda: set(runs.iterdir()) if runs.exists() else set()  # noqa: E731
    before, planted, stop = listed(), [], threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not planted and not stop.is_set() and time.monotonic() < deadline:
            for run in listed() - before:
                planted.append(run)
                plant(run, stop)
            time.sleep(0.02)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread, planted, stop


def _verified(fleet, tmp_path: Path) -> str:
    """`inv runs --verify --reindex`: every file against the manifest, the index rebuilt."""
    out = run_cli("runs", "--verify", "--reindex", "--archive", str(tmp_path / "archive"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert ": 1 runs in " in out.stdout or ": 2 runs in " in out.stdout, out.stdout
    return out.stdout


@pytest.mark.slow(minutes=2)
def test_a_run_of_large_and_sparse_files_costs_the_control_plane_tens_of_mib(fleet, tmp_path):
    """100 MiB of data and three 120 MiB sparse files fetched, a fourth over the run's bound
    left on the host: before, the control plane held every file at once (its peak grew by
    more than the run's size) and the archive held the holes dense."""
    profile = fleet.profile("big", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    runs = fleet.workdir("h0") / "runs"
    data = os.urandom(100 * MIB)

    def plant(run: Path, _stop) -> None:
        (run / "a-data.bin").write_bytes(data)
        for name in ("b-sparse.bin", "c-sparse.bin", "d-sparse.bin", "e-over.bin"):
            with open(run / name, "wb") as fh:
                fh.seek(120 * MIB - 4)
                fh.write(b"end\n")

    try:
        code, said, clean_peak = _cli_peak(fleet, *_bench(fleet, tmp_path, profile))
        assert code == 0, said
        thread, planted, _ = _planting(runs, plant)
        code, said, peak = _cli_peak(fleet, *_bench(fleet, tmp_path, profile))
        thread.join()
        assert code == 0 and planted, said
        grew = peak - clean_peak
        record("fetch_streamed run", {"clean_peak_mib": round(clean_peak / MIB),
                                      "peak_mib": round(peak / MIB),
                                      "growth_mib": round(grew / MIB)})  # fmt: skip
        assert grew < GROWTH, f"{clean_peak / MIB:.0f} -> {peak / MIB:.0f} MiB"
        archived = tmp_path / "archive" / "h0" / planted[0].name
        got = archived / "a-data.bin"
        assert hashlib.sha256(got.read_bytes()).digest() == hashlib.sha256(data).digest()
        for name in ("b-sparse.bin", "c-sparse.bin", "d-sparse.bin"):
            kept = archived / name
            assert kept.stat().st_size == 120 * MIB and kept.stat().st_blocks * 512 < MIB, name
        line = ("not fetched, over the archive's bounds (128 MiB a file, 512 MiB a run): "
                f"e-over.bin ({120 * MIB} bytes); left on the host in {planted[0].resolve()}")  # fmt: skip
        assert line in said and (archived / "not-fetched.txt").read_text() == line + "\n"
        assert not (archived / "e-over.bin").exists()
        assert archived.name in _verified(fleet, tmp_path)
    finally:
        fleet.cli("stop", "--hosts", "h0", "--grace", "1")


@pytest.mark.slow(minutes=1)
def test_a_file_that_grows_while_it_is_fetched_is_cut_off_and_refused(fleet, tmp_path):
    """A process the run left keeps writing a file after the run ended: it is listed at one
    size and more comes while it is fetched. Before, it was archived as whatever came (and
    a link beside it was followed and archived)."""
    profile = fleet.profile("grow", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr

    def plant(run: Path, stop: threading.Event) -> None:
        def write() -> None:  # 3 MiB/s, never past 100 MiB (under the file bound)
            with open(run / "grows.log", "ab") as fh:
                for _ in range(1600):
                    if stop.is_set():
                        return
                    fh.write(b"x" * (64 << 10))
                    fh.flush()
                    time.sleep(0.02)

        threading.Thread(target=write, daemon=True).start()
        (run / "elsewhere.log").symlink_to("/etc/hostname")  # a link: never fetched

    thread, planted, stop = _planting(fleet.workdir("h0") / "runs", plant)
    try:
        out = fleet.cli(*_bench(fleet, tmp_path, profile))
        stop.set()
        thread.join()
        said = out.stdout + out.stderr
        assert out.returncode == 0 and planted, said
        archived = tmp_path / "archive" / "h0" / planted[0].name
        shown = f"left on the host in {planted[0].resolve()}"
        [line] = [x for x in (archived / "not-fetched.txt").read_text().splitlines()]
        assert line.startswith("not fetched, grew while it was fetched (cut off, nothing kept): "
                               "grows.log (listed with ") and line.endswith(shown), line  # fmt: skip
        assert "grows.log (listed with" in said
        assert not (archived / "grows.log").exists()
        assert not (archived / "elsewhere.log").exists()
        assert not [p for p in archived.iterdir() if p.name.startswith(".")]
        assert (archived / "results.jsonl").stat().st_size > 0  # the rest of the run is there
        assert archived.name in _verified(fleet, tmp_path)
        assert not [p for p in archived.parent.iterdir() if p.name.startswith(".tmp-")]
    finally:
        stop.set()
        fleet.cli("stop", "--hosts", "h0", "--grace", "1")


@pytest.mark.unit
def test_a_record_read_back_whole_is_bounded_and_a_refused_file_leaves_nothing(tmp_path):
    """The records the manifest is built from are read back whole, each to 16 MiB; a file
    refused while it came leaves neither itself nor its temporary name in the staging."""
    from gpufleet.archive.layout import Archive
    from gpufleet.archive.store import RunStaging
    from gpufleet.control.bench import intake
    from gpufleet.errors import UserError

    with RunStaging(Archive(tmp_path), "h0", "r1") as staging:
        staging.receive("results.jsonl", 32 * MIB, lambda dest: dest.write(bytes(17 * MIB)))
        with pytest.raises(UserError) as refused:
            intake.record(staging, "results.jsonl")
        assert str(refused.value) == ("results.jsonl of the run is over 16 MiB, more than a "
                                      "run's records hold: not read, nothing archived")  # fmt: skip
        with pytest.raises(OverLimit):
            staging.receive("grew.log", 10, lambda dest: dest.write(b"x" * 11))
        assert sorted(p.name for p in staging.dir.iterdir()) == ["results.jsonl"]
    assert list((tmp_path / "h0").iterdir()) == []  # never committed: nothing left
