"""The fleet index: one SQLite file beside the runs (`Archive.index_path`) holding each
run's summary, so `inv fleet`, `inv history` and `inv metrics` answer for 128 hosts x 50
runs without reading 6,400 manifests.

The run files stay the only source of truth. Every open brings the index up to date with
them: a run whose manifest or results.jsonl is new or changed (size or mtime of each file
the index reads) is read again, and its results.jsonl checked against the manifest's
sha256; `--reindex` checks every file of every run (archive/store.verify). A run whose
files do not parse or verify, or a folder without its manifest, is kept in the index as
broken, with the reason, and every view leaves it out by name (`broken_lines`): one bad
run never stops the rest. A run gone is dropped, and the sweep membership (which runs are
repeats of one sweep cell) is rebuilt when a sweep's state changed. An index that is
missing is built; one that is unreadable or of another schema is rebuilt with a note;
`rebuild=True` (`inv runs --reindex`) forces it. An archive the user may not write gets
an index in memory, with a note. SQLite is the standard library's: embedded, no server.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.archive import store
from gpufleet.archive.kept import Manifest
from gpufleet.archive.layout import Archive
from gpufleet.errors import UserError
from gpufleet.fleet.runfiles import READ, Broken, Row, one_line, read_checked
from gpufleet.kinds import RunStatus
from gpufleet.report import catalogue
from gpufleet.report.fingerprint import Fact, fingerprint

SCHEMA = 2
PROMPT_SET = "prompt set"  # the fingerprint entry the index adds: name and sha256 prefix
T = TypeVar("T")

_TABLES = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sources (path TEXT PRIMARY KEY, stamp TEXT NOT NULL, kind TEXT);
CREATE TABLE broken (host TEXT NOT NULL, run_id TEXT NOT NULL, profile TEXT,
    reason TEXT NOT NULL, PRIMARY KEY (host, run_id));
CREATE TABLE runs (
    host TEXT NOT NULL, run_id TEXT NOT NULL, profile TEXT, status TEXT NOT NULL,
    superseded INTEGER NOT NULL, started_at TEXT NOT NULL, engine TEXT, engine_version TEXT,
    prompt_set TEXT, gpu_model TEXT, fingerprint TEXT NOT NULL, manifest TEXT NOT NULL,
    PRIMARY KEY (host, run_id));
CREATE INDEX runs_by_profile ON runs (profile, host, started_at);
CREATE TABLE levels (
    host TEXT NOT NULL, run_id TEXT NOT NULL, concurrency INTEGER NOT NULL,
    repeat INTEGER NOT NULL, row TEXT NOT NULL);
CREATE INDEX levels_by_run ON levels (host, run_id);
CREATE TABLE cells (host TEXT NOT NULL, run_id TEXT NOT NULL, sweep_id TEXT NOT NULL,
    label TEXT NOT NULL, PRIMARY KEY (host, run_id));
"""


@dataclass
class IndexedRun:
    """One archived run as the index keeps it: what selects it, what fingerprints it."""

    host: str
    run_id: str
    profile: str | None
    status: str
    superseded: bool
    started_at: str
    engine: str | None
    engine_version: str | None
    prompt_set: str | None
    gpu_model: str | None
    fingerprint: dict[str, Fact]
    round_id: str  # the sweep it was a cell of, else its own run id (`inv bench` shares one)
    cell: str | None  # the sweep cell's label (its repeats share it)
    rows: list[Row] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        """Finished and not replaced by a later attempt: a run the fleet view may read."""
        return self.status == RunStatus.DONE and not self.superseded


def _fact_json(value: Fact) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _fact(value: Any) -> Fact:
    return tuple(value) if isinstance(value, list) else value


def prompt_set_text(manifest: Manifest) -> str | None:
    ref = manifest.prompt_set
    digest = ref.prompts_sha256 or ref.sha256
    if not ref.name and not digest:
        return None
    return f"{ref.name or 'prompts'} ({digest[:12]})" if digest else ref.name


def run_fingerprint(manifest: Manifest) -> dict[str, Fact]:
    """What changes speed (report/fingerprint.py) and the prompt set the run sent."""
    facts = fingerprint(manifest)
    facts[PROMPT_SET] = prompt_set_text(manifest)
    return facts


