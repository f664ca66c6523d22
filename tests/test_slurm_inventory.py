"""Inventories from where hosts live (issue 27): Slurm host lists (the syntax of
`scontrol show hostnames`, expanded without Slurm), a job's or a partition's nodes through
Slurm's own commands, and executable inventories as Ansible has them; bad input is one line
and exit 2."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from gpufleet.control.inventory import hostlist, slurm
from gpufleet.control.inventory.model import load_inventory
from gpufleet.errors import UserError
from helpers import run_cli


@pytest.mark.parametrize(
    ("text", "expected"),
    [  # Slurm's documented forms (hostlist expressions in slurm.conf(5), scontrol(1))
        ("gpu[01-04,10]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu10"]),
        ("tux[0-2]", ["tux0", "tux1", "tux2"]),
        ("linux[0-1],login", ["linux0", "linux1", "login"]),
        ("rack[1-2]-node[8-9]", ["rack1-node8", "rack1-node9", "rack2-node8", "rack2-node9"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        ("a1,a1,a[1-2]", ["a1", "a2"]),
        ("single", ["single"]),
    ],
)
def test_host_lists_expand_as_slurm_does(text, expected):
    assert hostlist.expand(text) == expected


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("gpu[3-1]", "range 3-1 goes down"),
        ("gpu[1-x]", "'1-x' in [1-x] is not a number or a range"),
        ("gpu[1-2", "'[' without ']'"),
        ("gpu1-2]", "']' without '['"),
        ("gpu[[1]]", "nested brackets"),
        ("a,,b", "empty name between commas"),
        ("gpu[1-9999999]", "over 100000 hosts"),
    ],
)
def test_a_bad_host_list_is_one_line(text, said):
    with pytest.raises(UserError, match=re.escape(said)):
        hostlist.expand(text)


def test_a_node_list_entry_is_one_host_per_node_with_the_entry_fields(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(
        "defaults: {user: ops}\n"
        "hosts:\n"
        '  "gpu[01-03]": {port: 2222, group: h200, gpus: {count: 8}}\n'
        "  login: {address: 192.0.2.9}\n"
    )
    inv = load_inventory(path)
    assert sorted(inv.hosts) == ["gpu01", "gpu02", "gpu03", "login"]
    assert inv.hosts["gpu02"].address == "gpu02" and inv.hosts["gpu02"].port == 2222
    assert inv.hosts["gpu02"].user == "ops" and inv.hosts["gpu02"].gpus.count == 8
    assert [h.name for h in inv.select("h200")] == ["gpu01", "gpu02", "gpu03"]


def test_an_inventory_given_as_a_bad_slurm_host_list_on_the_command_line():
    bad = run_cli("hosts", "--inventory", "slurm:gpu[2-1]")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "gpufleet: slurm:gpu[2-1]: host list 'gpu[2-1]': range 2-1 goes down"
    )


def _program(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_job_or_a_partition_without_slurm_here_is_one_line(tmp_path, monkeypatch):
    # with Slurm here, tests/test_slurm_real.py asks the real one
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(UserError, match="needs Slurm's `squeue` on this machine"):
        slurm.job_nodes("4242")
    with pytest.raises(UserError, match="needs Slurm's `sinfo` on this machine"):
        slurm.partition_nodes("h200")
    with pytest.raises(UserError, match="expected a job id"):
        slurm.job_nodes("12;rm")
    assert slurm.listed_nodes("gpu[1-2]").names == ["gpu1", "gpu2"]  # no sinfo: expanded


def test_an_executable_inventory_is_run_and_checked(tmp_path):
    good = _program(tmp_path / "fleet", 'echo \'{"hosts": {"a1": {"address": "192.0.2.5"}}}\'\n')
    out = run_cli("hosts", "--inventory", str(good))
    assert out.returncode == 0 and "192.0.2.5" in out.stdout, out.stderr
    cases = [
        ("fails", "echo boom >&2; exit 3\n", f"inventory program {tmp_path}/fails exited 3: boom"),
        ("notjson", 'echo "hosts: [1, 2"\n', "its output is not JSON or YAML (line 2)"),
        ("badfield", 'echo \'{"hosts": {"a1": {"prot": 22}}}\'\n', "hosts.a1.prot: unknown key"),
    ]  # fmt: skip
    for name, body, said in cases:
        out = run_cli("hosts", "--inventory", str(_program(tmp_path / name, body)))
        assert out.returncode == 2, (name, out.stdout, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and said in out.stderr, out.stderr


@pytest.mark.unit
@pytest.mark.parametrize(
    ("states", "said"),
    [
        (["COMPLETING", "COMPLETING", "TIMEOUT"], "reached its time limit (TIMEOUT)"),
        (["COMPLETING", "NODE_FAIL"], "lost its node (NODE_FAIL)"),
        (["COMPLETING", "REQUEUED", "PENDING"], "was requeued (REQUEUED)"),
        (["CANCELLED"], "was cancelled (CANCELLED)"),
        (["GONE"], "ended (Slurm lists it no more)"),
        (["RUNNING"], None),
    ],
)
def test_a_job_s_end_is_read_until_slurm_settles_and_said_in_its_word(monkeypatch, states, said):
    """Issue 69 R1: a time limit read "COMPLETING", a requeue "COMPLETING" then "PENDING",
    and "requeued" never appeared. The state is read again while it passes (COMPLETING)
    and said in Slurm's own word (the real cluster's scancel and requeue:
    test_slurm_real.py)."""
    from gpufleet.control.inventory import slurm

    seen = iter(states)
    monkeypatch.setattr(slurm, "job_state", lambda job: next(seen))
    monkeypatch.setattr(slurm, "SETTLE_POLL_S", 0.0)
    assert slurm.job_end("7") == said
