"""What root touches on a host, recorded by the kernel's view of it: strace on a real sshd.

An audit hook inside Python cannot see what runs before it is installed (site, .pth
files, encodings, the dynamic loader) nor what other programs do, so the census traces
the sshd that serves gpufleet's connection, with every process it forks: each `execve`,
each file opened (for writing, or a module, library or configuration read), each
directory made, each rename and unlink. Processes of the login shell's rc files (root's
own ~/.bashrc) are left out; everything from the host python's start on, and every write
the SFTP server makes for gpufleet, is in.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CALLS = (
    "execve,open,openat,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,"
    "symlink,symlinkat,link,linkat,chdir,clone,clone3,fork,vfork"
)
PSEUDO = ("/proc/", "/sys/", "/dev/", "pipe:", "socket:", "anon_inode:")
IMPORTS = (".py", ".pyc", ".so", ".pth", ".pyz", ".zip")
_LIBRARY = re.compile(r"\.so(\.\d+)*$")
CONFIGS = (".cfg", ".conf", ".yaml", ".yml", ".json", ".toml", ".ini", ".cache")
WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")
_LINE = re.compile(r"^(\d+) +(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\) += (-?\d+)(?:<([^>]*)>)?")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_DIRFD = re.compile(r"^(?:AT_FDCWD|\d+)<([^>]*)>")


@dataclass(frozen=True)
class Touch:
    kind: str  # exec, import, config, write, mkdir, probe (a module looked for, not found)
    path: str  # absolute

    @property
    def directory(self) -> str:
        """Where it happened: the directory made, or the one holding the file (a module's
        __pycache__ counts as its package)."""
        where = self.path if self.kind == "mkdir" else os.path.dirname(self.path)
        return where.removesuffix("/__pycache__")


def strace_wrapper(log: Path) -> list[str]:
    """The census sshd's wrapper: strace from the sshd's start on, following every process
    it forks, into `log`. From the start, not attached (`-p`): a seccomp filter, which only
    a traced start can install, stops the traced calls alone; attached, strace stopped at
    every call of every process (20 python starts: 5.8 s of CPU attached, 2.4 s from the
    start, 2.0 s untraced)."""
    return ["strace", "-f", "-y", "-qq", "--seccomp-bpf", "-s", "4096", "-e", f"trace={CALLS}",
            "-o", str(log), "--"]  # fmt: skip


def trace_log(sshd) -> Path:
    """The log the census sshd's strace writes (its wrapper's `-o`)."""
    return Path(sshd.wrapper[sshd.wrapper.index("-o") + 1])


@contextmanager
def traced(log: Path, out: Path) -> Iterator[Path]:
    """What the traced sshd's processes did while the block ran: the whole lines `log`
    gained meanwhile, copied to `out`. strace writes each call's line before the process
    goes on, so a task's calls are all there once its answer came back; a server it left
    running goes on writing, and the census reads only processes started within."""
    start = log.stat().st_size
    try:
        yield out
    finally:
        with log.open("rb") as fh:
            fh.seek(max(0, start - 1))
            data = fh.read()
        if start:  # from the first line that begins within the block
            data = data[data.find(b"\n") + 1 :]
        out.write_bytes(data[: data.rfind(b"\n") + 1])


def _joined(lines: list[str]) -> Iterator[tuple[int, str]]:
    """(pid, call) with strace's `<unfinished ...>` / `<... resumed>` halves put together."""
    pending: dict[int, str] = {}
    for raw in lines:
        match = _LINE.match(raw)
        if not match:
            continue
        pid, rest = int(match.group(1)), match.group(2)
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
            continue
        if rest.startswith("<... "):
            head = pending.pop(pid, "")
            rest = head + rest.split("resumed>", 1)[1]
        yield pid, rest


def _absolute(path: str, base: str | None) -> str:
    return os.path.normpath(path if path.startswith("/") or not base else os.path.join(base, path))


