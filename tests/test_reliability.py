"""Faults survived, bad input refused, nothing lost (docs/RELIABILITY.md lists each case)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.archive import store as archive
from gpufleet.control.connect.fanout import run_on_hosts
from gpufleet.control.inventory.model import load_inventory
from gpufleet.host.agent.protocol import EchoArgs
from gpufleet.sim import gpustate
from gpufleet.sim.sshd import LoopbackSshd, free_port, keygen
from helpers import REPO, pid_alive, read_run_id, run_cli

HOSTILE = st.lists(
    st.sampled_from([*"ab $`'\"\\;|&<>(){}[]*?!#~\n\t%=-_./", "$(touch {c})", "`touch {c}`"]),
    max_size=20,
).map("".join)


FIGURES = Path(os.environ.get("GPUFLEET_RELIABILITY_FIGURES", "/tmp/gpufleet-reliability.json"))


def record(key: str, value) -> None:
    """Keep a measured outcome for docs/RELIABILITY.md. Tests run side by side (xdist
    workers), so the read-modify-write holds a lock and the file is replaced whole."""
    import fcntl

    with open(FIGURES.with_name(FIGURES.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
        data[key] = value
        partial = FIGURES.with_name(f"{FIGURES.name}.{os.getpid()}.part")
        partial.write_text(json.dumps(data, indent=2))
        partial.replace(FIGURES)


def _bench_profile(fleet, name="rel", **sim):
    return fleet.profile(name, tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1, **sim})


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(HOSTILE, min_size=1, max_size=8))
def test_hostile_strings_reach_the_agent_literally_over_ssh(fleet, tmp_path, values):
    """Each string as a value and as a key; several per SSH call (one call is what costs)."""
    canary = tmp_path / "CANARY"
    values = [value.replace("{c}", str(canary)) for value in values]
    keyed = {value: n for n, value in enumerate(values)}
    inv = load_inventory(fleet.inventory)
    [res] = run_on_hosts(
        inv.select("h0"), lambda s: s.call(EchoArgs(payload={"values": values, "keyed": keyed})), 1
    )
    assert res.ok, res.error
    assert res.value["payload"] == {"values": values, "keyed": keyed}
    assert not canary.exists()


def test_hostile_workdir_and_profile_values(fleet, tmp_path):
    canary = tmp_path / "CANARY"
    workdir = str(tmp_path / f"w d'; touch {canary}; $(touch {canary})")
    fleet.write_inventory(
        extra_hosts={
            "odd": {"address": "127.0.0.1", "port": fleet.sshds[0].port, "workdir": workdir}
        }
    )
    out = fleet.cli("gpu-clean", "--hosts", "odd")
    assert out.returncode == 0, out.stdout + out.stderr
    assert os.path.isdir(workdir) and oct(os.stat(workdir).st_mode & 0o777) == "0o700"
    assert not canary.exists()


SECRETS = [
    "hf_supersecret",
    "sk-supersecret",
    "flag-supersecret",
    "admin-supersecret",
    "url-supersecret",
]


def test_secrets_never_written(fleet, tmp_path):
    """Secrets as a user puts them in playbooks/ (env, flags, a URL with a password): none
    reaches any file gpufleet writes, on either side; archives are private (0600/0700)."""
    profile = _bench_profile(fleet, "secret")
    data = yaml.safe_load(profile.read_text())
    data["env"] = {"HF_TOKEN": "hf_supersecret", "MY_API_KEY": "sk-supersecret", "PLAIN": "visible"}
    data["flags"] = {"api-key": "flag-supersecret", "admin-api-key": "admin-supersecret"}
    data["model_path"] = "https://hf-user:url-supersecret@hub.example/models/m"
    profile.write_text(yaml.safe_dump(data))
    dry = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", "--dry-run")
    assert "PLAIN=visible" in dry.stdout and "--api-key '***'" in dry.stdout
    assert not any(s in dry.stdout + dry.stderr for s in SECRETS), dry.stdout
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    archive = tmp_path / "a"
    try:
        out = fleet.cli(
            "bench", "--hosts", "h0", "--concurrency", "1", "--num-prompts", "2",
            "--output-len", "4", "--archive", str(archive),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        compared = run_cli("compare", "secret", "secret", "--archive", str(archive))
        assert compared.returncode == 0, compared.stderr  # writes the report and plots too
    finally:
        fleet.cli("stop", "--hosts", "h0")
    server_logs = {p for p in fleet.workdir("h0").glob("logs/*.log")}  # the server's own output
    # ... and the key file the server reads through --config (0600), instead of its argv
    server_logs |= {p for p in fleet.workdir("h0").glob("servers/*.keys.yaml")}
    assert all(p.stat().st_mode & 0o077 == 0 for p in server_logs)
    written = [p for p in archive.rglob("*") if p.is_file()]
    written += [p for p in fleet.workdir("h0").rglob("*") if p.is_file() and p not in server_logs]
    assert len(written) > 20
    for path in written:
        found = [s for s in SECRETS if s.encode() in path.read_bytes()]
        assert not found, (path, found)
    [run_dir] = [p for p in (archive / "h0").iterdir()]
    assert "flag-supersecret" not in (run_dir / "server.log").read_text()
    assert "api_key='***'" in (run_dir / "server.log").read_text()  # SGLang prints its args
    for path in [archive, *archive.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    record("secrets_scan", {"files_scanned": len(written), "secret_values_found": 0})


def test_gpu_clean_never_kills_init_sshd_or_ancestors_whatever_nvml_says(fleet, tmp_path):
    state = fleet.state_dir("h1")
    fleet.env("h1")
    own_sshd = fleet.sshds[1].proc.pid  # h1's sshd: an ancestor of h1's agent
    other_sshd = fleet.sshds[0].proc.pid  # an sshd that is not
    for pid in (1, own_sshd, other_sshd):
        gpustate.register(0, 100, pid=pid, path=state)
    try:
        out = fleet.cli("gpu-clean", "--hosts", "h1", "--timeout", "2", "--all-users")
        assert out.returncode == 1
        assert pid_alive(own_sshd) and pid_alive(other_sshd) and pid_alive(1)
        assert f"left {other_sshd} alone: sshd is never killed" in out.stdout
        assert f"left {own_sshd} alone: agent, ancestor or init" in out.stdout
        assert "left 1 alone: agent, ancestor or init" in out.stdout
    finally:
        for pid in (1, own_sshd, other_sshd):
            gpustate.release(pid, path=state)

    # connection: local -- this test process is an ancestor of the agent: never killed
    local = tmp_path / "local.yaml"
    local.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "here": {
                        "connection": "local",
                        "python": sys.executable,
                        "workdir": str(tmp_path / "lw"),
                        "gpus": {"count": 8, "simulated": True},
                    }
                }
            }
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet", "status", "--inventory", str(local)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0
    gpustate.register(2, 100, pid=os.getpid(), path=tmp_path / "lw" / "sim-gpus")
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "gpu-clean",
                "--inventory",
                str(local),
                "--timeout",
                "2",
                "--all-users",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert out.returncode == 1
        assert f"left {os.getpid()} alone: agent, ancestor or init" in out.stdout
    finally:
        gpustate.release(os.getpid(), path=tmp_path / "lw" / "sim-gpus")


def test_three_kinds_of_broken_host_are_reported_precisely(fleet, fresh_sshd, tmp_path):
    changed = fresh_sshd()
    other_key = tmp_path / "stranger_key"
    keygen(other_key)
    with open(fleet.known_hosts, "a") as fh:  # a stale key for `changed`'s address
        fh.write(
            fleet.sshds[0].known_hosts_line().replace(str(fleet.sshds[0].port), str(changed.port))
        )
    fleet.write_inventory(
        extra_hosts={
            "down": {"address": "127.0.0.1", "port": free_port()},
            "noauth": {
                "address": "127.0.0.1",
                "port": fleet.sshds[2].port,
                "identity_file": str(other_key),
            },
            "newkey": {"address": "127.0.0.1", "port": changed.port},
        }
    )
    start = time.monotonic()
    healthy = fleet.cli("status", "--hosts", "h0,h1")  # the reference, on this machine now
    reference = time.monotonic() - start
    assert healthy.returncode == 0, healthy.stderr
    start = time.monotonic()
    out = fleet.cli("status", "--hosts", "down,noauth,newkey,h0,h1")
    elapsed = time.monotonic() - start
    assert out.returncode == 1
    assert (
        "down: FAILED: cannot connect to root@127.0.0.1:" in out.stderr
        and "connection refused" in out.stderr
    )
    assert "noauth: FAILED: authentication failed for root@127.0.0.1:" in out.stderr
    assert "newkey: FAILED: HOST KEY CHANGED" in out.stderr
    assert "3 of 5 host(s) failed" in out.stderr
    assert out.stdout.count("NVIDIA H200") == 16  # h0 and h1 answered
    # no broken host holds the task: beyond what the healthy ones take here, at most the
    # refused host's retries (jittered, 2 s apart at most) -- was `< 30 s`, 31.2 s beside a
    # CPU hog in CI
    assert elapsed < 2 * reference + 15, (elapsed, reference)
    record("three_broken_hosts_s", round(elapsed, 1))


def test_32_hosts_through_default_maxstartups(tmp_path, ssh_keys, host_python):
    # default MaxStartups (10:30:100); INFO logs each connection it drops
    sshd = LoopbackSshd(tmp_path / "sshd", ssh_keys, max_startups=None, log_level="INFO").start()
    try:
        known = tmp_path / "known_hosts"
        known.write_text(sshd.known_hosts_line())
        inventory = tmp_path / "fleet.yaml"
        inventory.write_text(
            yaml.safe_dump(
                {
                    "defaults": {
                        "user": "root",
                        "identity_file": str(ssh_keys),
                        "known_hosts": str(known),
                        "python": host_python,
                        "gpus": {"count": 8, "simulated": True},
                    },
                    "hosts": {
                        f"n{i:02d}": {
                            "address": "127.0.0.1",
                            "port": sshd.port,
                            "workdir": str(tmp_path / "w" / f"n{i:02d}"),
                        }
                        for i in range(32)
                    },
                }
            )
        )
        out = subprocess.run(
            [sys.executable, "-m", "gpufleet", "gpu-clean", "--inventory", str(inventory)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert out.stdout.count("verified clean") == 32
        log = (tmp_path / "sshd" / "sshd.log").read_text()
        record("maxstartups_32_hosts", {"ok": 32, "sshd_dropped": log.count("past MaxStartups")})
    finally:
        sshd.stop()


def test_two_launches_at_once_one_wins(fleet):
    profile = _bench_profile(fleet, "race")
    procs = [
        fleet.popen("launch", "--profile", str(profile), "--hosts", "h2", stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    try:
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 1], outs
        loser = outs[[p.returncode for p in procs].index(1)][1]
        assert (
            "this host is in use by `inv launch`" in loser  # the host's owner (issue 69.4)
            or "another gpufleet launch on port" in loser
            or "already runs on port" in loser
            or "is taken" in loser
        )
        servers = [
            json.loads(p.read_text()) for p in (fleet.workdir("h2") / "servers").glob("*.json")
        ]
        assert len([s for s in servers if pid_alive(s["pid"])]) == 1
    finally:
        fleet.cli("stop", "--hosts", "h2")


def test_server_sigkilled_mid_bench_fails_fast(fleet, tmp_path):
    profile = _bench_profile(fleet, "victim")
    port = yaml.safe_load(profile.read_text())["port"] + 7
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h1").returncode == 0
    state = json.loads((fleet.workdir("h1") / "servers" / f"{port}.json").read_text())
    kids = psutil.Process(state["pid"]).children()
    # killed once the level is under way, whatever the machine's load (a fixed 2 s timer
    # fired before a busy machine's bench had found the server)
    proc = fleet.popen("bench", "--hosts", "h1", "--concurrency", "4", "--num-prompts", "400",
                       "--output-len", "64", "--archive", str(tmp_path / "a"),
                       stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert read_run_id(proc, until="C=4: "), "the bench never started its level"
        os.kill(state["pid"], signal.SIGKILL)
        killed = time.monotonic()
        stdout, stderr = proc.communicate(timeout=120)
        elapsed = time.monotonic() - killed
        assert proc.returncode == 1, stdout + stderr
        assert "run archived as FAILED" in stderr and "server process exited" in stderr
        assert elapsed < 20
        record("server_sigkill_bench_exit_s", round(elapsed, 1))
        [run_dir] = list((tmp_path / "a" / "h1").iterdir())
        assert archive.read_manifest(run_dir).status == "failed"
    finally:
        for k in kids:
            k.kill()


@pytest.mark.faults
def test_sshd_killed_mid_bench_then_attach_loses_nothing(fleet, fresh_sshd, tmp_path):
    host_sshd = fresh_sshd()
    fleet.add_sshd_host("flaky", host_sshd, port_offset=50)
    profile = _bench_profile(fleet, "flaky")
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "flaky").returncode == 0
    try:
        proc = fleet.popen(
            "bench",
            "--hosts",
            "flaky",
            "--concurrency",
            "64",
            "--num-prompts",
            "640",
            "--output-len",
            "32",
            "--client-procs",  # the runner's generator processes survive with it
            "2",
            "--archive",
            str(tmp_path / "a"),
        )
        run_id = read_run_id(proc, until="C=64: 640 requests")
        time.sleep(2)
        # sshd dies with every session it holds: the control side loses the host
        for p in [
            psutil.Process(host_sshd.proc.pid),
            *psutil.Process(host_sshd.proc.pid).children(recursive=True),
        ]:
            if p.name().startswith("sshd"):
                p.kill()
        host_sshd.proc.wait()
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 1 and "--attach" in rest
        host_sshd.proc = None
        host_sshd.start()  # same port, same host key
        out = fleet.cli(
            "bench",
            "--hosts",
            "flaky",
            "--attach",
            run_id,
            "--archive",
            str(tmp_path / "a"),
            timeout=180,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        results = json.loads((tmp_path / "a" / "flaky" / run_id / "results.jsonl").read_text())
        assert results["completed"] == 640 and results["failed"] == 0
        record(
            "sshd_killed_mid_run",
            {
                "completed": results["completed"],
                "lost": 640 - results["completed"] - results["failed"],
                "failed": results["failed"],
            },
        )
    finally:
        fleet.cli("stop", "--hosts", "flaky")


@pytest.mark.faults
def test_ctrl_c_during_sweep_then_resume(fleet, tmp_path):
    a = _bench_profile(fleet, "ca")
    port = yaml.safe_load(a.read_text())["port"]
    fleet.profile("cb", tp=1, port=port, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    args = [
        "sweep",
        "--profiles",
        f"{a.parent}/ca.yaml,{a.parent}/cb.yaml",
        "--hosts",
        "h0",
        "--concurrency",
        "2",
        "--num-prompts",
        "30",
        "--output-len",
        "32",
        "--archive",
        str(tmp_path / "a"),
    ]
    proc = fleet.popen(*args)
    for line in proc.stdout:
        if "C=2: 30 requests" in line:
            break
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    [state_file] = (tmp_path / "a" / "sweeps").glob("*.json")
    state = json.loads(state_file.read_text())  # valid JSON: written atomically
    assert state["status"] != "done"
    out = fleet.cli(*args, "--resume", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    state = json.loads(state_file.read_text())
    assert state["status"] == "done"
    runs = list((tmp_path / "a" / "h0").iterdir())
    assert len(runs) == 2 and all(archive.verify(r) == [] for r in runs)


def _held_then_fetched_on_resume(
    fleet, host_sshd, proc, args: list[str], host: str, run_id: str, requests: int,
    fault_at: float,
) -> float:  # fmt: skip
    """After the host's sshd was killed with the first arm's run finished or running there:
    the sweep says NOT FETCHED in one line and starts no other cell on that host, the cell
    keeps its run id, nothing is half-archived; sshd back, `--resume` archives that very
    run whole (never measures it again). Seconds from the fault to the sweep's end."""
    archive = Path(args[args.index("--archive") + 1])
    first, second = (Path(p).stem for p in args[args.index("--profiles") + 1].split(","))
    rest = proc.communicate(timeout=120)[0]
    said_after = time.monotonic() - fault_at
    assert proc.returncode == 1, rest[-3000:]
    assert "NOT FETCHED" in rest and f"run {run_id} stays on the host" in rest, rest[-3000:]
    assert f"{second} on {host}: not started: the run of {first} (run " in rest, rest[-3000:]
    [state_file] = (archive / "sweeps").glob("*.json")
    cell = json.loads(state_file.read_text())["cells"][first][host]
    assert cell["status"] == "benching" and cell["run_id"] == run_id, cell
    assert not (archive / host / run_id).exists()  # nothing half-archived
    host_sshd.proc = None
    host_sshd.start()  # same port, same host key
    try:
        out = fleet.cli(*args, "--resume", timeout=300)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        assert f"re-attaching run {run_id}" in out.stdout
        runs = sorted(p.name for p in (archive / host).iterdir())
        assert [r for r in runs if f"-{first}-" in r or r == run_id] == [run_id], runs
        results = json.loads((archive / host / run_id / "results.jsonl").read_text())
        assert results["completed"] == requests and results["failed"] == 0
    finally:
        fleet.cli("stop", "--hosts", host)
    return said_after


