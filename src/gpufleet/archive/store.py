"""The run archive: logs/<host>/<run-id>/, written atomically, checksummed, listable.

A run is written into a hidden temporary directory beside its final place and renamed into
place only when every file and the manifest (with the sha256 of every file) are on disk, so
a crash or a full disk never leaves a partial run looking complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpufleet import per_request
from gpufleet.archive.incoming import Incoming
from gpufleet.archive.kept import Manifest, Superseded
from gpufleet.archive.layout import Archive
from gpufleet.errors import UserError
from gpufleet.records import Level, ResultRow
from gpufleet.terminal import CONTROL
from gpufleet.wire import WireError

# Archives hold server argv, hosts and timings: private by default (files 0600, directories
# 0700); GPUFLEET_ARCHIVE_MODE=group shares them with the group (0640 / 0750).
_GROUP = os.environ.get("GPUFLEET_ARCHIVE_MODE") == "group"
FILE_MODE = 0o640 if _GROUP else 0o600
DIR_MODE = 0o750 if _GROUP else 0o700
MANIFEST = "manifest.json"
STALE_S = 600  # a staging folder unwritten this long, its pid gone, is a killed write's
_NAME_MAX = 255  # bytes: the longest name a filesystem keeps


def name_refused(name: str) -> str | None:
    """Why the archive keeps no run file named `name` (None: it may). One rule for every
    file a run brings: a host names them, so a name may be anything its filesystem takes."""
    if name == MANIFEST:
        return "the archive's own"
    plain = name and "/" not in name and not name.startswith(".")
    if not plain or len(name.encode(errors="surrogateescape")) > _NAME_MAX:
        return "not a plain file name"
    if CONTROL.search(name) or "\n" in name or "\t" in name:
        return "a control character in it"
    return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_run(
    archive: Archive, host: str, run_id: str, files: dict[str, bytes], manifest: Manifest
) -> Path:
    """Archive a run whose files are all in hand (RunStaging for one fetched as it comes)."""
    with RunStaging(archive, host, run_id) as run:
        for name, data in sorted(files.items()):
            run.add(name, data)
        return run.commit(manifest)


class RunStaging:
    """A run being archived: its hidden folder beside its final place, which files are put
    in whole (`add`) or as they arrive (`receive`), and which `commit` renames into place
    with the manifest (the sha256 of every file). Leaving the `with` any other way removes
    it: nothing half-written is ever seen as a run."""

    def __init__(self, archive: Archive, host: str, run_id: str) -> None:
        root = archive.root
        self.final = archive.run_dir(host, run_id)
        self.where = archive.host_dir(host)
        named = {host, run_id} & {"", ".", ".."} or "/" in host + run_id
        if not _inside(root, self.final) or named:
            raise UserError(f"refusing to archive outside {root}/: host {host!r}, run {run_id!r}")
        if self.final.exists():
            raise UserError(f"{self.final} already exists: a run is archived once")
        self.host, self.run_id = host, run_id
        self.dir = archive.partial_run_dir(host, run_id)
        self.sums: dict[str, str] = {}
        with self._said():
            make_dirs(self.where)
            self.cleared = clear_stale(self.where)
            self.dir.mkdir(mode=DIR_MODE)
            os.chmod(self.dir, DIR_MODE)

    def __enter__(self) -> RunStaging:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)  # committed: renamed away already

    @contextlib.contextmanager
    def _said(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise UserError(f"cannot write the archive under {self.where} "
                            f"({exc.strerror or exc}); nothing was archived for this run"
                            ) from None  # fmt: skip

    def _checked(self, name: str) -> Path:
        if name_refused(name):
            raise UserError(f"refusing to archive a file named {name!r}")
        return self.dir / name

    def add(self, name: str, data: bytes) -> None:
        """A file in hand (small: a summary, a record rewritten here)."""
        path = self._checked(name)
        with self._said():
            path.unlink(missing_ok=True)
            _write_private(path, data)
        self.sums[name] = sha256(data)

    def receive(self, name: str, limit: int, fill: Callable[[Incoming], object]) -> int:
        """A file written as it arrives: `fill` writes its pieces to the Incoming it is
        given, under a temporary name renamed to `name` once all came. Over `limit` bytes
        (OverLimit), or on any error, nothing of it stays. The bytes received."""
        path, part = self._checked(name), self.dir / f".{name}.part"
        try:
            with self._said():
                fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
                with os.fdopen(fd, "wb") as fh:
                    os.fchmod(fh.fileno(), FILE_MODE)
                    incoming = Incoming(fh, limit)
                    fill(incoming)
                    digest = incoming.finish()
                os.replace(part, path)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        self.sums[name] = digest
        return incoming.size

    def drop(self, name: str) -> None:
        """A file put in that the run does not keep."""
        (self.dir / name).unlink(missing_ok=True)
        self.sums.pop(name, None)

    def commit(self, manifest: Manifest) -> Path:
        """The manifest written, the run renamed into its place: archived."""
        manifest.files = dict(sorted(self.sums.items()))
        with self._said():
            _write_private(self.dir / MANIFEST, manifest.to_json().encode())
            os.rename(self.dir, self.final)
        return self.final


def clear_stale(host_dir: Path) -> list[str]:
    """Remove the staging folders (`.tmp-RUN-PID`) of writers no longer running: one
    killed mid-run (SIGKILL, a power cut) could not remove its own, up to a run's bound of
    disk never listed and never reclaimed. A folder whose pid runs (maybe a writer of this
    archive right now), or written to in the last STALE_S (a writer on another machine
    sharing the archive: its pid means nothing here), is left. The names removed."""
    cleared = []
    for entry in os.scandir(host_dir):
        pid = entry.name.rpartition("-")[2]
        if not entry.name.startswith(".tmp-") or not pid.isdigit() or _running(int(pid)):
            continue
        with contextlib.suppress(OSError):  # another user's, say: not this write's to clear
            if entry.is_dir(follow_symlinks=False) and _idle_for(entry.path) > STALE_S:
                shutil.rmtree(entry.path)
                cleared.append(entry.name)
    return cleared


def _idle_for(folder: str) -> float:
    """Seconds since the folder or a file in it was last written."""
    with os.scandir(folder) as entries:
        times = [e.stat(follow_symlinks=False).st_mtime for e in entries]
    return time.time() - max([os.lstat(folder).st_mtime, *times])


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: running
        return True
    return True


def make_dirs(path: Path) -> None:
    """Create `path` and missing parents with the archive's directory mode."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(directory, DIR_MODE)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), FILE_MODE)  # exactly: a umask may be laxer or stricter
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_private_file(path: Path, data: bytes) -> None:
    """Write a file beside the runs (a report, a sweep's state) atomically, archive mode."""
    make_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    _write_private(tmp, data)
    os.replace(tmp, path)


