"""gpu-clean on a host that others share: it kills what is stale, never what merely shares
the host (a tmux whose command line mentions SGLang, another PID namespace), and the
rehearsal server dies like SGLang does. Real processes over real sshd."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml

from helpers import REPO, pid_alive
from test_reliability import record

TMUX = textwrap.dedent(
    """
    sleep 300 & editor=$!
    "$PY" -c "from gpufleet.sim import gpustate; gpustate.join_host($$); gpustate.join_host($editor)"
    "$PY" -m gpufleet.sim.hold --gpu 1 --mib 20000 --title sglang::scheduler_TP0 &
    stale=$!
    echo "panes $$ $stale $editor"
    wait
    """
)


def test_a_tmux_mentioning_sglang_is_not_killed_only_its_stale_pane(fleet):
    # argv[0] is tmux and its command line mentions sglang.launch_server, as
    # `tmux new 'python -m sglang.launch_server ...'` does; one pane is a stale scheduler
    # holding GPU memory, the other someone's editor
    tmux = subprocess.Popen(
        ["tmux", "-c", TMUX, "new", "python -m sglang.launch_server --model-path /m"],
        executable="/bin/sh",
        env={**fleet.env("h0"), "PY": sys.executable},
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        seen: dict[str, list[str]] = {}
        while not ("panes" in seen and "ready" in seen):
            words = tmux.stdout.readline().split()
            assert words, "the tmux stand-in did not start"
            seen[words[0]] = words[1:]
        server, stale, editor = (int(p) for p in seen["panes"])
        out = fleet.cli("gpu-clean", "--hosts", "h0", "--grace", "2")
        assert out.returncode == 0, out.stdout + out.stderr
        assert not pid_alive(stale), out.stdout
        assert pid_alive(server) and pid_alive(editor), out.stdout
        record("tmux_case", {"killed": [stale], "left_alone": [server, editor]})
    finally:
        subprocess.run(["pkill", "-P", str(tmux.pid)], check=False)
        tmux.kill()
        tmux.wait()


def test_another_pid_namespace_is_left_alone_unless_all_tenants(fleet):
    env = fleet.env("h1")
    tenant = subprocess.Popen(
        ["unshare", "--pid", "--fork", sys.executable, "-m", "gpufleet.sim.hold",
         "--gpu", "2", "--mib", "5000"],
        env=env, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        line = tenant.stdout.readline().split()
        assert line and line[0] == "ready", line
        holder = int(line[1])  # its PID on the host, as NVML reports it
        assert pid_alive(holder)
        out = fleet.cli("gpu-clean", "--hosts", "h1", "--grace", "1", "--timeout", "3")
        assert out.returncode == 1, out.stdout + out.stderr
        assert f"left {holder} alone: in another PID namespace" in out.stdout
        assert "use --all-tenants" in out.stdout and pid_alive(holder)
        started = time.monotonic()
        out = fleet.cli("gpu-clean", "--hosts", "h1", "--grace", "1", "--all-tenants")
        assert out.returncode == 0, out.stdout + out.stderr
        assert not pid_alive(holder)
        # a namespace's init ignores SIGTERM from outside: the table says SIGKILL was needed
        assert f"{holder} (SIGKILL after 1s)" in out.stdout
        record(
            "tenant_case",
            {"refused_without_flag": 1, "killed_with_all_tenants": 1,
             "clean_s": round(time.monotonic() - started, 1)},
        )  # fmt: skip
    finally:
        tenant.kill()
        tenant.wait()


def test_bad_or_everything_patterns_are_usage_errors(fleet):
    for pattern, expected in [("(", "bad process pattern"), (".", "matches the gpufleet agent"),
                              ("ssh", "matches sshd"), ("python", "matches")]:  # fmt: skip
        out = fleet.cli("gpu-clean", "--hosts", "h0", "--pattern", pattern)
        assert out.returncode == 2, (pattern, out.stdout, out.stderr)
        assert expected in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_rehearsal_server_without_process_titles_dies_with_gpu_clean(fleet):
    """Like SGLang's launcher, the rehearsal server's main process is a stale server too,
    also on a host whose Python lacks setproctitle (its command line stays python -m ...)."""
    profile = fleet.profile("notitle", tp=1, env={"GPUFLEET_SIM_NO_TITLE": "1"})
    port = yaml.safe_load(profile.read_text())["port"]
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h2").returncode == 0
    state = json.loads((fleet.workdir("h2") / "servers" / f"{port + 14}.json").read_text())
    main = state["pid"]
    cmdline = (Path("/proc") / str(main) / "cmdline").read_bytes().split(b"\0")
    assert cmdline[1:3] == [b"-m", b"gpufleet.sim.server"]  # no title to match
    # healthy, it is live and left alone; --include-running finds it by its module name
    out = fleet.cli("gpu-clean", "--hosts", "h2", "--grace", "2", "--include-running")
    assert out.returncode == 0, out.stdout + out.stderr
    assert not pid_alive(main), out.stdout
    status = fleet.cli("status", "--hosts", "h2")
    [row] = [ln for ln in status.stdout.splitlines() if ln.startswith("h2 ") and "notitle" in ln]
    assert " dead " in row and "ready" not in row, status.stdout


def test_a_workdir_or_agent_planted_by_someone_else_is_never_run(fleet, tmp_path):
    import os
    import zipfile

    from gpufleet.control.agent import bundle as agentzip

    # a shared workdir another user created first (e.g. under /tmp): refused, nothing run
    shared = tmp_path / "shared-workdir"
    shared.mkdir(mode=0o777)
    os.chown(shared, 65534, 65534)
    fleet.write_inventory(
        extra_hosts={
            "odd": {"address": "127.0.0.1", "port": fleet.sshds[0].port, "workdir": str(shared)}
        }
    )
    out = fleet.cli("gpu-clean", "--hosts", "odd")
    assert out.returncode == 1
    assert (
        f"odd: FAILED: refusing to run the agent: workdir {shared}: goes through a directory "
        f"another user owns, {shared} (owner uid 65534, mode 0{shared.stat().st_mode & 0o777:o}); "
        f"fix: chown root {shared}" in out.stderr
    ), out.stderr

    # an agent file with the right name but other bytes: its hash is checked before it runs
    canary = tmp_path / "CANARY"
    workdir = fleet.workdir("h0")
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    planted = workdir / agentzip.build().filename
    with zipfile.ZipFile(planted, "w") as zf:
        zf.writestr("__main__.py", f"open({str(canary)!r}, 'w').write('ran')\n")
    out = fleet.cli("gpu-clean", "--hosts", "h0")
    assert out.returncode == 1 and not canary.exists()
    assert "does not match the agent gpufleet built" in out.stderr
    planted.unlink()
    assert fleet.cli("gpu-clean", "--hosts", "h0").returncode == 0  # re-uploaded, runs


def test_proxy_jump_checks_the_bastions_key_too(fleet, tmp_path):
    bastion, target = fleet.sshds[0], fleet.sshds[1]
    jump = {
        "address": "127.0.0.1",
        "port": target.port,
        "workdir": str(tmp_path / "jumped"),
        "proxy_jump": f"root@127.0.0.1:{bastion.port}",
    }
    fleet.write_inventory(extra_hosts={"jumped": jump})
    out = fleet.cli("status", "--hosts", "jumped")
    assert out.returncode == 0, out.stdout + out.stderr  # through the bastion, both keys known

    # the bastion's key unknown: refused (Fabric's gateway alone would have trusted it)
    only_target = tmp_path / "ssh" / "known_hosts"
    only_target.parent.mkdir()
    only_target.write_text(target.known_hosts_line())
    fleet.write_inventory(extra_hosts={"jumped": {**jump, "known_hosts": str(only_target)}})
    out = fleet.cli("status", "--hosts", "jumped")
    assert out.returncode == 1
    assert f"unknown host key for [127.0.0.1]:{bastion.port}" in out.stderr, out.stderr


def test_the_keyscan_hint_works_where_the_folder_does_not_exist(fleet, tmp_path):
    missing = tmp_path / "no-such-dir" / "known_hosts"
    fleet.write_inventory(known_hosts=str(missing))
    out = fleet.cli("status", "--hosts", "h0")
    assert out.returncode == 1
    hint = out.stderr.split("trust it with `", 1)[1].split("`", 1)[0]
    assert hint.startswith(f"mkdir -p -m 700 {missing.parent} && ssh-keyscan -p ")
    subprocess.run(["bash", "-c", hint], check=True, capture_output=True)  # pasted as is
    assert fleet.cli("status", "--hosts", "h0").returncode == 0


def test_a_lost_host_is_reported_at_once_with_a_pasteable_attach(fleet, fresh_sshd, tmp_path):
    import os

    import psutil

    from helpers import read_run_id

    flaky_sshd = fresh_sshd()
    with open(fleet.known_hosts, "a") as fh:
        fh.write(flaky_sshd.known_hosts_line())
    fleet.write_inventory(
        extra_hosts={
            "flaky": {
                "address": "127.0.0.1", "port": flaky_sshd.port,
                "workdir": str(fleet.workdir("flaky")), "vars": {"server_port_offset": 50},
            }
        }
    )  # fmt: skip
    profile = fleet.profile("lost", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "flaky,h1").returncode == 0
    try:
        proc = fleet.popen(
            "bench", "--hosts", "flaky,h1", "--concurrency", "4", "--num-prompts", "60",
            "--output-len", "64", "--archive", str(tmp_path / "a"),
        )  # fmt: skip
        # flaky's own level has started: its benchmark is being watched when sshd dies
        run_id = read_run_id(proc, until="flaky: C=4: 60 requests")
        for p in [flaky_sshd.proc, *psutil.Process(flaky_sshd.proc.pid).children(recursive=True)]:
            if p.pid and psutil.Process(p.pid).name().startswith("sshd"):
                os.kill(p.pid, 9)
        lines = proc.communicate(timeout=120)[0].splitlines()
        lost = [i for i, ln in enumerate(lines) if ln.startswith("flaky: FAILED: lost")]
        assert lost, "\n".join(lines)
        lost = lost[0]
        h1_done = next(i for i, ln in enumerate(lines) if ln.startswith("h1: archived"))
        assert lost < h1_done, "\n".join(lines)  # said when it happened, not at the end
        assert sum(ln.startswith("flaky: FAILED") for ln in lines) == 1
        hint = lines[lost].split("fetch it with `", 1)[1].split("`", 1)[0]
        assert hint == (
            f"inv bench --attach {run_id} --hosts flaky --inventory {fleet.inventory}"
            f" --archive {tmp_path / 'a'}"
        )  # where it lands: issue 81.7
    finally:
        flaky_sshd.proc = None
        flaky_sshd.start()
        fleet.cli("stop", "--hosts", "flaky,h1")
