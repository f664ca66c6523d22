"""The scale curve: gpu-clean, launch (with its health wait), a short bench and stop on 1, 8,
32 and 128 simulated hosts over real loopback sshd, then the largest fleet's bench again
with a quarter of its sshds killed mid-run (those hosts' runs are fetched afterwards with
`--attach`: nothing lost).

Prints, per task: wall time and its ratio to one host, the control plane's CPU per host
(user + system of the `inv` process, from wait4) and its peak memory. Every "host" here
shares this machine's cores with the others' sshd, agent and server processes, so wall time
at 128 hosts measures this machine as much as gpufleet; the CPU per host is gpufleet's own.

run: python benchmarks/fleet_scale.py [--hosts 1,8,32,128] [--hosts-per-sshd 8]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml
from _fleet import BenchFleet

from gpufleet.sim.sshd import free_port

BENCH = ["--concurrency", "4", "--output-len", "32"]


@dataclass
class Measured:
    wall_s: float
    cpu_s: float
    rss_mib: float
    code: int
    out: str
    host_cpu_s: float = 0.0


def hosts_cpu_s(fleet: BenchFleet) -> float:
    """CPU of everything the sshds ran and reaped (logins, shells, agents): the hosts' side.
    Servers and bench runners start their own sessions and are not counted."""
    total = 0.0
    for sshd in fleet.sshds:
        if sshd.proc is not None:
            times = psutil.Process(sshd.proc.pid).cpu_times()
            total += times.children_user + times.children_system
    return total


def measured(fleet: BenchFleet, *args: str) -> Measured:
    """Run the CLI once; its own CPU and peak RSS from wait4 (sshd and agents excluded)."""
    hosts_before = hosts_cpu_s(fleet)
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", *args, "--inventory", str(fleet.inventory)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    time.sleep(0.2)  # the sshds reap their last sessions
    return Measured(
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
        proc.returncode,
        text,
        hosts_cpu_s(fleet) - hosts_before,
    )


def profile(fleet: BenchFleet) -> Path:
    path = fleet.root / "scale.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engine": "sim",
                "model_path": "/models/scale",
                "tp": 1,
                "port": free_port(),
                "health_timeout": 300,
                "sim": {"load-seconds": 1.0, "warmup-seconds": 0.2},
            }
        )
    )
    return path


def row(hosts: int, task: str, m: Measured, base: dict[str, float], failed: str = "") -> None:
    """One line of figures; for a command that failed with no host to blame (a usage
    error, a crash), its exit code and no figure: its time measures nothing."""
    if m.code and not failed:
        print(f"{hosts:5d}  {task:9s}  FAILED (exit {m.code}): no figure", flush=True)
        return
    base.setdefault(task, m.wall_s)
    print(
        f"{hosts:5d}  {task:9s}  {m.wall_s:7.2f}  {m.wall_s / base[task]:5.2f}x"
        f"  {m.cpu_s * 1000 / hosts:8.1f}  {m.rss_mib:7.1f}  {m.host_cpu_s * 1000 / hosts:9.0f}"
        f"  {m.code:4d}  {failed}",
        flush=True,
    )


def kill_sshd(sshd) -> None:
    """The sshd and every session it holds: its hosts drop off the network."""
    parent = psutil.Process(sshd.proc.pid)
    for p in [parent, *parent.children(recursive=True)]:
        if p.name().startswith("sshd"):
            p.send_signal(signal.SIGKILL)
    sshd.proc.wait()
    sshd.proc = None


def fault_run(fleet: BenchFleet, hosts: int, archive: Path) -> None:
    """Bench the fleet, kill a quarter of the sshds once every host has started; then count
    hosts archived, hosts reported failed, and hosts with no word (the goal: none)."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "bench", *BENCH, "--num-prompts", "800",
             "--forks", str(hosts), "--archive", str(archive), "--inventory", str(fleet.inventory)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            out.seek(0)
            if out.read().count(" started against ") >= hosts:
                break
            time.sleep(0.2)
        time.sleep(1.0)
        doomed = fleet.sshds[: max(1, len(fleet.sshds) // 4)]
        for sshd in doomed:
            kill_sshd(sshd)
        proc.wait()
        out.seek(0)
        text = out.read()
    lost_names = {f"h{i:02d}" for i in range(hosts) if fleet.sshds[i % len(fleet.sshds)] in doomed}
    archived = {p.parent.parent.name for p in archive.glob("h*/*/manifest.json")}
    failed = set(re.findall(r"^(h\d+): FAILED", text, re.M))
    silent = {f"h{i:02d}" for i in range(hosts)} - archived - failed
    print(
        f"fault: {len(doomed)} of {len(fleet.sshds)} sshds killed mid-bench "
        f"({len(lost_names)} hosts): exit {proc.returncode}, {len(archived)} archived, "
        f"{len(failed)} reported FAILED (all of them the killed sshds' hosts: "
        f"{failed == lost_names}), {len(silent)} with no word",
        flush=True,
    )
    if silent or proc.returncode != 1:
        print(text[-3000:])
    run_id = re.search(r"--attach (\S+)", text)
    for sshd in doomed:
        sshd.start()
    if run_id:
        m = measured(fleet, "bench", "--attach", run_id.group(1), "--hosts",
                     ",".join(sorted(lost_names)), "--archive", str(archive))  # fmt: skip
        done = sum(
            1
            for name in lost_names
            if (archive / name / run_id.group(1) / "manifest.json").exists()
        )
        print(f"fault: --attach after restarting those sshds: exit {m.code}, "
              f"{done} of {len(lost_names)} runs archived", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,8,32,128")
    parser.add_argument("--hosts-per-sshd", type=int, default=8)
    parser.add_argument("--no-fault", action="store_true")
    options = parser.parse_args()
    counts = [int(n) for n in options.hosts.split(",")]
    print(f"machine: {os.cpu_count()} CPUs; gpufleet's control plane CPU per host below")
    print(
        "hosts  task          wall s  x 1 host  cpu ms/host  rss MiB  host-side ms/host"
        "  exit  failed"
    )
    base: dict[str, float] = {}
    for hosts in counts:
        sshds = max(1, hosts // options.hosts_per_sshd)
        fleet = BenchFleet(hosts=hosts, sshds=sshds, max_startups="400:30:800", forks=hosts)
        try:
            measured(fleet, "gpu-clean")  # the one-time agent upload, not counted
            prof = str(profile(fleet))
            archive = fleet.root / "archive"
            for task, args in (
                ("gpu-clean", ["gpu-clean"]),
                ("launch", ["launch", "--profile", prof]),
                ("bench", ["bench", *BENCH, "--num-prompts", "16", "--archive", str(archive)]),
                ("stop", ["stop"]),
            ):
                m = measured(fleet, *args)
                failed = sorted(set(re.findall(r"^(h\d+): FAILED", m.out, re.M)))
                row(hosts, task, m, base, f"{len(failed)} failed" if failed else "")
                if m.code and not failed:
                    print(m.out[-2000:])
            if hosts == counts[-1] and not options.no_fault:
                measured(fleet, "launch", "--profile", prof)
                fault_run(fleet, hosts, fleet.root / "fault-archive")
                measured(fleet, "stop")
        finally:
            measured(fleet, "stop")
            fleet.close()


if __name__ == "__main__":
    main()
