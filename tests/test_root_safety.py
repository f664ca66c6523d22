"""Root on a shared host: no local user gets code run through the workdir (issue 22.1).

Every case over real sshd, as root, with a second user (uid 65534) playing the attacker.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.host.agent import trust
from test_reliability import record

NOBODY = 65534
PLANT = "import pathlib; pathlib.Path({canary!r}).write_text('ran as root')\n"


def _plant(directory: Path, canary: Path) -> None:
    """What an attacker drops where the agent would run: modules the bootstrap imports."""
    for module in ("hashlib", "runpy", "os", "stat", "zipimport", "encodings"):
        (directory / f"{module}.py").write_text(PLANT.format(canary=str(canary)))


def _attacker_dir(path: Path, mode: int = 0o755) -> Path:
    path.mkdir(parents=True)
    path.chmod(mode)
    os.chown(path, NOBODY, NOBODY)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _clean_on(fleet, host: str):
    return fleet.cli("gpu-clean", "--hosts", host)


def test_a_module_planted_in_the_workdir_is_never_imported(fleet, tmp_path):
    # the workdir itself is safe (root's, 0700) but a hashlib.py sits in it: the old
    # bootstrap (`python -c` with the workdir as cwd) imported it before the hash check
    canary = tmp_path / "CANARY"
    workdir = fleet.workdir("h0")
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _plant(workdir, canary)
    out = _clean_on(fleet, "h0")
    assert out.returncode == 0, out.stderr
    assert not canary.exists()
    # PYTHONPATH/PYTHONSTARTUP in the login environment are ignored too (python -I)
    record("root_planted_module", {"exit": out.returncode, "canary": canary.exists()})


@pytest.mark.parametrize("case", ["sticky-symlink", "link-to-root-dir", "world-writable"])
def test_an_unsafe_workdir_path_is_refused_and_left_unchanged(fleet, tmp_path, case):
    canary = tmp_path / "CANARY"
    sticky = tmp_path / "shared-tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp
    if case == "sticky-symlink":
        # another user points /tmp/gpufleet at a directory they own, full of bait
        bait = _attacker_dir(tmp_path / "bait", 0o777)
        _plant(bait, canary)
        workdir = sticky / "gpufleet"
        workdir.symlink_to(bait)
        os.lchown(workdir, NOBODY, NOBODY)
        victim, expected = bait, "goes through a symlink another user owns"
    elif case == "link-to-root-dir":
        # the link points at a root-owned directory: it must not be chmod'ed 700
        victim = tmp_path / "victim"
        victim.mkdir(mode=0o755)
        victim.chmod(0o755)
        workdir = sticky / "gpufleet"
        workdir.symlink_to(victim)
        os.lchown(workdir, NOBODY, NOBODY)
        expected = "goes through a symlink another user owns"
    else:
        # `workdir: /tmp`: root's, but everyone writes there
        victim = workdir = sticky
        _plant(sticky, canary)
        expected = "is writable by other users"
    before = _mode(victim)
    fleet.write_inventory(
        extra_hosts={
            "odd": {"address": "127.0.0.1", "port": fleet.sshds[0].port, "workdir": str(workdir)}
        }
    )
    out = _clean_on(fleet, "odd")
    assert out.returncode == 1
    [failed] = [ln for ln in out.stderr.splitlines() if ln.startswith("odd: FAILED")]
    assert "refusing to run the agent" in failed and expected in failed, out.stderr
    assert "Traceback" not in out.stderr
    assert not canary.exists()
    assert _mode(victim) == before  # never chmod'ed
    assert not any(p.name.endswith(".pyz") for p in victim.iterdir())  # nothing uploaded
    record(f"root_unsafe_workdir_{case}", {"line": failed, "mode": oct(_mode(victim))})


def test_a_parent_writable_by_another_user_is_refused(fleet, tmp_path):
    parent = _attacker_dir(tmp_path / "theirs", 0o755)  # they could swap our dir inside
    fleet.write_inventory(
        extra_hosts={
            "odd": {
                "address": "127.0.0.1",
                "port": fleet.sshds[0].port,
                "workdir": str(parent / "gpufleet"),
            }
        }
    )
    out = _clean_on(fleet, "odd")
    assert out.returncode == 1
    assert "a directory another user owns" in out.stderr
    assert not (parent / "gpufleet").exists()  # not even created


def test_own_symlink_and_missing_dirs_are_fine_and_created_0700(fleet, tmp_path):
    real = fleet.workdir("h1")
    real.mkdir(parents=True, exist_ok=True, mode=0o700)
    link = tmp_path / "wd-link"
    link.symlink_to(real)
    fresh = tmp_path / "new" / "deeper"
    fleet.write_inventory(
        extra_hosts={
            "viaLink": {
                "address": "127.0.0.1",
                "port": fleet.sshds[1].port,
                "workdir": str(link),
                "vars": {"server_port_offset": 7},
            },
            "fresh": {
                "address": "127.0.0.1",
                "port": fleet.sshds[2].port,
                "workdir": str(fresh),
                "vars": {"server_port_offset": 14},
            },
        }
    )
    out = fleet.cli("gpu-clean", "--hosts", "viaLink,fresh")
    assert out.returncode == 0, out.stderr
    assert _mode(fresh) == 0o700 and _mode(fresh.parent) == 0o700


def test_bootstrap_rules_without_ssh(tmp_path):
    # the rules themselves, for the paths a user is likely to write
    uid = os.geteuid()

    def workdir(path: str) -> str:
        return trust.judge(path, uid, trust.WORKDIR, "workdir", create=True)

    assert workdir(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    with pytest.raises(trust.Untrusted):
        workdir("/")
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o775)  # group-writable, not sticky: a group member could swap entries
    with pytest.raises(trust.Untrusted, match="writable by other users"):
        workdir(str(loose / "wd"))
    assert not (loose / "wd").exists()


# -- 22.5 infrastructure and 22.6 live servers are not stale --------------------------------
def test_gpu_infrastructure_is_never_killed(fleet):
    import json

    from helpers import pid_alive

    # the MPS daemon holds GPU memory for every tenant's clients; persistenced holds none
    mps, [mps_pid] = fleet.hold("h0", "--gpu", "3", "--mib", "600", "--title",
                                "nvidia-cuda-mps-server")  # fmt: skip
    persist, [persist_pid] = fleet.hold("h0", "--title", "nvidia-persistenced")
    try:
        out = fleet.cli("gpu-clean", "--hosts", "h0", "--all-users", "--all-tenants",
                        "--grace", "1", "--timeout", "3", "--pattern", "nvidia-")  # fmt: skip
        assert pid_alive(mps_pid) and pid_alive(persist_pid)
        assert (
            f"h0: left {mps_pid} alone: infrastructure (nvidia-cuda-mps-server) is never killed"
            in out.stdout
        ), out.stdout + out.stderr
        assert f"left {persist_pid} alone: infrastructure (nvidia-persistenced)" in out.stdout
        dry = fleet.cli("gpu-clean", "--hosts", "h0", "--dry-run", "--json")
        answer = json.loads(dry.stdout)["h0"]
        assert mps_pid not in [p["pid"] for p in answer["would_kill"]]
        record("infrastructure_left_alone", {"exit": out.returncode, "alive": 2})
    finally:
        for proc in (mps, persist):
            proc.kill()
            proc.wait()


def test_a_live_server_is_left_running_with_a_pasteable_stop(fleet):
    import json
    import shlex

    import psutil
    import yaml

    from helpers import pid_alive

    profile = fleet.profile("live", tp=2)
    port = yaml.safe_load(profile.read_text())["port"]
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h1").returncode == 0
    state = json.loads((fleet.workdir("h1") / "servers" / f"{port + 7}.json").read_text())
    pids = {state["pid"], *(c.pid for c in psutil.Process(state["pid"]).children(True))}

    dry = fleet.cli("gpu-clean", "--hosts", "h1", "--dry-run", "--json")
    answer = json.loads(dry.stdout)["h1"]
    assert answer["ok"], answer
    assert not pids & {p["pid"] for p in answer["would_kill"]}
    [live] = answer["live"]
    assert live["port"] == port + 7 and live["profile"] == "live" and live["gpus"] == [0, 1]

    out = fleet.cli("gpu-clean", "--hosts", "h1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert all(pid_alive(p) for p in pids)
    [said] = [ln for ln in out.stdout.splitlines() if "left the live" in ln]
    assert f"port {port + 7}" in said and "GPUs 0,1" in said
    hint = said.split("free them with `")[1].rstrip("`")
    record("live_server_left", said)

    # the printed hint, pasted as it is, frees the GPUs
    pasted = subprocess.run(
        [sys.executable, "-m", "gpufleet", *shlex.split(hint)[1:]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr
    assert not any(pid_alive(p) for p in pids)


def test_include_running_kills_a_live_server_and_a_dead_one_stays_stale(fleet):
    import json

    import yaml

    from helpers import pid_alive

    profile = fleet.profile("live2", tp=1)
    port = yaml.safe_load(profile.read_text())["port"]
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h2").returncode == 0
    state = json.loads((fleet.workdir("h2") / "servers" / f"{port + 14}.json").read_text())
    out = fleet.cli("gpu-clean", "--hosts", "h2", "--include-running", "--grace", "2")
    assert out.returncode == 0 and not pid_alive(state["pid"]), out.stdout + out.stderr
    assert "left the live" not in out.stdout
