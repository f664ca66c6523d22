"""Ctrl-C during a sweep never costs a cell: a real SIGINT to the CLI's process group at each
phase of a cell, on two hosts over real sshd, then the printed `--resume` line pasted as is.

After that one resume the sweep is done, every cell has exactly one successful archived
run (nothing that had succeeded ran twice), and no server or bench runner is left running
on any host. Timings go to $GPUFLEET_RELIABILITY_FIGURES for docs/RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpufleet.archive import store
from gpufleet.archive.layout import Archive
from gpufleet.host.agent.procstat import ProcRef
from gpufleet.host.server.state import server_alive
from gpufleet.records import ServerState
from helpers import REPO, run_cli
from test_reliability import record
from test_slurm_real import held_by_the_interrupted_run

pytestmark = pytest.mark.slow  # real Ctrl-C at each phase of real sweeps: minutes

# phase -> (a regex on the CLI's output that says the phase has begun)
PHASES = {
    "cleaning": r"\[sweep\] ia on h0: cleaning",
    "launching": r"\[sweep\] ia on h0: launching",
    "waiting": r"^h0: started pid",
    "mid-level": r"^h0: C=1: \d+ requests",
    "between-levels": r"^h0: C=1: done",
    "stopping": r"\[sweep\] ia on h0: stopping",
    "final-compare": r"^h0: .* vs ",
}


def _profiles(fleet) -> Path:
    # each running request costs 15 ms a step: C=4 runs 4x slower per token than C=1, so
    # the second level lasts ~3.6 s (the SIGINT "between levels" lands before it ends on a
    # busy machine) on few tokens (8 x 24: little CPU)
    sim = {"load-seconds": 1.5, "warmup-seconds": 0.2, "decode-per-req-ms": 15}
    a = fleet.profile("ia", tp=1, sim=sim)
    port = yaml.safe_load(a.read_text())["port"]
    fleet.profile("ib", tp=1, port=port, sim=sim, flags={"max-running-requests": 16})
    return a.parent


def _start(args: list[str]) -> subprocess.Popen:
    """The CLI as a terminal would run it: its own process group, to which Ctrl-C goes."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpufleet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )


def _leftovers(fleet) -> list[str]:
    """Servers or bench runners still running on any host's workdir."""
    found = []
    for name in ("h0", "h1"):
        work = fleet.workdir(name)
        for state_file in (work / "servers").glob("*.json"):
            state = ServerState.from_wire(json.loads(state_file.read_text()))
            if server_alive(state):
                found.append(f"{name}: server pid {state.pid} ({state.profile})")
        for runner in (work / "runs").glob("*/runner.json"):
            if ProcRef.from_wire(json.loads(runner.read_text())).alive():
                found.append(f"{name}: bench runner of {runner.parent.name}")
    return found


