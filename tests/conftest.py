"""Fixtures with real parts: OpenSSH sshd hosts on loopback and a host Python without gpufleet."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpufleet.sim import provider as rehearsal
from gpufleet.sim.sshd import LoopbackSshd, keygen, release_ports, sshd_path
from helpers import TEST_DEADLINE, Fleet, SimServer, launched_under, running_slurm, stop_launched

# tests that run the agent's code in this process start it as the zipapp does: with the
# rehearsal engine plugged into its seam (host/agent/simulation.py)
rehearsal.install()

HOSTENV = Path(os.environ.get("GPUFLEET_TEST_HOSTENV", "/tmp/gpufleet-test-hostenv"))
HOST_PACKAGES = ["psutil", "nvidia-ml-py", "aiohttp", "setproctitle", "uvloop"]


# Test workers side by side (pytest-xdist, scripts/test.sh) each take their own slice of
# the loopback ports (gpufleet.sim.sshd.free_port), so two tests never pick the same port.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["GPUFLEET_PORT_SLICE"] = "{}/{}".format(
        int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw")),
        os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"),
    )


@pytest.fixture(scope="session")
def host_python() -> str:
    """A Python like an SGLang venv's: psutil, nvidia-ml-py, aiohttp; gpufleet NOT installed."""
    python = HOSTENV / "bin" / "python"
    marker = HOSTENV / ".ready"
    with open(f"{HOSTENV}.lock", "w") as lock:  # workers side by side build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            _build_hostenv(python, marker)
    probe = subprocess.run([str(python), "-c", "import gpufleet"], capture_output=True)
    assert probe.returncode != 0, "the host venv must not have gpufleet"
    return str(python)


def _build_hostenv(python: Path, marker: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(HOSTENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *HOST_PACKAGES], check=True)
    marker.write_text("ok\n")


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("sshkeys")
    keygen(directory / "client_key")
    return directory / "client_key"


def _start_hosts(root: Path, client_key: Path, count: int, **kwargs) -> list[LoopbackSshd]:
    if sshd_path() is None:
        pytest.fail("sshd missing: the test command installs openssh-server (see README)")
    return [LoopbackSshd(root / f"sshd{i}", client_key, **kwargs).start() for i in range(count)]


@pytest.fixture(scope="session")
def sshd_hosts(tmp_path_factory, ssh_keys) -> list[LoopbackSshd]:
    """Three real sshd processes on loopback, shared by the session's tests."""
    hosts = _start_hosts(tmp_path_factory.mktemp("sshd"), ssh_keys, 3)
    yield hosts
    for h in hosts:
        h.stop()


@pytest.fixture
def fresh_sshd(tmp_path, ssh_keys):
    """Start extra sshd processes for one test (for tests that kill or change them)."""
    started: list[LoopbackSshd] = []

    def start(**kwargs) -> LoopbackSshd:
        host = LoopbackSshd(tmp_path / f"sshd-extra{len(started)}", ssh_keys, **kwargs).start()
        started.append(host)
        return host

    yield start
    for h in started:
        h.stop()


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm (munged, slurmctld, three slurmds: n1-n3; partition h200 = n2-n3) in a
    temporary folder, shared by the session's tests and stopped by PID at its end. It
    fails, never skips, where Slurm is missing: the test command installs it."""
    from gpufleet.sim.slurm_cluster import APT_PACKAGES, missing_programs

    missing = missing_programs()
    if missing:
        pytest.fail(f"Slurm missing ({', '.join(missing)}): apt-get install -y {APT_PACKAGES}")
    with running_slurm("gpufleet-slurm-") as cluster:
        yield cluster


@pytest.fixture
def fleet(tmp_path, sshd_hosts, ssh_keys, host_python) -> Fleet:
    """The fleet over the session's sshd hosts; whatever its test launched on them (servers,
    runs, agents, a CLI in the background) is stopped after it, pass or fail."""
    fleet = Fleet(tmp_path, sshd_hosts, ssh_keys, host_python)
    yield fleet
    for pid in fleet.held:  # a held process's children outlive the test's proc.kill()
        with contextlib.suppress(OSError):  # gone; and never a pid reused by another program
            if b"gpufleet.sim.hold" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
    stop_launched(fleet.root)  # the hosts' workdirs and the inventory are under it


@pytest.fixture(scope="session", autouse=True)
def _suite_home(tmp_path_factory):
    """The suite's own HOME, under its temporary folder: the rehearsal inventory's
    `~/.gpufleet/rehearsal`, the agent build cache and every `~` a CLI the tests start
    expands are never the user's (a test ran gpu-clean on the user's own rehearsal host,
    where another checkout had left a server). At the session's end, once every fixture
    has stopped what it started, a process still running under the folder fails it."""
    base = tmp_path_factory.getbasetemp()
    home = base / "home"
    home.mkdir(exist_ok=True)
    before = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    yield home
    if before is not None:
        os.environ["HOME"] = before
    deadline = time.monotonic() + 10  # what a fixture just stopped may still be exiting
    while launched_under(base) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = stop_launched(base, grace=2)
    if left:
        pytest.fail("the session left processes running (stopped now):\n" + "\n".join(left))


@pytest.fixture
def readable_program():
    """`make(text)`: `text` as an executable any user may read and run (an engine that the
    run_as user `nobody` starts: not under root's private tmp), removed after the test."""
    folders: list[Path] = []

    def make(text: str) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="gpufleet-engine-"))
        folders.append(folder)
        folder.chmod(0o755)
        program = folder / "engine"
        program.write_text(text)
        program.chmod(0o755)
        return program

    yield make
    for folder in folders:
        shutil.rmtree(folder)


