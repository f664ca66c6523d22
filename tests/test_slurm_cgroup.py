"""On a real Slurm that tracks steps by cgroup (`proctrack/cgroup`, cgroup v1's freezer):
servers and runs outlive the launch's step and end with the job (host/proc/stepkeeper.py).

Such a Slurm ends every process of a step when the step ends, whatever its parents: before
the step keeper, launch over srun refused there (the detached srun holding the server's
step died with the agent's step, measured). This cluster is its own (nodes cg1-cg2: the
cgroups are named by node and job), started once for this module.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from gpufleet.sim.slurm_cluster import LocalSlurm, missing_programs
from helpers import Fleet, processes_under, running_slurm, srun_inventory
from test_slurm_real import cancel_mid_bench, status_says_the_job_ended

FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture(scope="module")
def cgroup_slurm():
    if missing_programs():
        pytest.fail(f"Slurm missing ({', '.join(missing_programs())})")
    if not FREEZER.is_dir():
        pytest.skip("no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer (cgroup v2 only)")
    with running_slurm("gpufleet-slurm-cgroup-", nodes=2, proctrack="cgroup",
                       node_prefix="cg") as cluster:  # fmt: skip
        yield cluster


@pytest.fixture
def cluster(cgroup_slurm: LocalSlurm, monkeypatch) -> LocalSlurm:
    monkeypatch.setenv("SLURM_CONF", str(cgroup_slurm.conf))
    assert "proctrack/cgroup" in cgroup_slurm.run("scontrol", "show", "config")
    return cgroup_slurm


def _step_of(pid: int) -> str:
    """The freezer cgroup a process is in: Slurm's `/slurm_NODE/uid_U/job_J/step_S`."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if ":freezer:" in line:
            return line.split(":", 2)[2]
    return ""


def _server_pid(fleet: Fleet) -> int:
    [state] = (fleet.workdir("h0") / "servers").glob("*.json")
    return int(json.loads(state.read_text())["pid"])


def _gone(workdir: Path, within: float) -> list[str]:
    deadline = time.monotonic() + within
    while processes_under(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    return processes_under(workdir)


@pytest.mark.slow(minutes=2)
@pytest.mark.faults
def test_under_cgroup_tracking_servers_and_runs_outlive_the_launch_and_end_with_the_job(
    fleet, cluster, tmp_path
):
    job = cluster.submit("-N1")
    node = cluster.wait_running(job)
    srun_inventory(fleet, job, [node])
    profile = str(fleet.profile())
    out = fleet.cli("launch", "--profile", profile, "--hosts", "h0")
    assert out.returncode == 0 and "h0: READY test" in out.stdout, out.stdout + out.stderr

    # the launch's own step has ended; the server runs on, in the keeper's step of the job
    server = _server_pid(fleet)
    step = _step_of(server)
    assert re.search(rf"/slurm_{node}/uid_\d+/job_{job}/step_\d+$", step), step
    status = fleet.cli("status", "--hosts", "h0")
    assert status.returncode == 0 and "ok" in status.stdout, status.stdout + status.stderr

    archive = tmp_path / "a"
    bench = fleet.cli("bench", "--concurrency", "1", "--num-prompts", "4", "--output-len",
                      "8", "--archive", str(archive), "--hosts", "h0", timeout=240)  # fmt: skip
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
    assert list(archive.glob("h0/*/manifest.json")), "the run is archived"

    # a second launch finds the keeper running: one keeper per job and node
    again = fleet.cli("launch", "--profile", profile, "--hosts", "h0", "--replace")
    assert again.returncode == 0, again.stdout + again.stderr
    assert _step_of(_server_pid(fleet)) == step

    workdir = fleet.workdir("h0")
    cluster.cancel(job)
    assert _gone(workdir, 30) == [], "the job's end ends the server, the keeper, its srun"

    status_says_the_job_ended(fleet, cluster, job, node)


@pytest.mark.slow(minutes=1)
@pytest.mark.faults
def test_under_cgroup_tracking_a_job_cancelled_mid_bench_leaves_nothing(fleet, cluster, tmp_path):
    """The same case as on the linuxproc cluster: one failure line naming the ended job, no
    `--attach`, nothing of gpufleet's left on the node (the keeper's children included)."""
    cancel_mid_bench(fleet, cluster, tmp_path)
