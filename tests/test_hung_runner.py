"""Issue 80, bullet 5: a hung run_as runner cannot hold the host past its job.

A run_as bench runner that hangs while it still runs (here: the run_as user stops one of its
client processes, so the runner waits for it forever, sleeping, never stopped itself) kept
the host "in use" forever: root's gpu-clean took over only from a stopped holder or runner,
and nothing else ended it. Now the run's job has an end, recorded in owner.json at its
start (host/bench/jobend.py's bound on its wall time, from its plan); before it the hung
runner still holds the host (a long run is never cut short) and every refusal says when
its job ends; past it, another verb is refused in one line naming that end and the
gpu-clean line that takes the host over, and that line, pasted, ends the runner's processes
and takes the host. Over the real sshd, root connecting, the run_as user (nobody) hanging
its own runner."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.host.agent.jobdeadline import boot_now
from gpufleet.host.agent.procstat import ProcRef, group_members, read_stat
from gpufleet.host.bench.jobend import deadline_of
from gpufleet.records import BenchPlan
from helpers import REPO
from test_host_owner import _read_until, _start
from test_reliability import record

NOBODY = 65534


def _client_of(runner: int, within: float) -> int:
    """A client process (host/bench/spread.py's child) the runner started."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for stat in group_members(runner):
            cmdline = Path(f"/proc/{stat.pid}/cmdline").read_bytes() if stat.pid != runner else b""
            if stat.ppid == runner and b"child_main" in cmdline:
                return stat.pid
        time.sleep(0.02)
    alive = read_stat(runner)
    raise AssertionError(
        f"runner {runner} started no client process within {within:g} s "
        f"({alive}: {[read_stat(s.pid) for s in group_members(runner)]})"
    )


def _pasted(line: str, fleet) -> list[str]:
    """The `inv ...` command a refusal names, as this test runs the CLI."""
    found = re.search(r"`(inv gpu-clean[^`]*)`", line)
    assert found, line
    argv = shlex.split(found.group(1))
    return [sys.executable, "-m", "gpufleet", *argv[1:], "--inventory", str(fleet.inventory)]


@pytest.mark.slow(minutes=4)
def test_a_hung_run_as_runner_holds_the_host_until_its_jobs_end_then_gpu_clean_takes_it(
    fleet, tmp_path
):
    profile = fleet.profile("hung", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1,
                                               "decode-per-req-ms": 10})  # fmt: skip
    fleet.write_inventory()
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    fleet.write_inventory(run_as="nobody")
    workdir = fleet.workdir("h0")
    # a short job: 1 s a request, 24 requests over two client processes
    bench = _start(fleet, "bench", "--hosts", "h0", "-c", "2", "--num-prompts", "24",
                   "--output-len", "20", "--client-procs", "2", "--request-timeout", "1",
                   "--no-flush", "--archive", str(tmp_path / "a"))  # fmt: skip
    seen: list[str] = []
    runner = client = None
    try:
        _read_until(bench, " started against ", seen)
        [state] = (workdir / "runs").glob("*/runner.json")
        runner = ProcRef.from_wire(json.loads(state.read_text()))
        owner = json.loads((workdir / "owner.json").read_text())
        ends, ends_by = owner["runner"]["ends_boot_s"], owner["runner"]["ends_by"]
        plan = BenchPlan.from_wire(json.loads((state.parent / "plan.json").read_text()), "plan")
        job = deadline_of(plan, state.parent / "prompts.jsonl")
        assert plan.request_timeout == 1.0
        assert 0 < ends - boot_now() <= job, (ends - boot_now(), job)  # recorded at its start
        # the run_as user hangs its runner: one of its client processes stops, the runner
        # waits for it, asleep (never stopped itself: the old take-over did not apply)
        client = ProcRef.capture(_client_of(runner.pid, within=60))
        assert client is not None
        subprocess.run(["kill", "-STOP", str(client.pid)], user=NOBODY, group=NOBODY, check=True)
        os.killpg(bench.pid, signal.SIGKILL)  # the task is gone; its run goes on, detached
        bench.wait(timeout=10)
        time.sleep(1.0)
        assert read_stat(runner.pid).state in ("S", "R"), read_stat(runner.pid)

        early = fleet.cli("gpu-clean", "--hosts", "h0", "--include-running", timeout=180)
        said = early.stdout + early.stderr
        assert boot_now() < ends, "the refusal came after the job's end: rerun"
        assert early.returncode != 0 and f"its job ends by {ends_by}" in said, said[-3000:]
        assert "took over" not in said
        assert runner.alive() and client.alive(), "a runner inside its job was ended"

        time.sleep(max(0.0, ends - boot_now()) + 0.5)  # past the recorded end, no sooner
        other = fleet.cli("bench", "--hosts", "h0", "-c", "1", "--num-prompts", "1",
                          "--archive", str(tmp_path / "b"), timeout=180)  # fmt: skip
        refused = other.stdout + other.stderr
        assert other.returncode != 0, refused[-3000:]
        [line] = [x for x in refused.splitlines() if "ran past its job's end" in x]
        assert f"({ends_by}, " in line and f"pid {runner.pid} as nobody" in line, line
        assert runner.alive(), "a verb without take-over ended the runner"

        started = boot_now()
        clean = subprocess.run(_pasted(line, fleet), capture_output=True, text=True,
                               cwd=REPO, timeout=180)  # fmt: skip
        took_s, clean_s = boot_now() - ends, boot_now() - started
        said = clean.stdout + clean.stderr
        assert clean.returncode == 0, said[-3000:]
        took = [x for x in said.splitlines() if "took over this host" in x]
        assert len(took) == 1, said[-3000:]
        assert "from `inv bench`" in took[0] and "since " in took[0], took[0]
        assert f"runner (pid {runner.pid} as nobody) ran past its job's end ({ends_by}" in took[0]
        assert not runner.alive() and not client.alive(), "the runner's processes live on"
        assert not [s for s in group_members(runner.pid) if s.running], "left running"
        status = json.loads((state.parent / "status.json").read_text())  # root's, read first
        assert status["status"] == "failed", status
        assert "ran past its job's end" in status["reason"], status
        assert "ended by `inv gpu-clean`" in status["reason"], status
        attach = fleet.cli("bench", "--hosts", "h0", "--attach", state.parent.name,
                           "--archive", str(tmp_path / "a"), timeout=180)  # fmt: skip
        told = attach.stdout + attach.stderr
        assert attach.returncode != 0 and "ran past its job's end" in told, told[-3000:]
        now = json.loads((workdir / "owner.json").read_text())
        assert "gpu-clean" in now["task"] and "runner" not in now, now
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
        for ref in (client, runner):
            if ref is not None and ref.alive():  # only the very processes it started
                with contextlib.suppress(OSError):
                    os.kill(ref.pid, signal.SIGKILL)
        fleet.cli("stop", "--hosts", "h0", "--grace", "2", timeout=120)
    record("hung_runner_takeover", {
        "before": "gpu-clean refused forever (runner asleep, not stopped)",
        "job_end_s": round(job, 1), "refused_before_end": True,
        "taken_over_s_after_end": round(took_s, 1),
        "gpu_clean_s": round(clean_s, 1), "line": took[0],
    })  # fmt: skip
