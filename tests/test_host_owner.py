"""Issue 69.4: a host has one owner at a time (host/agent/ownership.py).

Two sweeps on one host each cleaned the GPUs before their next cell and killed the other's
loading server (3 of 4 cells "crashed"). Now the task whose agent changes the host holds
it until that agent ends; another task's launch, bench, gpu-clean or stop is refused in
one line naming the owner, and reading the host never is. The lock follows its owner's
end: a task killed with SIGKILL frees the host, and a detached bench run keeps it until
the run ends. Real sshd, real processes, the rehearsal engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import yaml

from gpufleet.archive import store
from gpufleet.archive.layout import Archive
from helpers import REPO, pid_alive
from test_reliability import record


def _start(fleet, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpufleet", *args, "--inventory", str(fleet.inventory)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        start_new_session=True,
    )  # fmt: skip


def _read_until(proc: subprocess.Popen, words: str, seen: list[str]) -> None:
    for line in proc.stdout:
        seen.append(line)
        if words in line:
            return
    raise AssertionError(f"never said {words!r}:\n{''.join(seen)[-3000:]}")


def test_a_second_sweep_on_a_host_in_use_is_refused_naming_the_first(fleet, tmp_path):
    # the first cell's server loads for 60 s: the four refused tasks below run meanwhile
    # (with 2 s, on 2 cores beside five other test workers, the first sweep had ended and
    # freed the host before the fourth, a launch, started: it succeeded; with 20 s beside
    # seven, the checks outlasted it too; its health timeout leaves room for the load)
    a = fleet.profile("own-a", tp=1, health_timeout=150,
                      sim={"load-seconds": 60.0, "warmup-seconds": 0.1})  # fmt: skip
    port = yaml.safe_load(a.read_text())["port"]
    fleet.profile("own-b", tp=1, sim={"load-seconds": 2.0, "warmup-seconds": 0.1}, port=port)
    playbooks = a.parent
    first = _start(
        fleet, "sweep", "--profiles", f"{playbooks}/own-a.yaml,{playbooks}/own-b.yaml",
        "--hosts", "h0", "-c", "1", "--num-prompts", "4", "--output-len", "8",
        "--archive", str(tmp_path / "first"),
    )  # fmt: skip
    seen: list[str] = []
    try:
        _read_until(first, "launching", seen)  # its server is loading now
        second = fleet.cli(
            "sweep", "--profiles", f"{playbooks}/own-b.yaml", "--hosts", "h0", "-c", "1",
            "--num-prompts", "4", "--output-len", "8", "--archive", str(tmp_path / "second"),
        )  # fmt: skip
        others = [fleet.cli("gpu-clean", "--hosts", "h0"), fleet.cli("stop", "--hosts", "h0"),
                  fleet.cli("launch", "--profile", str(a), "--hosts", "h0")]  # fmt: skip
        reading = fleet.cli("status", "--hosts", "h0")
        assert first.poll() is None, "the first sweep ended before the checks: nothing was held"
    finally:
        rest, _ = first.communicate(timeout=240)
    seen.append(rest)
    text = "".join(seen)
    assert first.returncode == 0, text[-3000:]
    words = f"this host is in use by `inv sweep` (pid {first.pid} on "
    assert second.returncode != 0 and words in second.stdout + second.stderr, second
    for out in others:
        assert out.returncode == 1 and words in out.stderr, out.stdout + out.stderr
        assert "Traceback" not in out.stderr
    assert reading.returncode == 0, reading.stdout + reading.stderr
    # the first sweep lost nothing: both its cells measured, none crashed
    runs = store.list_runs(Archive(tmp_path / "first"))
    assert sorted(r.status for r in runs) == ["done", "done"], text[-3000:]
    assert "crashed" not in text
    # its end freed the host: the refused sweep now runs
    again = fleet.cli(
        "sweep", "--profiles", f"{playbooks}/own-b.yaml", "--hosts", "h0", "-c", "1",
        "--num-prompts", "4", "--output-len", "8", "--archive", str(tmp_path / "second"),
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    record("one_owner_two_sweeps", {"first_cells_done": len(runs), "refused": 4})


def test_a_task_killed_outright_frees_the_host(fleet):
    profile = fleet.profile("owner-killed", tp=1, sim={"load-seconds": 30.0})
    proc = _start(fleet, "launch", "--profile", str(profile), "--hosts", "h1")
    seen: list[str] = []
    try:
        _read_until(proc, "loading", seen)
        refused = fleet.cli("gpu-clean", "--hosts", "h1")
        assert refused.returncode == 1 and "in use by `inv launch`" in refused.stderr
        os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: only the connection ends
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while True:
            out = fleet.cli("gpu-clean", "--hosts", "h1", "--include-running")
            if out.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "verified clean" in out.stdout
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        fleet.cli("stop", "--hosts", "h1")


def test_a_detached_bench_run_keeps_the_host_until_it_ends(fleet, tmp_path):
    profile = fleet.profile("owner-run", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1,
                                                    "decode-per-req-ms": 20})  # fmt: skip
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h2").returncode == 0
    bench = _start(
        fleet, "bench", "--profile", "owner-run", "--hosts", "h2", "-c", "1",
        "--num-prompts", "6", "--output-len", "40", "--archive", str(tmp_path / "a"),
    )  # fmt: skip
    seen: list[str] = []
    try:
        _read_until(bench, " started against ", seen)
        os.killpg(bench.pid, signal.SIGKILL)  # the task is gone; its run goes on, detached
        bench.wait(timeout=10)
        [runner] = (fleet.workdir("h2") / "runs").glob("*/runner.json")
        pid = yaml.safe_load(runner.read_text())["pid"]
        assert pid_alive(pid)
        refused = fleet.cli("stop", "--hosts", "h2")
        # the task is gone: the refusal names the run that holds the host now, not the task
        # as if it ran (issue 81.8)
        said = refused.stderr
        assert refused.returncode == 1 and f"held by run {runner.parent.name} (C=1" in said, said
        assert "left running by `inv bench`" in said and "in use by" not in said, said
        deadline = time.monotonic() + 120
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(pid)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
    out = fleet.cli("stop", "--hosts", "h2")
    assert out.returncode == 0 and "verified clean" in out.stdout, out.stdout + out.stderr


def test_every_launch_writes_a_log_of_its_own(fleet):
    """Two servers once wrote one log file, archived with both runs. A relaunch (a template
    without {stamp}, or within the stamp's second) now gets `-2`, `-3` ..."""
    import json

    profile = fleet.profile("one-log", tp=1, log="logs/fixed.log",
                            sim={"load-seconds": 0.2, "warmup-seconds": 0.1})  # fmt: skip
    port = yaml.safe_load(profile.read_text())["port"]
    logs = []
    for _ in range(3):
        out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h1")
        assert out.returncode == 0, out.stdout + out.stderr
        state = json.loads((fleet.workdir("h1") / "servers" / f"{port + 7}.json").read_text())
        logs.append(state["log"])
        assert fleet.cli("stop", "--hosts", "h1").returncode == 0
    assert [os.path.basename(p) for p in logs] == ["fixed.log", "fixed-2.log", "fixed-3.log"]
    for path in logs:
        with open(path) as fh:
            assert fh.read().count("launching one-log") == 1


def test_a_run_directory_swapped_for_a_link_is_one_line_and_nothing_is_read(fleet, tmp_path):
    """Issue 68.5: a run directory swapped for a link (to another directory root can read)
    was followed: listed and handed over as the run's files. It is now one line naming the
    link, exit 1, no traceback, and nothing of the target reaches the archive."""
    runs = fleet.workdir("h2") / "runs"
    runs.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret = tmp_path / "elsewhere"
    secret.mkdir()
    (secret / "status.json").write_text('{"status": "done"}')
    (secret / "key.pem").write_text("not for the archive")
    run_id = "20261205T000000Z-swapped-000000"
    (runs / run_id).symlink_to(secret)
    out = fleet.cli("bench", "--hosts", "h2", "--attach", run_id,
                    "--archive", str(tmp_path / "a"))  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    failed = [ln for ln in out.stderr.splitlines() if ln.startswith("h2: FAILED")]
    assert len(failed) == 1 and f"is a link to {secret}" in failed[0], out.stderr
    assert "Traceback" not in out.stderr
    assert not list((tmp_path / "a").rglob("key.pem")) if (tmp_path / "a").exists() else True


HOLDS_THE_HOST = """
import fcntl, os, sys, time
fd = os.open("owner.lock", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_a_watch_that_says_done_leaves_the_host_free(tmp_path, monkeypatch):
    """Found beside six test workers (a Ctrl-C resume, CI-like load): the runner writes its
    last status and holds the host (its inherited lock) until it exits a moment later; the
    watch answered "done" at once and the cell's stop was refused, "this host is in use by
    `inv sweep`", naming the task that started the run. Here a real process holds the lock
    past the run's "done": the watch returns once it let go, and the next verb gets the host."""
    from gpufleet.host.agent import ownership
    from gpufleet.host.agent.procstat import ProcRef
    from gpufleet.host.agent.protocol import BenchWatchArgs
    from gpufleet.host.bench import bench_verbs

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "20261206T000000Z-own-000000"
    run_dir.mkdir(parents=True)
    (run_dir / "status.json").write_text(json.dumps({"status": "done"}))
    runner = subprocess.Popen([sys.executable, "-c", HOLDS_THE_HOST, "1.5"], cwd=tmp_path,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert runner.stdout.readline() == "held\n"
        ref = ProcRef.capture(runner.pid)
        (run_dir / "runner.json").write_text(json.dumps(ref.to_wire()))
        answer = bench_verbs.bench_watch(BenchWatchArgs(run_id=run_dir.name))
        assert answer["status"] == "done"
        owner = {"id": "next", "task": "inv stop", "control": "", "pid": os.getpid(), "since": ""}
        ownership.claim(owner)  # raised IN_USE ("in use by ...") before
        assert ownership.holder_now()["id"] == "next"
        assert runner.poll() is not None  # it had ended (a zombie holds nothing)
    finally:
        runner.kill()
        if ownership._held is not None:
            os.close(ownership._held)
        ownership._held, ownership._owner = None, None