@pytest.mark.parametrize("phase", list(PHASES))
def test_ctrl_c_at_each_phase_then_one_resume_finishes(fleet, tmp_path, phase):
    playbooks = _profiles(fleet)
    archive = tmp_path / "a"
    args = [
        "sweep",
        "--profiles", f"{playbooks}/ia.yaml,{playbooks}/ib.yaml",
        "--concurrency", "1,4",
        "--num-prompts", "8",
        "--output-len", "24",
        "--archive", str(archive),
        "--inventory", str(fleet.inventory),
        "--hosts", "h0,h1",
    ]  # fmt: skip
    proc = _start(args)
    output = []
    sent_at = None
    for line in proc.stdout:
        output.append(line)
        if sent_at is None and re.search(PHASES[phase], line):
            os.killpg(proc.pid, signal.SIGINT)
            sent_at = time.monotonic()
    code = proc.wait(timeout=120)
    exited_after = time.monotonic() - sent_at
    text = "".join(output)
    assert sent_at is not None, f"phase {phase} never showed:\n{text[-3000:]}"
    state_file = next((archive / "sweeps").glob("*.json"))
    state = json.loads(state_file.read_text())  # valid JSON: written atomically
    if phase in ("cleaning", "launching", "waiting"):
        # cancelled cleanly: the cell's server is stopped, the cell will run again
        assert _leftovers(fleet) == []
        assert state["cells"]["ia"]["h0"]["status"] == "interrupted"
    if phase in ("mid-level", "between-levels"):
        # the benchmark goes on on the host: the cell waits to be re-attached
        assert state["cells"]["ia"]["h0"]["status"] == "benching"
    if state["status"] != "done":
        assert code == 130, text[-3000:]
    # the exit line prints the exact resume command; paste it as a user would
    match = re.search(r"finish the sweep with `([^`]+)`", text)
    if state["status"] == "done":
        command = f"inv sweep {' '.join(args[1:])} --resume"  # nothing left: resume is a no-op
    else:
        assert match, text[-3000:]
        command = match.group(1)
        assert "--inventory" in command and "--hosts h0,h1" in command and "--resume" in command
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    started = time.monotonic()
    out = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    resume_s = time.monotonic() - started
    failed = [ln for ln in out.stdout.splitlines() if "FAILED" in ln]
    assert out.returncode == 0, "\n".join(failed) + "\n" + out.stdout[-3000:] + out.stderr[-2000:]
    if phase in ("mid-level", "between-levels"):
        assert "ia on h0: re-attaching run" in out.stdout

    state = json.loads(state_file.read_text())
    assert state["status"] == "done"
    for profile, cells in state["cells"].items():
        for host, cell in cells.items():
            assert cell["status"] == "done", (profile, host, cell)
            manifest = store.read_manifest(archive / host / cell["run_id"])
            assert manifest.status == "done"
    runs = store.list_runs(Archive(archive))
    for profile in ("ia", "ib"):
        for host in ("h0", "h1"):
            good = [
                r for r in runs
                if r.host == host and r.manifest.profile == profile and r.status == "done"
            ]  # fmt: skip
            assert len(good) == 1, f"{profile} on {host}: {len(good)} successful runs"
    assert all(store.verify(r.path) == [] for r in runs)
    assert _leftovers(fleet) == []
    record(
        f"ctrl_c_{phase}",
        {"exit_s": round(exited_after, 1), "exit_code": code, "resume_s": round(resume_s, 1)},
    )


def test_ctrl_c_during_inv_bench_prints_a_pasteable_attach(fleet, tmp_path):
    # the level is held open by the rehearsal (no token while the file exists): Ctrl-C
    # always finds it running, where a short level raced it and could end first (exit 0)
    hold = tmp_path / "hold"
    hold.touch()
    sim = {"load-seconds": 0.3, "warmup-seconds": 0.1, "hold-while": str(hold)}
    profile = fleet.profile("ibench", tp=1, sim=sim)
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h1").returncode == 0
    args = [
        "bench", "--profile", "ibench", "--concurrency", "2", "--num-prompts", "20",
        "--output-len", "64", "--archive", str(tmp_path / "a"),
        "--inventory", str(fleet.inventory), "--hosts", "h1",
    ]  # fmt: skip
    proc = _start(args)
    output = []
    for line in proc.stdout:
        output.append(line)
        if " started against " in line:
            os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130, "".join(output)[-2000:]
    text = "".join(output)
    match = re.search(r"fetch it with `([^`]+)`", text)
    assert match and "--inventory" in match.group(1), text[-2000:]
    hold.unlink()  # the run goes on on the host: let it finish, then fetch it as printed
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    command = match.group(1)  # as printed: it names the archive too (issue 81.7)
    out = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    [run] = store.list_runs(Archive(tmp_path / "a"))
    assert run.status == "done" and run.manifest.levels[0].concurrency == 2
    fleet.cli("stop", "--hosts", "h1")


