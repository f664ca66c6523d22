"""Input on a shared host: one line and exit 2 for names that would escape the archive,
files that are not UTF-8, keys given twice, numbers without bounds (docs/RELIABILITY.md)."""

from __future__ import annotations

import pytest

from gpufleet.archive import store
from gpufleet.archive.kept import Manifest
from gpufleet.archive.layout import Archive
from gpufleet.control.inventory.model import load_inventory
from gpufleet.errors import UserError
from helpers import run_cli


def _one_line_exit_2(out, expected: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["../../x", "/tmp/x", ".hidden", "a/b"])
def test_host_names_that_would_escape_the_archive_are_refused(tmp_path, name):
    path = tmp_path / "inv.yaml"
    path.write_text(f'hosts: {{"{name}": {{address: 192.0.2.1}}}}\n')
    out = run_cli("hosts", "--inventory", str(path))
    _one_line_exit_2(out, "a host name becomes an archive folder")


@pytest.mark.parametrize("name", ["sweeps", "compare", "findmax", "tunes"])
def test_host_names_that_are_archive_folders_are_refused(tmp_path, name):
    # a host named `sweeps` would mix its runs with the sweep states (archive/layout.py)
    path = tmp_path / "inv.yaml"
    path.write_text(f'hosts: {{"{name}": {{address: 192.0.2.1}}}}\n')
    out = run_cli("hosts", "--inventory", str(path))
    _one_line_exit_2(out, f"'{name}' is a folder of the archive (logs/{name}/)")


def test_the_archive_never_writes_outside_its_root(tmp_path):
    for host, run_id in [("..", "x"), ("h", "../../x"), ("h", "..")]:
        with pytest.raises(UserError, match="refusing to archive outside"):
            store.write_run(
                Archive(tmp_path / "logs"),
                host,
                run_id,
                {"a": b"1"},
                Manifest(run_id, host, "done"),
            )
    assert not (tmp_path / "x").exists()


def test_profile_and_run_id_names_are_checked(tmp_path):
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "x.yaml").write_text("model_path: /m\n")  # playbooks/../x.yaml
    out = run_cli("launch", "--profile", "../x", "--dry-run", cwd=tmp_path)
    _one_line_exit_2(out, "a profile name becomes a file and archive name")
    out = run_cli("bench", "--attach", "../../etc", "--hosts", "sim-h200")
    _one_line_exit_2(out, "--attach '../../etc': expected a run id")


def test_non_utf8_and_duplicate_keys_are_one_line(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("hosts:\n  caf\xe9: {address: 192.0.2.1}\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin.yaml: not UTF-8 text \(byte 0xe9 on line 2\)"):
        load_inventory(latin)
    twice = tmp_path / "twice.yaml"
    twice.write_text("hosts:\n  h1: {address: 192.0.2.1}\n  h1: {address: 192.0.2.2}\n")
    with pytest.raises(
        UserError, match=r"twice.yaml: malformed YAML at line 3.*duplicate key 'h1'"
    ):
        load_inventory(twice)
    out = run_cli("hosts", "--inventory", str(twice))
    _one_line_exit_2(out, "duplicate key 'h1'")


def test_a_non_utf8_profile_does_not_break_the_listing(tmp_path):
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "good.yaml").write_text("model_path: /m\n")
    (playbooks / "bad.yaml").write_bytes(b"model_path: /caf\xe9\n")
    out = run_cli("profiles", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "good" in out.stdout and "INVALID" in out.stdout and "not UTF-8" in out.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--concurrency", "99999999999999999999"], "--concurrency 99999999999999999999: at most 100000"),
        (["--concurrency", "1", "--num-prompts", "100000000000"], "--num-prompts 100000000000: at most 100000"),
        (["--concurrency", "1", "--output-len", "0"], "--output-len '0': expected a whole number >= 1"),
        (["--concurrency", "1", "--request-rate", "1e12"], "--request-rate 1e12: at most 1e+06"),
        (["--concurrency", "1", "--duration", "1e9"], "--duration 1e9: at most 604800"),
    ],
)  # fmt: skip
def test_numbers_are_bounded_and_name_their_limit(args, expected):
    out = run_cli("bench", *args, "--hosts", "sim-h200")
    _one_line_exit_2(out, expected)


def test_launch_help_is_help_not_a_profile():
    out = run_cli("launch", "--help")
    assert out.returncode == 0 and "--profile" in out.stdout and "--dry-run" in out.stdout
    out = run_cli("launch")
    _one_line_exit_2(out, "launch needs --profile NAME")


def test_what_the_agent_reads_of_a_server_or_a_users_run_is_bounded(tmp_path):
    """Issue 68.5: the agent read a health answer whole (a run_as server's body is its
    own: 100 MB of it was read into root's agent) and took a user's sparse file back as a
    dense one (root filled its disk with what took the user nothing). The answer is read
    up to 64 KiB; a taken-back file keeps its holes."""
    import http.server
    import os
    import threading
    import time

    from gpufleet.host.bench import userrun
    from gpufleet.host.server import probe

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            chunk = b"x" * (1 << 20)
            try:
                for _ in range(100):  # 100 MiB, no length: read until closed
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the reader stopped at its limit, as it should: no traceback in the log

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        status, body = probe.get(f"http://127.0.0.1:{server.server_port}/health", 10)
        assert status == 200 and len(body) == probe.BODY_LIMIT == 64 << 10
        assert time.monotonic() - started < 10
    finally:
        server.shutdown()

    sparse = tmp_path / "records.jsonl"
    with open(sparse, "wb") as fh:
        fh.write(b"head\n")
        fh.seek(1 << 30)  # a 1 GiB hole
        fh.write(b"tail\n")
    copy = tmp_path / "copy"
    with open(sparse, "rb") as src, open(copy, "wb") as dst:
        userrun.copy_keeping_holes(src, dst)
    assert copy.stat().st_size == sparse.stat().st_size
    assert copy.stat().st_blocks * 512 < 1 << 20, copy.stat().st_blocks  # not 1 GiB of disk
    with open(copy, "rb") as fh:
        assert fh.read(5) == b"head\n"
        fh.seek(1 << 30)
        assert fh.read() == b"tail\n"
        fh.seek(4096)
        assert fh.read(4096) == bytes(4096)
    os.unlink(copy)
