"""Issue 80.5: a bench run's job has an end (host/bench/jobend.py), and past it root ends
the runner's processes, only those (host/agent/jobdeadline.py). The parts the sshd test
(test_hung_runner.py) rests on, each against real sockets and real processes: a request
that cannot even connect ends within its timeout, so the bound holds; the end of a runner
hits the very processes it started, never a reused PID, never root's; a record with no
end, or a damaged one, holds as it did."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.host.agent import jobdeadline
from gpufleet.host.agent.procstat import ProcRef, group_members
from gpufleet.host.bench import jobend
from gpufleet.host.bench.level import Prompt
from gpufleet.host.bench.loadgen import LevelSpec, run_level
from gpufleet.records import BenchPlan, Level, PromptRow
from test_reliability import record

NOBODY = 65534


def test_a_request_that_cannot_connect_ends_within_its_timeout_so_the_bound_holds():
    """A listener whose backlog is full answers no SYN: before, each request waited out
    the client's own 30 s connect limit before its timeout began (8 requests at C=4 took
    60 s against a 0.2 s timeout); the timeout now covers connecting, so the level ends
    within the bound jobend states for it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)  # never accepted
    with server:
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        plan = BenchPlan(run_id="r", levels=[Level(4, 8)], request_timeout=0.2, warmup=0)
        bound = jobend.sending_bound_s(plan, 8, 4, [PromptRow(prompt="hi")] * 8)
        started = time.perf_counter()
        run = asyncio.run(run_level(url, [Prompt("hi", 1, 4, None)] * 8, 4,
                                    LevelSpec(request_timeout=0.2, warmup=0)))  # fmt: skip
        took = time.perf_counter() - started
    assert [r.error for r in run.records] == ["timed out after 0.2s"] * 8
    assert took < 10 * bound, (took, bound)  # 60 s before: 100 x the bound
    record("request_timeout_connect", {"before_s": 60.0, "after_s": round(took, 2),
                                       "bound_s": round(bound, 2)})  # fmt: skip


def test_the_bound_follows_the_plan():
    """More prompts per slot, a longer timeout, sessions of turns, a schedule: a later end;
    --duration caps the sending; bench_serving counts its own 20 h a request."""
    rows = [PromptRow(prompt="p")] * 64
    plan = BenchPlan(run_id="r", levels=[Level(4, 64)], request_timeout=10.0)
    base = jobend.sending_bound_s(plan, 64, 4, rows)
    assert base == (16 + 1) * 10.0
    assert jobend.sending_bound_s(plan, 64, 8, rows) < base
    longer = BenchPlan(run_id="r", levels=[Level(4, 64)], request_timeout=20.0)
    assert jobend.sending_bound_s(longer, 64, 4, rows) == 2 * base
    sessions = [PromptRow(turns=["a", "b", "c"])] * 64
    assert jobend.sending_bound_s(plan, 64, 4, sessions) == 3 * base
    traced = [PromptRow(prompt="p", at=500.0), *rows[1:]]
    assert jobend.sending_bound_s(plan, 64, 4, traced) >= 500.0 + base - 10.0
    slow = BenchPlan(run_id="r", levels=[Level(4, 64)], request_timeout=10.0, request_rate=0.1)
    assert jobend.sending_bound_s(slow, 64, 4, rows) > 63 / 0.1 / 3  # ~630 s of arrivals
    timed = BenchPlan(run_id="r", levels=[Level(4, 64)], request_timeout=10.0, duration=5.0)
    assert jobend.sending_bound_s(timed, 64, 4, rows) == 5.0 + 10.0
    theirs = BenchPlan(run_id="r", levels=[Level(4, 64)], engine="sglang-bench")
    assert jobend.sending_bound_s(theirs, 64, 4, rows) == 17 * 20 * 3600.0  # its own 20 h
    whole = jobend.deadline_s(plan, rows)
    assert whole >= jobend.bound_s(plan, rows) + jobend.MARGIN_MIN_S


def _group_as_nobody() -> subprocess.Popen:
    """A leader in a session of its own and a child of it, as another user: a runner."""
    return subprocess.Popen(["/bin/sh", "-c", "sleep 300 & exec sleep 301"], user=NOBODY,
                            group=NOBODY, start_new_session=True)  # fmt: skip


