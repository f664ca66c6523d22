"""launch / wait / stop / logs over real sshd with the rehearsal engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import psutil
import yaml

from gpufleet.host.agent.procstat import ProcRef
from gpufleet.sim import gpustate
from helpers import pid_alive


def _state(fleet, host: str, port: int) -> dict:
    return json.loads((fleet.workdir(host) / "servers" / f"{port}.json").read_text())


def _server_info(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
        return json.loads(r.read())


def test_launch_ready_stop_clean_on_two_hosts(fleet):
    profile = fleet.profile()
    port = yaml.safe_load(profile.read_text())["port"]
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0,h1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "h0: READY test" in out.stdout and "h1: READY test" in out.stdout
    assert "h0: loading" in out.stdout and "h0: ready" in out.stdout
    for host, host_port in (("h0", port), ("h1", port + 7)):
        state = _state(fleet, host, host_port)
        assert state["status"] == "ready" and state["port"] == host_port
        assert pid_alive(state["pid"])
        assert os.getpgid(state["pid"]) == state["pgid"] == state["pid"]
        assert os.getsid(state["pid"]) == state["pid"]  # its own session: survives hangup
        assert len(gpustate.live_allocations(fleet.state_dir(host))) == 2
        assert state["argv"][1:3] == ["-m", "gpufleet.sim.server"]

    status = fleet.cli("status", "--hosts", "h0")
    assert (
        "servers" in status.stdout
        and f"h0    test     {_state(fleet, 'h0', port)['pid']}" in status.stdout
    )

    logs = fleet.cli("logs", "--hosts", "h1", "--lines", "3")
    assert logs.returncode == 0 and "The server is fired up and ready to roll!" in logs.stdout

    again = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert again.returncode == 1
    assert "already runs on port" in again.stderr and "--replace" in again.stderr

    out = fleet.cli("stop", "--hosts", "h0,h1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "h0: stopped test" in out.stdout and "verified clean" in out.stdout
    for host in ("h0", "h1"):
        assert gpustate.live_allocations(fleet.state_dir(host)) == []
        assert gpustate.host_pids(fleet.state_dir(host)) == set()


def test_crash_during_load_surfaces_the_error(fleet):
    profile = fleet.profile("crashy", sim={"load-seconds": 0.5, "crash-during-load": True})
    start = time.monotonic()
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h2")
    assert out.returncode == 1
    assert time.monotonic() - start < 20
    assert "h2: FAILED: crashed:" in out.stderr
    assert "The size of tensor a (160) must match the size of tensor b (2)" in out.stderr
    assert "last" in out.stderr and "lines of the server log" in out.stderr
    assert "Traceback (most recent call last)" not in out.stderr.split("---")[0]


def test_preflight_refuses_taken_port_unknown_flag_and_busy_gpu(fleet):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        profile = fleet.profile("taken", port=taken)
        out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 1
    assert f"preflight refused the launch: port {taken} on 127.0.0.1 is taken" in out.stderr

    profile = fleet.profile("badflag", flags={"cuda-graph-max-bs-typo": 8})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 1
    assert "flag --cuda-graph-max-bs-typo is not accepted by this engine version" in out.stderr
    assert not list((fleet.workdir("h0") / "servers").glob("*.json")) or all(
        json.loads(p.read_text())["profile"] != "badflag"
        for p in (fleet.workdir("h0") / "servers").glob("*.json")
    )

    holder, _ = fleet.hold("h0", "--gpu", "1", "--mib", "512")
    try:
        out = fleet.cli("launch", "--profile", str(fleet.profile()), "--hosts", "h0")
        assert out.returncode == 1
        assert "GPU 1 is in use: 512 MiB" in out.stderr
    finally:
        holder.kill()
        holder.wait()


def test_the_engines_help_is_asked_once_per_version_and_kept_in_the_workdir(fleet):
    """Every sweep cell launches again, and SGLang's --help takes ~16 s on a CPU: the
    flags are checked against a copy kept per engine version in the workdir. Shown by
    editing the copy: the next launch reads it (and refuses a flag it no longer lists);
    without the copy the engine is asked again."""
    profile = fleet.profile("helpcache", tp=1)
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h0").returncode == 0
    assert fleet.cli("stop", "--hosts", "h0").returncode == 0
    [kept] = (fleet.workdir("h0") / "cache" / "engine-help").glob("*.txt")
    assert "--model-path" in kept.read_text() and oct(kept.stat().st_mode & 0o777) == "0o600"
    kept.write_text(kept.read_text().replace("--model-path", "--modelpath"))
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 1
    assert "flag --model-path is not accepted by this engine version" in out.stderr
    kept.unlink()
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h0").returncode == 0
    assert fleet.cli("stop", "--hosts", "h0").returncode == 0
    assert "--model-path" in kept.read_text()


def test_orphaned_schedulers_after_launcher_sigkill_are_cleaned(fleet):
    profile = fleet.profile()
    port = yaml.safe_load(profile.read_text())["port"]
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h1").returncode == 0
    state = _state(fleet, "h1", port + 7)
    kids = psutil.Process(state["pid"]).children()
    os.kill(state["pid"], signal.SIGKILL)
    time.sleep(0.3)
    assert all(pid_alive(k.pid) for k in kids)
    out = fleet.cli("gpu-clean", "--hosts", "h1", "--grace", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert not any(pid_alive(k.pid) for k in kids)


def test_dropped_connection_while_waiting_then_wait_resumes(fleet):
    profile = fleet.profile("slow", sim={"load-seconds": 4, "warmup-seconds": 0.2})
    port = yaml.safe_load(profile.read_text())["port"]
    proc = fleet.popen("launch", "--profile", str(profile), "--hosts", "h2")
    for line in proc.stdout:
        if "h2: loading" in line:
            break
    proc.kill()  # the control machine goes away mid-wait
    proc.wait()
    state = _state(fleet, "h2", port + 14)
    assert pid_alive(state["pid"])
    out = fleet.cli("wait", "--hosts", "h2", "--port", str(port + 14))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"h2: READY port {port + 14}" in out.stdout
    assert fleet.cli("stop", "--hosts", "h2").returncode == 0


def test_dry_run_starts_nothing_and_shows_argv(fleet):
    profile = fleet.profile("dry", env={"HF_TOKEN": "hf_secret", "NCCL_DEBUG": "WARN"})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0,h1", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "-m gpufleet.sim.server --model-path /models/test --tp-size 2" in out.stdout
    assert "HF_TOKEN='***'" in out.stdout and "hf_secret" not in out.stdout
    assert "NCCL_DEBUG=WARN" in out.stdout
    assert "dry run: nothing started" in out.stdout
    assert not (fleet.workdir("h0") / "servers").exists() or not list(
        (fleet.workdir("h0") / "servers").glob("*.json")
    )


def test_hostile_values_reach_the_server_literally(fleet, tmp_path):
    canary = tmp_path / "CANARY"
    evil = f"/m'; touch {canary}; echo '$(touch {canary})`touch {canary}`\nnext"
    profile = fleet.profile(
        "evil",
        model_path=evil,
        flags={"served-model-name": f'a" ; touch {canary} #'},
        env={"EVIL": f"$(touch {canary}); touch {canary}"},
    )
    port = yaml.safe_load(profile.read_text())["port"]
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        info = _server_info(port)
        assert info["model_path"] == evil
        assert info["served_model_name"] == f'a" ; touch {canary} #'
        assert not canary.exists()
    finally:
        fleet.cli("stop", "--hosts", "h0")
    assert not canary.exists()


RECORDER = (
    "import json, os, sys, http.server as h; "
    "json.dump(dict(argv=sys.argv, env=os.environ['EVIL']), open(os.environ['OUT'], 'w')); "
    "h.HTTPServer(('127.0.0.1', int(sys.argv[1])), h.SimpleHTTPRequestHandler).serve_forever()"
)


def test_hostile_values_reach_a_custom_engine_literally(fleet, tmp_path):
    """A custom engine sees argv and environment byte for byte, and nothing runs a shell."""
    canary = tmp_path / "CANARY"
    evil = f"/m'; touch {canary}; echo '$(touch {canary})`touch {canary}`\nnext"
    record = tmp_path / "record.json"
    profile = fleet.profile(
        "evil-custom",
        engine="custom",
        health_path="/",
        check_model_path=False,
        model_path=evil,
        command=["{python}", "-c", RECORDER, "{port}", "{model_path}"],
        env={"EVIL": f"$(touch {canary}); touch {canary}\n", "OUT": str(record)},
        sim={},
        flags={"x": f"a;touch {canary}"},
    )
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h1")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        seen = json.loads(record.read_text())
        assert seen["argv"][2:] == [evil, "--x", f"a;touch {canary}"]
        assert seen["env"] == f"$(touch {canary}); touch {canary}\n"
    finally:
        fleet.cli("stop", "--hosts", "h1")
    assert not canary.exists()


def test_a_custom_engines_missing_program_is_one_line_at_preflight_and_dry_run(fleet):
    """Issue 38: a custom engine whose program is not installed gave a Python traceback at
    launch, and `--dry-run` passed. Both now refuse in one line naming the program."""
    for command in (["llama-server-not-installed", "--port", "{port}"],
                    ["/opt/nowhere/llama-server", "--port", "{port}"]):  # fmt: skip
        profile = fleet.profile("nobinary", engine="custom", health_path="/",
                                check_model_path=False, command=command, sim={})  # fmt: skip
        for dry in ([], ["--dry-run"]):
            out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h1", *dry)
            assert out.returncode == 1, out.stdout + out.stderr
            assert f"the engine's program {command[0]!r} is not" in out.stderr, out.stderr
            assert "Traceback" not in out.stdout + out.stderr


def test_malformed_profile_is_one_line(fleet):
    path = fleet.root / "playbooks" / "broken.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text("model_path: /m\ntp: eight\n")
    out = fleet.cli("launch", "--profile", str(path))
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        == f"gpufleet: {path}: tp: Input should be a valid integer, unable to parse string as an integer (got 'eight')"
    )
    path.write_text("extends: nowhere\nmodel_path: /m\n")
    out = fleet.cli("launch", "--profile", str(path))
    assert out.returncode == 2 and "extends: unknown profile 'nowhere'" in out.stderr


def test_logs_follow_streams_new_lines(fleet):
    profile = fleet.profile("follow")
    port = yaml.safe_load(profile.read_text())["port"]
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h0").returncode == 0
    proc = fleet.popen("logs", "--follow", "--hosts", "h0", "--lines", "2")
    try:
        seen = [proc.stdout.readline() for _ in range(2)]
        assert "ready to roll" in "".join(seen)
        state = _state(fleet, "h0", port)
        with open(state["log"], "a") as fh:
            fh.write("a line written after follow started\n")
        assert "h0| a line written after follow started" in proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
        fleet.cli("stop", "--hosts", "h0")


def test_stop_refuses_a_state_file_whose_pid_now_belongs_to_another_process(fleet):
    """PID reuse: the saved process group is someone else's now; stop must not signal it."""
    stranger = subprocess.Popen(
        ["sleep", "300"],
        start_new_session=True,  # its own group, id = its pid, like a server
    )
    try:
        servers = fleet.workdir("h0") / "servers"
        servers.mkdir(parents=True, exist_ok=True, mode=0o700)
        ref = ProcRef.capture(stranger.pid)
        state = {
            "pid": stranger.pid,
            "proc": {"pid": stranger.pid, "start_ticks": ref.start_ticks - 100},  # not it
            "pgid": stranger.pid,
            "port": 31999,
            "profile": "ghost",
            "engine": "sglang",
            "argv": ["python", "-m", "sglang.launch_server"],
            "gpus": [0],
            "status": "ready",
            "started_at": "2026-11-29T00:00:00Z",
            "health_url": "http://127.0.0.1:31999/health",
            "log": "/dev/null",
        }
        (servers / "31999.json").write_text(json.dumps(state))
        out = fleet.cli("stop", "--hosts", "h0")
        assert out.returncode == 0, out.stdout + out.stderr
        assert (
            f"server state for port 31999 is stale: pid {stranger.pid} is now `sleep`; "
            "state cleared, nothing killed"
        ) in out.stdout
        assert stranger.poll() is None  # alive: nothing was signalled
        assert json.loads((servers / "31999.json").read_text())["status"] == "stale"
        again = fleet.cli("stop", "--hosts", "h0")
        assert "no running server to stop" in again.stdout
    finally:
        stranger.kill()
        stranger.wait()
