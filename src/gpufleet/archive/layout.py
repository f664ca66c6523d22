"""The archive as one object: `Archive(root)` owns every folder and file name under the
archive root and the queries over them; nothing else builds a path under `logs/`
(tests/test_structure.py holds that). The root is resolved in one place, `Archive.at`.

    <root>/<host>/<run-id>/            one archived run (manifest.json and its files)
    <root>/<host>/.tmp-<run-id>-<pid>/ a run being written (renamed into place when whole)
    <root>/sweeps/<sweep-id>.json      a sweep's state (cells, their runs, resume data)
    <root>/tunes/<sweep-id>.json       a tune's record (table, choices, verification)
    <root>/tunes/<sweep-id>.burst.jsonl   the bursty trace its verification replayed
    <root>/findmax/<host>/<stamp>-<profile>.json   a find-max search and its probes
    <root>/compare/<name>/             a comparison's plots and report.html
    <root>/health/<host>.json          the host's GPU health at its last gpu-clean
    <root>/index/runs.sqlite3          the fleet index: per-run summaries, rebuilt from the
                                       files above whenever missing, stale or unreadable

`sweeps`, `tunes`, `findmax`, `compare`, `health` and `index` are therefore not host names (the
inventory refuses them).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

RESERVED = frozenset({"sweeps", "tunes", "findmax", "compare", "health", "index"})


def profile_label(profile: str) -> str:
    """How a profile is named in runs and sweeps: a path by its file name without .yaml,
    anything else as given (`qwen2.5-eagle3` keeps its dot, and so does an arm's label such
    as `llama-3.1[depth=2]`; Path.stem would cut both at the last dot)."""
    if profile.endswith((".yaml", ".yml")):
        return Path(profile).name.rsplit(".", 1)[0]
    return profile


def safe_name(text: str) -> str:
    """A file or folder name made of `text` (letters, digits, '_', '.', '-'; 80 at most)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


DEFAULT_ROOT = "logs"  # the archive's folder when neither --archive nor $GPUFLEET_ARCHIVE
# a server's log on its host, relative to the host's workdir (a profile's `log:` default)
SERVER_LOG = DEFAULT_ROOT + "/{profile}-{port}-{stamp}.log"


@dataclass(frozen=True)
class Archive:
    """The archive under `root`: its folders, run-file names and queries."""

    root: Path

    @classmethod
    def at(cls, root: Archive | Path | str | None = None) -> Archive:
        """The archive at `root`, else $GPUFLEET_ARCHIVE, else logs/."""
        if isinstance(root, Archive):
            return root
        return cls(Path(root or os.environ.get("GPUFLEET_ARCHIVE") or DEFAULT_ROOT))

    def __str__(self) -> str:
        return str(self.root)

    def host_dir(self, host: str) -> Path:
        return self.root / host

    def run_dir(self, host: str, run_id: str) -> Path:
        return self.root / host / run_id

    def partial_run_dir(self, host: str, run_id: str) -> Path:
        return self.root / host / f".tmp-{run_id}-{os.getpid()}"

    @property
    def sweeps_dir(self) -> Path:
        return self.root / "sweeps"

    def sweep_state(self, sweep_id: str) -> Path:
        return self.sweeps_dir / f"{sweep_id}.json"

    def tune_record(self, sweep_id: str) -> Path:
        return self.root / "tunes" / f"{sweep_id}.json"

    def tune_records(self) -> list[Path]:
        """Every tune's record, oldest first."""
        return sorted((self.root / "tunes").glob("*.json"))

    def tune_burst_trace(self, sweep_id: str) -> Path:
        return self.root / "tunes" / f"{sweep_id}.burst.jsonl"

    def findmax_dir(self, host: str) -> Path:
        return self.root / "findmax" / host

    def findmax_record(self, host: str, stamp: str, profile: str | None) -> Path:
        return self.findmax_dir(host) / f"{stamp}-{profile or 'adhoc'}.json"

    def health_record(self, host: str) -> Path:
        return self.root / "health" / f"{host}.json"

    @property
    def index_path(self) -> Path:
        """The fleet index (fleet/index.py): a cache of the run files, never their source."""
        return self.root / "index" / "runs.sqlite3"

    def fleet_dir(self, profile: str) -> Path:
        """Where `inv fleet` writes its table, plot and page for one profile."""
        return self.root / "compare" / safe_name(f"fleet-{profile}")

    def compare_dir(self, name: str) -> Path:
        return self.root / "compare" / safe_name(name)

    # -- queries ---------------------------------------------------------------------------

    def sweep_states(self) -> list[Path]:
        """Every sweep's state file, oldest first (the id starts with its UTC time)."""
        return sorted(self.sweeps_dir.glob("*.json"))

    def findmax_records(self, host: str, profile: str) -> list[Path]:
        """A host's find-max records of one profile, oldest first."""
        return sorted(self.findmax_dir(host).glob(f"*-{profile}.json"))

    def run_dirs(self) -> list[tuple[str, Path]]:
        """(host, run dir) for every archived run's folder, whole or not (a folder without
        its manifest is listed too: the fleet index refuses it by name). Partial runs
        (hidden) and the archive's own folders are not runs."""
        if not self.root.is_dir():
            return []
        out = []
        for host_dir in sorted(self.root.iterdir()):
            if host_dir.name in RESERVED or host_dir.name.startswith(".") or not host_dir.is_dir():
                continue
            out += [(host_dir.name, d) for d in sorted(host_dir.iterdir())
                    if d.is_dir() and not d.name.startswith(".")]  # fmt: skip
        return out

    def run_manifests(self, manifest_name: str) -> list[Path]:
        """Every archived run's manifest (<root>/<host>/<run-id>/<manifest>), sorted."""
        return sorted(self.root.glob(f"*/*/{manifest_name}"))
