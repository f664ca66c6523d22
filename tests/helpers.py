"""Test helpers with real parts: a fleet of loopback sshd hosts, the CLI, the rehearsal server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from gpufleet.sim.sshd import LoopbackSshd
from gpufleet.terminal import CONTROL as TERMINAL_CONTROL

if TYPE_CHECKING:
    from gpufleet.sim.slurm_cluster import LocalSlurm

REPO = Path(__file__).resolve().parent.parent


class Fleet:
    """An inventory over real sshd hosts, each a simulated 8-GPU host with its own workdir."""

    def __init__(self, root: Path, hosts: list[LoopbackSshd], client_key: Path, python: str):
        self.root = root
        self.sshds = hosts
        self.client_key = client_key
        self.python = python
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text("".join(h.known_hosts_line() for h in hosts))
        self.names = [f"h{i}" for i in range(len(hosts))]
        self.held: list[int] = []  # every process `hold` started, children included
        self.inventory = root / "fleet.yaml"
        self.write_inventory()

    def workdir(self, name: str) -> Path:
        return self.root / "work" / name

    def state_dir(self, name: str) -> Path:
        return self.workdir(name) / "sim-gpus"

    def write_inventory(self, extra_hosts: dict | None = None, **defaults) -> Path:
        data = {
            "defaults": {
                "connection": "ssh",
                "user": "root",
                "identity_file": str(self.client_key),
                "known_hosts": str(self.known_hosts),
                "python": self.python,
                "connect_timeout": 5,
                "gpus": {"count": 8, "simulated": True},
                **defaults,
            },
            "hosts": {
                name: {
                    "address": "127.0.0.1",
                    "port": sshd.port,
                    "workdir": str(self.workdir(name)),
                    # the hosts share this machine's ports: move each host's servers apart
                    "vars": {"server_port_offset": 7 * i},
                }
                for i, (name, sshd) in enumerate(zip(self.names, self.sshds, strict=True))
            },
            "groups": {"all-sim": list(self.names)},
        }
        data["hosts"].update(extra_hosts or {})
        self.inventory.write_text(yaml.safe_dump(data))
        return self.inventory

    def add_sshd_host(self, name: str, sshd: LoopbackSshd, port_offset: int) -> None:
        """Put one more host, behind its own sshd (a test kills or reads it), in the
        inventory: its host key trusted, its servers' ports moved by `port_offset`."""
        with open(self.known_hosts, "a") as fh:
            fh.write(sshd.known_hosts_line())
        self.write_inventory(
            extra_hosts={
                name: {
                    "address": "127.0.0.1",
                    "port": sshd.port,
                    "workdir": str(self.workdir(name)),
                    "vars": {"server_port_offset": port_offset},
                }
            }
        )

    def env(self, name: str) -> dict[str, str]:
        """Environment for a workload process that lives on simulated host `name`."""
        state = self.state_dir(name)
        state.mkdir(parents=True, exist_ok=True)
        from gpufleet.sim import gpustate

        gpustate.ensure_topology(state, count=8, host=name)
        env = dict(os.environ)
        env["GPUFLEET_SIM_STATE"] = str(state)
        env["PYTHONPATH"] = str(REPO / "src")
        return env

    def hold(self, name: str, *args: str) -> tuple[subprocess.Popen, list[int]]:
        """Start `python -m gpufleet.sim.hold ARGS` on host `name`; return it and the PIDs."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.sim.hold", *args],
            env=self.env(name),
            stdout=subprocess.PIPE,
            text=True,
        )
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", f"hold did not start: {line}"
        pids = [int(p) for p in line[1:]]
        self.held += pids  # the fleet fixture kills what a test left (a child outlives kill())
        return proc, pids

    def profile(self, name: str = "test", **fields) -> Path:
        """Write a rehearsal profile into this test's playbooks folder; return its path."""
        from gpufleet.sim.sshd import free_port

        directory = self.root / "playbooks"
        directory.mkdir(exist_ok=True)
        data = {
            "engine": "sim",
            "model_path": "/models/test",
            "tp": 2,
            "port": free_port(),
            "health_timeout": 30,
            "sim": {"load-seconds": 1.0, "warmup-seconds": 0.2},
            **fields,
        }
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    def custom_profile(
        self, name: str, program: Path, *args: str, port: int | None = None, **fields
    ) -> tuple[Path, int]:
        """A `custom` engine profile that runs `program --port PORT ARGS` (on a free port
        unless given), healthy at `/`, on one GPU, with no model path: (its path, the port)."""
        from gpufleet.sim.sshd import free_port

        port = port or free_port()
        command = [str(program), "--port", "{port}", *args]
        path = self.profile(name, engine="custom", health_path="/", tp=1, port=port,
                            check_model_path=False, command=command, **fields)  # fmt: skip
        return path, port

    def popen(self, *args: str, stderr: int = subprocess.STDOUT) -> subprocess.Popen:
        """The real CLI against this fleet, in the background (to interrupt or race it)."""
        return subprocess.Popen(
            [sys.executable, "-m", "gpufleet", *args, "--inventory", str(self.inventory)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=REPO,
        )

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run the real `gpufleet` CLI as a subprocess against this fleet's inventory."""
        return run_cli(*args, "--inventory", str(self.inventory), timeout=timeout)


# When the running test must end (its pytest timeout, set by conftest): a CLI still
# running near then is asked for its threads' stacks before it is killed, so a hang in CI
# says where it waited instead of only that the test timed out.
TEST_DEADLINE: list[float] = []


# The health endpoint of an engine program a test writes (conftest's `readable_program`):
# GET answers 200 "ok", quietly; the program serves `Health` (or a subclass of it)
HEALTH_HANDLER = """class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
"""


def run_cli(
    *args: str, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    env.pop("GPUFLEET_INVENTORY", None)
    if TEST_DEADLINE:
        timeout = max(1.0, min(timeout, TEST_DEADLINE[0] - time.monotonic() - 20))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd or REPO,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        raise AssertionError(
            f"`gpufleet {' '.join(args)}` still ran after {timeout:.0f} s; its output, "
            f"then its threads:\n{stdout[-3000:]}\n{stderr[-6000:]}"
        ) from None
    raw = TERMINAL_CONTROL.findall(stdout + stderr)
    if raw:  # issue 80.4: every byte a task prints passes the terminal filter
        raise AssertionError(f"`gpufleet {' '.join(args)}` printed control characters "
                             f"{sorted(set(raw))!r}: something bypasses cli/scrubbing.py")  # fmt: skip
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def read_run_id(proc: subprocess.Popen, until: str | None = None) -> str | None:
    """The run id a background `bench` prints ("... run ID started against ..."), reading
    on until a line containing `until` when given."""
    run_id = None
    for line in proc.stdout:
        if "started against" in line:
            run_id = line.split("run ", 1)[1].split()[0]
        if run_id and (until is None or until in line):
            break
    return run_id


def ended(proc: subprocess.Popen, grace: float = 20) -> None:
    """`proc` terminated, and killed if it is still there after `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie holds no GPU memory)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()


class SimServer:
    """`python -m gpufleet.sim.server ARGS` on a free port, on a simulated host's GPU state."""

    def __init__(self, state_dir: Path, *args: str, load: float = 0.3) -> None:
        from gpufleet.sim import gpustate
        from gpufleet.sim.sshd import free_port

        gpustate.ensure_topology(state_dir, count=8, host="simserver")
        self.port = free_port()
        self.state_dir = state_dir
        self.log_path = state_dir.parent / f"server-{self.port}.log"
        env = dict(os.environ, GPUFLEET_SIM_STATE=str(state_dir), PYTHONPATH=str(REPO / "src"))
        argv = [
            sys.executable,
            "-m",
            "gpufleet.sim.server",
            "--model-path",
            "/models/sim",
            "--port",
            str(self.port),
            "--sim-load-seconds",
            str(load),
            "--sim-warmup-seconds",
            "0.2",
            *args,
        ]
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 20) -> None:
        import time

        from gpufleet.host.server import probe as healthprobe

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if healthprobe.is_ready(self.url + "/health"):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.log_path.read_text()}")
            time.sleep(0.05)
        raise AssertionError("server not ready")

    def text(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        import signal as _signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, _signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, _signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def bench_local_run(url: str, tmp: Path, *args: str) -> Path:
    """`inv bench --client local --url URL ARGS` archived under tmp/archive: its run dir
    (the command must succeed)."""
    archive = tmp / "archive"
    out = run_cli(
        "bench", "--client", "local", "--url", url, "--archive", str(archive), *args,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    [host_dir] = list(archive.iterdir())
    [run_dir] = list(host_dir.iterdir())
    return run_dir


def unwrap(text: str) -> str:
    """Output with prose wrapped for the terminal (cli/output.py: prose) joined back into one
    line per sentence: a continuation line starts with four spaces."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("    ") and lines and not line.strip().startswith(("-", "|")):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return "\n".join(lines)


def level(c: int = 1, ci: dict | None = None, **figures):
    """A measured level as the report reads it (report/stats.LevelFigures), from the figures
    a test cares about; `ci` {key: (low, high)} makes it a level with repeats."""
    from gpufleet.report.stats import LevelFigures

    return LevelFigures(
        row(max_concurrency=c, **figures), repeats=3 if ci else 1, ci=dict(ci or {})
    )


def requests_around(per_request_tps: float, count: int = 11, spread: float = 0.02) -> str:
    """A level's requests-cN.jsonl whose median per-request output tok/s is exactly
    `per_request_tps` (each request `spread` apart around it), for an archived run a test
    writes by hand: the report resamples a percentile's interval from its requests."""
    tokens, middle = 256, count // 2
    lines = []
    for i in range(count):
        speed = per_request_tps * (1 + spread * (i - middle))
        lines.append({"index": i, "ok": True, "ttft": 0.01, "e2e": tokens / speed, "itl": [],
                      "completion_tokens": tokens})  # fmt: skip
    return "".join(json.dumps(r) + "\n" for r in lines)


def row(**figures):
    """A results.jsonl row with the figures a test cares about."""
    from gpufleet.records import ResultRow

    wire = {"max_concurrency": 1, "completed": 1, "failed": 0, "output_throughput": 0.0}
    return ResultRow.from_wire({**wire, **figures})


class NoTransport:
    """An asyncio transport that goes nowhere: feed an HTTP protocol bytes by hand."""

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


def srun_inventory(fleet: Fleet, job: str, nodes: list[str]) -> Path:
    """The fleet's hosts (same names, workdirs and port offsets), reached by srun on the
    job's nodes instead of sshd."""
    data = yaml.safe_load(fleet.inventory.read_text())
    data["defaults"] = {
        "connection": "srun", "slurm_job": job, "python": fleet.python,
        "gpus": data["defaults"]["gpus"],
    }  # fmt: skip
    hosts = {}
    for name, node in zip(fleet.names, nodes, strict=False):
        fields = data["hosts"][name]
        hosts[name] = {"address": node, "workdir": fields["workdir"], "vars": fields["vars"]}
    data["hosts"] = hosts
    data["groups"] = {"all-sim": list(hosts)}
    fleet.inventory.write_text(yaml.safe_dump(data))
    return fleet.inventory


def processes_under(folder: Path) -> list[str]:
    """Every process whose working directory or command line is under `folder` (gpufleet's
    agents, servers and runners all work in the host's workdir), as `pid cmdline`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not pid_alive(int(entry.name)):
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cwd.startswith(str(folder)) or str(folder) in cmdline:
            found.append(f"{entry.name} {cmdline[:120]}")
    return found


def _own_line() -> set[int]:
    """This process and its ancestors: a folder on pytest's own command line is not a
    process the tests left."""
    own, pid = set(), os.getpid()
    while pid > 1 and pid not in own:
        own.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return own


def launched_under(folder: Path) -> list[str]:
    """processes_under(folder) less pytest's own line and Slurm's daemons (a session's
    cluster, stopped by its fixture): what the tests started there."""
    own = _own_line()
    found = []
    for entry in processes_under(folder):
        pid, _, cmdline = entry.partition(" ")
        if int(pid) not in own and not cmdline.startswith(("slurmstepd", "slurmd", "slurmctld")):
            found.append(entry)
    return found


def stop_launched(folder: Path, grace: float = 5.0) -> list[str]:
    """Stop what the tests launched under `folder` (servers, agents, CLIs, holders): SIGTERM,
    then SIGKILL to what still runs after `grace` seconds; what was running."""
    found = launched_under(folder)
    for entry in found:
        with contextlib.suppress(OSError):
            os.kill(int(entry.split()[0]), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while found and time.monotonic() < deadline:
        if not any(pid_alive(int(e.split()[0])) for e in found):
            break
        time.sleep(0.1)
    for entry in launched_under(folder):
        with contextlib.suppress(OSError):
            os.kill(int(entry.split()[0]), signal.SIGKILL)
    return found


QUICK_SIM = {"load-seconds": 0.2, "warmup-seconds": 0.1}  # a rehearsal server up in ~0.3 s


def adaptive_flags(steps: int, topk: int = 1, draft_tokens: int | None = None,
                   running: int = 16) -> dict:  # fmt: skip
    """SGLang's flags for an EAGLE-3 server with adaptive speculation whose own static
    speculation drafts `steps` deep (`topk` wide, `draft_tokens`: steps + 1 by default)."""
    return {
        "speculative-algorithm": "EAGLE3",
        "speculative-num-steps": steps,
        "speculative-eagle-topk": topk,
        "speculative-num-draft-tokens": draft_tokens or steps + 1,
        "speculative-adaptive": True,
        "max-running-requests": running,
    }


def simulated_nvml(tmp_path: Path, monkeypatch, count: int):
    """`pynvml` reading `count` rehearsal GPUs in this process, gone with the test."""
    from gpufleet.host.gpu import nvml as nvmlread
    from gpufleet.sim import gpustate

    state = tmp_path / "gpus"
    gpustate.ensure_topology(state, count=count)
    monkeypatch.setenv(gpustate.STATE_ENV, str(state))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the shim leaves with the test
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    nvmlread.activate_simulation({"state_dir": str(state), "count": count}, "t")
    return nvmlread.load_pynvml()


@contextlib.contextmanager
def running_slurm(prefix: str, **shape: object) -> Iterator[LocalSlurm]:
    """A real Slurm cluster of `shape` (LocalSlurm's fields) in a folder of /tmp itself, not
    pytest's 0700 one (another user's job, a test, reads it); started again where one of
    its kernel-picked ports was taken before the bind, stopped by PID and removed after."""
    from gpufleet.sim.slurm_cluster import LocalSlurm

    directory = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = LocalSlurm(directory, **shape)  # type: ignore[arg-type]
    try:
        for attempt in range(3):
            try:
                cluster.start()
                break
            except RuntimeError:
                cluster.stop()
                if attempt == 2:
                    raise
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
