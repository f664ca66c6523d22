"""A sweep's state on disk: which cells of which profiles on which hosts are done, running
or failed (a SweepRecord, written atomically after every change), opened new or, with
`--resume`, as the latest sweep of the same cells.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.archive import store
from gpufleet.archive.kept import Cell, SweepRecord
from gpufleet.archive.layout import Archive
from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.inventory.model import Host
from gpufleet.control.sweep.cells import ArmSpec, profile_label
from gpufleet.errors import UserError
from gpufleet.kinds import CellStatus

Say = Callable[[str], None]


class SweepState:
    """The sweep's progress on disk (a SweepRecord, written atomically after every change)."""

    def __init__(self, path: Path, record: SweepRecord) -> None:
        self.path = path
        self.record = record
        self.lock = threading.Lock()
        self.say: Say = lambda text: None  # progress lines, set by run()
        self.as_root: set[str] = set()  # hosts whose servers ran as root for want of run_as

    @classmethod
    def new(
        cls,
        archive: Archive,
        profiles: list[str],
        hosts: list[str],
        levels: list[int],
        *,
        arms: list[ArmSpec] | None = None,
        kind: str = "sweep",
        request: BenchRequest | None = None,
    ) -> SweepState:
        """A new sweep of these cells on these hosts, saved before any cell starts."""
        arms = arms or [ArmSpec(p, label=profile_label(p)) for p in profiles]
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        sweep_id = f"{stamp}-{'-vs-'.join(profile_label(p) for p in profiles)}"
        if kind != "sweep":
            sweep_id += f"-{kind}"
        record = SweepRecord(
            sweep_id=sweep_id,
            kind=kind,
            profiles=profiles,
            arms=[a.to_json() for a in arms],
            hosts=hosts,
            concurrency=levels,
            created_at=datetime.now(UTC).isoformat(),
            cells={a.key: {h: Cell() for h in hosts} for a in arms},
            request=request.to_json() if request else None,
        )
        state = cls(archive.sweep_state(sweep_id), record)
        state.save()
        return state

    @classmethod
    def latest(
        cls,
        archive: Archive,
        profiles: list[str],
        arms: list[ArmSpec] | None = None,
        kind: str = "sweep",
    ) -> SweepState:
        """The newest sweep of these profiles and cells (a finished one resumes to its
        compare)."""
        keys = [a.key for a in arms] if arms else None
        candidates = archive.sweep_states()
        for path in reversed(candidates):
            record = SweepRecord.load(path)
            if record.profiles != profiles or record.kind != kind:
                continue
            if keys is None or [a["key"] for a in record.arms or []] == keys:
                return cls(path, record)
        raise UserError(f"--resume: no {kind} of {','.join(profiles)} under {archive.sweeps_dir}/")

    @property
    def sweep_id(self) -> str:
        """The sweep's id (its record's file name)."""
        return self.record.sweep_id

    def arms(self) -> list[ArmSpec]:
        """The cells' specs in the order they run (older state files: one per profile)."""
        if self.record.arms is None:
            return [ArmSpec(p, label=profile_label(p)) for p in self.record.profiles]
        return [ArmSpec.from_json(a) for a in self.record.arms]

    def save(self) -> None:
        """Write the record atomically (0600)."""
        with self.lock:
            store.write_private_file(self.path, self.record.to_json().encode())

    def cell(self, profile: str, host: str) -> Cell:
        """One cell's state on one host."""
        return self.record.cells[profile][host]

    def hosts_left(self) -> list[str]:
        """The sweep's hosts with a cell not done (nor dropped): the only ones a resume
        line may name (issue 81.7: after a resume on another node set, the closing line
        offered a --resume for a host with nothing left)."""
        over = (CellStatus.DONE, CellStatus.DROPPED)
        keys = [a.key for a in self.arms()]
        return [h for h in self.record.hosts
                if any(self.record.cells[k][h].status not in over for k in keys
                       if h in self.record.cells.get(k, {}))]  # fmt: skip

    def update(self, profile: str, host: str, **fields: Any) -> None:
        """Set a cell's fields by name (an unknown name is a bug: AttributeError)."""
        with self.lock:
            cell = self.record.cells[profile][host]
            for name, value in fields.items():
                if not hasattr(cell, name):
                    raise AttributeError(f"a sweep cell has no field {name!r}")
                setattr(cell, name, value)
        self.save()


def check_arms(names: list[str], arms: list[ArmSpec]) -> None:
    """Every cell's profile loads with its flags (UserError otherwise), before anything
    starts."""
    if not names:
        raise UserError("--profiles needs at least one profile (e.g. baseline,eagle3)")
    for arm in arms:
        arm.resolved_profile()


def open_state(
    archive: Archive,
    profiles: list[str],
    hosts: list[Host],
    levels: list[int],
    *,
    resume: bool,
    arms: list[ArmSpec] | None = None,
    kind: str = "sweep",
    request: BenchRequest | None = None,
) -> SweepState:
    """The latest sweep of these cells (--resume), or a new one that keeps `request`."""
    if resume:
        return SweepState.latest(archive, profiles, arms, kind)
    names = [h.name for h in hosts]
    return SweepState.new(archive, profiles, names, levels, arms=arms, kind=kind, request=request)


def hosts_of(state: SweepState, selected: Fleet) -> Fleet:
    """The selected hosts that belong to this sweep (a resumed sweep keeps its hosts)."""
    return selected.only(state.record.hosts)