def _inside(root: Path, path: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def parse_results(text: str, where: str) -> list[ResultRow]:
    """The rows of a results.jsonl, checked; one line (UserError) naming the row if not."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(ResultRow.from_wire(json.loads(line), f"{where}:{number}"))
        except ValueError as exc:
            raise UserError(f"{where}:{number}: not JSON ({exc})") from None
        except WireError as exc:
            raise UserError(f"not a gpufleet results row: {exc}") from None
    return rows


def read_results(run_dir: Path) -> list[ResultRow]:
    """An archived run's level rows (results.jsonl), checked."""
    path = run_dir / "results.jsonl"
    return parse_results(path.read_text(), str(path))


def read_requests(run_dir: Path, row: ResultRow) -> list[per_request.RequestTimes] | None:
    """The finished requests of one level's row (its `requests-c64.jsonl`), timed as the
    row's figures counted them (an open-loop level's from when each was due); None where
    the run kept none or a line is not a request's."""
    tag = Level(concurrency=row.max_concurrency, num_prompts=0, repeat=row.repeat).tag
    try:
        lines = (run_dir / f"requests-{tag}.jsonl").read_text().splitlines()
        fields = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError):
        return None
    if not all(isinstance(f, dict) for f in fields):
        return None
    from_due = row.get(per_request.OPEN_LOOP_KEY) is not None
    return [per_request.RequestTimes.of(f, from_due) for f in fields if f.get("ok") is True]


def read_level_requests(
    found: list[tuple[Path, ResultRow]],
) -> list[list[per_request.RequestTimes]] | None:
    """Each repeat's requests of one level (run dir, row), in order; None unless every
    repeat kept them (a percentile's interval needs all of them)."""
    requests = [r for r in (read_requests(d, row) for d, row in found) if r is not None]
    return requests if len(requests) == len(found) else None


def read_manifest(run_dir: Path) -> Manifest:
    """A run's manifest, checked; one line (UserError) for one written by a newer gpufleet,
    whose fields this version cannot vouch for, or one that is not a manifest."""
    return Manifest.load(run_dir / MANIFEST)


