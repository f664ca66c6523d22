"""Issue 50, bullet 2: `run_as: USER` runs the engine's code (the server, its version and
flag probes) as that user, over a real sshd where gpufleet connects as root; root keeps
gpu-clean (its kill policy counts the run_as user's processes as gpufleet's own) and `stop`.
Where the inventory sets no run_as and the server runs as root, `inv launch` says so once,
with how to set it; `run_as: root` is a choice and silences it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpufleet.host.proc import gpuprocs
from helpers import HEALTH_HANDLER

NOBODY = 65534
SERVER = (
    """#!/usr/bin/env python3
import http.server, os, sys
if "--help" in sys.argv:
    print(f"usage: engine --port PORT --table FILE\\nprobed as uid {os.getuid()}")
    sys.exit(0)
port = int(sys.argv[sys.argv.index("--port") + 1])
if "--table" in sys.argv:  # a profile's file, written for this user where it can read it
    table = sys.argv[sys.argv.index("--table") + 1]
    print(f"table {table} reads {open(table).read()!r}", flush=True)
"""
    + HEALTH_HANDLER
    + """print(f"serving as uid {os.getuid()} home {os.environ.get('HOME')} cwd {os.getcwd()}",
      flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""
)


@pytest.fixture
def engine(readable_program) -> Path:
    return readable_program(SERVER)


def _uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


@pytest.mark.slow(minutes=1)
def test_run_as_runs_the_server_and_its_probes_as_that_user(fleet, engine, tmp_path):
    (tmp_path / "table.json").write_text('{"1": 3}')
    profile, port = fleet.custom_profile(
        "asuser", engine, check_flags=True, files={"table": str(tmp_path / "table.json")},
        flags={"table": "{file:table}"}, version_command=["sh", "-c", "echo version $(id -u)"],
    )  # fmt: skip
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
    profile, _ = fleet.custom_profile("asroot", engine)
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
def test_a_rehearsal_sweep_gives_no_root_note_it_could_not_follow(fleet, tmp_path):
    """Issue 64, trip 7: on rehearsal hosts the note advised `run_as: USER`, which the
    launch then refuses for the rehearsal engine. The note and the refusal now follow one
    rule (host/agent/runas.cannot_run_as): no note where run_as cannot be set."""
    profile = fleet.profile("sw", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    out = fleet.cli("sweep", "--profiles", str(profile), "--hosts", "h0,h1",
                    "--concurrency", "1", "--num-prompts", "2", "--output-len", "4",
                    "--archive", str(tmp_path / "a"), timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "sets no run_as" not in out.stdout + out.stderr, out.stdout[-2000:]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("engine", "host", "noted"),
    [
        ("custom", {}, True),  # a real engine as root for want of run_as: said
        ("sglang", {"run_as": "root"}, False),  # root chosen: silent
        ("sglang", {"run_as": "nobody"}, False),
        ("sim", {}, False),  # the rehearsal engine: run_as is refused there, so no advice
        ("sglang", {"connection": "srun", "slurm_job": "12"}, False),  # the job's user
    ],
)
def test_the_root_note_follows_the_rule_the_refusal_follows(engine, host, noted):
    from gpufleet.control.inventory.model import Host
    from gpufleet.control.server.lifecycle import runs_as_root_unasked
    from gpufleet.host.agent import runas
    from gpufleet.records import ServerState

    h = Host(name="h0", **host)
    state = ServerState.from_wire({"pid": 1, "port": 1, "engine": engine, "health_url": "h",
                                   "profile": "p", "log": "l", "started_at": "t",
                                   "user": "root"})  # fmt: skip
    assert runs_as_root_unasked(h, state) is noted
    in_job = h.slurm_job is not None
    if runas.cannot_run_as(engine, in_job):  # refused there: never advised
        assert not runs_as_root_unasked(h, state)


@pytest.mark.slow(minutes=2)
def test_run_as_runs_the_bench_client_as_that_user_and_root_takes_back_only_its_files(
    fleet, tmp_path
):
    """The bench runner runs as nobody, from nobody's own directory, against the server it
    is given (here root's, launched before run_as was set: the test's host python sits where
    nobody cannot run it, which a launch as nobody says in one line); root reads what the
    runner wrote without following links and archives the run as any other. A link nobody
    planted among its files (to a root-only file) is not taken back."""
    profile = fleet.profile("benchas", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1,
                                                  "decode-per-req-ms": 40})  # fmt: skip
    command = [fleet.python, "-c", "pass"]
    custom = fleet.profile("unrunnable", engine="custom", tp=1, check_model_path=False,
                           health_path="/", command=command)  # fmt: skip
    fleet.write_inventory(run_as="nobody")
    out = fleet.cli("launch", "--profile", str(custom), "--hosts", "h0", timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr
    assert (
        f"cannot start {fleet.python} as nobody (run_as: it must be able to read and run "
        "it): Permission denied" in out.stdout + out.stderr
    ), out.stdout + out.stderr

    fleet.write_inventory()
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", timeout=120)
    fleet.write_inventory(run_as="nobody")
    secret = tmp_path / "root-only"
    secret.write_text("root's secret")
    secret.chmod(0o600)
    try:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        archive = tmp_path / "a"
        bench = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "bench", "--concurrency", "1,2",
             "--num-prompts", "6", "--output-len", "24", "--archive", str(archive),
             "--hosts", "h0", "--inventory", str(fleet.inventory)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        runner_uid, planted = _watch_nobodys_run(bench, secret)
        stdout, stderr = bench.communicate(timeout=60)
        assert bench.returncode == 0, stdout[-2000:] + stderr[-2000:]
        assert runner_uid == NOBODY
        assert planted is not None, "the run was seen in nobody's directory"
        [manifest] = archive.glob("h0/*/manifest.json")
        run_files = {p.name for p in manifest.parent.iterdir()}
        assert {"results.jsonl", "status.json", "plan.json", "server.log"} <= run_files
        assert "stolen.txt" not in run_files and ".keys.json" not in run_files
        assert json.loads((manifest.parent / "status.json").read_text())["status"] == "done"
        assert not (planted.parent).exists(), "nobody's copy of the run is removed once taken"
        log = (manifest.parent / "server.log").read_text()
        assert ">>> gpufleet: run " in log, "the server's log, read through root's descriptor"
    finally:
        stop = fleet.cli("stop", "--hosts", "h0", "--grace", "2", timeout=120)
    assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]


