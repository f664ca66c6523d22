"""A real Slurm on this one machine, for rehearsing (and testing) Slurm inventories and the
`srun` transport: `munged`, `slurmctld` and N `slurmd`s, each node its own name and port,
everything (key, sockets, state, spool, logs) in one folder, stopped by PID.

Debian's `slurm-wlm` (22.05) allows several slurmd on one host (docs/FACTS.md, Slurm). Every
client command (squeue, sinfo, srun, sbcast) finds this cluster through `SLURM_CONF`, which
`env()` gives. Not part of the host agent: it runs on the control machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "squeue", "sinfo", "srun", "sbcast", "scontrol")
APT_PACKAGES = "slurmctld slurmd slurm-client munge"
SBIN = ("/usr/sbin", "/usr/local/sbin")


def _kernel_port() -> int:
    """A port the kernel picks from its ephemeral range: the cluster's daemons hold theirs
    for a whole test session, so they must stay out of the range tests draw servers'
    ports from (sim.sshd.free_port, profile port + a host's offset): a slurmd there made
    a test's server find its port taken."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_programs() -> list[str]:
    """The Slurm and MUNGE programs this machine lacks (none: a cluster can start)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    return [p for p in PROGRAMS if shutil.which(p, path=path) is None]


def _program(name: str) -> str:
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    found = shutil.which(name, path=path)
    if found is None:
        raise RuntimeError(f"{name} not found: apt-get install -y {APT_PACKAGES}")
    return found


@dataclass
class LocalSlurm:
    """One Slurm cluster: node names n1..nN (`h200` is every node but the first)."""

    directory: Path
    nodes: int = 3
    cpus: int = 2
    # how slurmd follows a step's processes: `linuxproc` (by parents) or `cgroup` (by the
    # freezer cgroup of cgroup v1; such a cluster's nodes take another prefix, as the
    # cgroups are named by node and job, and two clusters on one machine must not share)
    proctrack: str = "linuxproc"
    node_prefix: str = "n"
    procs: list[subprocess.Popen] = field(default_factory=list)
    ctld_port: int = 0
    node_ports: list[int] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}{i}" for i in range(1, self.nodes + 1)]

    def env(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF naming this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        """A Slurm client command against this cluster; its stdout."""
        done = subprocess.run(
            list(argv), capture_output=True, text=True, env=self.env(), timeout=timeout
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def _write_config(self) -> None:
        d = self.directory
        host = socket.gethostname()
        self.ctld_port = _kernel_port()
        self.node_ports = [_kernel_port() for _ in self.node_names]
        lines = [
            f"ClusterName=gpufleet{os.getpid()}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={d / 'munge.socket'}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            f"ProctrackType=proctrack/{self.proctrack}",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ReturnToService=1",  # a node set down by hand stays down until resumed
            "MinJobAge=300",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "KillWait=5",
        ]
        for name, port in zip(self.node_names, self.node_ports, strict=True):
            lines.append(
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={self.cpus} State=UNKNOWN"
            )
        every = ",".join(self.node_names)
        lines.append(f"PartitionName=main Nodes={every} Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=FORCE:8")  # fmt: skip
        if self.nodes > 1:
            lines.append(f"PartitionName=h200 Nodes={','.join(self.node_names[1:])} "
                         "MaxTime=INFINITE State=UP OverSubscribe=FORCE:8")  # fmt: skip
        self.conf.write_text("\n".join(lines) + "\n")
        if self.proctrack == "cgroup":  # read beside slurm.conf
            (d / "cgroup.conf").write_text(
                "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
            )

    def _spawn(self, argv: list[str], log: str) -> None:
        out = open(self.directory / log, "ab")  # noqa: SIM115 (owned by the process)
        self.procs.append(
            subprocess.Popen(
                argv,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                start_new_session=True,
            )
        )

    def start(self, timeout: float = 60.0) -> LocalSlurm:
        """Key, munged, slurmctld, the slurmds; returns once sinfo reads every node idle."""
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)  # steps of another user (tests) read the config through it
        for sub in ("state", "munge"):
            (d / sub).mkdir(mode=0o700, exist_ok=True)
        (d / "spool").mkdir(mode=0o755, exist_ok=True)  # another user's batch script lies here
        key = d / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        self._write_config()
        self.conf.chmod(0o644)
        self._spawn(
            [_program("munged"), "--foreground", "--force", f"--key-file={key}",
             f"--socket={d / 'munge.socket'}", f"--pid-file={d / 'munge' / 'munged.pid'}",
             f"--log-file={d / 'munge' / 'munged.log'}", f"--seed-file={d / 'munge' / 'seed'}"],
            "munged.out",
        )  # fmt: skip
        self._wait(lambda: (d / "munge.socket").exists(), timeout, "munged")
        self._spawn(self._controller_argv(), "slurmctld.out")
        for name in self.node_names:
            self._spawn([_program("slurmd"), "-D", "-N", name, "-f", str(self.conf)],
                        f"slurmd-{name}.out")  # fmt: skip
        self._wait(self._all_idle, timeout, "every node idle")
        return self

    def _controller_argv(self) -> list[str]:
        return [_program("slurmctld"), "-D", "-c", "-f", str(self.conf)]

    def stop_controller(self) -> None:
        """slurmctld stopped (SIGTERM: it saves its state first), a fault the suite makes:
        jobs and their steps run on; no new step starts until it is back."""
        restarted = [a for a in self._controller_argv() if a != "-c"]
        for proc in self.procs:
            if proc.args in (self._controller_argv(), restarted) and proc.poll() is None:
                proc.terminate()
                proc.wait()

    def start_controller(self, timeout: float = 60.0) -> None:
        """slurmctld started again on its saved state (-c would clear the jobs: not given)."""
        argv = [a for a in self._controller_argv() if a != "-c"]
        if any(p.args in (argv, self._controller_argv()) and p.poll() is None for p in self.procs):
            return
        self._spawn(argv, "slurmctld.out")
        self._wait(self._answers, timeout, "slurmctld answering, every node responding")

    def _answers(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                              env=self.env(), timeout=10, check=False)  # fmt: skip
        return done.returncode == 0 and "*" not in done.stdout

    def _all_idle(self) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                logs = " ".join(sorted(p.name for p in self.directory.glob("*.log")))
                raise RuntimeError(f"{proc.args[0]} exited {proc.returncode} (logs: {logs})")
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10)
        states = dict(line.split()[:2] for line in out.splitlines() if line.strip())
        return len(states) == self.nodes and all(s == "idle" for s in states.values())

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"local Slurm: {what} not reached in {timeout:g}s ({self.directory})")

    def submit(self, *options: str, command: str = "sleep 3600") -> str:
        """A batch job (`sbatch --parsable OPTIONS --wrap COMMAND`); its id."""
        out = self.run("sbatch", "--parsable", "--output=/dev/null", "--chdir=/tmp", *options,
                       "--wrap", command)  # fmt: skip
        return out.strip().split(";")[0]

    def wait_running(self, job: str, timeout: float = 30) -> str:
        """Once the job runs: its node list."""

        def running() -> bool:
            return self.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip() == "RUNNING"

        self._wait(running, timeout, f"job {job} running")
        return self.run("squeue", "-h", "-j", job, "-o", "%N").strip()

    def cancel(self, job: str) -> None:
        self.run("scancel", job, check=False)

    def _jobs(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).split()

    def stop(self) -> None:
        """Every job cancelled (a job's slurmstepd and its processes are not the daemons'
        children: they would outlive them), then every daemon, by PID: TERM, then KILL
        after 5 s; last, whatever still carries this cluster's SLURM_CONF is killed."""
        if self.procs:
            jobs = self._jobs()
            if jobs:
                self.run("scancel", *jobs, check=False, timeout=10)
                with contextlib.suppress(RuntimeError):
                    self._wait(lambda: not self._jobs(), 20, "jobs ended")
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        for pid in _carrying(f"SLURM_CONF={self.conf}".encode()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _carrying(entry: bytes) -> list[int]:
    """The processes whose environment holds `entry` (a step left by a slurmd killed)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if entry in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
    return found
