"""The step keeper without Slurm (host/proc/stepkeeper.py): what it starts, what it refuses,
and that a second one leaves the first in charge. The real Slurm case is
test_slurm_cgroup.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.host.agent.protocol import KEEPER_ALREADY, KEEPER_READY
from gpufleet.host.proc import stepkeeper
from helpers import pid_alive

JOB = "77"


@pytest.fixture
def keeper(tmp_path, monkeypatch):
    """A keeper for job 77 running in tmp_path (its workdir), ended after the test."""
    tmp_path.chmod(0o700)
    monkeypatch.chdir(tmp_path)
    code = "import sys; from gpufleet.host.proc import stepkeeper; stepkeeper.serve(sys.argv[1])"
    proc = subprocess.Popen([sys.executable, "-c", code, JOB], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == KEEPER_READY
    yield proc
    proc.kill()
    proc.wait()


def test_the_keeper_starts_what_is_asked_as_its_child_and_a_second_keeper_defers(keeper, tmp_path):
    assert stepkeeper.running(JOB) is not None
    log, pid_file = tmp_path / "out.log", tmp_path / "child.pid"
    env = {"PATH": os.environ["PATH"], "SAID": "from the request"}
    pid = stepkeeper.request(JOB, ["sh", "-c", 'echo "$SAID"; exec sleep 30'], env, log,
                             pid_file=pid_file, stdin_file=None)  # fmt: skip
    assert Path(f"/proc/{pid}/stat").read_text().split()[3] == str(keeper.pid)  # its parent
    deadline = time.monotonic() + 10
    while "from the request" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text() == "from the request\n"

    code = "import sys; from gpufleet.host.proc import stepkeeper; stepkeeper.serve(sys.argv[1])"
    second = subprocess.run([sys.executable, "-c", code, JOB], capture_output=True, text=True,
                            timeout=30)  # fmt: skip
    assert second.stdout.strip() == KEEPER_ALREADY and second.returncode == 0
    os.kill(pid, 9)


def test_a_request_that_is_a_link_or_not_a_program_is_refused_and_the_keeper_runs_on(
    keeper, tmp_path
):
    folder = stepkeeper.folder(JOB)
    planted = tmp_path / "planted.json"
    marker = tmp_path / "marker"
    planted.write_text(json.dumps({"argv": ["touch", str(marker)], "env": {}, "log": "x.log",
                                   "pid_file": str(tmp_path / "p.pid"), "stdin": os.devnull}))  # fmt: skip
    os.symlink(planted, folder / "0-planted.request")
    with pytest.raises(RuntimeError, match="No such file"):
        stepkeeper.request(JOB, ["/nonexistent/program"], {}, tmp_path / "l.log",
                           pid_file=tmp_path / "n.pid", stdin_file=None)  # fmt: skip
    assert not (folder / "0-planted.request").exists(), "removed unread"
    assert not marker.exists()
    assert keeper.poll() is None and pid_alive(keeper.pid)
