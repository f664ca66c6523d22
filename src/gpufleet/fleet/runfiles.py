"""What the fleet index reads of one run, and why it refuses one: a run's manifest and
results.jsonl, each a regular file of bounded size in a real folder of the archive (not a
symbolic link), results.jsonl matching the manifest's checksum, every figure one a
measurement can give. A refusal is a `Broken` with its reason in one line, which every view
prints as the run left out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from gpufleet.archive import store
from gpufleet.archive.kept import Manifest
from gpufleet.errors import UserError
from gpufleet.report import catalogue

RESULTS = "results.jsonl"
READ = (store.MANIFEST, RESULTS)  # the files the index reads of each run, tracked


class Row(TypedDict, total=False):
    """One results.jsonl line as its runner wrote it (records.ResultRow's wire form, a shape
    the host's runner owns): kept as JSON, not parsed into a ResultRow, because a full
    parse costs 0.28 ms a row and `inv history` reads 20,000. The keys read by name are
    declared; the figures are read by their catalogue key (report/catalogue.py)."""

    max_concurrency: int
    repeat: int
    level_status: str | None
    completed: int
    failed: int
    output_throughput: float


@dataclass
class Broken:
    """A run the index cannot serve: why, in one line, and its profile where known."""

    reason: str
    profile: str | None = None


def read_checked(run_dir: Path, full: bool) -> tuple[Manifest, list[Row]] | Broken | None:
    """The run's manifest and rows, or why not: no manifest, a file that does not parse,
    results.jsonl not the file the manifest's checksum names (every file's with `full`);
    None for a run removed meanwhile (gone, not broken)."""
    try:
        link = store.link_problem(run_dir)
        if link:
            raise UserError(link)
        if not (run_dir / store.MANIFEST).exists():
            raise UserError(f"a run folder without its {store.MANIFEST}")
        for name in READ:
            _check_file(run_dir / name)
        manifest, rows = _read_run(run_dir)
    except (UserError, OSError, ValueError) as exc:
        if not run_dir.exists():
            return None
        return Broken(one_line(str(exc).replace(f"{run_dir}/", "")))
    sums = manifest.files
    if full:
        problems = store.verify(run_dir)
    elif RESULTS in sums:
        try:
            data = (run_dir / RESULTS).read_bytes()
            same = store.sha256(data) == sums[RESULTS]
            problems = [] if same else [f"{RESULTS}: checksum mismatch"]
        except FileNotFoundError:
            problems = [f"{RESULTS}: missing"]
    else:
        problems = []
    if problems:
        return Broken(f"does not verify: {'; '.join(problems[:3])}", manifest.profile)
    return manifest, rows


READ_MOST = 64 << 20  # bytes of a manifest or results.jsonl: a run's are kilobytes


def _check_file(path: Path) -> None:
    """One line (UserError) for a file the index must not read: a link or a device (it
    reads another file, or never ends), or one larger than READ_MOST."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise UserError(f"{path.name}: not a regular file (a link or a device): not read")
    if path.exists() and (size := path.stat().st_size) > READ_MOST:
        raise UserError(f"{path.name}: {size} bytes, more than a run's {READ_MOST} at most")


def one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def _read_run(run_dir: Path) -> tuple[Manifest, list[Row]]:
    """A run's manifest and level rows; one line (UserError) naming the file if unreadable
    or holding a figure no measurement gives (figure_problem)."""
    manifest = store.read_manifest(run_dir)
    rows = []
    if (run_dir / RESULTS).exists():
        rows = [r.to_wire() for r in store.read_results(run_dir)]
    for n, row in enumerate(rows, 1):
        problem = figure_problem(row)
        if problem:
            raise UserError(f"{RESULTS}:{n}: {problem}")
    return manifest, rows


FIGURE_MOST = 1e12  # beyond any figure a level gives (tok/s, ms, requests, joules)
_FIGURES = frozenset(catalogue.BY_KEY) | {catalogue.COMPLETED, catalogue.FAILED}


def figure_problem(row: Row) -> str | None:
    """Why a row's figure cannot be a measurement (NaN, infinite, negative, beyond
    FIGURE_MOST), else None: such a figure would move a median or hide a host silently."""
    for key in sorted(_FIGURES & row.keys()):
        value = row[key]  # type: ignore[literal-required]
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not (0 <= value <= FIGURE_MOST):  # NaN fails both comparisons
            return f"{key} is {value!r} (expected a finite figure from 0 to {FIGURE_MOST:.0e})"
    return None
