"""What a run may bring into the archive, fetched from its host: each file, and all of
them, under a stated bound; what is over stays on the host, named in one line.

A run's records run to tens of MB; a runner (as the run_as user) may leave anything, such
as two sparse 768 MiB files that once took `inv bench` to 1.6 GB and the archive to 1.5 GB
dense (issue 80). A connection hands a file over whole, so these bounds are also the
control plane's memory for a fetch: a file over them is never downloaded.
"""

from __future__ import annotations

from gpufleet.control.connect.base import Session
from gpufleet.errors import HostError
from gpufleet.host.agent.protocol import BenchWatchAnswer
from gpufleet.kinds import Kind

FETCH_FILE = 128 << 20
FETCH_RUN = 512 << 20
NOT_FETCHED = "not-fetched.txt"


def fetchable(answer: BenchWatchAnswer) -> tuple[list[str], str | None]:
    """The run's files within the bounds, in the host's order, and the one line that names
    those left on the host (None: all fit)."""
    names, over, total = [], [], 0
    for listed in answer["files"]:
        size = int(listed["size"])
        if size > FETCH_FILE or total + size > FETCH_RUN:
            over.append(f"{listed['name']} ({size} bytes)")
            continue
        names.append(listed["name"])
        total += size
    if not over:
        return names, None
    return names, (
        f"not fetched, over the archive's bounds ({FETCH_FILE >> 20} MiB a file, "
        f"{FETCH_RUN >> 20} MiB a run): {', '.join(over)}; left on the host in "
        f"{answer['run_dir']}"
    )


def download(session: Session, path: str) -> bytes:
    """A file of the run, refused where it grew past the bound since it was listed."""
    data = session.download(path)
    if len(data) > FETCH_FILE:
        raise HostError(f"{path} grew past {FETCH_FILE >> 20} MiB while it was fetched",
                        Kind.UNTRUSTED)  # fmt: skip
    return data
