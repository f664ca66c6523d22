"""Fixtures with real parts: OpenSSH sshd hosts on loopback and a host Python without gpufleet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.sim.sshd import LoopbackSshd, keygen, sshd_path
from helpers import Fleet, SimServer

HOSTENV = Path(os.environ.get("GPUFLEET_TEST_HOSTENV", "/tmp/gpufleet-test-hostenv"))
HOST_PACKAGES = ["psutil", "nvidia-ml-py", "aiohttp", "setproctitle", "uvloop"]


@pytest.fixture(scope="session")
def host_python() -> str:
    """A Python like an SGLang venv's: psutil, nvidia-ml-py, aiohttp; gpufleet NOT installed."""
    python = HOSTENV / "bin" / "python"
    marker = HOSTENV / ".ready"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(HOSTENV)], check=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *HOST_PACKAGES,
            ],
            check=True,
        )
        marker.write_text("ok\n")
    probe = subprocess.run([str(python), "-c", "import gpufleet"], capture_output=True)
    assert probe.returncode != 0, "the host venv must not have gpufleet"
    return str(python)


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


@pytest.fixture
def fleet(tmp_path, sshd_hosts, ssh_keys, host_python) -> Fleet:
    return Fleet(tmp_path, sshd_hosts, ssh_keys, host_python)


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
REAL_PARTS = {"sshd_hosts", "fresh_sshd", "fleet", "sim_server", "census_host", "uvicorn_url"}
SPAWNS = ("run_cli(", "subprocess", "Popen", "SimServer", "BenchFleet", "chromium", "visit(")


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
        light = not heavy and "slow" not in item.keywords and "gpu" not in item.keywords
        if light and not _spawns(item):
            item.add_marker(pytest.mark.unit)
