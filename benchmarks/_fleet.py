"""Shared by benchmark scripts: N inventory hosts over real loopback sshd processes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gpufleet.sim.sshd import LoopbackSshd, keygen


def host_python() -> str:
    """Like an SGLang venv: the tests' host venv if present (no gpufleet), else this Python."""
    candidate = os.environ.get("GPUFLEET_TEST_HOSTENV", "/tmp/gpufleet-test-hostenv")
    python = Path(candidate) / "bin" / "python"
    return str(python) if python.exists() else sys.executable


class BenchFleet:
    """`hosts` simulated 8-GPU hosts spread over `sshds` sshd processes on loopback."""

    def __init__(
        self, hosts: int, sshds: int = 1, max_startups: str | None = None, forks: int = 32
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
        keygen(self.root / "client_key")
        self.sshds = [
            LoopbackSshd(
                self.root / f"sshd{i}", self.root / "client_key", max_startups=max_startups
            )
            for i in range(sshds)
        ]
        for s in self.sshds:
            s.start()
        known = self.root / "known_hosts"
        known.write_text("".join(s.known_hosts_line() for s in self.sshds))
        self.inventory = self.root / "fleet.yaml"
        data = {
            "forks": forks,
            "defaults": {
                "user": "root",
                "identity_file": str(self.root / "client_key"),
                "known_hosts": str(known),
                "python": host_python(),
                "gpus": {"count": 8, "simulated": True},
            },
            "hosts": {
                f"h{i:02d}": {
                    "address": "127.0.0.1",
                    "port": self.sshds[i % sshds].port,
                    "workdir": str(self.root / "work" / f"h{i:02d}"),
                    # the hosts share this machine's ports: move each host's servers apart
                    "vars": {"server_port_offset": 3 * i},
                }
                for i in range(hosts)
            },
        }
        self.inventory.write_text(yaml.safe_dump(data))

    def cli(self, *args: str) -> tuple[float, subprocess.CompletedProcess]:
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "gpufleet", *args, "--inventory", str(self.inventory)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        return time.perf_counter() - start, out

    def close(self) -> None:
        for s in self.sshds:
            s.stop()
