"""The host's Python, judged from outside it before it runs.

A Python runs code from its tree before any line of ours: `site` executes `.pth` files in
every site-packages directory (`-I` does not stop it), `pyvenv.cfg` names the `home` whose
standard library is imported, and `bin/` holds the executable itself. So the tree is read
over SFTP (or the local filesystem for `connection: local`) with `lstat`, `readlink` and
directory listings, and every part is judged by the one trust rule (host/agent/trust.py): the
executable and its real path, the venv's `pyvenv.cfg`, `bin/` and `home`, the standard
library, every site directory and each of its entries, every `.pth` file and the
directories its lines add. The remote command then runs the very executable judged: a
bare `python3` is looked up on the standard system PATH here, never the login's PATH.
What lies deeper (every directory under sys.path) is imported only after the bootstrap
has judged it on the host (control/agent/bootstrap.py, `module_directories`): a local walk is
a thousand times faster than SFTP round trips over a venv with torch in it.
"""

from __future__ import annotations

import posixpath
import stat
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.host.agent import trust

SEARCH_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
PTH_LIMIT = 1 << 20  # a .pth file larger than this is not a list of paths
SITE_NAMES = ("site-packages", "dist-packages")
# what the dynamic loader and the C library read for any program, the python included
SYSTEM = ("/etc", "/etc/ld.so.cache", "/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ssl",
          "/etc/ssl/certs", "/lib", "/lib64", "/usr/lib", "/usr/lib64",
          "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/lib",
          "/usr/lib/x86_64-linux-gnu/gconv", "/usr/lib/aarch64-linux-gnu/gconv")  # fmt: skip


class TreeReader(Protocol):
    """What the judge needs of a filesystem: SFTP offers exactly this."""

    def lstat(self, path: str) -> Any:
        """The entry's own attributes (never following a link)."""

    def readlink(self, path: str) -> str:
        """Where a link points."""

    def listdir(self, path: str) -> list[tuple[str, Any]]:
        """A directory's entries with their own attributes."""

    def read(self, path: str, limit: int) -> bytes:
        """At most `limit` bytes of a regular file."""


class CachedTree:
    """One answer per path for the whole judgement: every judged path is walked from `/`,
    and over SFTP each `lstat` is a round trip (46 unique ones for a venv, not ~200)."""

    def __init__(self, fs: TreeReader) -> None:
        self.fs = fs
        self.asked = 0  # round trips made (benchmarks, tests)
        self._answers: dict[tuple[str, str], Any] = {}

    def _ask(self, what: str, path: str, *args: Any) -> Any:
        key = (what, path)
        if key not in self._answers:
            self.asked += 1
            try:
                self._answers[key] = getattr(self.fs, what)(path, *args)
            except OSError as exc:
                self._answers[key] = exc
        answer = self._answers[key]
        if isinstance(answer, OSError):
            raise answer
        return answer

    def lstat(self, path: str) -> Any:
        """Asked once per path and answer."""
        return self._ask("lstat", path)

    def readlink(self, path: str) -> str:
        """Asked once per path."""
        return self._ask("readlink", path)

    def listdir(self, path: str) -> list[tuple[str, Any]]:
        """Asked once per directory."""
        return self._ask("listdir", path)

    def read(self, path: str, limit: int) -> bytes:
        """Asked once per file and limit."""
        return self._ask("read", path, limit)


@dataclass
class Verdict:
    """What the judge found of an interpreter: the path it runs, every path judged, and one line
    per problem (none: trusted)."""

    executable: str  # the absolute path the remote command runs
    judged: list[str] = field(default_factory=list)  # every path the rule judged
    problems: list[str] = field(default_factory=list)  # one line each; none = trusted


class _Judge:
    def __init__(self, fs: TreeReader, uid: int) -> None:
        self.fs, self.uid = fs, uid
        self.verdict = Verdict(executable="")

    def path(self, path: str, kind: str, what: str) -> str | None:
        """The real path when it exists (judged), else None (a missing one judged by who
        could create it)."""
        self.verdict.judged.append(path)
        try:
            return trust.judge(path, self.uid, kind, what, fs=self.fs)
        except FileNotFoundError:
            try:
                trust.judge_missing(path, self.uid, what, fs=self.fs)
            except trust.Untrusted as exc:
                self.verdict.problems.append(str(exc))
            return None
        except trust.Untrusted as exc:
            self.verdict.problems.append(str(exc))
            return None

    def entries(self, directory: str, what: str) -> list[tuple[str, Any]]:
        """Each entry of a judged directory: root's or the user's, nobody else can write
        it; a link is judged along its whole way."""
        try:
            listed = self.fs.listdir(directory)
        except OSError:
            return []
        for name, st in listed:
            entry = posixpath.join(directory, name)
            if stat.S_ISLNK(st.st_mode):
                self.path(entry, trust.ANY, what)
            elif st.st_uid not in (0, self.uid) or trust.others_can_write(st):
                self.verdict.judged.append(entry)
                self.verdict.problems.append(
                    f"{what} {entry}: {trust.describe(entry, st)} can be changed by another "
                    f"user; fix: chown root {entry} && chmod go-w {entry}"
                )
        return listed

    def path_files(self, directory: str) -> None:
        """A `._pth` file beside the executable replaces sys.path with its lines (CPython's
        getpath reads `<executable>._pth`): each one found is judged, and every directory
        it names, as the standard library's are."""
        try:
            listed = self.fs.listdir(directory)
        except OSError:
            return
        for name, st in listed:
            if name.endswith("._pth") and not stat.S_ISDIR(st.st_mode):
                file = posixpath.join(directory, name)
                if self.path(file, trust.FILE, "a ._pth file") is not None:
                    self.pth(file)

    def site_dir(self, directory: str) -> None:
        real = self.path(directory, trust.DIRECTORY, "site directory")
        if real is None:
            return
        for name, st in self.entries(real, "site directory entry"):
            if name.endswith(".pth") and stat.S_ISREG(st.st_mode):
                self.pth(posixpath.join(real, name))

    def pth(self, file: str) -> None:
        """A .pth line that is not `import ...` adds a directory to sys.path: judged too."""
        try:
            text = self.fs.read(file, PTH_LIMIT).decode("utf-8", "replace")
        except OSError:
            return
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            added = posixpath.normpath(posixpath.join(posixpath.dirname(file), line))
            real = self.path(added, trust.DIRECTORY, f"a path {file} adds")
            if real is not None:
                self.entries(real, f"an entry of {added} (added by {file})")


