"""Slurm for real (issue 39): a running Slurm (munged, slurmctld, three slurmds n1-n3 on this
machine) answers the inventories, and `connection: srun` runs the same tasks as SSH, the
agent a job step on each node, reached by sbcast.

Each failure is one line naming the Slurm command or state, exit 2; nodes Slurm will not
run on are listed as skipped with Slurm's own reason."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from gpufleet.sim.slurm_cluster import LocalSlurm
from helpers import (
    REPO,
    Fleet,
    pid_alive,
    processes_under,
    read_run_id,
    run_cli,
    running_slurm,
    srun_inventory,
)
from test_reliability import record

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def cluster(slurm_cluster: LocalSlurm, monkeypatch) -> LocalSlurm:
    """The session's Slurm, its config in this test's environment (the CLI inherits it),
    and every job the test submitted cancelled after it."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    before = set(slurm_cluster.run("squeue", "-h", "-o", "%i").split())
    yield slurm_cluster
    for job in set(slurm_cluster.run("squeue", "-h", "-o", "%i").split()) - before:
        slurm_cluster.cancel(job)


@pytest.fixture
def own_cluster(monkeypatch) -> Iterator[LocalSlurm]:
    """A cluster of this test's own (p1 and p2; partition h200 = p2), for a
    test that stops slurmctld: the session's cluster serves the tests beside it meanwhile."""
    with running_slurm("gpufleet-slurm-own-", nodes=2, node_prefix="p") as cluster:
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster


def _one_line_exit_2(out, said: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], out.stderr


def test_the_cluster_is_real_and_runs_jobs(cluster):
    states = set(cluster.run("sinfo", "-h", "-N", "-o", "%N %T").splitlines())
    assert states == {"n1 idle", "n2 idle", "n3 idle"}
    job = cluster.submit("-N2", "-p", "h200")
    assert cluster.wait_running(job) == "n[2-3]"
    out = cluster.run("srun", f"--jobid={job}", "--overlap", "-w", "n3", "-N1", "-n1",
                      "printenv", "SLURMD_NODENAME")  # fmt: skip
    assert out.strip() == "n3"


def test_a_running_job_of_yours_is_its_nodes(cluster):
    job = cluster.submit("-N2", "-p", "h200")
    cluster.wait_running(job)
    out = run_cli("hosts", "--inventory", f"slurm:job={job}")
    assert out.returncode == 0, out.stderr
    assert re.search(r"^n2 .* slurm", out.stdout, re.M) and re.search(r"^n3 ", out.stdout, re.M)
    assert "n1" not in out.stdout


def test_a_job_that_is_not_yours_and_running_is_one_line_naming_why(cluster):
    pending = cluster.submit("--begin=now+1hour")
    _one_line_exit_2(
        run_cli("hosts", "--inventory", f"slurm:job={pending}"),
        f"slurm job {pending} is pending (BeginTime): it holds no nodes yet",
    )
    ended = cluster.submit("-N1")
    cluster.wait_running(ended)
    cluster.cancel(ended)
    _one_line_exit_2(run_cli("hosts", "--inventory", f"slurm:job={ended}"),
                     f"slurm job {ended} is not running (CANCELLED)")  # fmt: skip
    _one_line_exit_2(
        run_cli("hosts", "--inventory", "slurm:job=987654"),
        "slurm job 987654: no such job (ended and purged, or never submitted)",
    )
    theirs = cluster.submit("--uid=nobody")
    cluster.wait_running(theirs)
    _one_line_exit_2(run_cli("hosts", "--inventory", f"slurm:job={theirs}"),
                     f"slurm job {theirs} belongs to nobody, not root")  # fmt: skip


def test_drained_and_down_nodes_are_skipped_with_slurms_reason(cluster):
    try:
        cluster.run("scontrol", "update", "nodename=n1", "state=drain", "reason=fan failure")
        out = run_cli("hosts", "--inventory", "slurm:partition=main")
        assert out.returncode == 0, out.stderr
        assert "skipped n1: drained (fan failure)" in out.stdout
        assert re.search(r"^n2 ", out.stdout, re.M) and not re.search(r"^n1 ", out.stdout, re.M)
        listed = run_cli("hosts", "--inventory", "slurm:n[1-2]")
        assert listed.returncode == 0, listed.stderr
        assert "skipped n1: drained (fan failure)" in listed.stdout
        assert re.search(r"^n2 ", listed.stdout, re.M)

        cluster.run("scontrol", "update", "nodename=n1", "state=resume")  # drain outlives down
        cluster.run("scontrol", "update", "nodename=n1", "state=down", "reason=psu dead")
        out = run_cli("hosts", "--inventory", "slurm:partition=main")
        # `down*` as sinfo prints it: down, and (set by hand) not answering the controller
        assert re.search(r"^skipped n1: down(, not responding)? \(psu dead\)$", out.stdout, re.M)
        _one_line_exit_2(
            run_cli("hosts", "--inventory", "slurm:n1"),
            "slurm nodes n1: every node is skipped: n1 down",
        )
    finally:
        cluster.run("scontrol", "update", "nodename=n1", "state=resume", check=False)
    ok = run_cli("hosts", "--inventory", "slurm:partition=h200")
    assert ok.returncode == 0 and "skipped" not in ok.stdout, ok.stdout + ok.stderr
    _one_line_exit_2(
        run_cli("hosts", "--inventory", "slurm:partition=nope"),
        "slurm partition nope: no such partition, or no nodes (sinfo lists none)",
    )
    _one_line_exit_2(
        run_cli("hosts", "--inventory", "slurm:zz[1-2]"),
        "slurm nodes zz[1-2]: not nodes of this Slurm: zz1, zz2",
    )