def test_resume_reruns_a_failed_archived_cell_and_compare_picks_the_success(fleet, tmp_path):
    playbooks = _profiles(fleet)
    data = yaml.safe_load((playbooks / "ib.yaml").read_text())
    data["sim"]["crash-at-batch"] = 3  # the seeds' crash: ib's run dies at C=4
    (playbooks / "ib.yaml").write_text(yaml.safe_dump(data))
    archive = tmp_path / "a"
    args = [
        "sweep", "--profiles", f"{playbooks}/ia.yaml,{playbooks}/ib.yaml",
        "--concurrency", "1,4", "--num-prompts", "8", "--output-len", "16",
        "--archive", str(archive), "--hosts", "h0",
    ]  # fmt: skip
    out = fleet.cli(*args, timeout=300)
    assert out.returncode == 1, out.stdout[-2000:]
    assert "finish the sweep with `inv sweep" in out.stderr and "--resume" in out.stderr
    [failed] = [r for r in store.list_runs(Archive(archive)) if r.status == "failed"]

    data["sim"].pop("crash-at-batch")
    (playbooks / "ib.yaml").write_text(yaml.safe_dump(data))
    out = fleet.cli(*args, "--resume", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "ia: already done, skipped" in out.stdout
    runs = {r.run_id: r for r in store.list_runs(Archive(archive))}
    assert runs[failed.run_id].manifest.superseded  # kept, marked
    assert store.verify(failed.path) == []  # its checksummed files untouched
    [success] = [r for r in runs.values() if r.manifest.profile == "ib" and r.status == "done"]

    listing = run_cli("runs", "--archive", str(archive))
    assert "failed (superseded)" in listing.stdout and success.run_id in listing.stdout
    compared = run_cli("compare", "ia", "ib", "--archive", str(archive), "--format", "json")
    assert compared.returncode == 0, compared.stderr
    arms = json.loads(compared.stdout)["h0"]["arms"]
    assert arms[1]["run_ids"] == [success.run_id]


def test_a_second_ctrl_c_aborts_at_once_and_resume_still_finishes(fleet, tmp_path):
    playbooks = _profiles(fleet)
    # both hosts' levels are held open by the rehearsal (no token while the file exists):
    # the first Ctrl-C finds both cells benching, and the sweep then waits on their watch
    # slices, so the second lands while it still runs (a short level could end between)
    hold = tmp_path / "hold"
    hold.touch()
    for name in ("ia", "ib"):
        data = yaml.safe_load((playbooks / f"{name}.yaml").read_text())
        data["sim"]["hold-while"] = str(hold)
        (playbooks / f"{name}.yaml").write_text(yaml.safe_dump(data))
    archive = tmp_path / "a"
    args = [
        "sweep", "--profiles", f"{playbooks}/ia.yaml,{playbooks}/ib.yaml",
        "--concurrency", "1", "--num-prompts", "6", "--output-len", "48",
        "--archive", str(archive), "--inventory", str(fleet.inventory), "--hosts", "h0,h1",
    ]  # fmt: skip
    proc = _start(args)
    output = []
    benching: set[str] = set()
    for line in proc.stdout:
        output.append(line)
        if (started := re.search(r"^(h[01]): C=1: \d+ requests", line)) is not None:
            benching.add(started.group(1))
            if benching == {"h0", "h1"}:
                os.killpg(proc.pid, signal.SIGINT)
        if line.startswith("gpufleet: stopping:"):  # the first press taken: press again
            sent = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)  # the impatient second press
            break
    output.append(proc.communicate(timeout=30)[0])
    aborted_in = time.monotonic() - sent
    text = "".join(output)
    assert proc.returncode == 130 and aborted_in < 5, (aborted_in, text[-2000:])
    command = re.search(r"aborted; finish the sweep with `([^`]+)`", text).group(1)
    hold.unlink()  # the held runs go on on the hosts: let them finish for the resume
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    out = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    state = json.loads(next((archive / "sweeps").glob("*.json")).read_text())
    assert state["status"] == "done"
    assert _leftovers(fleet) == []
    record("ctrl_c_twice", {"exit_s": round(aborted_in, 2)})


def test_a_run_left_by_a_sweep_stopped_over_ssh_owns_its_host(fleet, tmp_path):
    """Issue 81.6 over sshd (test_slurm_real.py: the same over srun): a second sweep is
    refused in one line naming the run that holds the host, not the stopped sweep's pid."""
    try:
        held_by_the_interrupted_run(fleet, tmp_path / "a", "ssh")
    finally:
        fleet.cli("stop", "--hosts", "h0")


def _sigterm_at(proc: subprocess.Popen, pattern: str, sig=signal.SIGTERM) -> tuple[str, float]:
    """`sig` to the CLI alone (SIGTERM as `timeout`, a CI cancel or a scheduler sends it) at
    the first line matching `pattern`; everything it printed and the seconds it took to exit."""
    output = []
    sent = time.monotonic()
    for line in proc.stdout:
        output.append(line)
        if re.search(pattern, line):
            os.kill(proc.pid, sig)
            sent = time.monotonic()
            break
    output.append(proc.communicate(timeout=120)[0])
    return "".join(output), round(time.monotonic() - sent, 1)


