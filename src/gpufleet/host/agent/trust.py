"""The one trust rule: which paths root may execute, import, read configuration from, or
write through, on a host other people share.

A path is trusted when the file and every directory on the way to it belong to root or
the connecting user and nobody else can write them, each symlink resolved one component
at a time (its own owner judged too), and the final entry judged as what it must be (a
directory gpufleet works in, or a file). A world-writable sticky directory (/tmp) may be
crossed as an ancestor, since others cannot rename an entry that is not theirs, but is
never a directory gpufleet works in. This is sshd's StrictModes, applied to every path
root touches; the same walk runs in the bootstrap (inlined there), in the agent, and on
the control plane over SFTP (`fs` is anything with `lstat` and `readlink`).

Standard library only, and nothing at import time but `os` and `stat`: the bootstrap
inlines this module's code and runs it before anything of the host's disk is trusted.
"""

from __future__ import annotations

import os
import stat

MAX_LINKS = 40  # like the kernel's ELOOP limit
FILE, DIRECTORY, WORKDIR, ANY = "file", "directory", "workdir", "any"


class Untrusted(Exception):
    """The path could let another local user change what root runs or writes: refuse."""


class LocalFS:
    """The rule's view of this machine's own filesystem."""

    lstat = staticmethod(os.lstat)
    readlink = staticmethod(os.readlink)


def describe(path: str, st: os.stat_result) -> str:
    return f"{path} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"


def others_can_write(st: os.stat_result) -> bool:
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _sticky(st: os.stat_result) -> bool:
    return bool(stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX)


def _refuse(what: str, path: str, shown: str, why: str, fix: str) -> Untrusted:
    return Untrusted(f"{what} {path}: {shown} {why}; fix: {fix}")


