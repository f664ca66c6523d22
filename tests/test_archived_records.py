"""What the archive keeps is read back typed and checked (gpufleet/archive/kept.py): a file from
a newer gpufleet or a hand-edited one is one line naming the file and the field, never a
KeyError deep in a report."""

from __future__ import annotations

import json

import pytest

from gpufleet.archive.kept import Cell, FindMaxRecord, ProbeRecord, SweepRecord
from gpufleet.errors import UserError
from helpers import run_cli


def _sweep(root, **changes):
    record = SweepRecord(
        sweep_id="20261130T000000Z-a-vs-b", profiles=["a", "b"], hosts=["h0"], concurrency=[1],
        cells={"a": {"h0": Cell()}, "b": {"h0": Cell()}},
    )  # fmt: skip
    data = {**record.to_wire(), **changes}
    path = root / "sweeps" / f"{record.sweep_id}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    return record.sweep_id, path


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"schema": 99}, "written by a newer gpufleet (sweep state schema 99); this version "
                         "reads schema 1 and older: upgrade gpufleet to read it"),
        ({"cells": {"a": {"h0": {"status": 3}}}},
         "not a gpufleet sweep state (SweepRecord.cells.a.h0.status: 3 is not str)"),
        ({"surprise": 1}, "not a gpufleet sweep state (SweepRecord: unknown field(s) "
                          "['surprise'])"),
    ],
)  # fmt: skip
def test_a_sweep_state_that_is_not_this_versions_is_one_line(tmp_path, changes, expected):
    sweep_id, path = _sweep(tmp_path, **changes)
    out = run_cli("report", "--sweep", sweep_id, "--archive", str(tmp_path))
    assert out.returncode == 2
    assert out.stderr.strip() == f"gpufleet: {path}: {expected}"


def test_a_state_written_before_schemas_reads_as_schema_1(tmp_path):
    _, path = _sweep(tmp_path)
    data = json.loads(path.read_text())
    del data["schema"], data["arms"], data["durations_s"]  # the oldest state files' shape
    path.write_text(json.dumps(data))
    record = SweepRecord.load(path)
    assert (
        record.schema == 1 and record.arms is None and record.cells["a"]["h0"].status == "pending"
    )


def test_records_round_trip_through_their_files(tmp_path):
    answer = FindMaxRecord(
        host="h0", by="concurrency", target=0.99, limit=64, at="2026-11-30T00:00:00+00:00",
        slo={"ttft_ms": 500.0}, holds_up_to=8, fails_from=16,
        probes=[ProbeRecord(8, 1.0, "r8", "done"), ProbeRecord(16, 0.5, "r16", "done")],
    )  # fmt: skip
    path = tmp_path / "fm.json"
    path.write_text(answer.to_json())
    assert FindMaxRecord.load(path) == answer
    path.write_text("{not json")
    with pytest.raises(UserError, match=r"fm\.json: unreadable"):
        FindMaxRecord.load(path)


def test_a_record_linked_to_an_endless_file_is_refused_not_read(tmp_path):
    """Issue 81, adversarial pass: a sweep state linked to /dev/zero made `inv fleet` (which
    reads every sweep state for its cells) read forever. A record is read to its bound."""
    path = tmp_path / "sweeps" / "endless.json"
    path.parent.mkdir()
    path.symlink_to("/dev/zero")
    with pytest.raises(UserError, match="over 64 MiB: not read"):
        SweepRecord.load(path)