def _gone_within(fleet, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while _leftovers(fleet) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _leftovers(fleet)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sigterm_during_inv_bench_leaves_the_run_with_an_attach_that_lands_in_its_archive(
    fleet, tmp_path, sig
):
    """Issue 81.7/81.8: SIGTERM took the process down with nothing said; now it is Ctrl-C:
    exit 130 and the `--attach` line, which carries the bench's `--archive` (pasted as
    printed, it archived into the default folder before)."""
    profile = fleet.profile("tbench", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h1").returncode == 0
    archive = tmp_path / "my archive"
    proc = _start(["bench", "--profile", "tbench", "--concurrency", "2", "--num-prompts", "20",
                   "--output-len", "64", "--archive", str(archive),
                   "--inventory", str(fleet.inventory), "--hosts", "h1"])  # fmt: skip
    text, exit_s = _sigterm_at(proc, " started against ", sig)
    assert proc.returncode == 130, text[-2000:]
    match = re.search(r"fetch it with `([^`]+)`", text)
    assert match and "--archive" in match.group(1), text[-2000:]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    out = subprocess.run(["bash", "-c", match.group(1)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    [run] = store.list_runs(Archive(archive))
    assert run.status == "done" and run.manifest.levels[0].concurrency == 2
    fleet.cli("stop", "--hosts", "h1")
    record(f"{sig.name.lower()}_bench", {"exit_s": exit_s, "exit_code": 130})


def test_sigterm_during_a_tune_level_stops_its_arm_and_frees_the_host(fleet, tmp_path):
    """Issue 81.8: a tune killed by SIGTERM mid-level printed nothing, left its server up
    and the host held by the orphaned level. Now: the stop line, exit 130 with the resume
    line, the arm's server stopped (its level with it) and the host free."""
    from helpers import QUICK_SIM, adaptive_flags

    profile = fleet.profile("tterm", tp=1, sim=QUICK_SIM, flags=adaptive_flags(3, running=64))
    proc = _start(["tune", "--profile", str(profile), "--depths", "1", "--concurrency", "1,16",
                   "--num-prompts", "64", "--output-len", "64", "--hosts", "h0",
                   "--archive", str(tmp_path / "a"), "--inventory", str(fleet.inventory)])  # fmt: skip
    text, exit_s = _sigterm_at(proc, r"^h0: C=1: \d+ requests")
    assert proc.returncode == 130, text[-3000:]
    assert "gpufleet: stopping (SIGTERM): no new cell starts" in text, text[-3000:]
    assert re.search(r"finish the sweep with `inv tune .*--resume`", text), text[-3000:]
    exited = time.monotonic()
    assert _gone_within(fleet, 30) == []
    free_s = round(time.monotonic() - exited, 1)
    out = fleet.cli("gpu-clean", "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    record("sigterm_tune", {"exit_s": exit_s, "exit_code": 130, "host_free_after_s": free_s})


def test_sigterm_during_a_rehearsal_level_leaves_it_to_resume(fleet, tmp_path):
    """Issue 81.8: `inv rehearse` stopped by SIGTERM mid-level ends as at Ctrl-C: exit 130,
    the level left running detached and the `--resume` line that fetches it."""
    archive = tmp_path / "a"
    proc = _start(["rehearse", "--inventory", str(fleet.inventory), "--hosts", "h0",
                   "--archive", str(archive)])  # fmt: skip
    text, exit_s = _sigterm_at(proc, r"^h0: C=1: \d+ requests")
    try:
        assert proc.returncode == 130, text[-3000:]
        assert re.search(r"finish the sweep with `inv rehearse .*--resume`", text), text[-3000:]
        state = json.loads(next((archive / "sweeps").glob("*.json")).read_text())
        assert state["cells"]["baseline"]["h0"]["status"] == "benching", state["cells"]
        record("sigterm_rehearse", {"exit_s": exit_s, "exit_code": 130})
    finally:  # the detached level holds the host until it ends (by design): then stop
        deadline = time.monotonic() + 240
        while any("runner" in x for x in _leftovers(fleet)) and time.monotonic() < deadline:
            time.sleep(0.5)
        fleet.cli("stop", "--hosts", "h0")
        assert _gone_within(fleet, 30) == []
