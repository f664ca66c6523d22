"""Issue 50, bullet 2: `run_as: USER` runs the engine's code (the server, its version and
flag probes) as that user, over a real sshd where gpufleet connects as root; root keeps
gpu-clean (its kill policy counts the run_as user's processes as gpufleet's own) and `stop`.
Where the inventory sets no run_as and the server runs as root, `inv launch` says so once,
with how to set it; `run_as: root` is a choice and silences it."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpufleet.host.proc import gpuprocs

NOBODY = 65534
SERVER = """#!/usr/bin/env python3
import http.server, os, sys
if "--help" in sys.argv:
    print(f"usage: engine --port PORT --table FILE\\nprobed as uid {os.getuid()}")
    sys.exit(0)
port = int(sys.argv[sys.argv.index("--port") + 1])
if "--table" in sys.argv:  # a profile's file, written for this user where it can read it
    table = sys.argv[sys.argv.index("--table") + 1]
    print(f"table {table} reads {open(table).read()!r}", flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
print(f"serving as uid {os.getuid()} home {os.environ.get('HOME')} cwd {os.getcwd()}",
      flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def engine():
    """The engine's program where any user may read and run it (not under root's tmp)."""
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-runas-"))
    folder.chmod(0o755)
    program = folder / "engine"
    program.write_text(SERVER)
    program.chmod(0o755)
    yield program
    shutil.rmtree(folder)


def _uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


@pytest.mark.slow(minutes=1)
def test_run_as_runs_the_server_and_its_probes_as_that_user(fleet, engine, tmp_path):
    from gpufleet.sim.sshd import free_port

    port = free_port()
    (tmp_path / "table.json").write_text('{"1": 3}')
    profile = fleet.profile("asuser", engine="custom", health_path="/", check_flags=True,
                            check_model_path=False, files={"table": str(tmp_path / "table.json")},
                            command=[str(engine), "--port", "{port}"],
                            flags={"table": "{file:table}"},
                            port=port, tp=1,
                            version_command=["sh", "-c", "echo version $(id -u)"])  # fmt: skip
    fleet.write_inventory(run_as="nobody")
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", timeout=120)
    try:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert "sets no run_as" not in out.stdout  # the inventory names a user: no note
        state = json.loads((fleet.workdir("h0") / "servers" / f"{port}.json").read_text())
        assert _uid_of(state["pid"]) == NOBODY
        assert state["user"] == "nobody"
        assert state["engine_version"] == f"version {NOBODY}"  # the probe ran as nobody
        helps = list((fleet.workdir("h0") / "cache" / "engine-help").glob("*.txt"))
        assert helps and f"probed as uid {NOBODY}" in helps[0].read_text()
        log = Path(state["log"]).read_text()
        assert f"serving as uid {NOBODY} home /nonexistent" in log, log
        # the profile's file, written by a child running as nobody in its own directory
        # (its HOME, /nonexistent, cannot hold one: /tmp/gpufleet-run-65534, 0700, its own)
        own = Path(f"/tmp/gpufleet-run-{NOBODY}")
        assert f"table {own}/" in log and "reads '{\"1\": 3}'" in log, log
        assert own.stat().st_uid == NOBODY and own.stat().st_mode & 0o777 == 0o700
    finally:
        stop = fleet.cli("stop", "--hosts", "h0", "--grace", "2", timeout=120)
    assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]


@pytest.mark.slow(minutes=1)
def test_a_root_server_is_said_once_and_run_as_root_silences_it(fleet, engine):
    from gpufleet.sim.sshd import free_port

    port = free_port()
    profile = fleet.profile("asroot", engine="custom", health_path="/", tp=1,
                            check_model_path=False,
                            command=[str(engine), "--port", "{port}"], port=port)  # fmt: skip
    for run_as, said in ((None, True), ("root", False)):
        fleet.write_inventory(**({"run_as": run_as} if run_as else {}))
        out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0,h1", timeout=120)
        fleet.cli("stop", "--hosts", "h0,h1", "--grace", "2", timeout=120)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        notes = [line for line in out.stdout.splitlines() if "sets no run_as" in line]
        assert len(notes) == (1 if said else 0), out.stdout
        if said:
            assert "the server runs as root on h0, h1" in notes[0]


def test_run_as_refuses_an_unknown_user_and_the_rehearsal_engine(fleet):
    fleet.write_inventory(run_as="no-such-user")
    out = fleet.cli("launch", "--profile", str(fleet.profile("x", tp=1)), "--hosts", "h0",
                    "--dry-run", timeout=120)  # fmt: skip
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "run_as: no user 'no-such-user' on this host" in said, said
    fleet.write_inventory(run_as="nobody")
    out = fleet.cli("launch", "--profile", str(fleet.profile("y", tp=1)), "--hosts", "h0",
                    "--dry-run", timeout=120)  # fmt: skip
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "run_as nobody: the rehearsal engine" in said, said


@pytest.mark.unit
def test_gpu_clean_counts_the_run_as_users_processes_as_its_own():
    """A stale server of the run_as user is gpufleet's to kill without --all-users; the
    same process is another user's where no run_as names it."""
    proc = subprocess.Popen(["sleep", "60"], user=NOBODY, group=NOBODY)
    try:
        info = gpuprocs.describe_pid(proc.pid)
        assert info is not None and info.uid == NOBODY
        alone = gpuprocs.KillPolicy(frozenset({0, 1}), owners=frozenset({0}))
        assert gpuprocs.refusal(info, alone) == "owned by nobody (use --all-users)"
        with_run_as = gpuprocs.KillPolicy(frozenset({0, 1}), owners=frozenset({0, NOBODY}))
        assert gpuprocs.refusal(info, with_run_as) is None
        tree, refused = gpuprocs.collect_trees([proc.pid], with_run_as)
        assert list(tree) == [proc.pid] and refused == []
        [killed] = gpuprocs.kill_trees(tree, grace_s=2)
        assert killed.killed and killed.signal == "SIGTERM"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow(minutes=1)
def test_a_sweep_says_once_where_its_servers_ran_as_root(fleet, tmp_path):
    """The same note after a sweep (its cells launch in parallel, on each host, per arm):
    one line naming the hosts, none with `run_as: root`."""
    profile = fleet.profile("sw", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    for run_as, said in ((None, True), ("root", False)):
        fleet.write_inventory(**({"run_as": run_as} if run_as else {}))
        out = fleet.cli("sweep", "--profiles", str(profile), "--hosts", "h0,h1",
                        "--concurrency", "1", "--num-prompts", "2", "--output-len", "4",
                        "--archive", str(tmp_path / f"a-{run_as}"), timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        notes = [line for line in out.stdout.splitlines() if "sets no run_as" in line]
        assert notes == ([notes[0]] if said else []), out.stdout[-2000:]
        if said:
            assert "the server runs as root on h0, h1" in notes[0]