def _kill_on_open(sessions: list[psutil.Process], paths: list[str]) -> subprocess.Popen:
    """strace on the host's sshd session processes (not their children: the agent and the
    bench runner open the same files) that SIGKILLs the one that opens any of `paths`:
    internal-sftp serves downloads inside that process, so it dies with the download begun."""
    argv = ["strace", "-qq", "-o", "/dev/null", "-e", "trace=openat",
            "-e", "inject=openat:signal=KILL"]  # fmt: skip
    for path in paths:
        argv += ["-P", path]
    for proc in sessions:
        argv += ["-p", str(proc.pid)]
    return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)


@pytest.mark.faults
def test_a_run_whose_download_is_cut_is_fetched_on_resume_never_measured_again(
    fleet, fresh_sshd, tmp_path
):
    """Issue 51: sshd killed while the control downloads a finished run's files. The cell
    stays the host's (its run id kept), no later cell cleans or launches there, and
    `--resume` fetches that run whole; it is never measured again."""
    host_sshd = fresh_sshd()
    fleet.add_sshd_host("cut", host_sshd, port_offset=67)
    first, second = _bench_profile(fleet, "da"), _bench_profile(fleet, "db")
    archive = tmp_path / "a"
    args = ["sweep", "--profiles", f"{first},{second}", "--hosts", "cut", "--concurrency",
            "8", "--num-prompts", "160", "--output-len", "32", "--archive", str(archive)]  # fmt: skip
    proc = fleet.popen(*args)
    run_id = read_run_id(proc, until="C=8: 160 requests")
    run_dir = os.path.realpath(fleet.workdir("cut") / "runs" / run_id)
    listener = psutil.Process(host_sshd.proc.pid)
    sessions = [p for p in listener.children(recursive=True) if p.name().startswith("sshd")]
    names = sorted(p.name for p in Path(run_dir).iterdir() if not p.name.startswith("."))
    tracer = _kill_on_open(sessions, [f"{run_dir}/{name}" for name in names])
    try:
        tracer.wait(timeout=120)  # returns when the traced session died on the first open
    finally:
        tracer.kill()
    cut_at = time.monotonic()
    assert any(not p.is_running() for p in sessions), "no session opened the run's files"
    status = json.loads((Path(run_dir) / "status.json").read_text())
    assert status["status"] == "done", status  # the bench had finished: this was the download
    for p in [listener, *listener.children(recursive=True)]:
        if p.is_running() and p.name().startswith("sshd"):
            p.kill()
    host_sshd.proc.wait()
    said_after = _held_then_fetched_on_resume(fleet, host_sshd, proc, args, "cut", run_id, 160,
                                              cut_at)  # fmt: skip
    record("download_cut", {"completed": 160, "fault_to_line_s": round(said_after, 1)})


