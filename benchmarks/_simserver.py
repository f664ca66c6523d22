"""Start the rehearsal server for a benchmark and wait until it is ready."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpufleet.host.server import probe as healthprobe
from gpufleet.sim import gpustate
from gpufleet.sim.sshd import free_port

REPO = Path(__file__).resolve().parent.parent


class BenchServer:
    def __init__(self, *args: str, cores: set[int] | None = None) -> None:
        """`cores`: pin the server (every thread) to these, so a client measured beside it
        does not share a core with it."""
        self.state = Path(tempfile.mkdtemp(prefix="gpufleet-bench-gpus-"))
        gpustate.ensure_topology(self.state, count=8)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(
            os.environ,
            GPUFLEET_SIM_STATE=str(self.state),
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])
            ),
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufleet.sim.server",
                "--model-path",
                "/models/sim",
                "--port",
                str(self.port),
                "--sim-load-seconds",
                "0.2",
                "--sim-warmup-seconds",
                "0",
                *args,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if healthprobe.is_ready(self.url + "/health", timeout=1):
                return
            time.sleep(0.05)
        raise RuntimeError("rehearsal server did not become ready")

    def cpu_seconds(self) -> float:
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        import signal

        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(10)
