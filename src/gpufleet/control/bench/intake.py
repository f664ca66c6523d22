"""What a run may bring into the archive, fetched from its host: each file, and all of
them, under a stated bound, streamed to disk; what is over stays on the host, named in one
line.

A run's records run to tens of MB; a runner (as the run_as user) may leave anything, such
as two sparse 768 MiB files that once took `inv bench` to 1.6 GB and the archive to 1.5 GB
dense (issue 80). The rules:

- a file listed over 128 MiB, or past 512 MiB for the run with the files before it, is
  not fetched (`not-fetched.txt` and the warning name it, its size and where it stays);
- a file is streamed into the archive's staging folder a piece (1 MiB) at a time
  (Session.download_to, every connection's own way) and counted as it comes against the
  size it was listed with: one that grew while fetched is cut off there and refused, named
  in the same file, and nothing of it stays in the archive. The control side counts the
  bytes it received, not what the host said;
- holes are kept, not refused: every aligned 64 KiB of zeros received is skipped on disk
  (archive/incoming.py), so a sparse file takes the archive the disk its data takes. Its
  zeros still cross the connection and count against the bounds above. Refusing by the
  host's allocated blocks was not chosen: a compressed filesystem (ZFS, btrfs) reports
  fewer blocks than a dense log holds, and the count could change after it was listed;
- a file is named by whoever wrote it: a name the archive keeps no file under (its own
  manifest.json, a control character or newline, not a plain name: store.name_refused)
  and the files past FETCH_COUNT stay on the host, named in one line each (escaped, ten
  names at most and how many more), and the rest of the run is archived;
- the records the manifest is built from (plan, status, results...) are read back whole,
  each to 16 MiB: a larger one is refused in one line, nothing archived.

So the control plane's memory for a fetch is a piece's, whatever the run holds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpufleet.archive import store
from gpufleet.archive.incoming import OverLimit
from gpufleet.archive.manifest import RECORDS
from gpufleet.archive.store import RunStaging
from gpufleet.control.connect.base import Sink
from gpufleet.control.connect.local import file_pieces
from gpufleet.errors import UserError
from gpufleet.host.agent.protocol import BenchWatchAnswer, RunFile, RunStatusFile
from gpufleet.terminal import shown

FETCH_FILE = 128 << 20
FETCH_RUN = 512 << 20
FETCH_COUNT = 256  # files a run: a run writes about fifteen, two more a level
# taken first: the records the manifest is built from and the run format requires, the
# logs a failure is told from
FIRST = frozenset((*RECORDS, *store.REQUIRED_FILES, *store.REQUIRED_FROM_A_HOST, "server.log",
                   "runner.log"))  # fmt: skip
RECORD_READ = 16 << 20  # a record the manifest is built from, read back whole
NOT_FETCHED = "not-fetched.txt"
# written into a run here, never taken from a host (a runner's own would forge them)
WRITTEN_HERE = frozenset((NOT_FETCHED, "summary.csv", "summary.md"))
Reader = Callable[[str, Sink, int], int]  # (path, dest, limit) -> bytes received: download_to


def fetchable(answer: BenchWatchAnswer) -> tuple[list[RunFile], list[str]]:
    """The run's files the archive takes, its records and logs first, then in the host's
    order, and the lines (none: all
    are taken) naming those left on the host: a name the archive keeps no file under
    (store.name_refused), past the run's FETCH_COUNT files, over the bounds."""
    kept: list[RunFile] = []
    named, many, over, total = [], [], [], 0
    first = lambda f: f["name"] not in FIRST  # noqa: E731
    for listed in sorted(answer["files"], key=first):  # stable: the host's order after
        name, size = listed["name"], int(listed["size"])
        if store.name_refused(name) or name in WRITTEN_HERE:
            named.append(_shown(name))
        elif len(kept) >= FETCH_COUNT:
            many.append(_shown(name))
        elif size > FETCH_FILE or total + size > FETCH_RUN:
            over.append(f"{_shown(name)} ({size} bytes)")
        else:
            kept.append(listed)
            total += size
    where = f"left on the host in {_shown(answer['run_dir'])}"
    why = {
        "named as the archive keeps no file (its own manifest.json or a file written "
        "here, a control character, a name that is no plain file name)": named,
        f"past the archive's {FETCH_COUNT} files a run": many,
        f"over the archive's bounds ({FETCH_FILE >> 20} MiB a file, "
        f"{FETCH_RUN >> 20} MiB a run)": over,
    }
    return kept, [f"not fetched, {w}: {_listed(n)}; {where}" for w, n in why.items() if n]