@pytest.mark.faults
def test_a_finished_run_is_fetched_never_measured_again_after_a_lost_host(
    fleet, fresh_sshd, tmp_path
):
    """Issue 51: a cell whose bench finished on the host but could not be fetched was
    recorded FAILED, the sweep went on to clean and launch the next cell there, and
    `--resume` measured it again from scratch. Now the cell stays the host's (BENCHING, with
    its run id), no other cell touches that host, and `--resume` fetches the run itself."""
    host_sshd = fresh_sshd()
    fleet.add_sshd_host("flaky", host_sshd, port_offset=60)
    first = _bench_profile(fleet, "fa")
    second = _bench_profile(fleet, "fb")
    archive = tmp_path / "a"
    args = ["sweep", "--profiles", f"{first},{second}", "--hosts", "flaky", "--concurrency",
            "64", "--num-prompts", "640", "--output-len", "32", "--archive", str(archive)]  # fmt: skip
    proc = fleet.popen(*args)
    run_id = read_run_id(proc, until="C=64: 640 requests")
    time.sleep(1)
    for p in [psutil.Process(host_sshd.proc.pid),
              *psutil.Process(host_sshd.proc.pid).children(recursive=True)]:  # fmt: skip
        if p.name().startswith("sshd"):
            p.kill()
    host_sshd.proc.wait()
    said_after = _held_then_fetched_on_resume(fleet, host_sshd, proc, args, "flaky", run_id, 640,
                                              time.monotonic())  # fmt: skip
    record("finished_run_after_lost_host", {"completed": 640,
                                            "fault_to_line_s": round(said_after, 1)})  # fmt: skip