def _lib_dirs(judge: _Judge, prefix: str, version: str | None) -> list[str]:
    """The standard library and site directories under one prefix."""
    out: list[str] = []
    for lib in ("lib", "lib64", "local/lib"):
        base = posixpath.join(prefix, lib)
        try:
            names = [name for name, _ in judge.fs.listdir(base)]
        except OSError:
            continue
        for name in sorted(names):
            if (
                name == "python3"
                or name == version
                or (version is None and name.startswith("python3"))
            ):
                out.append(posixpath.join(base, name))
    return out


def _find(fs: TreeReader, name: str) -> str:
    for directory in SEARCH_PATH:
        candidate = posixpath.join(directory, name)
        try:
            fs.lstat(candidate)
        except OSError:
            continue
        return candidate
    return posixpath.join("/usr/bin", name)  # not found: said by the judge as missing


def _venv_config(fs: TreeReader, executable: str) -> str | None:
    """pyvenv.cfg beside the executable or one level up, as Python's getpath looks."""
    here = posixpath.dirname(executable)
    for directory in (here, posixpath.dirname(here)):
        cfg = posixpath.join(directory, "pyvenv.cfg")
        try:
            fs.lstat(cfg)
        except OSError:
            continue
        return cfg
    return None


def _home(fs: TreeReader, cfg: str) -> str | None:
    try:
        text = fs.read(cfg, PTH_LIMIT).decode("utf-8", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() == "home":
            return value.strip()
    return None


def judge_python(python: str, uid: int, fs: TreeReader, home: str = "/root") -> Verdict:
    """Every part of `python`'s tree that runs before our code, judged by the trust rule."""
    fs = fs if isinstance(fs, CachedTree) else CachedTree(fs)
    judge = _Judge(fs, uid)
    if python.startswith("~/"):
        python = posixpath.join(home, python[2:])
    elif "/" in python and not python.startswith("/"):
        python = posixpath.join(home, python)  # the login's cwd, where ssh runs commands
    executable = python if "/" in python else _find(fs, python)
    judge.verdict.executable = executable
    real = judge.path(executable, trust.FILE, "the host python")
    if real is None:
        if not judge.verdict.problems:  # missing: the shell says so when it runs
            judge.verdict.judged.clear()
        return judge.verdict
    try:
        magic = fs.read(real, 4)
    except OSError:
        magic = b""
    if magic != b"\x7fELF":
        judge.verdict.problems.append(
            f"the host python {executable}: {real} is not a Python executable (a script?), so "
            "what it runs cannot be judged before it runs; fix: set python: to the "
            "interpreter itself (a wrapper's variables go under the profile's env:)"
        )
        return judge.verdict
    name = posixpath.basename(real)
    version = name if name.startswith("python3.") else None
    prefixes = [posixpath.dirname(posixpath.dirname(real))]
    cfg = _venv_config(fs, executable)
    if cfg is not None and judge.path(cfg, trust.FILE, "the venv's configuration") is not None:
        venv = posixpath.dirname(cfg)
        judge.path(venv, trust.DIRECTORY, "the venv")
        judge.path(posixpath.join(venv, "bin"), trust.DIRECTORY, "the venv's bin")
        prefixes.insert(0, venv)
        venv_home = _home(fs, cfg)
        if venv_home:  # a relative home is read from the venv's directory, as getpath does
            venv_home = posixpath.normpath(posixpath.join(venv, venv_home))
            judge.path(venv_home, trust.DIRECTORY, "the venv's home")
            # the base installation whose standard library the venv loads: a --copies
            # venv's executable does not lead there, its home does
            prefixes.append(posixpath.dirname(venv_home))
    for directory in dict.fromkeys(posixpath.dirname(p) for p in (executable, real)):
        judge.path_files(directory)
    for system in SYSTEM:
        judge.path(system, trust.ANY, "the system the python loads")
    for prefix in dict.fromkeys(prefixes):
        libdir = judge.path(posixpath.join(prefix, "lib"), trust.DIRECTORY, "the python's lib")
        for name, _ in judge.fs.listdir(libdir) if libdir else []:
            if name.startswith("libpython"):  # a shared build loads it before any module
                judge.path(posixpath.join(libdir, name), trust.ANY, "the python's library")
        for lib in _lib_dirs(judge, prefix, version):
            if judge.path(lib, trust.DIRECTORY, "the standard library") is None:
                continue
            judge.entries(lib, "the standard library")
            # imported at start-up, before the bootstrap judges the trees under sys.path
            judge.entries(posixpath.join(lib, "encodings"), "the standard library")
            for site in SITE_NAMES:
                judge.site_dir(posixpath.join(lib, site))
    return judge.verdict
