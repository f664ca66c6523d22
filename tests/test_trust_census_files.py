"""The census turned hostile file by file (issue 50, bullet 4): besides each directory
(test_trust_census.py), each file root loads and each entry on its way.

A gpu-clean over a real sshd is traced (tests/census.py) to list what root executed,
imported and read as configuration, per directory. Then, one directory at a time, a file
root loaded there is made another user's in two ways, each with the task run again:
- **file**: the file itself owned by uid 65534 (it could rewrite it);
- **link**: the file replaced by a symlink to a copy that uid 65534 owns.
Each case must end in a refusal that names the file, or leave it unused (not loaded in that
run): no case may load it. Where the machine allows, a file is made another user's only as
the census sshd's sessions see it (its directory overlaid in that sshd's mount namespace),
so those cases run beside the other tests; a file whose directory cannot be overlaid (one
with mount points below it) is changed for real and put back, in a case that runs alone.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from census import hostile_file_in_namespace, touches
from test_reliability import record
from test_trust_census import (  # noqa: F401  (census_host: a fixture)
    CENSUS,
    CONFINED,
    _confinable,
    _run_traced,
    census_host,
)

NOBODY = 65534
LOADED = ("exec", "import", "config")


def _one_file_per_directory(trace: Path, python: str) -> list[str]:
    """The first file root loaded in each directory (sorted), real regular files only."""
    chosen: dict[str, str] = {}
    for touch in touches(trace, python):
        if touch.kind not in LOADED or "/runs/" in touch.path:
            continue
        path = os.path.realpath(touch.path)
        if not os.path.isfile(path) or os.path.islink(touch.path):
            continue
        directory = os.path.dirname(path)
        if directory not in chosen or path < chosen[directory]:
            chosen[directory] = path
    return sorted(chosen.values())


class _Hostile:
    """One file made another user's, and put back whatever happens."""

    def __init__(self, path: str, kind: str, spare: Path) -> None:
        self.path, self.kind, self.spare = path, kind, spare
        self.st = os.lstat(path)

    def __enter__(self) -> _Hostile:
        if self.kind == "file":
            os.chown(self.path, NOBODY, -1)
        else:  # link: the name now leads to a copy the other user owns
            self.spare.mkdir(exist_ok=True)
            os.chown(self.spare, NOBODY, NOBODY)
            copy = self.spare / os.path.basename(self.path)
            shutil.copy2(self.path, copy)
            os.chown(copy, NOBODY, NOBODY)
            # atomic both ways: a program starting meanwhile (this machine's own) finds
            # the name at every instant
            os.link(self.path, f"{self.path}.census-kept")
            os.symlink(copy, f"{self.path}.census-link")
            os.rename(f"{self.path}.census-link", self.path)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kind == "file":
            os.chown(self.path, self.st.st_uid, self.st.st_gid)
            os.chmod(self.path, stat.S_IMODE(self.st.st_mode))
        else:
            os.rename(f"{self.path}.census-kept", self.path)


@contextmanager
def _turned_hostile(where: str, sshd, path: str, kind: str, scratch: Path) -> Iterator[None]:
    """The file made another user's: in the census sshd's namespace only ("confined"), or
    for every process, put back after ("shared", the case that runs alone)."""
    if where == "shared":
        with _Hostile(path, kind, scratch / "theirs"):
            yield
        return
    theirs = scratch / "theirs"
    theirs.mkdir(exist_ok=True)
    os.chown(theirs, NOBODY, NOBODY)
    copy = theirs / os.path.basename(path)
    shutil.copy2(path, copy)
    os.chown(copy, NOBODY, NOBODY)
    with hostile_file_in_namespace(sshd.proc.pid, path, kind, str(copy), scratch / "overlay"):
        yield


WHERE = [
    pytest.param("confined", marks=pytest.mark.skipif(
        not CONFINED, reason="no overlay in a mount namespace on this machine")),
    pytest.param("shared", marks=pytest.mark.exclusive),
]  # fmt: skip


@pytest.mark.slow(minutes=4)
@pytest.mark.parametrize("where", WHERE)
def test_each_file_root_loads_turned_hostile_is_refused(
    fleet,
    census_host,  # noqa: F811  (the fixture imported above)
    tmp_path,
    host_python,
    where,
):
    sshd, commands, names = census_host
    if where == "shared" and CONFINED:  # known before a trace: the census lists its folders
        listed = json.loads(CENSUS.read_text())["gpu-clean"]
        if all(_confinable(names.real(d)) for d in listed):
            pytest.skip("every folder of gpu-clean's census is overlaid in the census sshd's "
                        "namespace (the confined case)")  # fmt: skip
    task = commands["gpu-clean"]
    first = _run_traced(fleet, sshd, task, tmp_path / "trace")
    assert first.returncode == 0, first.stdout[-2000:]
    every = _one_file_per_directory(tmp_path / "trace", host_python)
    assert len(every) >= 10, every
    files = [f for f in every if _confinable(os.path.dirname(f)) == (where == "confined")]
    if not files:
        pytest.skip(f"every file's directory is overlaid in the census sshd's namespace "
                    f"({len(every)} files, the confined case)")  # fmt: skip
    outcomes: dict[str, dict[str, int]] = {"file": {}, "link": {}}
    loaded: list[str] = []
    theirs = tmp_path / "theirs"
    for kind in os.environ.get("CENSUS_KINDS", "file,link").split(","):
        for path in files:
            with _turned_hostile(where, sshd, path, kind, tmp_path):
                out = _run_traced(fleet, sshd, task, tmp_path / "trace")
            used = [t for t in touches(tmp_path / "trace", host_python)
                    if t.kind in LOADED and os.path.realpath(t.path) in
                    (path, str(theirs / os.path.basename(path)))]  # fmt: skip
            # the refusal names the file, or (a link) the other user's directory it leads
            # through, found from whichever name led there first (libbz2.so -> ...)
            fixes = [ln for ln in (out.stdout + out.stderr).splitlines() if "fix:" in ln]
            refused = out.returncode != 0 and any(path in ln or str(theirs) in ln for ln in fixes)
            outcome = "refused" if refused else ("unused" if not used else "LOADED")
            outcomes[kind][outcome] = outcomes[kind].get(outcome, 0) + 1
            if outcome == "LOADED" or (out.returncode != 0 and not refused):
                said = [ln for ln in (out.stdout + out.stderr).splitlines() if "FAILED:" in ln]
                loaded.append(f"{kind} {names.portable(path)}: exit {out.returncode}, "
                              f"{said[:1] or (out.stdout + out.stderr).splitlines()[-1:]}")  # fmt: skip
    record(f"census_files_{where}", {"files": len(files), **outcomes})
    assert not loaded, "\n".join(loaded)