@dataclass
class ListedRun:
    """One run of the archive as `inv runs` lists it: its manifest, or why it has none."""

    path: Path
    host: str
    run_id: str
    manifest: Manifest | None
    problem: str | None = None  # the manifest is unreadable or not one

    @property
    def status(self) -> str:
        """`done`, `failed`, `failed (superseded)`, or what is wrong with the manifest."""
        if self.manifest is None:
            missing = self.problem == f"no {MANIFEST}"
            return str(self.problem) if missing else f"unreadable manifest: {self.problem}"
        status = str(self.manifest.status)
        return f"{status} (superseded)" if self.manifest.superseded else status

    @property
    def started_at(self) -> str:
        return (self.manifest.started_at if self.manifest else None) or ""


def list_runs(archive: Archive) -> list[ListedRun]:
    """Every run folder of the archive, a folder without its manifest too (its problem
    says so: `inv runs --verify` fails it by name)."""
    runs = []
    for host_name, run_dir in archive.run_dirs():
        path = run_dir / MANIFEST
        if not path.exists():
            runs.append(ListedRun(run_dir, host_name, run_dir.name, None, f"no {MANIFEST}"))
            continue
        try:
            manifest, problem = read_manifest(run_dir), None
        except UserError as exc:
            manifest, problem = None, str(exc).removeprefix(f"{path}: ")
        host = manifest.host if manifest else run_dir.parent.name
        runs.append(ListedRun(run_dir, host, run_dir.name, manifest, problem))
    return sorted(runs, key=lambda r: r.started_at)


# What a finished run must hold (format schema 1): a manifest that lacks one of them was
# archived incomplete, whatever its checksums say.
REQUIRED_FILES = ("plan.json", "status.json", "results.jsonl", "summary.csv")
REQUIRED_FROM_A_HOST = ("sysinfo.json", "nvml_before.json", "nvml_after.json")


def required_files(manifest: Manifest) -> tuple[str, ...]:
    if manifest.status != "done":
        return ()
    from_host = bool(manifest.host_facts.hostname)
    return REQUIRED_FILES + (REQUIRED_FROM_A_HOST if from_host else ())


def verify(run_dir: Path) -> list[str]:
    """Problems found: missing files, changed files, unlisted files, files the run format
    requires that the manifest lacks. Empty list = intact."""
    link = link_problem(run_dir)
    if link:
        return [link]
    if not (run_dir / MANIFEST).exists():
        return [f"no {MANIFEST}: restore it, or move the folder out of the archive"]
    try:
        manifest = read_manifest(run_dir)
    except (OSError, ValueError, UserError) as exc:
        return [f"manifest unreadable: {exc}"]
    listed = manifest.files
    problems = [
        f"{name}: required by the run format, not in the manifest"
        for name in required_files(manifest)
        if name not in listed
    ]
    for name, digest in listed.items():
        path = run_dir / name
        if not path.exists() and not path.is_symlink():
            problems.append(f"{name}: missing")
        elif path.is_symlink() or not path.is_file():
            problems.append(f"{name}: not a regular file (a link or a device): not read")
        elif file_sha256(path) != digest:
            problems.append(f"{name}: checksum mismatch")
    for path in run_dir.iterdir():
        if path.name not in listed and path.name != MANIFEST:
            problems.append(f"{path.name}: not in the manifest")
    return problems


def link_problem(run_dir: Path) -> str | None:
    """Why a folder listed as a run is not one of this archive's: it, or its host's folder,
    is a symbolic link, which would serve another folder's files (another host's run, any
    file) under this host's name. None for a real folder."""
    for path in (run_dir, run_dir.parent):
        if path.is_symlink():
            target = os.readlink(path)[:200]
            return (f"{path.name}: a symbolic link (to {target}), not a folder of this archive: "
                    "not read; move the run in instead")  # fmt: skip
    return None


def file_sha256(path: Path) -> str:
    """A file's sha256, read in 1 MiB pieces (a run's request logs can be large)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def mark_superseded(run_dir: Path, note: str) -> None:
    """Keep a failed run but mark it replaced by a later attempt (listed, never compared).

    Only the manifest changes (rewritten atomically); the checksummed files stay as they were.
    """
    manifest = read_manifest(run_dir)
    manifest.superseded = Superseded(at=datetime.now(UTC).isoformat(), note=note)
    tmp = run_dir / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(manifest.to_json())
    os.replace(tmp, run_dir / MANIFEST)
