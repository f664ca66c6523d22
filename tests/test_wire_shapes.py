"""Declared JSON shapes (issue 49): a TypedDict inside a record is checked where the record
is read, like a record's own fields, so a shape declared instead of `dict[str, Any]` is a
check, not a comment. Python 3.11 misses NotRequired under `from __future__ import
annotations`; wire reads the hints itself."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpufleet.archive.kept import ArmFields, SweepRecord
from gpufleet.host.agent.protocol import RunStatusFile, SimGpus
from gpufleet.wire import Record, WireError, check

ARM: ArmFields = {
    "profile": "eagle3",
    "key": "eagle3",
    "label": "eagle3",
    "overrides": {"tp-size": 8},
}


@dataclass
class Holder(Record):
    arms: list[ArmFields] = field(default_factory=list)
    sim: SimGpus | None = None


def test_a_declared_shape_is_read_back_as_written():
    assert check(ARM, ArmFields, "arm") == ARM
    assert check({}, RunStatusFile, "status") == {}  # total=False: nothing required


def test_a_missing_required_key_is_named_with_its_path():
    with pytest.raises(WireError, match=r"Holder.arms\[0\]: missing field\(s\) \['label'\]"):
        Holder.from_wire({"arms": [{"key": "x", "profile": "p"}]})


def test_a_mistyped_value_is_named_with_its_path():
    with pytest.raises(WireError, match=r"Holder.arms\[0\].overrides.tp-size: \{\} is not"):
        Holder.from_wire({"arms": [{**ARM, "overrides": {"tp-size": {}}}]})
    sim = {"state_dir": "s", "count": "8", "model": "H200", "memory_mib": 1, "reserved_mib": 0,
           "faults": {}, "boot_id": None}  # fmt: skip
    with pytest.raises(WireError, match=r"Holder.sim.count: '8' is not int"):
        Holder.from_wire({"sim": sim})


def test_not_required_keys_may_be_absent_and_unknown_keys_pass_through():
    """A newer writer's key is kept (JSON objects are open); an older record without an
    optional key reads."""
    arm = {"profile": "p", "key": "p", "label": "p", "later": 1}
    assert Holder.from_wire({"arms": [arm]}).arms == [arm]


def test_a_sweep_record_with_a_mistyped_arm_is_refused_where_it_is_read():
    record = {
        "sweep_id": "s", "profiles": ["p"], "hosts": ["h0"], "concurrency": [1],
        "created_at": "2026-12-03T00:00:00Z", "cells": {}, "arms": [{**ARM, "profile": 7}],
    }  # fmt: skip
    with pytest.raises(WireError, match=r"SweepRecord.arms\[0\].profile: 7 is not str"):
        SweepRecord.from_wire(record)
