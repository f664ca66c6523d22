"""gpu-clean wall time on 1, 8 and 32 simulated hosts behind ONE real sshd with default
MaxStartups (10:30:100), so the 32-host run must survive dropped handshakes through retries.
Also `inv --list` wall time. Prints a table; run: python benchmarks/gpu_clean_fanout.py
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from _fleet import BenchFleet

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    print("hosts  first run s  warm median s (3 runs)  hosts ok  hosts failed")
    base = None
    for n in (1, 8, 32):
        fleet = BenchFleet(hosts=n, sshds=1, max_startups=None)
        try:
            first, out = fleet.cli("gpu-clean")  # includes the one-time agent upload
            times, failed = [], 0
            for _ in range(3):
                wall, out = fleet.cli("gpu-clean")
                times.append(wall)
                failed = max(failed, out.stdout.count("FAILED") + out.stderr.count("FAILED"))
            ok = out.stdout.count("verified clean")
            med = statistics.median(times)
            base = base or med
            print(
                f"{n:5d}  {first:11.2f}  {med:10.2f} ({med / base:.2f}x 1 host)  {ok:8d}  {failed:12d}"
            )
        finally:
            fleet.close()

    walls = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run(["inv", "--list"], cwd=REPO, capture_output=True, check=True)
        walls.append(time.perf_counter() - start)
    print(f"inv --list: median {statistics.median(walls):.3f}s over 5 runs (goal < 0.5s)")


if __name__ == "__main__":
    main()
