"""The fleet index at scale: 128 hosts x 50 runs each (3 levels a run), the index built from
the files, then `inv fleet`, `inv history` and `inv metrics` timed as a user runs them
(each a fresh CLI process, Python's start included).

    python benchmarks/fleet_index.py [--hosts 128] [--runs 50]

Prints the archive's size, the index build (full, per run), an open with nothing changed,
an open after one new run, and each task's wall time (median of 3). A command that fails
(an exit code the task does not document) prints its error and no figure, and the script
exits 1: a usage error's 0.3 s is not a timing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fleetdata import write_run
from gpufleet.archive.layout import Archive
from gpufleet.fleet.index import open_index


def build_archive(root: Path, hosts: int, runs: int) -> None:
    for n in range(runs):
        day = f"2026-{1 + n // 28:02d}-{1 + n % 28:02d}"
        for h in range(hosts):
            slow = 0.85 if h == 7 else 1.0
            write_run(root, f"gpu{h:03d}", f"{day.replace('-', '')}T000000Z-baseline-{h:03d}",
                      {1: 60.0 * slow, 10: 380.0 * slow + n % 3, 64: 780.0 * slow},
                      started=f"{day}T00:00:00+00:00",
                      engine_version="0.5.23" if n >= runs - 1 else "0.5.22")  # fmt: skip


class CommandFailed(SystemExit):
    """A timed command exited with a code its task does not document: no figure."""


def timed(args: list[str], repeats: int = 3, ok: tuple[int, ...] = (0,)) -> float:
    """The median wall time of `repeats` runs of the CLI; CommandFailed (with the command's
    own words) if any run exits with a code not in `ok` (fleet and history gate with 1)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        got = subprocess.run([sys.executable, "-m", "gpufleet", *args], capture_output=True,
                             text=True)  # fmt: skip
        times.append(time.perf_counter() - began)
        if got.returncode not in ok:
            said = (got.stderr.strip() or got.stdout.strip())[-500:]
            raise CommandFailed(f"inv {' '.join(args)}: exit {got.returncode}, no figure: {said}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=128)
    parser.add_argument("--runs", type=int, default=50)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "logs"
        began = time.perf_counter()
        build_archive(root, a.hosts, a.runs)
        total = a.hosts * a.runs
        print(f"archive: {a.hosts} hosts x {a.runs} runs = {total} runs written in "
              f"{time.perf_counter() - began:.1f} s")  # fmt: skip
        archive = Archive(root)
        began = time.perf_counter()
        with open_index(archive, rebuild=True):
            pass
        built = time.perf_counter() - began
        print(f"index build: {built:.2f} s, {built / total * 1000:.2f} ms a run "
              f"({archive.index_path.stat().st_size / 1e6:.1f} MB)")  # fmt: skip
        began = time.perf_counter()
        with open_index(archive):
            pass
        print(f"index open, nothing changed: {time.perf_counter() - began:.3f} s")
        write_run(root, "gpu000", "20261231T000000Z-baseline-extra", {10: 380.0},
                  started="2026-12-31T00:00:00+00:00")  # fmt: skip
        began = time.perf_counter()
        with open_index(archive):
            pass
        print(f"index open after one new run: {time.perf_counter() - began:.3f} s")
        at = ["--archive", str(root)]
        slow = f"gpu{min(7, a.hosts - 1):03d}"
        for label, args, ok in (
            ("inv fleet --profile baseline", ["fleet", "--profile", "baseline", *at], (0, 1)),
            ("inv report --fleet baseline (plot and page)", ["report", "--fleet", "baseline",
                                                             *at], (0,)),
            ("inv history (every host)", ["history", *at], (0,)),
            ("inv history --host gpu007", ["history", "--host", slow, *at], (0,)),
            ("inv metrics --output", ["metrics", "--output", str(Path(tmp) / "m.prom"), *at],
             (0,)),
            ("inv --list (the CLI's own start)", ["--list"], (0,)),
        ):  # fmt: skip
            print(f"{label}: {timed(args, ok=ok):.2f} s")


if __name__ == "__main__":
    main()
