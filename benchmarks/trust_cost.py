"""What judging costs (issue 34): the host python's tree over SFTP, before it runs, and
the bootstrap's walk of every directory under sys.path and the workdir, on the host.

- SFTP requests and wall time of `interpreter.judge_python` over a real loopback sshd
  (one task's judgement, per host; median of 5);
- the bootstrap's `module_directories` walk on this machine (median of 5), and the number
  of directories it judges;
- gpu-clean wall time on one host (median of 5), the whole task with both judgements.

    python benchmarks/trust_cost.py [PYTHON]   # default: the tests' host venv
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from _fleet import BenchFleet, host_python

from gpufleet.control.agent import python_trust as interpreter
from gpufleet.control.connect import ssh
from gpufleet.control.inventory.connections import SshSettings
from gpufleet.control.inventory.model import load_inventory


def _median(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e3:.1f} ms (range {min(samples) * 1e3:.1f}-{max(samples) * 1e3:.1f})"


def main() -> None:
    python = sys.argv[1] if len(sys.argv) > 1 else host_python()
    fleet = BenchFleet(1)
    try:
        [host] = load_inventory(fleet.inventory).select("all")
        host = host.model_copy(update={"python": python})
        conn = ssh.open_connection(SshSettings.of(host))
        sftp = conn.sftp()
        walls, asked = [], 0
        for _ in range(5):
            tree = interpreter.CachedTree(ssh.SftpTree(sftp))
            start = time.perf_counter()
            verdict = interpreter.judge_python(python, 0, tree)
            walls.append(time.perf_counter() - start)
            asked = tree.asked
        conn.close()
        print(f"python judged over SFTP: {asked} requests, {_median(walls)}, "
              f"{len(verdict.judged)} paths judged, problems: {len(verdict.problems)}")  # fmt: skip
        code = (
            "import sys, time; sys.path.insert(0, sys.argv[1]); "
            "from gpufleet.control.agent import bootstrap; "
            "t = time.perf_counter(); bootstrap.module_directories(0); "
            "print(time.perf_counter() - t)"
        )
        src = str(interpreter.__file__).rsplit("/gpufleet/", 1)[0]
        walks = []
        for _ in range(5):
            out = subprocess.run([python, "-I", "-c", code, src], capture_output=True, text=True)
            walks.append(float(out.stdout.split()[0]))
        print(f"bootstrap walk of the directories under sys.path: {_median(walks)}")
        cleans = []
        for _ in range(5):
            wall, done = fleet.cli("gpu-clean")
            cleans.append(wall)
            assert done.returncode == 0, done.stderr
        print(f"gpu-clean, 1 host, whole task: {_median(cleans)}")
    finally:
        fleet.close()


if __name__ == "__main__":
    main()