def test_a_slurm_node_list_in_an_inventory_file_is_drain_checked_too(cluster, tmp_path):
    """Issue 69 R2: a sweep checked drains only for hosts with `slurm_job` or a `slurm:`
    inventory on the command line; the nodes of a `slurm:partition=...` key in an
    inventory file got the next cell silently. Now every host a Slurm node list makes is a
    Slurm node, however the inventory names Slurm; and `--hosts` naming a node the list
    skipped says Slurm's state, not "unknown host"."""
    from gpufleet.control.connect.fleet import Fleet
    from gpufleet.control.inventory.model import load_inventory
    from gpufleet.control.sweep import drain

    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {"slurm:partition=main": {"python": "python3"}}}))
    loaded = load_inventory(inventory)
    fleet = Fleet(list(loaded.hosts.values()), source=str(inventory))
    assert set(drain.slurm_nodes(fleet)) == set(loaded.hosts) and loaded.hosts
    node = sorted(loaded.hosts)[0]
    try:
        cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=fan check")
        assert drain.unavailable(fleet) == {node: "drained (fan check)"}
        out = run_cli("status", "--inventory", str(inventory), "--hosts", node)
        said = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(said) == 1, out.stdout + out.stderr
        assert f"{node}: Slurm has the node drained (fan check)" in said[0], said
        assert "unknown host" not in said[0]
    finally:
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    assert drain.unavailable(fleet) == {}


