"""What gpufleet asks Slurm, through Slurm's own commands: a job's nodes (squeue), a
partition's or a node list's nodes with their states (sinfo), and the environment a job
step is started with.

Every failure is one line naming the command and what Slurm said (exit 2 at the CLI).
Nodes Slurm will not run on (drained, down, not responding) are skipped, each with Slurm's
own state and reason, never silently.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field

from gpufleet.control.inventory import hostlist
from gpufleet.errors import UserError

TIMEOUT_S = 30
# sinfo's long states a job can be started on; any other (drained, draining, down, fail,
# maint, unknown, ...) or a flag such as `*` (not responding) skips the node
USABLE_STATES = {"idle", "mixed", "allocated", "completing", "planned", "reserved"}
FLAG_SUFFIXES = {"*": "not responding", "~": "powered off", "#": "powering up",
                 "%": "powering down", "!": "pending power down", "$": "in maintenance",
                 "@": "pending reboot", "^": "rebooting", "-": "planned"}  # fmt: skip


@dataclass(frozen=True)
class Nodes:
    """The nodes a spec names, and those skipped: node -> Slurm's state and reason."""

    names: list[str]
    skipped: dict[str, str] = field(default_factory=dict)


def step_env() -> dict[str, str]:
    """This environment without the SLURM_* variables of a job gpufleet itself may run in
    (under salloc they would steer `srun --jobid` into that job); SLURM_CONF is kept."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def run(command: list[str], what: str) -> str:
    """A Slurm command's stdout; one line naming the command if it cannot answer."""
    if shutil.which(command[0]) is None:
        raise UserError(f"{what} needs Slurm's `{command[0]}` on this machine (not found)")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
            env=step_env(),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise UserError(f"{what}: `{' '.join(command)}` did not answer in {TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{what}: `{' '.join(command)}` failed: {tail}")
    return done.stdout


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def job_nodes(job: str) -> Nodes:
    """The nodes of a running job of this user (squeue); a pending, ended or unknown job,
    or another user's, is one line saying which."""
    if not re.match(r"^\d+(_\d+)?$", job):
        raise UserError(f"slurm job {job!r}: expected a job id such as 123456")
    what = f"slurm job {job}"
    command = ["squeue", "-h", "-j", job, "--states=all", "-o", "%T|%u|%N|%r"]
    try:
        out = run(command, what)
    except UserError as exc:
        if "Invalid job id" not in str(exc):
            raise
        raise UserError(f"{what}: no such job (ended and purged, or never submitted): "
                        f"{str(exc).rpartition(': ')[2]}") from None  # fmt: skip
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        raise UserError(f"{what}: no such job (`{' '.join(command)}` lists nothing)")
    state, user, nodelist, reason = ([*lines[0].split("|"), "", "", ""])[:4]
    if state == "PENDING":
        raise UserError(f"{what} is pending ({reason}): it holds no nodes yet; run again once "
                        f"`squeue -j {job}` shows it RUNNING")  # fmt: skip
    if state != "RUNNING":
        raise UserError(f"{what} is not running ({state}): pass a running job's id")
    if user != _me():
        raise UserError(f"{what} belongs to {user}, not {_me()}: its nodes are in use by "
                        "that job; pass a job of your own")  # fmt: skip
    return Nodes(hostlist.expand(nodelist))


def job_state(job: str) -> str:
    """The job's state as squeue says it (RUNNING, CANCELLED, TIMEOUT, ...), or GONE where
    it no longer lists the job; UserError where squeue cannot answer."""
    try:
        out = run(["squeue", "-h", "-j", job, "--states=all", "-o", "%T"], f"slurm job {job}")
    except UserError as exc:
        if "Invalid job id" in str(exc):
            return "GONE"
        raise
    return (out.split() or ["GONE"])[0]


# What became of a job whose steps were a host's server and run, in Slurm's own state word:
# the cell's line says it (issue 69 R1: a time limit read "COMPLETING", a requeue
# "COMPLETING" then "PENDING", and "requeued" never appeared)
ENDED_WORDS = {
    "CANCELLED": "was cancelled", "TIMEOUT": "reached its time limit",
    "NODE_FAIL": "lost its node", "PREEMPTED": "was preempted",
    "BOOT_FAIL": "failed to boot its node", "DEADLINE": "reached its deadline",
    "OUT_OF_MEMORY": "ran out of memory", "COMPLETED": "ended", "FAILED": "failed",
    "PENDING": "was requeued", "REQUEUED": "was requeued", "REQUEUE_HOLD": "was requeued",
    "REQUEUE_FED": "was requeued", "SPECIAL_EXIT": "was requeued",
    "GONE": "ended (Slurm lists it no more)",
}  # fmt: skip
PASSING = ("COMPLETING", "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED")


