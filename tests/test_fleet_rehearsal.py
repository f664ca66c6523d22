"""The fleet view on the rehearsal engine: six simulated hosts swept twice, first stock
(no host may be named), then with one GPU of one host at lowered clocks (that host must be
named, with the clocks as its difference, and its history must call it slower). Six, not
four: in CI four stock hosts on a busy machine read 0.98-1.05x at C=1, and a fleet of four
needs 5.8 robust deviations to name a host (outliers.critical_z), which a 0.81x host
among them did not reach."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import run_cli, unwrap


def _inventory(tmp_path, slow_clock: int | None):
    hosts = {}
    for n, name in enumerate(("sim-a", "sim-b", "sim-c", "sim-d", "sim-e", "sim-f")):
        host = {"address": "localhost", "workdir": str(tmp_path / "hosts" / name),
                "vars": {"server_port_offset": 11 * n}}  # fmt: skip
        if name == "sim-d" and slow_clock:
            host["gpus"] = {"faults": {3: {"sm_clock_app_mhz": slow_clock}}}
        hosts[name] = host
    path = tmp_path / f"fleet-{slow_clock or 'stock'}.yaml"
    path.write_text(yaml.safe_dump({
        "defaults": {"connection": "local", "python": "auto",
                     "gpus": {"count": 8, "simulated": True}},
        "hosts": hosts,
    }))  # fmt: skip
    return path


def _profile(tmp_path):
    """The rehearsal baseline on a port of this test's own (free_port leaves room for the
    hosts' offsets): the playbook's fixed 30000 may sit in another test worker's range."""
    from gpufleet.sim.sshd import free_port

    path = tmp_path / "fleetbase.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump({
            "engine": "sim", "model_path": "/models/fleet", "tp": 8, "port": free_port(),
            "health_timeout": 60, "sim": {"load-seconds": 1.0, "warmup-seconds": 0.2},
        }))  # fmt: skip
    return path


def _sweep(tmp_path, inventory):
    got = run_cli("sweep", "--profiles", str(_profile(tmp_path)), "-c", "1,4", "--output-len", "48",
                  "--inventory", str(inventory), "--archive", str(tmp_path / "logs"),
                  timeout=400)  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]


# exclusive: it judges six hosts against each other on this one machine, so it runs alone,
# after the side-by-side tier (whose load made four stock hosts read 0.98-1.05x), and its
# twelve servers do not load the tests beside it
@pytest.mark.exclusive
@pytest.mark.slow(minutes=2)
def test_the_rehearsal_names_the_slowed_host_and_only_it(tmp_path):
    archive = ("--archive", str(tmp_path / "logs"))
    _sweep(tmp_path, _inventory(tmp_path, None))
    stock = run_cli("fleet", *archive)
    assert stock.returncode == 0, stock.stdout + stock.stderr
    assert "no host of 6 is off" in unwrap(stock.stdout)
    assert not [line for line in stock.stdout.splitlines() if line.rstrip().endswith(" !")]

    _sweep(tmp_path, _inventory(tmp_path, 1600))
    slowed = run_cli("fleet", "--latest", "--format", "json", *archive)
    assert slowed.returncode == 1, slowed.stdout + slowed.stderr
    (view,) = json.loads(slowed.stdout)
    assert [n["host"] for n in view["named"]] == ["sim-d"]
    fields = {d["field"] for d in view["named"][0]["differences"]}
    assert "application clocks (MHz)" in fields
    named_at = []
    for level in view["levels"]:
        others = [h for h in level["hosts"] if h["host"] != "sim-d"]
        assert all(not h["named"] and abs(h["ratio"] - 1) < 0.1 for h in others)
        sim_d = next(h for h in level["hosts"] if h["host"] == "sim-d")
        # a tensor-parallel step waits for its slowest GPU: 1600 / 1980 of stock speed
        assert sim_d["ratio"] == pytest.approx(1600 / 1980, abs=0.04)
        if not sim_d["judged"]:  # its client's timers fired late there: said, not judged
            assert not sim_d["named"] and sim_d["not_judged"], sim_d
            continue
        assert sim_d["named"] and sim_d["side"] == "slower", sim_d
        named_at.append(level)
    assert named_at, view  # named at a level its client did not mark (issue 81.1)

    history = run_cli("history", "--host", "sim-d", "--fail-on-regression", "10", *archive)
    assert history.returncode == 1, history.stdout + history.stderr
    said = unwrap(history.stdout)
    assert "application clocks (MHz)" in said and "slower" in said
    steady = run_cli("history", "--host", "sim-a", "--fail-on-regression", "10", *archive)
    assert steady.returncode == 0, steady.stdout + steady.stderr
