"""gpu-clean over real sshd hosts with real processes holding simulated GPU memory."""

from __future__ import annotations

import os
import subprocess

from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.inventory.model import load_inventory
from gpufleet.control.server import gpuclean as gpu
from gpufleet.host.agent.protocol import SysinfoArgs
from gpufleet.sim import gpustate
from helpers import pid_alive

NOBODY = 65534


def _as_nobody() -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def test_clean_kills_trees_orphans_and_stale_servers_then_verifies(fleet):
    tree, tree_pids = fleet.hold(
        "h0", "--gpu", "0", "--gpu", "1", "--mib", "70000", "--children", "2"
    )
    orphan_launcher, orphan_pids = fleet.hold(
        "h0", "--gpu", "2", "--mib", "50000", "--children", "1", "--orphan"
    )
    orphan_launcher.wait(10)  # the launcher exits; its child is re-parented away
    assert all(pid_alive(p) for p in orphan_pids)
    innocent = subprocess.Popen(["sleep", "300"])
    other_user = subprocess.Popen(["sleep", "300"], preexec_fn=_as_nobody)
    gpustate.register(3, 1000, pid=other_user.pid, path=fleet.state_dir("h0"))
    stale, stale_pids = fleet.hold("h1", "--title", "sglang::detokenizer")
    elsewhere, elsewhere_pids = fleet.hold("h2", "--title", "sglang::detokenizer")
    try:
        # h2's stale-looking process belongs to h2: cleaning only h0,h1 leaves it.
        out = fleet.cli("gpu-clean", "--hosts", "h0,h1", "--grace", "2", "--timeout", "5")
        assert out.returncode == 1, out.stdout + out.stderr
        assert "Traceback" not in out.stderr
        for pid in tree_pids + orphan_pids + stale_pids:
            assert not pid_alive(pid), f"{pid} should be dead\n{out.stdout}\n{out.stderr}"
        assert pid_alive(innocent.pid) and pid_alive(other_user.pid)
        assert all(pid_alive(p) for p in elsewhere_pids)
        assert f"left {other_user.pid} alone: owned by nobody (use --all-users)" in out.stdout
        assert "h0: FAILED: not clean after cleanup: GPU 3: busy 1000 MiB" in out.stderr
        assert "h1: verified clean" in out.stdout
        rows = [line.split() for line in out.stdout.splitlines() if line.startswith("h0 ")]
        assert len(rows) == 8
        assert rows[0][5] == ",".join(str(p) for p in sorted(tree_pids))
        assert rows[0][3] == "0" and rows[0][4] == "615" and rows[0][6] == "clean"

        out = fleet.cli("gpu-clean", "--hosts", "h0", "--all-users", "--grace", "2")
        assert out.returncode == 0, out.stdout + out.stderr
        assert not pid_alive(other_user.pid)
        assert pid_alive(innocent.pid)
        assert "h0: verified clean" in out.stdout
    finally:
        for p in (innocent, other_user, tree, stale, elsewhere):
            p.kill()
            p.wait()
    for pid in elsewhere_pids:
        assert not pid_alive(pid)


def test_dry_run_kills_nothing(fleet):
    proc, pids = fleet.hold("h1", "--gpu", "4", "--mib", "9000", "--children", "1")
    try:
        out = fleet.cli("gpu-clean", "--hosts", "h1", "--dry-run")
        assert out.returncode == 0, out.stderr
        assert all(pid_alive(p) for p in pids)
        for pid in pids:
            assert f"h1: would kill {pid} (root" in out.stdout
        assert "dry run: nothing killed" in out.stdout
        assert "busy 18000 MiB" in out.stdout  # parent and child, 9000 each
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_ignored_escalates_to_sigkill(fleet):
    proc, pids = fleet.hold("h2", "--gpu", "7", "--mib", "100", "--ignore-sigterm")
    try:
        inv = load_inventory(fleet.inventory)
        results = gpu.clean(Fleet(inv.select("h2"), 4), gpu.CleanOptions(grace_s=0.5))
        assert results[0].ok, results[0].error
        killed = {k.pid: k.signal for k in results[0].value.killed}
        assert killed == {pids[0]: "SIGKILL after 0.5s"}  # the table says it took SIGKILL
        assert not pid_alive(pids[0])
    finally:
        proc.kill()
        proc.wait()


def test_unattributed_memory_is_reported_not_fixed(fleet):
    state = fleet.state_dir("h1")
    fleet.env("h1")
    gpustate.register(5, 2048, pid=4_000_000, path=state, foreign=True)
    try:
        out = fleet.cli("gpu-clean", "--hosts", "h1", "--timeout", "1")
        assert out.returncode == 1
        assert "unattributed 2048 MiB (PID 4000000 not visible on this host)" in out.stdout
        assert "which this host cannot see" in out.stdout
    finally:
        gpustate.release(4_000_000, path=state)