def _watch_nobodys_run(bench: subprocess.Popen, secret: Path) -> tuple[int | None, Path | None]:
    """While the bench runs: the uid of the process working in nobody's run directory, and
    a link to `secret` planted there as nobody would."""
    own = Path(f"/tmp/gpufleet-run-{NOBODY}") / "runs"
    runner_uid, planted = None, None
    began, deadline = time.time() - 1, time.monotonic() + 120
    while bench.poll() is None and time.monotonic() < deadline:
        for run in own.glob("*") if own.exists() else []:
            if run.stat().st_mtime < began:  # an earlier test's
                continue
            for pid in _pids_with_cwd(run.parent.parent):
                runner_uid = runner_uid or _uid_of(pid)
            if planted is None and (run / "progress.jsonl").exists():
                planted = run / "stolen.txt"
                os.symlink(secret, planted)
                os.lchown(planted, NOBODY, NOBODY)
        time.sleep(0.05)
    return runner_uid, planted


def _pids_with_cwd(folder: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == str(folder):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def rooted_users():
    """Three real local users that would hold root's powers: a uid-0 alias, one whose
    primary group is 0, one in group 0; removed afterwards."""
    names = {"gpufleet-toor": ["-o", "-u", "0"], "gpufleet-gid0": ["-g", "0"],
             "gpufleet-grp0": ["-G", "root"]}  # fmt: skip
    for name, options in names.items():
        subprocess.run(["userdel", "-f", name], capture_output=True)  # left by a killed run
        subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", *options, name],
                       check=True, capture_output=True)  # fmt: skip
    try:
        yield list(names)
    finally:
        for name in names:  # -f: the uid-0 alias shares uid 0 with running processes
            subprocess.run(["userdel", "-f", name], capture_output=True)


@pytest.mark.exclusive  # adds users to this machine's passwd: nothing else may read it then
def test_run_as_naming_a_user_with_roots_powers_is_refused_in_one_line(rooted_users):
    from gpufleet.host.agent import runas
    from gpufleet.host.agent.protocol import AgentError

    said = {}
    for name in rooted_users:
        with pytest.raises(AgentError) as refused:
            runas.resolve(name)
        said[name] = str(refused.value)
        assert "\n" not in said[name] and f"getent passwd {name}" in said[name]
    assert "is uid 0, another name for root" in said["gpufleet-toor"]
    assert "has group 0 (root) as its primary group" in said["gpufleet-gid0"]
    assert "is a member of group 0 (root)" in said["gpufleet-grp0"]
    assert runas.resolve("root") is None  # root by its own name: the judged mode, knowingly
    assert runas.resolve("nobody").uid == NOBODY


def test_a_probe_the_run_as_user_cannot_read_says_so_not_not_installed(tmp_path):
    """Issue 68.5: where the run_as user could not read the engine's packages, the launch
    said "has no sglang installed". The version probe now names the folders it could not
    read, and the refusal says permission denied, as that user; where the package is
    simply absent, "not installed" stays."""
    import dataclasses

    from gpufleet.control.server.engines import DIST_VERSION
    from gpufleet.host.agent import runas
    from gpufleet.host.server import preflight

    closed = Path(tempfile.mkdtemp(prefix="gpufleet-closed-"))
    closed.chmod(0o700)  # root's: nobody cannot list it
    python = "/usr/bin/python3"  # one the user may run (this venv's may sit under root's home)
    argv = [python, "-c", DIST_VERSION.format("sglang")]
    spec = dataclasses.make_dataclass("S", ["version_argv", "version_missing"])(
        argv, "has no sglang installed (pip show sglang found nothing)"
    )
    user = runas.resolve("nobody")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(closed)}
    version, said = preflight.program_version(argv, env, user)
    assert version is None and f"permission denied: {closed}" in said, said
    line = preflight.version_refusal(spec, user, said)
    assert line.startswith(f"{python} as nobody: permission denied: {closed}"), line
    assert "not installed" not in line
    version, said = preflight.program_version(argv, {"PATH": "/usr/bin:/bin"}, user)
    assert version is None and preflight.version_refusal(spec, user, said).endswith(
        "has no sglang installed (pip show sglang found nothing)"
    )
    shutil.rmtree(closed)