def test_a_slurm_command_that_fails_is_one_line_naming_it(cluster, tmp_path, monkeypatch):
    broken = tmp_path / "slurm.conf"
    broken.write_text("ClusterName=x\nSlurmctldHost=nowhere\n")
    monkeypatch.setenv("SLURM_CONF", str(broken))
    out = run_cli("hosts", "--inventory", "slurm:job=1", timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "slurm job 1: `squeue -h -j 1 --states=all -o %T|%u|%N|%r` failed:" in out.stderr


@pytest.mark.slow(minutes=2)
@pytest.mark.parametrize("connection", ["ssh", "srun"])
def test_the_same_tasks_pass_over_ssh_and_over_srun(connection, fleet, cluster):
    """gpu-clean kills a stale holder, launch --clean, bench, stop: the same outcome and
    output over either way to the host."""
    if connection == "srun":
        job = cluster.submit("-N2", "-p", "h200")
        cluster.wait_running(job)
        srun_inventory(fleet, job, ["n2", "n3"])
    stale, stale_pids = fleet.hold("h1", "--gpu", "3", "--mib", "4000")
    try:
        out = fleet.cli("gpu-clean", "--hosts", "h0,h1")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"h1: killed {stale_pids[0]}" in out.stdout or str(stale_pids[0]) in out.stdout
        assert "h0: verified clean" in out.stdout and "h1: verified clean" in out.stdout
        assert not pid_alive(stale_pids[0])
    finally:
        stale.kill()
        stale.wait()
    profile = fleet.profile()
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", "--clean")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "h0: READY test" in out.stdout
    if connection == "srun":  # the agent's steps ended; the server is a step of its own
        steps = cluster.run("squeue", "-h", "-s", "-j", job, "-o", "%i").split()
        assert len(steps) == 2 and f"{job}.batch" in steps, steps
    bench = fleet.cli("bench", "--profile", str(profile), "--hosts", "h0", "--concurrency",
                      "1,2", "--num-prompts", "4", "--output-len", "8", timeout=300)  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert re.search(r"^2 +ok +4 +0 ", bench.stdout, re.M), bench.stdout  # C, status, ok, failed
    assert "h0: archived logs/h0/" in bench.stdout
    stop = fleet.cli("stop", "--hosts", "h0")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "h0: stopped test" in stop.stdout and "verified clean" in stop.stdout
    if connection == "srun":  # every agent step ended with its task
        assert cluster.run("squeue", "-h", "-s", "-j", job, "-o", "%i").split() == [f"{job}.batch"]


def test_srun_judges_the_host_python_before_it_runs(fleet, cluster, tmp_path):
    """The trust rule over srun reads the node through its own stat and find: a python
    in a directory others can write is refused before it runs, as over SSH."""
    job = cluster.submit("-N1", "-p", "h200")
    cluster.wait_running(job)
    inventory = srun_inventory(fleet, job, [cluster.run("squeue", "-h", "-j", job, "-o", "%N")
                                             .strip()])  # fmt: skip
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    os.symlink(fleet.python, shared / "python3")
    data = yaml.safe_load(inventory.read_text())
    data["defaults"]["python"] = str(shared / "python3")
    inventory.write_text(yaml.safe_dump(data))
    out = fleet.cli("gpu-clean", "--hosts", "h0")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "h0: FAILED: refusing to run the host python:" in out.stderr
    assert f"{shared} (owner uid 0, mode 0777) is writable by other users" in out.stderr


def test_a_job_of_nodes_under_srun_from_the_inventory_key(fleet, cluster):
    """`slurm:job=N` with `connection: srun` in the defaults: every node a host, each step
    in that job (the key sets slurm_job)."""
    job = cluster.submit("-N1", "-p", "h200")
    node = cluster.wait_running(job)
    fleet.inventory.write_text(yaml.safe_dump({
        "defaults": {"connection": "srun", "python": fleet.python,
                     "workdir": str(fleet.root / "work" / "slurm"),
                     "gpus": {"count": 8, "simulated": True}},
        "hosts": {f"slurm:job={job}": {"group": "mine"}},
    }))  # fmt: skip
    out = fleet.cli("gpu-clean", "--hosts", "mine")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{node}: verified clean" in out.stdout
    missing = fleet.root / "nojob.yaml"
    missing.write_text(yaml.safe_dump({"hosts": {"x": {"connection": "srun"}}}))
    _one_line_exit_2(run_cli("hosts", "--inventory", str(missing)),
                     "hosts.x: connection: srun needs slurm_job")  # fmt: skip


def test_run_as_in_a_slurm_job_is_refused_in_one_line(fleet, cluster):
    """Issue 50: a server in a Slurm job is a step of the job and runs as the job's user;
    `run_as` there would be a promise gpufleet does not keep: refused before anything runs."""
    job = cluster.submit("-N1", "-p", "h200")
    inventory = srun_inventory(fleet, job, [cluster.wait_running(job)])
    data = yaml.safe_load(inventory.read_text())
    data["defaults"]["run_as"] = "nobody"
    inventory.write_text(yaml.safe_dump(data))
    profile = fleet.profile("srunas", engine="custom", check_model_path=False, tp=1,
                            command=["true"], health_path="/")  # fmt: skip
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", "--dry-run")
    said = out.stdout + out.stderr
    assert out.returncode == 1, said
    assert "run_as nobody: a server in a Slurm job runs as the job's user" in said, said


@pytest.mark.slow(minutes=1)
@pytest.mark.faults
def test_a_server_ends_with_the_job_that_owned_it(fleet, cluster):
    """Launched over srun, the server is a step of the host's job: when the job is
    cancelled nothing of gpufleet's is left on the node (it lived on, parent PID 1, /health
    answering, before), and `inv status` says Slurm ended it, in Slurm's own words."""
    job = cluster.submit("-N1", "-p", "h200")
    node = cluster.wait_running(job)
    srun_inventory(fleet, job, [node])
    profile = fleet.profile()
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0 and "h0: READY test" in out.stdout, out.stdout + out.stderr
    workdir = fleet.workdir("h0")
    assert processes_under(workdir), "the server runs in the host's workdir"
    # issue 69: every step of gpufleet's is named for what it is ("N.3 sh" was unexplained)
    steps = cluster.run("squeue", "-h", "-s", "-j", job, "-o", "%i %j").split("\n")
    names = {line.split()[1] for line in steps if line.strip()} - {"batch", "extern"}
    assert names and all(n.startswith("gpufleet-") for n in names), steps
    assert "gpufleet-server" in names, steps
    cluster.cancel(job)
    deadline = time.monotonic() + 30
    while processes_under(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(workdir) == []
    status_says_the_job_ended(fleet, cluster, job, node, "-p", "h200")


def status_says_the_job_ended(fleet: Fleet, cluster: LocalSlurm, job: str, node: str,
                              *where: str) -> None:  # fmt: skip
    """In a new job on the same node, `inv status` names the server its old job ended, in
    Slurm's own words (this cluster's case and test_slurm_cgroup.py's)."""
    fresh = cluster.submit("-N1", *where, "-w", node)
    cluster.wait_running(fresh)
    srun_inventory(fleet, fresh, [node])
    status = fleet.cli("status", "--hosts", "h0")
    assert status.returncode == 0, status.stdout + status.stderr
    assert re.search(
        rf"h0: server test \(port \d+\) ended with its Slurm job: \*\*\* STEP "
        rf"{job}\.\d+ ON {node} CANCELLED AT ",
        status.stdout,
    ), status.stdout


def _srun_bench(fleet: Fleet, cluster: LocalSlurm, archive: Path):
    """A job on one node, the server launched there over srun, and a bench of it started
    in the background (long enough to interrupt): the job, the CLI and the run id."""
    job = cluster.submit("-N1", "-p", "h200")
    srun_inventory(fleet, job, [cluster.wait_running(job)])
    profile = fleet.profile("rel", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    proc = fleet.popen("bench", "--profile", str(profile), "--hosts", "h0", "--concurrency",
                       "8", "--num-prompts", "400", "--output-len", "32", "--archive",
                       str(archive))  # fmt: skip
    run_id = read_run_id(proc, until="C=8: 400 requests")
    assert run_id, "the bench did not start"
    time.sleep(1.5)
    return job, proc, run_id


@pytest.mark.slow(minutes=1)
@pytest.mark.faults
def test_a_bench_whose_control_step_is_lost_runs_on_and_is_attached(fleet, cluster, tmp_path):
    """The runner is a step of the job, not a child of the agent's step: when the control
    side's srun dies mid-bench (slurmctld or the login node gone), the run goes on, the
    failure line's `--attach` works when pasted, and nothing is measured twice."""
    job, proc, run_id = _srun_bench(fleet, cluster, tmp_path / "a")
    try:
        for child in psutil.Process(proc.pid).children(recursive=True):
            if child.name() == "srun":
                child.kill()  # the agent's step ends with its srun
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 1, rest
        hint = re.search(r"`(inv bench --attach \S+ --hosts h0[^`]*)`", rest)
        assert hint and run_id in hint.group(1), rest
        args = hint.group(1).split()[1:]  # pasted as printed: it names inventory and archive
        assert "--inventory" in args and "--archive" in args, hint.group(1)
        out = run_cli(*args, timeout=180)
        assert out.returncode == 0, out.stdout + out.stderr
        results = json.loads((tmp_path / "a" / "h0" / run_id / "results.jsonl").read_text())
        assert results["completed"] == 400 and results["failed"] == 0
    finally:
        fleet.cli("stop", "--hosts", "h0")
        cluster.cancel(job)


@pytest.mark.slow(minutes=2)
@pytest.mark.faults
def test_a_finished_run_whose_download_fails_ends_with_the_attach_that_fetches_it(
    fleet, own_cluster, tmp_path
):
    """Issue 69 R3: slurmctld down from mid-bench past the wait at download (the run
    finished on the node; its files need a new step): the bench printed FAILED with no
    `--attach`. Now the failure line ends with the `--attach` that fetches it, and that
    line, pasted once the controller is back, archives every request."""
    cluster = own_cluster
    os.environ["GPUFLEET_SLURMCTLD_WAIT_S"] = "5"
    try:
        job, proc, run_id = _srun_bench(fleet, cluster, tmp_path / "a")
    finally:
        del os.environ["GPUFLEET_SLURMCTLD_WAIT_S"]
    try:
        cluster.stop_controller()
        rest = proc.communicate(timeout=240)[0]
        assert proc.returncode == 1, rest
        assert "slurmctld did not answer for" in rest, rest
        hint = re.search(r"the run finished on h0 and stays there: fetch it with "
                         r"`(inv bench --attach \S+ --hosts h0[^`]*)`", rest)  # fmt: skip
        assert hint and run_id in hint.group(1), rest
        cluster.start_controller()
        out = run_cli(*hint.group(1).split()[1:], timeout=180)  # as printed: its archive too
        assert out.returncode == 0, out.stdout + out.stderr
        results = json.loads((tmp_path / "a" / "h0" / run_id / "results.jsonl").read_text())
        assert results["completed"] == 400 and results["failed"] == 0
    finally:
        cluster.start_controller()
        fleet.cli("stop", "--hosts", "h0")
        cluster.cancel(job)


@pytest.mark.slow(minutes=1)
@pytest.mark.faults
def test_a_job_cancelled_mid_bench_leaves_nothing_on_the_node(fleet, cluster, tmp_path):
    """scancel while the bench runs: the server, the runner and its generator processes
    end with the job (no process in the host's workdir), and the bench fails in one line
    that offers no `--attach` it could not keep."""
    cancel_mid_bench(fleet, cluster, tmp_path)


def cancel_mid_bench(fleet: Fleet, cluster: LocalSlurm, tmp_path: Path) -> None:
    """The case on either cluster (this one; test_slurm_cgroup.py's, by cgroup)."""
    job, proc, _ = _srun_bench(fleet, cluster, tmp_path / "a")
    node = cluster.run("squeue", "-h", "-j", job, "-o", "%N").strip()
    cancelled = time.monotonic()
    cluster.cancel(job)
    rest = proc.communicate(timeout=90)[0]
    print(f"the one-line failure {time.monotonic() - cancelled:.1f} s after scancel")
    assert proc.returncode == 1, rest
    failed = [line for line in rest.splitlines() if "h0: FAILED" in line]
    assert len(failed) == 1 and "--attach" not in failed[0], rest
    assert re.search(
        rf"Slurm job {job} was cancelled \(CANCELLED\): the server and the run "
        rf"on {node} ended with it",
        failed[0],
    ), rest
    deadline = time.monotonic() + 30
    while processes_under(fleet.workdir("h0")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(fleet.workdir("h0")) == []
    print(f"nothing left on the node {time.monotonic() - cancelled:.1f} s after scancel")


@pytest.mark.faults
def test_a_step_waits_for_slurmctld_with_backoff_then_says_srun_s_own_words(fleet, own_cluster):
    """slurmctld killed: a task that needs a new step says each wait on stderr and goes on
    once the controller is back; where it stays down past the bound, the one failure line
    carries srun's own message (it read "no message" in 3 of 5 tries: stderr was read
    before srun had written it) and how long it waited."""
    cluster = own_cluster
    job = cluster.submit("-N1", "-p", "h200")
    srun_inventory(fleet, job, [cluster.wait_running(job)])
    cluster.stop_controller()
    try:
        proc = fleet.popen("status", "--hosts", "h0")
        waits = []
        for text in proc.stdout:
            waits.append(text)
            if "slurmctld does not answer; trying again in 2 s (for up to 90 s)" in text:
                break
        cluster.start_controller()
        rest = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, "".join(waits) + rest
        assert re.search(r"h0: warning: slurmctld did not answer at first: the step started "
                         r"at try \d+, after \d+ s", rest), rest  # fmt: skip
        cluster.stop_controller()
        os.environ["GPUFLEET_SLURMCTLD_WAIT_S"] = "5"
        try:
            out = fleet.cli("status", "--hosts", "h0", timeout=120)
        finally:
            del os.environ["GPUFLEET_SLURMCTLD_WAIT_S"]
        failed = [line for line in out.stderr.splitlines() if "FAILED" in line]
        assert out.returncode == 1 and len(failed) == 1, out.stdout + out.stderr
        assert failed[0].count("slurmctld did not answer for") == 1, failed
        assert "Unable to contact slurm controller" in failed[0], failed
        # the whole stated wait, not up to the last doubling that fit (75 s of 90 before)
        waited = re.search(r"slurmctld did not answer for (\d+) s \(\d+ tr(y|ies), "
                           r"\$GPUFLEET_SLURMCTLD_WAIT_S=5\)", failed[0])  # fmt: skip
        assert waited and int(waited.group(1)) >= 5, failed
    finally:
        cluster.start_controller()
        cluster.cancel(job)


@pytest.mark.slow(minutes=2)
@pytest.mark.faults
def test_a_node_drained_mid_sweep_finishes_its_cell_then_is_skipped_with_slurms_reason(
    fleet, cluster, tmp_path
):
    """The policy of control/sweep/drain.py: a node drained while a cell runs finishes that
    cell, gets no later cell (one line with Slurm's state and reason, the reason listed in
    the sweep's report), and `--resume` runs what it missed once Slurm gives it back."""
    job = cluster.submit("-N2", "-p", "h200")
    nodes = cluster.wait_running(job)
    srun_inventory(fleet, job, ["n2", "n3"])
    first = fleet.profile("first", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    second = fleet.profile("second", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    assert nodes == "n[2-3]"
    archive = tmp_path / "a"
    sweep = ["sweep", "--profiles", f"{first},{second}", "--hosts", "h0,h1", "--concurrency",
             "1", "--num-prompts", "6", "--output-len", "16", "--archive", str(archive)]  # fmt: skip
    proc = fleet.popen(*sweep)
    said = []
    try:
        for text in proc.stdout:
            said.append(text)
            if text.startswith("[sweep 1/2] first on h0, h1"):
                cluster.run("scontrol", "update", "nodename=n3", "state=drain",
                            "reason=fan check")  # fmt: skip
                break
        rest = proc.communicate(timeout=240)[0]
        text = "".join(said) + rest
        assert proc.returncode == 1, text
        assert re.search(r"\[sweep\] first on h1: done", text), text
        assert ("[sweep 2/2] second on h1: not started: Slurm has the node draining (fan check); "
                "the sweep goes on without it") in text  # fmt: skip
        assert re.search(r"\[sweep\] second on h0: done", text), text
        report = next(archive.glob("**/report.html")).read_text()
        assert "not started: Slurm has the node draining (fan check)" in report
    finally:
        cluster.run("scontrol", "update", "nodename=n3", "state=resume", check=False)
    deadline = time.monotonic() + 60  # until Slurm has pinged it again: `mixed`, no flag
    while time.monotonic() < deadline:
        state = cluster.run("sinfo", "-h", "-N", "-n", "n3", "-o", "%T", check=False).split()
        if state and all(s in ("mixed", "allocated", "idle") for s in state):
            break
        time.sleep(0.5)
    resumed = fleet.cli(*sweep, "--resume", timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "[sweep 1/2] first: already done, skipped" in resumed.stdout
    assert re.search(r"\[sweep\] second on h1: done", resumed.stdout), resumed.stdout
    fleet.cli("stop", "--hosts", "h0,h1")


@pytest.mark.slow(minutes=1)
@pytest.mark.faults
def test_a_job_cancelled_mid_launch_fails_in_one_line_and_leaves_nothing(fleet, cluster):
    """scancel while launch waits for the server's health: one failure line that says the
    job ended (no `inv wait` hint that could not work), and nothing left on the node."""
    job = cluster.submit("-N1", "-p", "h200")
    srun_inventory(fleet, job, [cluster.wait_running(job)])
    profile = fleet.profile("slow", tp=1, sim={"load-seconds": 20, "warmup-seconds": 0.1})
    proc = fleet.popen("launch", "--profile", str(profile), "--hosts", "h0")
    deadline = time.monotonic() + 60
    while not processes_under(fleet.workdir("h0")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the server loads its model (20 s): launch is waiting for its health
    cancelled = time.monotonic()
    cluster.cancel(job)
    rest = proc.communicate(timeout=90)[0]
    print(f"the one-line failure {time.monotonic() - cancelled:.1f} s after scancel")
    failed = [line for line in rest.splitlines() if "h0: FAILED" in line]
    assert proc.returncode == 1 and len(failed) == 1, rest
    assert f"Slurm job {job} was cancelled (CANCELLED)" in failed[0], rest
    assert "inv wait" not in failed[0], rest
    deadline = time.monotonic() + 30
    while processes_under(fleet.workdir("h0")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(fleet.workdir("h0")) == []


@pytest.mark.slow(minutes=2)
@pytest.mark.faults
def test_a_time_limit_ends_the_server_and_status_says_why(fleet, cluster):
    """A job with a one-minute limit: when Slurm's limit ends it, the server ends with it,
    and `inv status` shows Slurm's own line, TIME LIMIT in it."""
    job = cluster.submit("-N1", "-p", "h200", "--time=1")
    node = cluster.wait_running(job)
    srun_inventory(fleet, job, [node])
    out = fleet.cli("launch", "--profile", str(fleet.profile()), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        if cluster.run("squeue", "-h", "-j", job, "--states=all", "-o", "%T").strip() == "TIMEOUT":
            break
        time.sleep(1)
    while processes_under(fleet.workdir("h0")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(fleet.workdir("h0")) == []
    fresh = cluster.submit("-N1", "-p", "h200", "-w", node)
    cluster.wait_running(fresh)
    srun_inventory(fleet, fresh, [node])
    status = fleet.cli("status", "--hosts", "h0")
    assert re.search(r"h0: server test \(port \d+\) ended with its Slurm job: \*\*\* STEP "
                     rf"{job}\.\d+ ON {node} CANCELLED AT \S+ DUE TO TIME LIMIT \*\*\*",
                     status.stdout), status.stdout + status.stderr  # fmt: skip


@pytest.mark.slow(minutes=2)
@pytest.mark.faults
@pytest.mark.parametrize(
    ("end", "words"), [("scancel", "was cancelled \\(CANCELLED\\)"),
                       ("requeue", "was requeued \\((PENDING|REQUEUED)\\)")],
)  # fmt: skip
def test_a_sweep_cell_whose_job_ends_mid_bench_is_said_once_and_one_resume_measures_it(
    fleet, cluster, tmp_path, end, words
):
    """Issue 69 R1: scancel while a sweep's cell benches. Before, the line said both "the
    server and the run on n2 ended with it" and "run X stays on the host ... --resume
    fetches it", the cell stayed `benching`, and the first --resume recorded FAILED
    (replaying the dead run's progress as if live); only a second one measured again.
    Now the cell is marked ended with its job at once, and one --resume (in a new job on
    the same node) measures it again."""
    job = cluster.submit("-N1", "-p", "h200", "--requeue")
    node = cluster.wait_running(job)
    srun_inventory(fleet, job, [node])
    profile = fleet.profile("ended", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    archive = tmp_path / "a"
    sweep = ["sweep", "--profiles", str(profile), "--hosts", "h0", "--concurrency", "8",
             "--num-prompts", "400", "--output-len", "32", "--archive", str(archive)]  # fmt: skip
    proc = fleet.popen(*sweep)
    said = []
    for text in proc.stdout:
        said.append(text)
        if re.search(r"^h0: C=8: \d+ requests", text):
            time.sleep(1.0)
            if end == "scancel":
                cluster.cancel(job)
            else:
                cluster.run("scontrol", "requeue", job)
            break
    rest = proc.communicate(timeout=120)[0]
    text = "".join(said) + rest
    assert proc.returncode == 1, text
    assert re.search(
        rf"Slurm job {job} {words}: the server and the run on {node} ended "
        "with it; run again in a running job",
        text,
    ), text
    cluster.cancel(job)  # a requeued job would start again: the resume runs in a new one
    assert "stays on the host" not in text and "fetches it" not in text, text
    fresh = cluster.submit("-N1", "-p", "h200", "-w", node)
    cluster.wait_running(fresh)
    srun_inventory(fleet, fresh, [node])
    resumed = fleet.cli(*sweep, "--resume", timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "re-attaching" not in resumed.stdout, resumed.stdout
    assert re.search(r"\[sweep\] ended on h0: done", resumed.stdout), resumed.stdout
    runs = [json.loads(p.read_text()) for p in archive.glob("h0/*/manifest.json")]
    assert sorted(r["status"] for r in runs) == ["done"], [r["status"] for r in runs]
    fleet.cli("stop", "--hosts", "h0")


@pytest.mark.slow(minutes=1)
def test_a_host_in_use_by_a_sweep_over_srun_refuses_another_task(fleet, cluster, tmp_path):
    """Issue 69.4 on the real Slurm: the host (a node of a job, reached by srun) is the
    running sweep's; another task's gpu-clean is refused in one line naming it, and never
    kills its loading server (before: each clean step killed the other's server)."""
    job = cluster.submit("-N1", "-p", "h200")
    srun_inventory(fleet, job, [cluster.wait_running(job)])
    profile = fleet.profile("owned", tp=1, sim={"load-seconds": 3.0, "warmup-seconds": 0.1})
    sweep = fleet.popen("sweep", "--profiles", str(profile), "--hosts", "h0", "-c", "1",
                        "--num-prompts", "4", "--output-len", "8", "--archive",
                        str(tmp_path / "a"))  # fmt: skip
    said = []
    for text in sweep.stdout:
        said.append(text)
        if "h0: loading" in text:
            break
    clean = fleet.cli("gpu-clean", "--hosts", "h0")
    rest = sweep.communicate(timeout=180)[0]
    assert clean.returncode == 1, clean.stdout + clean.stderr
    assert f"this host is in use by `inv sweep` (pid {sweep.pid} on " in clean.stderr
    assert sweep.returncode == 0, "".join(said) + rest
    assert re.search(r"\[sweep\] owned on h0: done", rest), rest


# what a user reads as a warning: gpufleet's `warning:` and `note:` lines, the login's
# variables not passed, the root note
WARNING_WORDS = re.compile(r"warning|note:|not passed to the server|sets no run_as", re.I)


# the load generator's marks on itself (host/bench/clientcert.py): true where the client's own
# figures crossed a bound, whatever gpufleet did
CLIENT_SELF = re.compile(r"(?:client-bound|client timers late) at C=(?P<level>\d+)")


def _client_marks(archive: Path) -> list[dict]:
    """The levels of every run under `archive` whose client figures crossed a bound."""
    rows = [json.loads(line) for f in archive.rglob("results.jsonl")
            for line in f.read_text().splitlines()]  # fmt: skip
    return [{"level": r["max_concurrency"]} for r in rows
            if r.get("client_bound") or r.get("client_late")]  # fmt: skip


@pytest.mark.slow(minutes=1)
@pytest.mark.parametrize("connection", ["ssh", "srun"])
def test_a_sweep_where_nothing_is_wrong_warns_of_nothing(connection, fleet, cluster, tmp_path):
    """Issue 64.2: every launch warned of login variables not passed, and the rehearsal
    ended advising run_as; a warning is a fact the user can act on. A sweep over the
    rehearsal hosts (ssh) and over a Slurm job's nodes (srun), with nothing wrong, prints
    no warning line at all."""
    if connection == "srun":
        job = cluster.submit("-N2", "-p", "h200")
        cluster.wait_running(job)
        srun_inventory(fleet, job, ["n2", "n3"])
    profile = fleet.profile("quiet", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    out = fleet.cli("sweep", "--profiles", str(profile), "--hosts", "h0,h1", "--concurrency",
                    "1,2", "--num-prompts", "4", "--output-len", "8",
                    "--archive", str(tmp_path / "a"), timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    said = (out.stdout + out.stderr).splitlines()
    warned = [ln for ln in said if WARNING_WORDS.search(ln) and not CLIENT_SELF.search(ln)]
    assert warned == [], warned
    # the client's marks on itself are facts of the machine that ran it (a 2-core machine
    # running the suite beside it lags its event loop): each must be what the archive measured
    marked = {m["level"] for m in _client_marks(tmp_path / "a")}
    for line in filter(CLIENT_SELF.search, said):
        assert int(CLIENT_SELF.search(line)["level"]) in marked, (line, marked)
    assert ": done (state: " in out.stdout, out.stdout[-2000:]
    fleet.cli("stop", "--hosts", "h0,h1")


def held_by_the_interrupted_run(fleet: Fleet, archive: Path, over: str) -> None:
    """Issue 81.6 (here and over ssh, test_interrupt.py): a sweep stopped by SIGTERM mid-level
    leaves its run going on on the host, and that run owns the host until it ends: a second
    sweep is refused in one line naming the run and the task that left it (never the dead
    task's pid as if it ran), and the first sweep's resume archives the original run."""
    profile = fleet.profile("held", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    proc = fleet.popen("sweep", "--profiles", str(profile), "--hosts", "h0", "--concurrency", "8",
                       "--num-prompts", "400", "--output-len", "32", "--archive", str(archive))  # fmt: skip
    said = []
    for text in proc.stdout:
        said.append(text)
        if re.search(r"^h0: C=8: \d+ requests", text):
            os.kill(proc.pid, signal.SIGTERM)  # as `timeout` or a CI cancel: the CLI only
            sent = time.monotonic()
            break
    rest = proc.communicate(timeout=120)[0]
    exit_s = round(time.monotonic() - sent, 1)
    assert proc.returncode == 130, "".join(said) + rest
    resume = re.search(r"finish the sweep with `([^`]+)`", rest)
    assert resume, rest
    state = json.loads(next((archive / "sweeps").glob("*.json")).read_text())
    [cell] = state["cells"]["held"].values()
    assert cell["status"] == "benching", cell
    other = fleet.profile("other", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    second = fleet.cli("sweep", "--profiles", str(other), "--hosts", "h0", "-c", "1",
                       "--num-prompts", "4", "--output-len", "8",
                       "--archive", str(archive.parent / "b"))  # fmt: skip
    assert second.returncode == 1, second.stdout + second.stderr
    refused = [ln for ln in second.stdout.splitlines() if "other on h0: FAILED" in ln]
    assert len(refused) == 1, second.stdout
    assert f"this host is held by run {cell['run_id']} (C=8, level 1 of 1, since " in refused[0]
    assert f"left running by `inv sweep` (pid {proc.pid} on " in refused[0], refused[0]
    assert "in use by" not in refused[0], refused[0]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    out = subprocess.run(["bash", "-c", resume.group(1)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "re-attaching run" in out.stdout, out.stdout
    results = json.loads((archive / "h0" / cell["run_id"] / "results.jsonl").read_text())
    assert results["completed"] == 400 and results["failed"] == 0
    record(f"sigterm_sweep_run_holds_host_{over}", {"exit_s": exit_s, "second_sweep_exit": 1})


@pytest.mark.slow(minutes=2)
@pytest.mark.faults
def test_a_run_left_by_a_sweep_stopped_over_srun_owns_its_node(fleet, cluster, tmp_path):
    """Before: the runner, a job step, never got the host's lock; the second sweep cleaned
    the node, killed the first run's server and reported success."""
    job = cluster.submit("-N1", "-p", "h200")
    srun_inventory(fleet, job, [cluster.wait_running(job)])
    try:
        held_by_the_interrupted_run(fleet, tmp_path / "a", "srun")
    finally:
        fleet.cli("stop", "--hosts", "h0")
        cluster.cancel(job)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.mark.slow(minutes=2)
@pytest.mark.faults
@pytest.mark.parametrize("seen", [True, False], ids=["watch-saw-done", "ended-at-once"])
def test_a_run_finished_when_its_job_ends_is_fetched_by_one_resume_never_measured_again(
    fleet, cluster, tmp_path, seen
):
    """Issue 81.7: the job cancelled once the cell's run wrote `done` on the node, before the
    sweep had its files. Before, the cell was marked failed with an `inv bench --attach`
    beside it, and the one --resume measured it again: the finished run (every request)
    was never fetched. Now the cell stays `benching`, NOT FETCHED names one recovery (the
    sweep's --resume), and that resume, in a new job on the node, archives the original.
    Where the job ended before the watch saw `done` (`ended-at-once`), the cell fails with
    its job, and the resume finds the run finished there and archives it all the same."""
    job = cluster.submit("-N1", "-p", "h200")
    node = cluster.wait_running(job)
    srun_inventory(fleet, job, [node])
    profile = fleet.profile("finished", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    archive = tmp_path / "a"
    proc = fleet.popen("sweep", "--profiles", str(profile), "--hosts", "h0", "--concurrency",
                       "8", "--num-prompts", "200", "--output-len", "32",
                       "--archive", str(archive))  # fmt: skip
    said = []
    for text in proc.stdout:
        said.append(text)
        if re.search(r"^h0: C=8: \d+ requests", text):
            break
    state = json.loads(next((archive / "sweeps").glob("*.json")).read_text())
    run_id = state["cells"]["finished"]["h0"]["run_id"]
    run_dir = fleet.workdir("h0") / "runs" / run_id
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and '"done"' not in _text(run_dir / "status.json"):
        time.sleep(0.001)
    runner = json.loads((run_dir / "runner.json").read_text())["pid"]
    held = seen
    try:  # the runner held after its `done`: the watch sees it and waits for the runner's exit
        os.kill(runner, signal.SIGSTOP)
        time.sleep(1.0 if seen else 0.0)
    except ProcessLookupError:
        held = False  # it had exited: the job ends at the fetch, or unseen by the sweep
    print(f"the runner was held after writing done: {held}")
    cluster.cancel(job)  # the job ends after the run wrote `done`
    text = "".join(said) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, text
    assert "--attach" not in text, text  # one recovery, never a second that archives twice
    cell = json.loads(next((archive / "sweeps").glob("*.json")).read_text())["cells"]
    if held:  # seen finished: not fetched, the one way to fetch it said
        unfetched = [ln for ln in text.splitlines() if "finished on h0: NOT FETCHED" in ln]
        assert len(unfetched) == 1, text
        # the watch saw the job end (`had finished ... before that`), or, where the runner
        # had exited as it was stopped (a zombie takes SIGSTOP), the download did
        assert (
            "the run had finished on h0 before that" in unfetched[0]
            or "the run finished on h0 and stays there" in unfetched[0]
        ), unfetched[0]
        assert "the sweep's --resume fetches it" in unfetched[0], unfetched[0]
        assert cell["finished"]["h0"]["status"] == "benching", cell
    resume = re.search(r"finish the sweep with `([^`]+)`", text)
    assert resume, text
    fresh = cluster.submit("-N1", "-p", "h200", "-w", node)
    cluster.wait_running(fresh)
    srun_inventory(fleet, fresh, [node])
    try:
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        out = subprocess.run(["bash", "-c", resume.group(1)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=240)  # fmt: skip
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        assert re.search(rf"(re-attaching|before it was fetched: fetching) run {run_id}",
                         out.stdout), out.stdout  # fmt: skip
        assert [p.name for p in (archive / "h0").iterdir()] == [run_id]  # not measured again
        results = json.loads((archive / "h0" / run_id / "results.jsonl").read_text())
        assert results["completed"] == 200 and results["failed"] == 0
        record(f"job_ended_after_done_{'seen' if seen else 'at_once'}",
               {"held": held, "completed": results["completed"], "runs_archived": 1})  # fmt: skip
    finally:
        fleet.cli("stop", "--hosts", "h0")
        cluster.cancel(fresh)
