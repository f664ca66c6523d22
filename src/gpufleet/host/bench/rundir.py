"""The run directory a bench writes on the host: every file through the secrets scrubber,
progress events, the checked result rows, and the server's log with the run's slice
marked (and the depth switches an adaptive server logged within it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from gpufleet.host.agent import bounded, safewrite
from gpufleet.host.agent.protocol import ProgressEvent
from gpufleet.host.agent.redact import scrub, scrub_tree
from gpufleet.records import Figures, Level, ResultRow, ServerState


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RunWriter:
    """Writes the run directory. Every file passes through `scrub`: the server echoes its
    own arguments (SGLang's /server_info and log list --api-key among them)."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.progress = safewrite.open_append(run_dir / "progress.jsonl", text=True, buffering=1)
        self.secrets: list[str] = []  # the server's secret values, set once it is known
        self.last: ResultRow | None = None  # the previous level's row (--client-procs auto)

    def json(self, name: str, data: Any) -> None:
        text = json.dumps(scrub_tree(data, self.secrets), indent=2)  # values, not the text
        safewrite.write_atomic(self.dir / name, text)

    def lines(self, name: str, rows: Sequence[object]) -> None:  # each a JSON line
        with safewrite.open_append(self.dir / name, text=True) as fh:
            for row in rows:
                fh.write(json.dumps(scrub_tree(row, self.secrets)) + "\n")

    def result(self, row: Figures, level: Level) -> ResultRow:
        """Append one level's row to results.jsonl, checked against its declared type: a
        renamed or mistyped figure fails here, on the run that wrote it."""
        checked = ResultRow.from_wire(row, f"results.jsonl C={level.concurrency}")
        self.lines("results.jsonl", [checked.to_wire()])
        self.last = checked
        return checked

    def event(self, event: ProgressEvent) -> None:
        self.progress.write(json.dumps(event) + "\n")

    def status(self, status: str, **extra: Any) -> None:
        self.json("status.json", {"status": status, "at": now_iso(), **extra})


# a runner started as the run_as user cannot open the server's log (root's, in root's
# workdir): root opens it and hands the runner the descriptor, named by this variable
LOG_FD_ENV = "GPUFLEET_SERVER_LOG_FD"


def open_log(state: ServerState) -> IO[bytes]:
    """The server's log for reading: the descriptor root handed over, else by its path."""
    handed = os.environ.get(LOG_FD_ENV)
    if handed:
        return os.fdopen(os.dup(int(handed)), "rb")
    return open(state.log, "rb")


def log_size(state: ServerState | None) -> int | None:
    if not state:
        return None
    try:
        with open_log(state) as fh:
            return os.fstat(fh.fileno()).st_size
    except (OSError, ValueError):
        return None


# SGLang 0.5.23 logs every change of draft depth between decode batches with this line
# (speculative/eagle_worker_v2.py, apply_runtime_state); so does the rehearsal server
DEPTH_SWITCH = b"Switch adaptive runtime state:"


# logged at start-up, at the same INFO level: without it, no switch would be logged either
ADAPTIVE_READY = b"AdaptiveSpeculativeParams initialized"


def depth_switches(state: ServerState | None, start: int | None, end: int | None) -> int | None:
    """How often the server changed its draft depth between two offsets of its log (exact,
    where sampling /server_info would miss a depth that flips every few steps); None
    without a readable log, or one that does not log at INFO (--log-level warning), where
    0 would be a guess."""
    if not state or start is None or end is None:
        return None
    try:
        with open_log(state) as fh:  # the server's: read a chunk at a time (bounded.py)
            count = bounded.count(fh, start, end, DEPTH_SWITCH)
            if count:
                return count
            return 0 if bounded.count(fh, 0, start, ADAPTIVE_READY) else None
    except OSError:
        return None


def write_server_log(
    writer: RunWriter,
    state: ServerState | None,
    marks: list[tuple[int, str]],
    secrets: list[str] | None = None,
    limit: int = 20 * 2**20,
) -> None:
    """Copy the server's log with `>>> gpufleet:` marker lines at the recorded offsets.

    Secret values of the server's argv and environment (e.g. an --api-key that SGLang
    prints among its server_args) are replaced by *** in the copy."""
    if not state:
        return
    try:
        with open_log(state) as fh:  # the server's: its newest `limit` bytes only
            start = max(0, os.fstat(fh.fileno()).st_size - limit)
            fh.seek(start)
            data = bounded.take(fh, limit)
    except OSError:
        return
    out, pos = [], 0  # offsets into `data`, which begins at the log's `start`
    for at, label in sorted((m for m in marks if m[0] is not None), key=lambda m: m[0]):
        offset = min(max(at - start, 0), len(data))
        out.append(data[pos:offset])
        if out[-1] and not out[-1].endswith(b"\n"):
            out.append(b"\n")
        out.append(f">>> gpufleet: {label}\n".encode())
        pos = offset
    out.append(data[pos:])
    text = b"".join(out).decode(errors="replace")
    safewrite.write_atomic(writer.dir / "server.log", scrub(text, secrets or []))
