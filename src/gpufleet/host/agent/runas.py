"""The unprivileged user a host's servers run as (`run_as:` in the inventory, issue 50).

Root keeps what needs root: killing stale GPU processes, reading the kernel log, NVML. The
engine's code (SGLang, torch, its JIT caches, a model's own Python) runs the server, its
ranks and its version and flag probes: with `run_as: USER` they start with that user's
uid, gid and groups, its own HOME, in its home directory, from the allow-list environment
(`PYTHONNOUSERSITE=1` included), so a venv or model another user can write runs with that
user's rights, not root's. The files such a server reads (a profile's files, the key file)
are written by a child running as that user, in its own directory: root never writes
where another user decides what a path means. Standard library only: this module ships.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from dataclasses import dataclass
from typing import TypedDict

from gpufleet.host.agent.protocol import AgentError
from gpufleet.kinds import Kind

ROOT_NAMES = (None, "", "root")  # absent, or `run_as: root`: the judged mode, as root
DIRECTORY = ".gpufleet-run"  # the user's own: its files and key files, under its HOME


def cannot_run_as(engine: str | None, in_slurm_job: bool) -> str | None:
    """Why a server of this engine cannot run as a run_as user, or None: the one rule both
    the launch's refusal and the "runs as root" note follow (the note must never advise
    what the launch would refuse)."""
    if engine == "sim":
        return ("the rehearsal engine shares the simulated GPUs' state with root's agent and "
                "runs as root: leave run_as unset for rehearsal hosts")  # fmt: skip
    if in_slurm_job:
        return ("a server in a Slurm job runs as the job's user (connection: srun): leave "
                "run_as unset there")  # fmt: skip
    return None


def pythons() -> list[str]:
    """The interpreters a child as the run_as user tries, in order: the agent's, which may
    sit where the user cannot reach (root's home), then the system's."""
    return list(dict.fromkeys([sys.executable, "/usr/bin/python3"]))


class PopenAs(TypedDict):
    """subprocess.Popen's keywords that start a child as another user, in its home."""

    user: int
    group: int
    extra_groups: list[int]
    cwd: str


@dataclass(frozen=True)
class RunAs:
    """A local user, resolved on the host (its uid, primary group, groups and home)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @property
    def cwd(self) -> str:
        return self.home if os.path.isdir(self.home) else "/"

    def popen(self) -> PopenAs:
        """What subprocess needs to start a child as this user (the agent is root)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups),
                "cwd": self.cwd}  # fmt: skip

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with this user's HOME, USER and LOGNAME (caches, configs: its own)."""
        return {**env, "HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def write_files(self, files: dict[str, str | bytes]) -> str:
        """Write `files` (relative names -> text or bytes) as the user into its own
        directory, 0600 files in 0700 directories, and return that directory:
        `~/.gpufleet-run`, or where its home cannot hold it (a service user's /nonexistent)
        `/tmp/gpufleet-run-UID`, which must then be the user's own and closed to others.
        The writer is a child with the user's rights, so nothing planted there can turn
        root's hand."""
        import base64
        import json

        wire = {name: {"b64": base64.b64encode(data).decode()} if isinstance(data, bytes)
                else data for name, data in files.items()}  # fmt: skip
        said = "no python it may run"
        for python in pythons():
            try:
                out = subprocess.run(
                    [python, "-I", "-S", "-c", _WRITER, self.home, str(self.uid), DIRECTORY],
                    input=json.dumps(wire), capture_output=True, text=True, timeout=60,
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, **self.popen(),  # type: ignore[arg-type]
                )  # fmt: skip
            except OSError as exc:
                said = f"{python}: {exc.strerror}"
                continue
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[-1]
            said = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise AgentError(f"run_as {self.name}: cannot write the server's files: {said}",
                         kind=Kind.PREFLIGHT)  # fmt: skip


# runs as the run_as user: its own directory, then each file through a fresh temporary
_WRITER = """
import base64, json, os, stat, sys
home, uid, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = json.load(sys.stdin)
def own(d):
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise SystemExit(f"{d} is not this user's own directory (0700)")
    return d
try:
    d = own(os.path.join(home, name))
except OSError:
    d = own(f"/tmp/gpufleet-run-{uid}")
for name, data in files.items():
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or "" in parts:
        raise SystemExit(f"refusing to write {name!r}")
    folder = d
    for part in parts[:-1]:
        folder = own(os.path.join(folder, part))
    payload = base64.b64decode(data["b64"]) if isinstance(data, dict) else data.encode()
    tmp = os.path.join(folder, f".{parts[-1]}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(payload)
    os.replace(tmp, os.path.join(folder, parts[-1]))
print(d)
"""


def resolve(name: str | None) -> RunAs | None:
    """The user named by `run_as`, or None where servers run as root (absent, or `root`)."""
    if name in ROOT_NAMES:
        return None
    assert name is not None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise AgentError(f"run_as: no user {name!r} on this host (getent passwd {name})",
                         kind=Kind.USAGE) from None  # fmt: skip
    groups = tuple(sorted(set(os.getgrouplist(name, entry.pw_gid))))
    rooted = _root_in(entry.pw_uid, entry.pw_gid, groups)
    if rooted:  # named to run unprivileged, it would not be: never silently root
        raise AgentError(f"run_as: {name!r} {rooted} on this host (getent passwd {name}): "
                         "name an unprivileged user, or `run_as: root` to run as root "
                         "knowingly", kind=Kind.USAGE)  # fmt: skip
    return RunAs(name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


def _root_in(uid: int, gid: int, groups: tuple[int, ...]) -> str | None:
    """How a user would hold root's powers: uid 0 (another name for root), primary group
    0, or membership of group 0 (root's files that are group-writable); None if not."""
    if uid == 0:
        return "is uid 0, another name for root"
    if gid == 0:
        return "has group 0 (root) as its primary group"
    if 0 in groups:
        return "is a member of group 0 (root)"
    return None


def owners(name: str | None) -> set[int]:
    """The uids whose processes count as gpufleet's own on this host: root's agent's, and
    the run_as user's (gpu-clean kills its stale servers without --all-users)."""
    user = resolve(name)
    return {os.geteuid(), *([user.uid] if user else [])}


def name_of(user: RunAs | None) -> str:
    """Who a child started with `user` runs as: that user, else the agent's own."""
    if user is not None:
        return user.name
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