def _shown(name: str) -> str:
    """A name a host gave, as a line may carry it: no control character, \\n included."""
    return shown(name).replace("\n", "\\n").replace("\t", "\\t")


def _listed(names: list[str], most: int = 10) -> str:
    """The first `most` names, and how many more: a line of bounded length."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def receive(staging: RunStaging, answer: BenchWatchAnswer, read: Reader) -> list[str]:
    """Stream every file of the run within the bounds into `staging`, through `read`; the
    lines (none: all came) naming what stays on the host, over the bounds as listed or
    grown while fetched."""
    files, said = fetchable(answer)
    grew, budget = [], FETCH_RUN
    for listed in files:
        name, size = listed["name"], int(listed["size"])
        limit = min(size, FETCH_FILE, budget)
        path = f"{answer['run_dir']}/{name}"
        try:
            budget -= staging.receive(name, limit, lambda dest, p=path, n=limit: read(p, dest, n))
        except OverLimit:
            grew.append(f"{_shown(name)} (listed with {size} bytes, more came)")
    if grew:
        where = f"left on the host in {_shown(answer['run_dir'])}"
        said.append(f"not fetched, grew while it was fetched (cut off, nothing kept): "
                    f"{_listed(grew)}; {where}")  # fmt: skip
    if said:
        staging.add(NOT_FETCHED, "".join(f"{line}\n" for line in said).encode())
    return said


def cleared(staging: RunStaging) -> list[str]:
    """The line (none: nothing to say) naming what this write removed of the writes killed
    before it (store.clear_stale)."""
    if not staging.cleared:
        return []
    return [f"removed {len(staging.cleared)} unfinished run folder(s) a killed fetch left in "
            f"{staging.where}: {_listed([_shown(n) for n in staging.cleared])}"]  # fmt: skip


def local_run(run_dir: Path, outcome: RunStatusFile) -> BenchWatchAnswer:
    """A `--client local` run's folder as a host's watch lists a finished run."""
    files: list[RunFile] = [
        {"name": p.name, "size": p.stat().st_size}
        for p in sorted(run_dir.iterdir())
        if p.is_file() and not p.name.startswith(".")
    ]
    return {"status": outcome["status"], "reason": outcome.get("reason"), "files": files,
            "run_dir": str(run_dir), "tail": None, "offset": 0}  # fmt: skip


def read_local(path: str, dest: Sink, limit: int) -> int:
    """A file of a `--client local` run, streamed as a connection's download_to does."""
    received = 0
    for piece in file_pieces(path, limit + 1):
        dest.write(piece)
        received += len(piece)
    return received


def record(staging: RunStaging, name: str) -> bytes | None:
    """A record of the run as received (plan.json, results.jsonl...), read back whole to
    its bound; None where the run has none."""
    try:
        with open(staging.dir / name, "rb") as fh:
            data = fh.read(RECORD_READ + 1)
    except FileNotFoundError:
        return None
    if len(data) > RECORD_READ:
        raise UserError(f"{name} of the run is over {RECORD_READ >> 20} MiB, more than a "
                        "run's records hold: not read, nothing archived")  # fmt: skip
    return data


def log_tail(staging: RunStaging, name: str, lines: int = 40) -> list[str]:
    """The last lines of a log of the run as received (its last 64 KiB read, no more)."""
    try:
        with open(staging.dir / name, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - (64 << 10)))
            data = fh.read(64 << 10)
    except FileNotFoundError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]