class Index:
    """An open, up-to-date index of one archive."""

    def __init__(self, conn: sqlite3.Connection, archive: Archive, notes: list[str]) -> None:
        self.conn = conn
        self.archive = archive
        self.notes = notes  # what the opening had to say (a rebuild, an index in memory)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries ---------------------------------------------------------------------------
    def hosts(self) -> list[str]:
        return [h for (h,) in self.conn.execute("SELECT DISTINCT host FROM runs ORDER BY host")]

    def profiles(self) -> list[str]:
        rows = self.conn.execute(
            "SELECT DISTINCT profile FROM runs WHERE profile IS NOT NULL ORDER BY profile"
        )
        return [p for (p,) in rows]

    def runs(
        self, profile: str | None = None, host: str | None = None, rows: bool = True
    ) -> list[IndexedRun]:
        """Runs oldest first (by start time), with their level rows unless `rows=False`."""
        where, args = [], []
        if profile is not None:
            where.append("r.profile = ?")
            args.append(profile)
        if host is not None:
            where.append("r.host = ?")
            args.append(host)
        sql = (
            "SELECT r.host, r.run_id, r.profile, r.status, r.superseded, r.started_at, "
            "r.engine, r.engine_version, r.prompt_set, r.gpu_model, r.fingerprint, "
            "COALESCE(c.sweep_id, r.run_id), c.label FROM runs r "
            "LEFT JOIN cells c ON c.host = r.host AND c.run_id = r.run_id"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY r.started_at, r.host, r.run_id"
        )
        out = []
        for rec in self.conn.execute(sql, args):
            facts = {k: _fact(v) for k, v in json.loads(rec[10]).items()}
            out.append(IndexedRun(*rec[:4], bool(rec[4]), *rec[5:10], facts, rec[11], rec[12]))
        if rows:
            self.load_rows(out)
        return out

    def load_rows(self, runs: list[IndexedRun]) -> None:
        """Fill each run's level rows (ordered by concurrency, then repeat)."""
        by_key = {(r.host, r.run_id): r for r in runs}
        for run in runs:
            run.rows = []
        if len(by_key) > 200:  # most of the archive: one scan beats a query per run
            query = self.conn.execute(
                "SELECT host, run_id, row FROM levels ORDER BY concurrency, repeat"
            )
            for host, run_id, row in query:
                if (host, run_id) in by_key:
                    by_key[host, run_id].rows.append(json.loads(row))
            return
        for (host, run_id), run in by_key.items():
            query = self.conn.execute(
                "SELECT row FROM levels WHERE host = ? AND run_id = ? ORDER BY concurrency, repeat",
                (host, run_id),
            )
            run.rows = [json.loads(row) for (row,) in query]

    def broken(
        self, profile: str | None = None, host: str | None = None
    ) -> list[tuple[str, str, str]]:
        """(host, run id, why) of each run left out as damaged, of this profile (or of no
        known profile) and host."""
        rows = self.conn.execute("SELECT host, run_id, profile, reason FROM broken "
                                 "ORDER BY host, run_id")  # fmt: skip
        return [
            (h, r, why)
            for h, r, p, why in rows
            if (profile is None or p in (None, profile)) and (host is None or h == host)
        ]

    def broken_lines(self, profile: str | None = None, host: str | None = None) -> list[str]:
        """`gpu01: run R: does not verify: results.jsonl: checksum mismatch`, one a run."""
        return [f"{h}: run {r}: {why}" for h, r, why in self.broken(profile, host)]

    def manifest(self, run: IndexedRun) -> Manifest:
        """The run's manifest as indexed (for what the summary columns do not hold)."""
        (text,) = self.conn.execute(
            "SELECT manifest FROM runs WHERE host = ? AND run_id = ?", (run.host, run.run_id)
        ).fetchone()
        return Manifest.from_wire(json.loads(text), "index")


# -- opening and syncing -----------------------------------------------------------------
def open_index(archive: Archive, rebuild: bool = False) -> Index:
    """The archive's index, brought up to date with its run files (module docstring)."""
    notes: list[str] = []
    path = archive.index_path
    if not archive.root.is_dir():  # a mistyped --archive makes no folder
        notes.append(f"no archive at {archive.root}/ (nothing archived there yet)")
        conn = _fresh(sqlite3.connect(":memory:", isolation_level=None))
        return Index(conn, archive, notes)
    if rebuild:
        _remove(path)
    conn = _open_file(path, notes)
    try:
        _sync(conn, archive, full=rebuild)
    except BaseException:
        conn.close()
        raise
    return Index(conn, archive, notes)


