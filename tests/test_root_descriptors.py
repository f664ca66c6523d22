"""Issue 80, bullet 5: nothing of root's crosses to the run_as user. Root's `owner.lock`
descriptor was inherited by the bench runner that runs as the run_as user; that user
stopping its own runner (kill -STOP) kept the host "in use" for root's gpu-clean, for as
long as it liked. Now the runner holds no descriptor of root's but the two it is handed on
purpose (the server's log to read, its own log to write); root keeps the host in a keeper
of its own that ends with the runner, and gpu-clean takes the host over from a stopped
owner in one line. Over the real sshd, root connecting and nobody attacking."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_host_owner import _read_until, _start
from test_reliability import record

NOBODY = 65534


def _uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def _descriptors(pid: int) -> dict[str, str]:
    """Each open descriptor of `pid` and what it points to."""
    out = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            out[fd.name] = os.readlink(fd)
        except OSError:
            continue
    return out


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone
        return None


def _alive_as(pid: int, uid: int) -> bool:
    try:
        return _uid_of(pid) == uid
    except (OSError, StopIteration):
        return False


def _holders_of(lock: Path) -> list[int]:
    """The processes with `lock` open."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(lock) in _descriptors(int(proc.name)).values():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.slow(minutes=2)
def test_a_stopped_run_as_runner_holds_nothing_of_roots_and_gpu_clean_takes_over(fleet, tmp_path):
    profile = fleet.profile("owned", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1,
                                                "decode-per-req-ms": 40})  # fmt: skip
    fleet.write_inventory()  # root's server; the runner as nobody
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    fleet.write_inventory(run_as="nobody")
    workdir = fleet.workdir("h0")
    lock = (workdir / "owner.lock").resolve()
    bench = _start(fleet, "bench", "--hosts", "h0", "-c", "1", "--num-prompts", "400",
                   "--output-len", "40", "--archive", str(tmp_path / "a"))  # fmt: skip
    seen: list[str] = []
    runner = None
    try:
        _read_until(bench, " started against ", seen)
        [state] = (workdir / "runs").glob("*/runner.json")
        runner = json.loads(state.read_text())["pid"]
        assert _uid_of(runner) == NOBODY
        state_file = json.loads(next((workdir / "servers").glob("*.json")).read_text())
        handed = {str(Path(state_file["log"]).resolve()), str(state.parent / "runner.log")}
        # the runner and every child it started (its client processes, its sampler): its
        # session's, never another test's nobody processes beside it (test_hung_runner's)
        theirs = [int(p.name) for p in Path("/proc").iterdir()
                  if p.name.isdigit() and _alive_as(int(p.name), NOBODY)
                  and _session_of(int(p.name)) == _session_of(runner)]  # fmt: skip
        assert runner in theirs
        for pid in theirs:
            # root's files it could not open itself (a system file every user may read, like
            # a .pth its Python opens at start, is its own open, not one of root's)
            roots = {target for target in _descriptors(pid).values()
                     if target.startswith("/") and target != "/dev/null"
                     and os.path.exists(target) and os.stat(target).st_uid == 0
                     and (not os.stat(target).st_mode & 0o004
                          or target.startswith(str(workdir.resolve())))}  # fmt: skip
            assert roots <= handed, (pid, roots)  # owner.lock above all
        environ = Path(f"/proc/{runner}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if v.startswith(b"GPUFLEET_LOGIN")], "root's login"
        holders = _holders_of(lock)
        assert runner not in holders and holders, holders
        assert all(_uid_of(pid) == 0 for pid in holders), holders
        os.killpg(bench.pid, signal.SIGKILL)  # the task is gone; its run goes on, detached
        bench.wait(timeout=10)
        deadline = time.monotonic() + 60  # the task's agent ends with its connection
        while len(_holders_of(lock)) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        [keeper] = _holders_of(lock)
        assert _uid_of(keeper) == 0 and keeper != runner  # the host is held on root's side
        # nobody stops its own runner
        subprocess.run(["kill", "-STOP", str(runner)], user=NOBODY, group=NOBODY, check=True)
        time.sleep(0.5)
        clean = fleet.cli("gpu-clean", "--hosts", "h0", "--include-running", timeout=180)
        said = clean.stdout + clean.stderr
        assert clean.returncode == 0, said[-3000:]
        took = [line for line in said.splitlines() if "took over this host" in line]
        assert len(took) == 1, said[-3000:]
        assert (
            "from `inv bench`" in took[0]
            and f"runner (pid {runner} as nobody) is stopped" in took[0]
        )
        assert "since " in took[0]
        assert "in use by" not in said and "verified clean" in said
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
        if runner is not None:
            with __import__("contextlib").suppress(OSError):
                os.kill(runner, signal.SIGKILL)
        fleet.cli("stop", "--hosts", "h0", "--grace", "2", timeout=120)
    record("stopped_runner_takeover", {"refused_before": "in use by `inv bench`",
                                       "gpu_clean_after": "took over, verified clean"})  # fmt: skip
