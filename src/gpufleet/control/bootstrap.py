"""The agent's bootstrap: the only code that runs on a host before the agent's hash is known.

Its source travels as `python -I -c SOURCE WORKDIR AGENT SHA256 VERB...`. `-I` (isolated
mode) keeps the workdir, PYTHONPATH, PYTHONSTARTUP and the user site out of sys.path, so
nothing a local user drops next to the agent (a `hashlib.py`) is imported as root. Before it
runs anything it checks the workdir path the way sshd's StrictModes checks ~/.ssh: every
directory on the way belongs to root or the connecting user and nobody else can write it (a
world-writable sticky directory such as /tmp is crossed only into an entry owned by root or
the user, which others cannot rename); a symlink on the way is followed only if it too is
owned by root or the user (then its target is checked the same way); the workdir itself is
the user's and writable by the user alone. Missing directories are created 0700; nothing
that already exists is chmod'ed. Standard library only, imported from the stdlib alone.

Exit codes: 90 the workdir cannot be created, 91 refused (unsafe path or agent file). The
agent (`serve`) says the workdir's real path in its first line.
"""

from __future__ import annotations

import sys

sys.path[:] = [p for p in sys.path if p not in ("", ".")]  # belt and braces beside -I
import os  # noqa: E402
import stat  # noqa: E402

MISSING = "gpufleet-agent-missing"
WARNING = "gpufleet-warning:"
MAX_LINKS = 40  # like the kernel's ELOOP limit


class Unsafe(Exception):
    """The path could let another local user change what runs: refuse, touch nothing."""


def _owner_ok(st: os.stat_result, uid: int) -> bool:
    return st.st_uid in (0, uid)


def _others_can_write(st: os.stat_result) -> bool:
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _describe(path: str, st: os.stat_result) -> str:
    return f"{path} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"


def safe_workdir(path: str, uid: int, create: bool = True) -> str:
    """The real path of a workdir that only root and `uid` control; Unsafe otherwise.

    Creates missing directories (0700) when `create`; FileNotFoundError when not.
    """
    root = os.lstat("/")
    if root.st_uid != 0 or _others_can_write(root):
        raise Unsafe(f"/ itself is unsafe: {_describe('/', root)}")
    pending = [p for p in os.path.abspath(path).split("/") if p]
    current = "/"
    links = 0
    while pending:
        name = pending.pop(0)
        if name in (".", ".."):
            current = current if name == "." else os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(candidate, 0o700)
            except FileExistsError:
                pass  # someone made it between our look and our mkdir: judged below
            st = os.lstat(candidate)
        last = not pending
        if last and not stat.S_ISLNK(st.st_mode) and st.st_uid != uid:
            raise Unsafe(f"workdir {candidate} is owned by another user")
        if not _owner_ok(st, uid):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "a directory"
            raise Unsafe(
                f"workdir path {path} goes through {what} another user owns: "
                f"{_describe(candidate, st)}"
            )
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise Unsafe(f"workdir path {path} has too many symlinks")
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending = [p for p in target.split("/") if p] + pending
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise Unsafe(f"workdir path component {candidate} is not a directory")
        if _others_can_write(st):
            # A sticky world-writable directory (/tmp) may be crossed: its entries are
            # checked in turn, and others cannot rename one that is not theirs.
            sticky = st.st_mode & stat.S_ISVTX and st.st_mode & stat.S_IWOTH
            if last or not sticky:
                raise Unsafe(
                    f"workdir path {path}: {_describe(candidate, st)} is writable by other users"
                )
        current = candidate
    if current == "/":
        raise Unsafe("workdir / is not a workdir")
    return current


def writable_by_others(path: str) -> str | None:
    """A file or directory on `path`'s way that another user could change, if any."""
    real = os.path.realpath(path)
    while True:
        try:
            st = os.stat(real)
        except OSError:
            return None
        sticky = st.st_mode & stat.S_ISVTX and stat.S_ISDIR(st.st_mode)
        if st.st_uid not in (0, os.geteuid()) or (_others_can_write(st) and not sticky):
            return _describe(real, st)
        if real == "/":
            return None
        real = os.path.dirname(real)


def python_warning() -> str | None:
    """Whether the Python that runs the agent (or its venv) can be changed by other users."""
    for what, path in (("the host python", sys.executable), ("its environment", sys.prefix)):
        found = writable_by_others(path)
        if found:
            return (
                f"{WARNING} {what} ({path}) can be changed by other users: {found}; "
                "code they put there runs as this user"
            )
    return None


def main(argv: list[str]) -> int:
    workdir, agent, digest = argv[1:4]
    try:
        real = safe_workdir(os.path.expanduser(workdir), os.geteuid())
    except Unsafe as exc:
        sys.stderr.write(f"{exc}\n")
        return 91
    except OSError as exc:
        sys.stderr.write(f"cannot create workdir {workdir}: {exc.strerror} ({exc.filename})\n")
        return 90
    os.chdir(real)
    warning = python_warning()
    if warning:
        sys.stderr.write(warning + "\n")
    try:
        fd = os.open(agent, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        sys.stdout.write(f"{MISSING} {real}\n")
        return 0
    except OSError:
        sys.stderr.write(f"{real}/{agent} is not a file of this user\n")
        return 91
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            sys.stderr.write(f"{real}/{agent} is not a file of this user\n")
            return 91
        data = fh.read()
    import hashlib

    if hashlib.sha256(data).hexdigest() != digest:
        sys.stderr.write(
            f"{agent} does not match the agent gpufleet built (sha256 {digest[:12]}...): "
            "remove it and gpufleet uploads its own\n"
        )
        return 91
    import runpy

    sys.argv = [os.path.join(real, agent), *argv[4:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