def touches(log: Path, python: str) -> list[Touch]:
    """Everything root did for gpufleet in the trace: from the host python's `execve` on
    (and its children), plus what the SFTP server wrote."""
    ours: set[int] = set()
    program: dict[int, str] = {}  # the last program each pid runs (children inherit)
    cwd: dict[int, str] = {}
    out: list[Touch] = []
    for pid, call in _joined(log.read_text(errors="replace").splitlines()):
        match = _CALL.match(call)
        if not match:
            continue
        name, args, ret, decoded = match.groups()
        ok = int(ret) >= 0
        strings = _STRING.findall(args)
        dirfd = _DIRFD.match(args)
        if dirfd and args.startswith("AT_FDCWD"):
            cwd[pid] = dirfd.group(1)  # -y shows the process's cwd there
        if name in ("clone", "clone3", "fork", "vfork") and ok and int(ret) > 0:
            child = int(ret)
            program.setdefault(child, program.get(pid, ""))
            cwd.setdefault(child, cwd.get(pid, "/"))
            if pid in ours:
                ours.add(child)
            continue
        if name == "chdir" and ok and strings:
            cwd[pid] = _absolute(strings[0], cwd.get(pid))
            continue
        if name == "execve" and ok and strings:
            program[pid] = strings[0]
            if strings[0] == python or pid in ours:
                ours.add(pid)
                out.append(Touch("exec", _absolute(strings[0], cwd.get(pid))))
            continue
        base = dirfd.group(1) if dirfd else cwd.get(pid)
        sftp = pid not in ours and program.get(pid, "").endswith("sshd")
        if pid not in ours and not sftp:
            continue
        out += [t for t in _classify(name, args, strings, ok, decoded, base) if
                pid in ours or t.kind in ("write", "mkdir")]  # fmt: skip
    return [t for t in out if not t.path.startswith(PSEUDO)]


def _classify(name: str, args: str, strings: list[str], ok: bool, decoded: str | None,
              base: str | None) -> list[Touch]:  # fmt: skip
    if not strings:
        return []
    if name in ("open", "openat", "creat"):
        path = decoded if ok and decoded else _absolute(strings[0], base)
        flags = args.split('",', 1)[-1]
        if name == "creat" or any(f in flags for f in WRITE_FLAGS):
            return [Touch("write", path)] if ok else []
        if path.endswith(IMPORTS) or "/__pycache__/" in path or _LIBRARY.search(path):
            return [Touch("import" if ok else "probe", path)]
        if ok and (path.endswith(CONFIGS) or path.startswith("/etc/")):
            return [Touch("config", path)]
        return []
    if name in ("mkdir", "mkdirat") and ok:
        return [Touch("mkdir", _absolute(strings[-1], base))]
    if name in ("unlink", "unlinkat", "symlink", "symlinkat") and ok:
        return [Touch("write", _absolute(strings[-1], base))]
    if name.startswith(("rename", "link")) and ok:
        return [Touch("write", _absolute(s, base)) for s in strings[:2]]
    return []


# run as another user: try to create each missing path (its missing directories first), and
# remove whatever it made; print the paths it could create
_CREATOR = """
import json, os, sys
could = []
for path in json.load(sys.stdin):
    made = []
    try:
        missing, d = [], os.path.dirname(path)
        while not os.path.lexists(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            os.mkdir(d)
            made.append(d)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        could.append(path)
        os.unlink(path)
    except OSError:
        if made:
            could.append(path)  # a directory on the way was its to make: the rest follows
    for d in reversed(made):
        try:
            os.rmdir(d)
        except OSError:
            pass
print(json.dumps(could))
"""