def test_a_runner_past_its_end_is_ended_with_its_group_never_a_reused_pid_nor_roots():
    leader = _group_as_nobody()
    try:
        deadline = time.monotonic() + 10
        while len(group_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        members = [ProcRef(s.pid, s.start_ticks) for s in group_members(leader.pid)]
        assert len(members) == 2
        me = ProcRef.capture(leader.pid)
        assert me is not None
        # the PID with another start time: another process now; nothing is signalled
        assert jobdeadline.end_group(ProcRef(me.pid, me.start_ticks + 1)) == 0
        assert all(m.alive() for m in members)
        assert jobdeadline.end_group(ProcRef.capture(os.getpid())) == 0  # never root's
        assert jobdeadline.end_group(me) == 2
        leader.wait(timeout=10)
        assert not any(m.alive() for m in members)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait(timeout=10)


def test_a_record_with_no_end_or_a_damaged_one_holds_as_it_did():
    now = jobdeadline.boot_now()
    assert jobdeadline.past({"pid": 1, "start_ticks": 1, "user": "nobody"}) is None
    for bad in ("soon", True, None, [1], float("nan")):
        assert jobdeadline.past({"ends_boot_s": bad}) is None, bad
    assert jobdeadline.past("not a record") is None
    assert jobdeadline.past({"ends_boot_s": now + 60}) is None
    assert jobdeadline.past({"ends_boot_s": now - 60}) >= 60
    said = jobdeadline.job_end(90.0)
    assert said["ends_by"].endswith("Z") and 89 < said["ends_boot_s"] - now < 100


KEEP = """
import os, subprocess, sys
from gpufleet.host.agent import jobdeadline, ownership, safewrite
from gpufleet.host.agent.procstat import ProcRef
owner = {"id": "t", "task": "inv bench", "control": "", "pid": os.getpid(), "since": ""}
ownership.claim(owner)
os.makedirs("runs/r1", mode=0o700)
runner = subprocess.Popen(["/bin/sh", "-c", "sleep 300 & exec sleep 301"], user=65534,
                          group=65534, start_new_session=True)
ownership.keep_for(ProcRef.capture(runner.pid), "nobody", ends=jobdeadline.job_end(1.0),
                   run="r1", grace=float(sys.argv[1]))
"""


def _locked(lock) -> bool:
    import fcntl

    with open(lock) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def test_the_keeper_ends_a_runner_nobody_took_over_once_its_grace_is_over(tmp_path):
    """Where no operator runs gpu-clean (an unattended host), root's keeper of the lock
    ends the runner itself `grace` after its job's end, and the run's status says why: the
    host frees itself. Before that end the runner still holds the host."""
    import json
    import sys

    from helpers import REPO

    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-c", KEEP, "2.0"], cwd=workdir, env=env, check=True,
                   timeout=60)  # fmt: skip
    held = json.loads((workdir / "owner.json").read_text())
    runner = ProcRef.from_wire(held["runner"])
    members = [ProcRef(s.pid, s.start_ticks) for s in group_members(runner.pid)]
    keeper = ProcRef.from_wire(held["holder"])
    try:
        until = held["runner"]["ends_boot_s"] + 2.0
        assert jobdeadline.boot_now() < until and runner.alive() and keeper.alive()
        assert _locked(workdir / "owner.lock")  # the task is gone: the keeper holds it
        while keeper.alive() and jobdeadline.boot_now() < until + 30:  # its poll, a load
            time.sleep(0.1)
        ended_after = jobdeadline.boot_now() - until
        assert not keeper.alive() and not _locked(workdir / "owner.lock")
        assert not any(m.alive() for m in [runner, *members]), "left running"
        status = json.loads((workdir / "runs" / "r1" / "status.json").read_text())
        assert status["status"] == "failed"
        assert f"runner (pid {runner.pid} as nobody) ran past its job's end (" in status["reason"]
        assert "ended by root's keeper of the host (" in status["reason"]
    finally:
        for ref in [*members, runner, keeper]:
            if ref.alive():
                with contextlib.suppress(OSError):
                    os.kill(ref.pid, signal.SIGKILL)
    record("keeper_ends_overdue_runner", {"ended_s_after_grace": round(ended_after, 2)})


TAKE = """
import json, os, sys, time
from gpufleet.host.agent import jobdeadline, ownership
from gpufleet.host.agent.protocol import AgentError
owner = {"id": "clean", "task": "inv gpu-clean", "control": "", "pid": os.getpid(), "since": ""}
try:
    said = ownership.claim(owner, take_over=True, host="h0")
except AgentError as exc:
    said = f"refused: {exc}"
print(json.dumps({"said": said, "owner": ownership.holder_now()}))
"""