def _owner(what: str, path: str, candidate: str, st: os.stat_result, uid: int) -> None:
    if st.st_uid in (0, uid):
        return
    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a directory"
    if not stat.S_ISLNK(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        kind = "a file"
    raise _refuse(
        what, path, f"goes through {kind} another user owns,", describe(candidate, st),
        f"chown root {candidate} (or remove it), or choose another path",
    )  # fmt: skip


def _final(what: str, path: str, real: str, st: os.stat_result, *, uid: int, kind: str) -> None:
    """The entry the path ends on, judged as what it must be."""
    shown = describe(real, st)
    if kind in (DIRECTORY, WORKDIR) and not stat.S_ISDIR(st.st_mode):
        raise _refuse(what, path, shown, "is not a directory", f"remove {real}")
    if kind == FILE and stat.S_ISDIR(st.st_mode):
        raise _refuse(what, path, shown, "is a directory, not a file", "name a file")
    if kind == WORKDIR and real == "/":
        raise _refuse(what, path, shown, "is not a workdir", "name a directory of your own")
    if kind == WORKDIR and st.st_uid != uid:
        raise _refuse(
            what, path, shown, "is owned by another user",
            f"chown {uid} {real}, or choose a directory of your own",
        )  # fmt: skip
    if st.st_uid not in (0, uid):
        raise _refuse(
            what, path, shown, "is owned by another user", f"chown root {real} (or remove it)"
        )
    if others_can_write(st):
        if _sticky(st):
            raise _refuse(
                what, path, shown, "is writable by other users (a shared sticky directory)",
                f"name a directory of your own inside it, such as {real.rstrip('/')}/gpufleet",
            )  # fmt: skip
        raise _refuse(what, path, shown, "is writable by other users", f"chmod go-w {real}")


def _lstat_or_make(fs: object, candidate: str, make: bool) -> os.stat_result:
    """The entry as it is; a missing one is made 0700 when `make` (then judged like the
    rest), else FileNotFoundError."""
    try:
        return fs.lstat(candidate)
    except FileNotFoundError:
        if not make:
            raise
        try:
            os.mkdir(candidate, 0o700)
        except FileExistsError:
            pass  # someone made it between our look and our mkdir: judged below
        return fs.lstat(candidate)


def _ancestor(what: str, path: str, candidate: str, st: os.stat_result) -> None:
    """An ancestor on the walk: a directory that no other user can change (but a sticky
    one, whose entries only their owners may replace)."""
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(what, path, candidate, "is not a directory", "fix the path")
    if others_can_write(st) and not (_sticky(st) and st.st_mode & stat.S_IWOTH):
        raise _refuse(
            what, path, describe(candidate, st), "is writable by other users",
            f"chmod go-w {candidate}",
        )  # fmt: skip


def judge(
    path: str,
    uid: int,
    kind: str = FILE,
    what: str = "path",
    *,
    fs: object = None,
    create: bool = False,
) -> str:
    """The real path of `path` when the rule trusts it; Untrusted (one line) otherwise.

    `kind` says what the final entry must be: FILE, DIRECTORY, WORKDIR (a directory owned
    by `uid` itself, never a sticky shared one) or ANY. With `create`, missing directories
    are made 0700 on the way and judged like the rest; without it a missing component
    raises FileNotFoundError.
    """
    fs = fs or LocalFS
    if not path.startswith("/"):
        if fs is not LocalFS:
            raise ValueError(f"judge a remote path from the root: {path!r}")
        path = os.path.join(os.getcwd(), path)  # as the kernel resolves it here
    root = fs.lstat("/")
    if root.st_uid != 0 or others_can_write(root):
        raise _refuse(what, path, describe("/", root), "is unsafe", "chmod 755 / as root")
    pending = [p for p in path.split("/") if p]
    current, links = "/", 0
    while pending:
        name = pending.pop(0)
        if name in (".", ".."):
            current = current if name == "." else os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        st = _lstat_or_make(
            fs, candidate, create and (bool(pending) or kind in (DIRECTORY, WORKDIR))
        )
        _owner(what, path, candidate, st, uid)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise _refuse(what, path, candidate, "has too many symlinks", "shorten the chain")
            target = fs.readlink(candidate)
            current = "/" if target.startswith("/") else current
            pending = [p for p in target.split("/") if p] + pending
            continue
        if pending:  # an ancestor: a directory only we (or a sticky one) control
            _ancestor(what, path, candidate, st)
        current = candidate
    # the entry the walk ends on is judged here, however the walk got there (a link to
    # `..` ends on a directory it only crossed as an ancestor)
    st = fs.lstat(current)
    if kind != ANY or others_can_write(st) or st.st_uid not in (0, uid):
        _final(what, path, current, st, uid=uid, kind=kind if kind != ANY else "")
    return current


def judge_tree(
    root: str, uid: int, skip: tuple[str, ...] = (), what: str = "module directory"
) -> int:
    """Every directory and file under `root` (itself judged first) is root's or `uid`'s and
    nobody else can write it: a module imported later from any of them is what was judged.
    A symlink inside is judged along its whole way, and a linked directory is walked like
    the rest (once: links that loop are followed no further). Returns the directories
    judged.

    One lstat per entry: a venv with torch holds thousands of directories and tens of
    thousands of files, and this runs at every agent start (benchmarks/trust_cost.py).
    `skip` names subtrees judged on their own (site-packages under the standard library,
    when it is its own sys.path entry or not used at all).
    """
    judge(root, uid, DIRECTORY, what)
    stack, count, seen = [root], 1, {os.path.realpath(root)}
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.path in skip:
                continue
            if entry.is_symlink():
                try:
                    real = judge(entry.path, uid, ANY, what)
                except FileNotFoundError:
                    continue  # a dangling link imports nothing
                if os.path.isdir(real) and real not in seen:
                    seen.add(real)  # a linked package: its tree is imported too
                    stack.append(real)
                    count += 1
                continue
            st = entry.stat(follow_symlinks=False)
            if st.st_uid not in (0, uid) or others_can_write(st):
                fix = "-R " if stat.S_ISDIR(st.st_mode) else ""
                raise _refuse(
                    what, root, describe(entry.path, st), "can be changed by another user",
                    f"chown {fix}root {entry.path} && chmod {fix}go-w {entry.path}",
                )  # fmt: skip
            if stat.S_ISDIR(st.st_mode):
                count += 1
                stack.append(entry.path)
    return count


def judge_entries(directory: str, uid: int, what: str) -> None:
    """The directory and each entry directly in it (files, links and their targets, not
    the subdirectories' contents): for the loader's library directories, where one file
    another user owns would be a library root loads (one lstat per entry)."""
    judge(directory, uid, DIRECTORY, what)
    for entry in os.scandir(directory):
        if entry.is_symlink():
            try:
                judge(entry.path, uid, ANY, what)
            except FileNotFoundError:
                continue
            continue
        st = entry.stat(follow_symlinks=False)
        if st.st_uid not in (0, uid) or others_can_write(st):
            raise _refuse(what, directory, describe(entry.path, st),
                          "can be changed by another user",
                          f"chown root {entry.path} && chmod go-w {entry.path}")  # fmt: skip


def judge_missing(path: str, uid: int, what: str = "path", fs: object = None) -> None:
    """A path that does not exist (yet) is trusted only where no other user could create
    it: its nearest existing directory must pass the rule as a directory gpufleet would
    work in (so never a shared sticky one such as /tmp). Untrusted otherwise: the path
    could appear between this judgement and its use (a `python:` created that way won 5
    times in 36 tries)."""
    parent = os.path.dirname(os.path.normpath(path)) or "/"
    while True:
        try:
            judge(parent, uid, DIRECTORY, what, fs=fs)
            return
        except FileNotFoundError:
            if parent == "/":
                return
            parent = os.path.dirname(parent)
        except Untrusted as exc:
            raise Untrusted(f"{what} {path} does not exist, and another user could create "
                            f"it: {str(exc).split(': ', 1)[-1]}") from None  # fmt: skip


def trusted(
    path: str, uid: int, kind: str = FILE, fs: object = None, what: str = "path"
) -> str | None:
    """None when `path` is trusted (or missing where nobody else could create it); else
    the one-line reason."""
    try:
        judge(path, uid, kind, what, fs=fs)
    except FileNotFoundError:
        try:
            judge_missing(path, uid, what, fs=fs)
        except Untrusted as exc:
            return str(exc)
    except Untrusted as exc:
        return str(exc)
    except OSError as exc:  # a path this user may not even look at (root's, to a runner)
        return f"{what} {path} cannot be judged: {exc.strerror or exc}"
    return None


def site_directories() -> list[str]:
    """The directories `site` would add to this python's sys.path, computed without running
    it (the agent runs under `-S`, issue 50): the site-packages of its prefix, of the base
    installation where pyvenv.cfg says include-system-site-packages, and the existing
    directories their `.pth` files name. Their `import` lines are never executed: root's
    children that run the host python normally (the server, its probes, the bench client)
    import from here, so these trees are judged before any of them starts."""
    import site
    import sys

    # a venv is found as site.venv() finds it (its prefix is set by `site`, so not under -S):
    # pyvenv.cfg beside the executable or one level up
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    venv = os.path.dirname(exe_dir)
    configs = [os.path.join(d, "pyvenv.cfg") for d in (exe_dir, venv)]
    config = next((c for c in configs if os.path.isfile(c)), None)
    prefixes = [sys.base_prefix]
    if config is not None:
        prefixes = [venv]
        with open(config) as fh:
            for line in fh:
                key, _, value = line.partition("=")
                if key.strip() == "include-system-site-packages" and value.strip() == "true":
                    prefixes.append(sys.base_prefix)
    found = [d for d in site.getsitepackages(prefixes) if os.path.isdir(d)]
    for directory in list(found):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".pth"):
                found += _pth_directories(directory, os.path.join(directory, name))
    return list(dict.fromkeys(found))


def _pth_directories(site_dir: str, pth: str) -> list[str]:
    """The directories a .pth file adds (its lines that are not comments or imports)."""
    out = []
    try:
        with open(pth, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.strip() or line.startswith(("#", "import ", "import\t")):
            continue
        path = os.path.abspath(os.path.join(site_dir, line.rstrip()))
        if os.path.isdir(path):
            out.append(path)
    return out