def test_down_host_is_reported_while_others_are_cleaned(fleet, fresh_sshd):
    from gpufleet.sim.sshd import free_port

    fleet.write_inventory(
        extra_hosts={"down": {"address": "127.0.0.1", "port": free_port(), "workdir": "/tmp/x"}}
    )
    proc, pids = fleet.hold("h0", "--gpu", "0", "--mib", "10")
    try:
        out = fleet.cli("gpu-clean", "--hosts", "h0,down")
        assert out.returncode == 1
        assert "down: FAILED: cannot connect to root@127.0.0.1:" in out.stderr
        assert "connection refused" in out.stderr
        assert "h0: verified clean" in out.stdout
        assert not pid_alive(pids[0])
        assert "1 of 2 host(s) failed" in out.stderr
    finally:
        proc.kill()
        proc.wait()


def test_unknown_and_changed_host_keys_are_refused(fleet, fresh_sshd, tmp_path):
    new = fresh_sshd()
    other = fresh_sshd()
    fleet.write_inventory(extra_hosts={"new": {"address": "127.0.0.1", "port": new.port}})
    out = fleet.cli("status", "--hosts", "new")
    assert out.returncode == 1
    assert f"new: FAILED: unknown host key for [127.0.0.1]:{new.port}" in out.stderr
    assert f"ssh-keyscan -p {new.port} 127.0.0.1 >>" in out.stderr

    # known_hosts holds another server's key for this address: a changed key.
    line = other.known_hosts_line().replace(str(other.port), str(new.port))
    with open(fleet.known_hosts, "a") as fh:
        fh.write(line)
    out = fleet.cli("status", "--hosts", "new")
    assert out.returncode == 1
    assert f"HOST KEY CHANGED for [127.0.0.1]:{new.port}" in out.stderr

    # both printed hints, pasted into a shell as they are, make the host usable
    remove = out.stderr.split("remove the old key with `")[1].split("`")[0]
    assert f"-f {fleet.known_hosts}" in remove
    subprocess.run(["bash", "-c", remove], check=True, capture_output=True)
    out = fleet.cli("status", "--hosts", "new")
    assert "unknown host key" in out.stderr
    trust = out.stderr.split("trust it with `")[1].split("`")[0]
    subprocess.run(["bash", "-c", trust], check=True, capture_output=True)
    fleet.write_inventory(
        extra_hosts={
            "new": {"address": "127.0.0.1", "port": new.port, "workdir": str(tmp_path / "wn")}
        }
    )
    out = fleet.cli("status", "--hosts", "new")
    assert out.returncode == 0, out.stderr


def test_accept_new_records_the_key_only_when_asked(fleet, fresh_sshd):
    new = fresh_sshd()
    fleet.write_inventory(
        extra_hosts={
            "new": {
                "address": "127.0.0.1",
                "port": new.port,
                "host_key_policy": "accept-new",
                "workdir": str(fleet.workdir("new")),
            }
        }
    )
    out = fleet.cli("status", "--hosts", "new")
    assert out.returncode == 0, out.stderr
    assert f"[127.0.0.1]:{new.port} ssh-ed25519" in fleet.known_hosts.read_text()


def test_agent_runs_with_a_python_lacking_gpufleet(fleet):
    inv = load_inventory(fleet.inventory)
    from gpufleet.control.connect.fanout import run_on_hosts

    results = run_on_hosts(inv.select("all-sim"), lambda s: (s.call(SysinfoArgs()), s.workdir), 8)
    for res in results:
        assert res.ok, res.error
        info, workdir = res.value
        assert info.python_executable == fleet.python
        assert info.gpus[0].name == "NVIDIA H200" and len(info.gpus) == 8
        assert info.gpus[0].power_limit_w == 700.0 and info.gpus[0].health == "ok"
        assert oct(os.stat(workdir).st_mode & 0o777) == "0o700"
        agents = [p for p in os.listdir(workdir) if p.startswith("agent-")]
        assert (
            len(agents) == 1 and oct(os.stat(f"{workdir}/{agents[0]}").st_mode & 0o777) == "0o600"
        )


def test_gpu_count_mismatch_and_no_driver(fleet):
    port = fleet.sshds[0].port
    fleet.write_inventory(
        extra_hosts={
            "lost-gpu": {
                "address": "127.0.0.1",
                "port": port,
                "workdir": str(fleet.workdir("lost")),
                "gpus": {"count": 8, "simulated": True, "sim_count": 7},
            },
            "nodriver": {
                "address": "127.0.0.1",
                "port": port,
                "workdir": str(fleet.workdir("nd")),
                "gpus": {"count": 8, "simulated": False},
            },
        }
    )
    out = fleet.cli("gpu-clean", "--hosts", "lost-gpu,nodriver,h1")
    assert out.returncode == 1
    assert "lost-gpu: FAILED: expected 8 GPUs, NVML sees 7" in out.stderr
    assert "nodriver: FAILED: no NVIDIA driver on nodriver" in out.stderr
    assert "h1: verified clean" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    status = fleet.cli("status", "--hosts", "lost-gpu,h1")  # a missing GPU: status says so too
    assert status.returncode == 1
    assert "lost-gpu: FAILED: expected 8 GPUs, NVML sees 7" in status.stderr