def job_end(job: str, settle_s: float = 10.0) -> str | None:
    """What ended a job this host's steps belonged to, in words and Slurm's state word
    ("was requeued (PENDING)"); None while it runs. A passing state (COMPLETING) is read
    again for up to `settle_s` until Slurm says how it ended. UserError where squeue
    cannot answer."""
    deadline = time.monotonic() + settle_s
    while True:
        state = job_state(job)
        if state in ("RUNNING", "SUSPENDED"):
            return None
        if state not in PASSING or time.monotonic() >= deadline:
            break
        time.sleep(SETTLE_POLL_S)
    words = ENDED_WORDS.get(state, "is not running")
    return f"{words} ({state})" if state != "GONE" else words


def _usable(state: str) -> str | None:
    """None when a job can start on a node in this sinfo state, else why not."""
    flags = [FLAG_SUFFIXES[c] for c in state if c in FLAG_SUFFIXES]
    base = state.rstrip("".join(FLAG_SUFFIXES))
    if base in USABLE_STATES and not flags:
        return None
    return ", ".join([base, *flags])


# A node just resumed (or whose slurmd just restarted) reads "not responding" until its
# slurmd registers again, within its next ping: asked again for this long before it is
# skipped as not responding (a node resumed 0.4 s earlier was skipped, issue 69)
SETTLE_S = 10.0
SETTLE_POLL_S = 0.5


def _node_states(command: list[str], what: str) -> tuple[list[str], dict[str, str]]:
    """sinfo -N output (`%N|%T|%E`) as the usable nodes, in order, and the skipped ones; a
    node whose only fault is "not responding" in a usable state is asked about again for
    SETTLE_S before it is skipped."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        names, skipped, settling = _parse_states(run(command, what))
        if not settling or time.monotonic() >= deadline:
            return names, skipped
        time.sleep(SETTLE_POLL_S)


def _parse_states(text: str) -> tuple[list[str], dict[str, str], list[str]]:
    """(usable nodes in order, skipped node -> why, the skipped only "not responding")."""
    names: list[str] = []
    skipped: dict[str, str] = {}
    settling: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        node, state, reason = ([*line.split("|", 2), "", ""])[:3]
        if node in names or node in skipped:
            continue  # a node of two partitions is listed twice
        why = _usable(state)
        if why is None:
            names.append(node)
            continue
        skipped[node] = why + (f" ({reason})" if reason and reason != "none" else "")
        if state.rstrip("*") in USABLE_STATES and state.endswith("*") and state.count("*") == 1:
            settling.append(node)
    return names, skipped, settling


def unusable_nodes(nodes: list[str]) -> dict[str, str]:
    """Which of these nodes Slurm now has drained, draining or down, with its reason (what
    a sweep reads before each cell); UserError where sinfo cannot answer."""
    command = ["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%E"]
    return _node_states(command, "slurm node states")[1]


def partition_nodes(partition: str) -> Nodes:
    """The nodes of a partition (sinfo) that can run a job; drained and down ones skipped
    with Slurm's reason."""
    if not re.match(r"^[A-Za-z0-9_.-]+$", partition):
        raise UserError(f"slurm partition {partition!r}: not a partition name")
    what = f"slurm partition {partition}"
    names, skipped = _node_states(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%T|%E"], what)
    if not names and not skipped:
        raise UserError(f"{what}: no such partition, or no nodes (sinfo lists none)")
    if not names:
        raise UserError(f"{what}: every node is skipped: " + _said(skipped))
    return Nodes(names, skipped)


def listed_nodes(text: str) -> Nodes:
    """A node list (`n[1-3]`), expanded; where Slurm's sinfo is on this machine, each node
    checked against it (unknown ones refused, drained and down ones skipped)."""
    expanded = hostlist.expand(text)
    if shutil.which("sinfo") is None:
        return Nodes(expanded)
    what = f"slurm nodes {text}"
    command = ["sinfo", "-h", "-N", "-n", ",".join(expanded), "-o", "%N|%T|%E"]
    names, skipped = _node_states(command, what)
    unknown = [n for n in expanded if n not in names and n not in skipped]
    if unknown:
        raise UserError(f"{what}: not nodes of this Slurm: {', '.join(unknown[:10])}")
    if not names:
        raise UserError(f"{what}: every node is skipped: " + _said(skipped))
    return Nodes([n for n in expanded if n in names], skipped)


def _said(skipped: dict[str, str]) -> str:
    return "; ".join(f"{node} {why}" for node, why in list(skipped.items())[:10])


_config_lock = threading.Lock()
_config: dict[str, str] = {}


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` as key -> value."""
    pairs = (line.partition(" = ") for line in text.splitlines() if " = " in line)
    return {key.strip(): value.strip() for key, _, value in pairs}


def config() -> dict[str, str]:
    """This cluster's running configuration (`scontrol show config`), read once."""
    with _config_lock:
        if not _config:
            _config.update(parse_config(run(["scontrol", "show", "config"], "slurm config")))
        return _config


def needs_step_keeper(settings: dict[str, str]) -> bool:
    """Whether an srun the launch's step detaches would end with that step (any tracker but
    `proctrack/linuxproc`, which follows parents, so a detached process escapes it): then
    servers and runs are started by the job's step keeper (host/proc/stepkeeper.py)."""
    return settings.get("ProctrackType", "") != "proctrack/linuxproc"