@pytest.fixture
def sim_server(tmp_path):
    servers: list[SimServer] = []

    def start(*args: str, load: float = 0.3, ready: bool = True) -> SimServer:
        server = SimServer(tmp_path / f"gpus{len(servers)}", *args, load=load)
        servers.append(server)
        if ready:
            server.wait_ready()
        return server

    yield start
    for s in servers:
        s.stop()


# The unit tier (`scripts/test.sh --fast`, pytest -m unit): what needs no sshd, no server
# and no other process of gpufleet, so every change can run it first in under 2 minutes.
REAL_PARTS = {"sshd_hosts", "fresh_sshd", "fleet", "sim_server", "census_host", "uvicorn_url",
              "slurm_cluster"}  # fmt: skip
SPAWNS = ("run_cli(", "subprocess", "Popen", "SimServer", "BenchFleet", "chromium", "visit(")


@pytest.fixture(autouse=True)
def _cli_deadline(request: pytest.FixtureRequest):
    """Tell run_cli when this test's timeout falls (see helpers.TEST_DEADLINE)."""
    import time

    marker = request.node.get_closest_marker("timeout")
    seconds = marker.args[0] if marker and marker.args else request.config.getini("timeout")
    TEST_DEADLINE[:] = [time.monotonic() + float(seconds or 300)]
    yield
    TEST_DEADLINE.clear()


@pytest.fixture(autouse=True)
def _port_blocks():
    """The loopback port blocks a test was handed are its own until it ends
    (gpufleet.sim.sshd.free_port)."""
    yield
    release_ports()


def _spawns(item: pytest.Item) -> bool:
    import inspect

    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function else ""
    except (OSError, TypeError):
        return True
    return any(word in source for word in SPAWNS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        heavy = REAL_PARTS & set(getattr(item, "fixturenames", ()))
        light = not heavy and not {"slow", "gpu", "exclusive"} & set(item.keywords)
        if light and not _spawns(item):
            item.add_marker(pytest.mark.unit)
        minutes = _expected_minutes(item)
        if minutes > 1:  # side by side on a busy machine, the longest take 2-3x as long
            item.add_marker(pytest.mark.timeout(max(300, int(minutes * 60 * 3))))
    if "PYTEST_XDIST_WORKER" in os.environ:
        # workers side by side (with --maxschedchunk 1, xdist hands tests out in this
        # order): the longest go out first, so none starts last and holds the run open
        # alone. The same order on every worker, as xdist needs.
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        items.sort(key=lambda item: _expected_seconds(item, known), reverse=True)


# How long each test took side by side (seconds, setup to teardown; those of 5 s or more),
# as `GPUFLEET_WRITE_DURATIONS=1 bash scripts/test.sh` measured them: the longest are
# handed out first. Ordered by the slow marks alone, tests of 40-80 s without one went out
# last, and one ran alone for the run's last ~50 s with the cores 75% idle.
DURATIONS = Path(__file__).with_name("durations.json")
_MEASURED: dict[str, float] = {}


def _expected_seconds(item: pytest.Item, known: dict[str, float]) -> float:
    """The measured duration, or the slow mark's minutes for a test not measured yet."""
    return max(known.get(item.nodeid, 0.0), _expected_minutes(item) * 60)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Sum each test's phases where the durations are written (the controller, or a run
    without workers)."""
    if os.environ.get("GPUFLEET_WRITE_DURATIONS") == "1" and "PYTEST_XDIST_WORKER" not in (
        os.environ
    ):
        _MEASURED[report.nodeid] = _MEASURED.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _MEASURED:
        return
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    known.update({test: round(s, 1) for test, s in _MEASURED.items()})
    kept = {test: s for test, s in sorted(known.items()) if s >= 5}
    DURATIONS.write_text(json.dumps(kept, indent=0) + "\n")


def _expected_minutes(item: pytest.Item) -> float:
    """`@pytest.mark.slow(minutes=4)`: how long the test is expected to take (1 for a bare
    `slow`, 0 for the rest), to send the longest out first."""
    marks = list(item.iter_markers("slow"))
    return max((m.kwargs.get("minutes", 1) for m in marks), default=0)