def _kept(tmp_path, job_s: float) -> tuple[Path, dict, dict, list[ProcRef]]:
    """A workdir whose host a keeper holds for a runner (a group as nobody) whose job
    ends `job_s` from now, its task gone: (workdir, env, owner.json, the group)."""
    import json
    import sys

    from helpers import REPO

    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-c", KEEP.replace("job_end(1.0)", f"job_end({job_s})"),
                    "600"], cwd=workdir, env=env, check=True, timeout=60)  # fmt: skip
    held = json.loads((workdir / "owner.json").read_text())
    group = [ProcRef(s.pid, s.start_ticks) for s in group_members(held["runner"]["pid"])]
    return workdir, env, held, [*group, ProcRef.from_wire(held["holder"])]


def _clean(workdir: Path, env: dict) -> dict:
    """gpu-clean's claim, as another task: what it said, and owner.json after."""
    import json
    import sys

    out = subprocess.run([sys.executable, "-c", TAKE], cwd=workdir, env=env, timeout=60,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout)


def _end_all(refs: list[ProcRef]) -> None:
    for ref in refs:
        if ref.alive():
            with contextlib.suppress(OSError):
                os.kill(ref.pid, signal.SIGKILL)


def test_a_hung_runner_inside_its_job_still_holds_the_host_and_the_end_is_said(tmp_path):
    workdir, env, held, procs = _kept(tmp_path, 120.0)
    try:
        said = _clean(workdir, env)["said"]
        assert said.startswith("refused: this host is held by"), said
        assert f"its job ends by {held['runner']['ends_by']}" in said, said
        assert all(p.alive() for p in procs), "a runner inside its job was ended"
    finally:
        _end_all(procs)


def test_past_its_end_gpu_clean_ends_a_stopped_runners_group(tmp_path):
    """The old rule ended only the keeper of a stopped runner and left the runner stopped;
    past its job's end the runner's group is ended too, stopped or not, in one line."""
    import json

    workdir, env, held, procs = _kept(tmp_path, 1.0)
    runner = ProcRef.from_wire(held["runner"])
    try:
        os.kill(runner.pid, signal.SIGSTOP)
        time.sleep(max(0.0, held["runner"]["ends_boot_s"] - jobdeadline.boot_now()) + 0.2)
        said = _clean(workdir, env)
        line = said["said"]
        assert line.startswith("took over this host from `inv bench`"), said
        assert f"runner (pid {runner.pid} as nobody) ran past its job's end (" in line
        assert "ended it (2 processes)" in line, line
        assert said["owner"]["task"] == "inv gpu-clean" and "runner" not in said["owner"]
        assert not any(p.alive() for p in procs), "left running"
        status = json.loads((workdir / "runs" / "r1" / "status.json").read_text())
        assert "ended by `inv gpu-clean` (2 processes)" in status["reason"], status
    finally:
        _end_all(procs)


def test_a_prompts_file_that_is_not_prompts_is_one_line(tmp_path):
    import pytest

    from gpufleet.host.agent.protocol import AgentError

    plan = BenchPlan(run_id="r", levels=[Level(1, 2)])
    for text, said in (('{"prompt": "a"}\n[1, 2]\n', "prompts.jsonl:2: expected a JSON object"),
                       ('{"prompt": "a"}\n{"nope": 1}\n', "prompts.jsonl:2: unknown field"),
                       ("{not json\n", "bench-start: ")):  # fmt: skip
        (tmp_path / "prompts.jsonl").write_text(text)
        with pytest.raises(AgentError, match=said) as raised:
            jobend.deadline_of(plan, tmp_path / "prompts.jsonl")
        assert "\n" not in str(raised.value)