def created_by(uid: int, paths: list[str]) -> list[str]:
    """Which of `paths` (missing now) a process of `uid` could create: the race a path that
    root looks for and does not find is exposed to, tried for real, each made path removed."""
    import json

    out = subprocess.run(  # the system's python: the test's may lie under root's home
        ["/usr/bin/python3", "-I", "-S", "-c", _CREATOR], input=json.dumps(sorted(set(paths))),
        capture_output=True, text=True, user=uid, group=uid, extra_groups=[], cwd="/",
        timeout=120, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


# -- a hostile directory confined to one sshd's sessions --------------------------------
# Turning a shared directory (the host venv, Python's, /etc/ssl) writable by others for one
# test would turn it hostile for every test beside it, so those cases ran alone. Instead
# the census sshd runs in its own mount namespace (PRIVATE_MOUNTS) and the directory is
# overlaid there: chmod reaches the overlay's copy, which only that sshd's sessions see,
# and anything the task wrote lands in the overlay's upper layer, where the test finds it.
PRIVATE_MOUNTS = ["unshare", "-m", "--propagation", "private"]


def _in_namespace(pid: int, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nsenter", "-t", str(pid), "-m", "sh", "-ec", script, "sh", *args],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


OVERLAY = ('mount -t tmpfs census "$2" && mkdir "$2/u" "$2/w" && '
           'mount -t overlay census -o "lowerdir=$1,upperdir=$2/u,workdir=$2/w" "$1" && '
           'chmod o+w "$1"')  # fmt: skip


def submounts(directory: str) -> list[str]:
    """Mount points below `directory` (docker's /etc/hosts under /etc): an overlay of the
    directory would hide them from the sessions, so such a directory is not confined."""
    inside = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(directory.rstrip("/") + "/"):
            inside.append(point)
    return inside


def can_confine() -> bool:
    """Whether this machine lets a test overlay a directory in a mount namespace of its own
    (a container without CAP_SYS_ADMIN does not): else the cases run alone, as before."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        probe = subprocess.run(
            [*PRIVATE_MOUNTS, "sh", "-ec", OVERLAY.replace("chmod o+w", "test -d"), "sh",
             "/usr/share", scratch],
            capture_output=True, timeout=30,
        )  # fmt: skip
    return probe.returncode == 0


@contextmanager
def hostile_in_namespace(pid: int, directory: str, scratch: Path) -> Iterator[Path]:
    """`directory`, writable by others as sshd `pid`'s sessions see it (an overlay in its
    mount namespace); yields where the task's writes to it would land (checked empty)."""
    scratch.mkdir(parents=True, exist_ok=True)
    made = _in_namespace(pid, OVERLAY, directory, str(scratch))
    if made.returncode != 0:
        raise RuntimeError(f"overlay of {directory} failed: {made.stderr.strip()}")
    try:
        yield scratch / "u"
    finally:
        _in_namespace(pid, 'umount "$1" && umount "$2"', directory, str(scratch))


# one file made another user's in the census sshd's namespace: its directory overlaid, the
# upper layer holding the file's stand-in (written before the overlay is mounted)
_STAND_IN = {
    "file": 'cp -p "$1/$3" "$2/u/$3" && chown 65534 "$2/u/$3"',  # theirs to rewrite
    "link": 'ln -s "$4" "$2/u/$3"',  # the name leads to a copy that is theirs
}


@contextmanager
def hostile_file_in_namespace(pid: int, path: str, kind: str, theirs: str,
                              scratch: Path) -> Iterator[None]:  # fmt: skip
    """`path` made another user's as sshd `pid`'s sessions see it, `kind` "file" (owned by
    uid 65534) or "link" (a symlink to `theirs`, a copy that uid 65534 owns); every other
    process sees the file as it was, so the case runs beside the other tests."""
    scratch.mkdir(parents=True, exist_ok=True)
    directory, name = os.path.split(path)
    script = ('mount -t tmpfs census "$2" && mkdir "$2/u" "$2/w" && ' + _STAND_IN[kind] +
              ' && mount -t overlay census -o "lowerdir=$1,upperdir=$2/u,workdir=$2/w" "$1"')  # fmt: skip
    made = _in_namespace(pid, script, directory, str(scratch), name, theirs)
    if made.returncode != 0:
        _in_namespace(pid, 'umount "$1"', str(scratch))
        raise RuntimeError(f"overlay of {path} failed: {made.stderr.strip()}")
    try:
        yield
    finally:
        # detached at once (lazily): a session of the case still ending may hold the file
        # (a python that mapped it), and the next case must find the directory as it was
        gone = _in_namespace(pid, 'umount -l "$1" && umount -l "$2"', directory, str(scratch))
        if gone.returncode != 0:
            raise RuntimeError(f"overlay of {path} stayed: {gone.stderr.strip()}")


def written_in_namespace(pid: int, upper: Path) -> list[str]:
    """What a task wrote into the overlaid directory: the upper layer's entries."""
    listed = _in_namespace(pid, 'ls -A "$1"', str(upper))
    return listed.stdout.split()