# what an index whose file opens but whose contents do not read raises: a row that is not
# JSON, a table gone, a page torn (the file is gpufleet's own, but a disk or a hand can
# damage it); "database is locked" is another process writing, not damage
DAMAGE = (sqlite3.DatabaseError, ValueError, KeyError, TypeError, IndexError)


def reading(archive: Archive, read: Callable[[Index], T]) -> tuple[T, list[str]]:
    """`read(index)` and the opening's notes. An index whose contents do not read is
    rebuilt from the run files and read again, with a note: a damaged index never stops a
    view or fails a scrape (what the run files hold is still the answer)."""
    try:
        with open_index(archive) as index:
            return read(index), index.notes
    except DAMAGE as exc:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise
        why = one_line(f"{archive.index_path}: its contents do not read "
                        f"({type(exc).__name__}: {exc}); rebuilt from the run files")  # fmt: skip
    with open_index(archive, rebuild=True) as index:
        return read(index), [why, *index.notes]


def _open_file(path: Path, notes: list[str]) -> sqlite3.Connection:
    try:
        store.make_dirs(path.parent)
        if not path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, store.FILE_MODE))
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        notes.append(
            f"the index cannot be written at {path} ({getattr(exc, 'strerror', None) or exc}): "
            "built in memory for this command"
        )
        return _fresh(sqlite3.connect(":memory:", isolation_level=None))
    try:
        found = dict(conn.execute("SELECT key, value FROM meta"))
        if found.get("schema") == str(SCHEMA):
            return conn
        problem = f"index schema {found.get('schema')!r}, this gpufleet writes {SCHEMA}"
    except sqlite3.DatabaseError as exc:
        empty = path.stat().st_size == 0
        if empty:  # just created
            return _fresh(conn)
        problem = f"unreadable: {exc}"
    conn.close()
    notes.append(f"{path}: {problem}; rebuilt from the run files")
    _remove(path)
    return _open_file(path, notes)


def _remove(path: Path) -> None:
    for suffix in ("", "-journal", "-wal", "-shm"):
        try:
            Path(f"{path}{suffix}").unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise UserError(
                f"cannot replace the fleet index {path} ({exc.strerror or exc}): remove it "
                "by hand (it is rebuilt from the run files)"
            ) from None


def _fresh(conn: sqlite3.Connection) -> sqlite3.Connection:
    conn.executescript(_TABLES)
    conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
    return conn


def _stamp(run_dir: Path) -> str:
    """Size and mtime of each file the index reads of a run (`-` for one absent)."""
    parts = []
    for name in READ:
        try:
            st = (run_dir / name).stat()
            parts.append(f"{name}:{st.st_mtime_ns}:{st.st_size}")
        except FileNotFoundError:
            parts.append(f"{name}:-")
    return ";".join(parts)


def _file_stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_mtime_ns}:{st.st_size}"