def test_a_take_over_from_a_stopped_runner_ends_it_so_its_user_cannot_resume_it(tmp_path):
    """A runner its user stopped inside its job was left stopped by the take-over (only its
    keeper was ended), so that user's `kill -CONT` resumed a run that sends to the server
    and writes its files with no lock, while another task owns the host. A take-over ends
    what held the host, every time: the runner's group too, and its status says why."""
    import json

    workdir, env, held, procs = _kept(tmp_path, 120.0)
    runner = ProcRef.from_wire(held["runner"])
    try:
        subprocess.run(["kill", "-STOP", str(runner.pid)], user=NOBODY, group=NOBODY, check=True)
        said = _clean(workdir, env)
        line = said["said"]
        assert line.startswith("took over this host from `inv bench`"), said
        assert f"runner (pid {runner.pid} as nobody) is stopped" in line, line
        assert "ended it (2 processes)" in line, line
        subprocess.run(["kill", "-CONT", str(runner.pid)], user=NOBODY, group=NOBODY)
        time.sleep(0.2)
        left = [p.pid for p in procs if p.alive()]
        assert said["owner"]["task"] == "inv gpu-clean" and not left, f"running on: {left}"
        status = json.loads((workdir / "runs" / "r1" / "status.json").read_text())
        assert status["status"] == "failed", status
        assert f"runner (pid {runner.pid} as nobody) was stopped" in status["reason"], status
        assert "ended by `inv gpu-clean` (2 processes)" in status["reason"], status
    finally:
        _end_all(procs)
    record("stopped_runner_resumed", {"before": "2 processes resumed by nobody, no lock",
                                      "after": line})  # fmt: skip


@pytest.mark.parametrize("job_s", [120.0, 1.0])
def test_a_take_over_refused_while_the_task_still_runs_ends_nothing(tmp_path, job_s):
    """The task that started the run is still connected (its agent holds the lock as the
    keeper does): a gpu-clean cannot take the host, so it ends nothing of that task's
    (its runner stopped, or past its job's end), and says who holds the host and since
    when, never the gpu-clean line that was just refused."""
    import json
    import sys

    from helpers import REPO

    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    keep = KEEP.replace("job_end(1.0)", f"job_end({job_s})")
    task = subprocess.Popen([sys.executable, "-c", keep + "\nprint(flush=True)\nsys.stdin.read()",
                             "600"], cwd=workdir, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)  # fmt: skip
    procs: list[ProcRef] = []
    try:
        assert task.stdout.readline() == b"\n"
        held = json.loads((workdir / "owner.json").read_text())
        runner = ProcRef.from_wire(held["runner"])
        procs = [ProcRef(s.pid, s.start_ticks) for s in group_members(runner.pid)]
        procs.append(ProcRef.from_wire(held["holder"]))
        subprocess.run(["kill", "-STOP", str(runner.pid)], user=NOBODY, group=NOBODY, check=True)
        time.sleep(max(0.0, held["runner"]["ends_boot_s"] - jobdeadline.boot_now()) + 0.2
                   if job_s < 60 else 0.0)  # fmt: skip
        said = _clean(workdir, env)["said"]
        assert said.startswith("refused: this host is in use by `inv bench`"), said
        assert "gpu-clean" not in said, said
        assert "since " in said, said
        left = [p.pid for p in procs if not p.alive()]
        assert not left, f"ended though the host was not taken: {left}"
    finally:
        task.kill()
        task.wait(timeout=10)
        _end_all(procs)


def test_a_runner_child_that_leaves_its_group_is_ended_with_it():
    """A process of the runner's that moves to a group of its own (setpgid: any process
    may) escaped the group's end and ran on; the runner leads a session of its own, and
    the session's processes are ended too (setsid, a new session, is the one way out, and
    what leaves it holds nothing of the host's: the keeper ends with the runner)."""
    from gpufleet.host.agent.procstat import all_stats, read_stat

    away = "/usr/bin/python3 -c 'import os, time; os.setpgid(0, 0); time.sleep(300)'"
    leader = subprocess.Popen(["/bin/sh", "-c", f"{away} & sleep 299 & exec sleep 301"],
                              user=NOBODY, group=NOBODY, start_new_session=True)  # fmt: skip
    theirs: list[ProcRef] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            theirs = [ProcRef(s.pid, s.start_ticks) for s in all_stats()
                      if s.session == leader.pid and s.running]  # fmt: skip
            moved = [r for r in theirs if read_stat(r.pid).pgid == r.pid != leader.pid]
            if len(theirs) == 3 and moved:
                break
            time.sleep(0.05)
        assert len(theirs) == 3 and moved, theirs
        ended = jobdeadline.end_group(ProcRef.capture(leader.pid))
        leader.wait(timeout=10)
        left = [r.pid for r in theirs if r.alive()]
        assert ended == 3 and not left, (ended, left)
    finally:
        _end_all(theirs)
        with contextlib.suppress(ProcessLookupError):
            leader.kill()
        leader.wait(timeout=10)
    record("runner_child_left_its_group", {"ended": ended, "of": 3})
