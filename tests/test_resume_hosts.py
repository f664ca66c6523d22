"""`--resume` is truthful about hosts (issue 51): after a job ended, a resume whose inventory
lacked the sweep's nodes printed `already done, skipped` for a cell that was not, then "some
sweep cells failed (see above)" with nothing above, and its hint's `--hosts` answered
`unknown host or group`. Nothing here connects to a host: the cell has nothing to run on the
hosts the inventory still has."""

from __future__ import annotations

import json

import yaml

from gpufleet.archive.layout import Archive
from helpers import run_cli
from test_compare import _run

SWEEP_ID = "20261203T100000Z-p"


def _interrupted_sweep(tmp_path):
    """A sweep of profile p on n1 and n2: done on n1, pending on n2 (its job ended)."""
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"model_path": "/models/p", "port": 30000}))
    root = tmp_path / "logs"
    _run(root, "n1", "20261203T100001Z-p-n1", "p", {1: (60.0, 60.0)})
    arm = {"key": "p", "profile": str(profile), "overrides": {}, "repeat": 1, "label": "p",
           "remove": []}  # fmt: skip
    state = {
        "sweep_id": SWEEP_ID, "profiles": [str(profile)], "hosts": ["n1", "n2"],
        "concurrency": [1], "status": "incomplete", "kind": "sweep", "arms": [arm],
        "cells": {"p": {"n1": {"status": "done", "run_id": "20261203T100001Z-p-n1"},
                        "n2": {"status": "pending"}}},
    }  # fmt: skip
    Archive(root).sweeps_dir.mkdir(parents=True, exist_ok=True)
    Archive(root).sweep_state(SWEEP_ID).write_text(json.dumps(state))
    return profile, root


def test_a_resume_without_the_sweeps_hosts_names_them_and_never_says_done(tmp_path):
    profile, root = _interrupted_sweep(tmp_path)
    inventory = tmp_path / "today.yaml"  # the new job: n1 again, n3; n2 is gone
    inventory.write_text(yaml.safe_dump({"hosts": {"n1": {"address": "192.0.2.11"},
                                                   "n3": {"address": "192.0.2.13"}}}))  # fmt: skip
    out = run_cli("sweep", "--profiles", str(profile), "--concurrency", "1", "--resume",
                  "--inventory", str(inventory), "--archive", str(root))  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert f"sweep {SWEEP_ID}: n2 is not resumed here: not in {inventory}" in text
    assert "already done, skipped" not in text
    assert "[sweep 1/1] p: not done on n2 (not among the hosts here, see above)" in text
    [said] = [ln for ln in out.stderr.splitlines() if "did not finish" in ln]
    assert "--hosts n2" not in said and "n3" not in said
    assert f"not reachable from {inventory}: n2 (not in {inventory})" in said
    # issue 81.7: n1 has nothing left, so no `--resume --hosts n1` is offered (before: a
    # command that, pasted, had nothing to do); only the host with cells left is named
    assert "finish the sweep with" not in said and "n1" not in said, said


def test_a_resume_with_every_host_done_says_done(tmp_path):
    profile, root = _interrupted_sweep(tmp_path)
    state_path = Archive(root).sweep_state(SWEEP_ID)
    state = json.loads(state_path.read_text())
    _run(root, "n2", "20261203T100002Z-p-n2", "p", {1: (61.0, 61.0)})
    state["cells"]["p"]["n2"] = {"status": "done", "run_id": "20261203T100002Z-p-n2"}
    state_path.write_text(json.dumps(state))
    inventory = tmp_path / "all.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {"n1": {"address": "192.0.2.11"},
                                                   "n2": {"address": "192.0.2.12"}}}))  # fmt: skip
    out = run_cli("sweep", "--profiles", str(profile), "--concurrency", "1", "--resume",
                  "--inventory", str(inventory), "--archive", str(root))  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[sweep 1/1] p: already done, skipped" in out.stdout
    assert "is not resumed here" not in out.stdout