def _sync(conn: sqlite3.Connection, archive: Archive, full: bool = False) -> None:
    """Bring the index in line with the run files and sweep states, in one transaction."""
    found = {str(d): (host, d, _stamp(d)) for host, d in archive.run_dirs()}
    sweeps = {}
    for path in archive.sweep_states():
        with contextlib.suppress(FileNotFoundError):  # removed since it was listed
            sweeps[str(path)] = _file_stamp(path)
    known = {path: (stamp, kind) for path, stamp, kind in conn.execute("SELECT * FROM sources")}
    changed = [p for p, (*_, st) in found.items() if known.get(p, (None,))[0] != st]
    gone = [p for p, (_, kind) in known.items() if kind == "run" and p not in found]
    sweeps_changed = {p: st for p, st in sweeps.items() if known.get(p, (None,))[0] != st}
    sweeps_gone = [p for p, (_, kind) in known.items() if kind == "sweep" and p not in sweeps]
    if not (changed or gone or sweeps_changed or sweeps_gone):
        return
    parsed = []
    for path in changed:
        host, run_dir, _ = found[path]
        read = _read_printable(run_dir, full)
        if read is None:
            gone.append(path)  # removed between the listing and the read
        else:
            parsed.append((path, shown(host), shown(run_dir.name), read))
    conn.execute("BEGIN IMMEDIATE")
    try:
        for path in gone:
            _drop(conn, shown(Path(path).parent.name), shown(Path(path).name))
            conn.execute("DELETE FROM sources WHERE path = ?", (path,))
        for path, host, run_id, read in parsed:
            _drop(conn, host, run_id)
            if isinstance(read, Broken):
                conn.execute("INSERT INTO broken VALUES (?, ?, ?, ?)",
                             (host, run_id, read.profile, read.reason))  # fmt: skip
            else:
                _insert(conn, host, run_id, *read)
            conn.execute("INSERT OR REPLACE INTO sources VALUES (?, ?, 'run')",
                         (path, found[path][2]))  # fmt: skip
        if sweeps_changed or sweeps_gone:
            _index_cells(conn, archive)
            conn.execute("DELETE FROM sources WHERE kind = 'sweep'")
            conn.executemany("INSERT INTO sources VALUES (?, ?, 'sweep')", sweeps.items())
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def shown(name: str) -> str:
    """A folder name as the index keys it and every view prints it: control characters
    escaped (an archive's folder named with an escape sequence or a newline would drive
    the terminal, or split a line of summary.md)."""
    return name if name.isprintable() else name.encode("unicode_escape").decode("ascii")


def _read_printable(run_dir: Path, full: bool) -> tuple[Manifest, list[Row]] | Broken | None:
    """read_checked, and a run whose folder names or printed manifest fields (profile,
    engine, start, every fingerprint value) hold a control character refused by name."""
    names = (run_dir.parent.name, run_dir.name)
    if any(shown(n) != n for n in names):
        return Broken("its folder name holds a control character: not read")
    read = read_checked(run_dir, full)
    if not isinstance(read, tuple):
        return read
    m = read[0]
    texts = {"profile": m.profile, "engine": m.server.engine, "started_at": m.started_at,
             "run_id": m.run_id, "host": m.host, **run_fingerprint(m)}  # fmt: skip
    for label, value in texts.items():
        for text in value if isinstance(value, tuple) else (value,):
            if isinstance(text, str) and shown(text) != text:
                return Broken(f"manifest.json: {label} holds a control character "
                              f"({shown(text)[:80]}): not read")  # fmt: skip
    return read


def _drop(conn: sqlite3.Connection, host: str, run_id: str) -> None:
    conn.execute("DELETE FROM broken WHERE host = ? AND run_id = ?", (host, run_id))
    conn.execute("DELETE FROM runs WHERE host = ? AND run_id = ?", (host, run_id))
    conn.execute("DELETE FROM levels WHERE host = ? AND run_id = ?", (host, run_id))


def _insert(conn: sqlite3.Connection, host: str, run_id: str, m: Manifest, rows: list[Row]) -> None:
    facts = run_fingerprint(m)
    gpus = [g.name for g in m.host_facts.gpus or [] if g.name]
    conn.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            host,
            run_id,
            m.profile,
            str(m.status),
            int(m.superseded is not None),
            m.started_at or m.archived_at or "",
            m.server.engine,
            m.server.engine_version,
            facts[PROMPT_SET],
            gpus[0] if gpus else None,
            json.dumps({k: _fact_json(v) for k, v in facts.items()}),
            m.to_json(),
        ),
    )
    conn.executemany(
        "INSERT INTO levels VALUES (?, ?, ?, ?, ?)",
        [
            (host, run_id, r[catalogue.CONCURRENCY], r.get("repeat") or 1, json.dumps(r))
            for r in rows
        ],
    )


def _index_cells(conn: sqlite3.Connection, archive: Archive) -> None:
    """Which runs were repeats of which sweep cell: compare's reading (report/select.py),
    the newest sweep naming a run winning."""
    from gpufleet.report.select import sweep_cells

    conn.execute("DELETE FROM cells")
    conn.executemany(
        "INSERT INTO cells VALUES (?, ?, ?, ?)",
        [(host, run_id, c.sweep_id, c.label) for (host, run_id), c in sweep_cells(archive).items()],
    )
