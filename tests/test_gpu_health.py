"""A clean GPU is a healthy, equal GPU (issue 25): every health rule, its fault injected into
the rehearsal NVML, gives its verdict and reason; a bad GPU refuses a launch over real sshd
unless --allow-unhealthy (recorded); compare flags a pair that differs in one power limit."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from gpufleet.host.gpu import health as gpuhealth
from gpufleet.host.gpu import nvml as nvmlread
from gpufleet.sim import gpustate
from gpufleet.sim import nvml_sim as simnvml
from helpers import run_cli


def _health(
    tmp_path: Path, monkeypatch, faults: dict, count: int = 8, remember: bool = True,
    boot_id: str | None = None,
):  # fmt: skip
    state = tmp_path / "gpus"
    gpustate.ensure_topology(state, count=count, host="h", faults=faults, boot_id=boot_id)
    monkeypatch.setenv(gpustate.STATE_ENV, str(state))
    monkeypatch.chdir(tmp_path)  # the XID cursor lives in the workdir
    simnvml.nvmlInit()
    try:
        readings = nvmlread.snapshot(simnvml)
        gpuhealth.attach(simnvml, readings, remember_xids=remember)
    finally:
        simnvml.nvmlShutdown()
    return readings


RULES = [  # fault on GPU 3 -> (verdict, words in its reasons)
    ({"power_limit_w": 300}, "bad", "power limit 300 W, below its default 700 W"),
    ({"sm_clock_app_mhz": 1500}, "warn", "application clocks 1500 MHz, default 1980 MHz"),
    ({"clock_events": ["hw_slowdown"]}, "bad", "clocks held down (hw_slowdown)"),
    ({"clock_events": ["hw_thermal"]}, "bad", "clocks held down (hw_thermal)"),
    ({"clock_events": ["hw_power_brake"]}, "bad", "clocks held down (hw_power_brake)"),
    ({"clock_events": ["sw_power_cap"]}, "warn", "software power cap"),
    ({"remap_pending": True}, "bad", "row remap is pending"),
    ({"remap_failed": True}, "bad", "row remapping failed"),
    ({"ecc_uncorrected": 2}, "bad", "2 uncorrectable ECC errors"),
    ({"xids": [79]}, "bad", "XID 79 (GPU has fallen off the bus) logged"),
    ({"xids": [13]}, "warn", "XID 13 in the kernel log"),
    ({"nvlink_down": [4]}, "bad", "NVLink 4 down (17 up)"),
    ({"pcie_width": 8}, "bad", "PCIe width x8, the GPU and slot support x16"),
    ({"mig": True}, "bad", "MIG is on"),
    ({"mig_pending": True}, "warn", "MIG on is pending"),
    ({"persistence": False}, "warn", "persistence mode off"),
    ({"compute_mode": "exclusive_process"}, "warn", "compute mode exclusive_process"),
    ({"ecc_pending": False}, "warn", "ECC off is pending"),
    ({"temperature_c": 91}, "warn", "91 C while idle"),
]


@pytest.mark.parametrize(("fault", "verdict", "words"), RULES, ids=[str(r[0]) for r in RULES])
def test_each_fault_gives_its_verdict_and_reason(tmp_path, monkeypatch, fault, verdict, words):
    readings = _health(tmp_path, monkeypatch, {"3": fault})
    faulty = readings[3].health
    assert faulty is not None and faulty.verdict == verdict, faulty
    assert any(words in r for r in faulty.reasons), faulty.reasons
    others = [g.health.verdict for g in readings if g.index != 3]
    assert set(others) <= {"ok", "warn"}  # a sibling may only be warned about the outlier
    assert "bad" not in others


def test_a_healthy_simulated_h200_reads_like_the_real_one(tmp_path, monkeypatch):
    [gpu] = _health(tmp_path, monkeypatch, {}, count=1)
    h = gpu.health
    assert h.verdict == "ok" and h.reasons == []
    # docs/REFERENCE.md: the lent H200's readings (one GPU: NVLink and retired pages n/a)
    assert (h.power_limit_w, h.power_default_w, h.sm_clock_app_mhz) == (700.0, 700.0, 1980)
    assert (h.pcie_gen, h.pcie_width, h.persistence, h.ecc, h.mig) == (5, 16, True, True, False)
    assert h.nvlinks_up is None and h.retired_pages_pending is None
    assert h.clock_events == [] and h.xids == []


def test_an_outlier_among_siblings_is_named(tmp_path, monkeypatch):
    readings = _health(tmp_path, monkeypatch, {"5": {"pcie_gen": 4}})
    assert readings[5].health.verdict == "warn"
    assert readings[5].health.reasons == ["warn: PCIe generation 4, below its siblings' 5"]
    assert {g.health.verdict for g in readings if g.index != 5} == {"ok"}


def test_a_recoverable_xid_is_reported_once(tmp_path, monkeypatch):
    first = _health(tmp_path, monkeypatch, {"2": {"xids": [13]}})
    assert first[2].health.xids == [13] and first[2].health.verdict == "warn"
    again = _health(tmp_path, monkeypatch, {"2": {"xids": [13]}})
    assert again[2].health.xids == [] and again[2].health.verdict == "ok"


@pytest.mark.parametrize("xid", sorted(gpuhealth.FATAL_XIDS))
def test_a_fatal_xid_holds_until_a_reboot_whoever_reads_it(tmp_path, monkeypatch, xid):
    """Issue 35: gpu-clean used a fatal XID up and the next launch ran on the GPU. Now every
    read after the first (gpu-clean's remembering one included) still says bad."""
    faults = {"2": {"xids": [xid]}}
    for remember in (False, True, True, False):
        gpu = _health(tmp_path, monkeypatch, faults, remember=remember)[2]
        assert gpu.health.verdict == "bad", (remember, gpu.health.reasons)
        assert f"XID {xid} (" in gpu.health.reasons[0]
    # a reboot: a new boot id and a fresh kernel log
    rebooted = _health(tmp_path, monkeypatch, {}, boot_id="second-boot")[2]
    assert rebooted.health.verdict == "ok", rebooted.health.reasons


def test_an_operator_clear_lifts_a_fatal_xid_and_is_logged(tmp_path, monkeypatch):
    faults = {"2": {"xids": [48]}, "5": {"xids": [95]}}
    assert _health(tmp_path, monkeypatch, faults)[2].health.verdict == "bad"
    simnvml.nvmlInit()
    try:
        cleared = gpuhealth.clear_fatal(simnvml, [2], "nvidia-smi -r -i 2", "ops@ctl")
    finally:
        simnvml.nvmlShutdown()
    assert [c.xid for c in cleared] == [48]
    after = _health(tmp_path, monkeypatch, faults)
    assert after[2].health.verdict == "ok"  # the same kernel log line does not come back
    assert after[5].health.verdict == "bad"  # GPU 5 was not cleared
    [entry] = [
        json.loads(x) for x in (tmp_path / gpuhealth.XID_CLEARED_LOG).read_text().splitlines()
    ]
    assert (entry["gpu"], entry["xid"], entry["by"]) == (2, 48, "ops@ctl")
    assert entry["reason"] == "nvidia-smi -r -i 2"


def test_the_bus_id_of_nvml_and_of_the_kernel_log_match():
    assert gpuhealth.bus_key("00000000:18:00.0") == gpuhealth.bus_key("0000:18:00") == "18:00"


def _faulty_inventory(fleet, host: str, faults: dict) -> Path:
    data = yaml.safe_load(fleet.inventory.read_text())
    data["hosts"][host]["gpus"] = {"count": 8, "simulated": True, "faults": faults}
    path = fleet.inventory.with_name("faulty.yaml")
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_bad_gpu_refuses_launch_and_allow_unhealthy_records_it(fleet, tmp_path):
    inventory = _faulty_inventory(fleet, "h1", {3: {"power_limit_w": 350}})
    profile = fleet.profile("hl", tp=2, gpus=[2, 3])
    args = ["--profile", str(profile), "--hosts", "h1", "--inventory", str(inventory)]
    out = run_cli("launch", *args)
    assert out.returncode == 1
    [said] = [ln for ln in out.stdout.splitlines() + out.stderr.splitlines() if "unhealthy" in ln]
    assert "GPU 3 is unhealthy: power limit 350 W, below its default 700 W" in said
    hint = re.search(r"see `([^`]+)`", said).group(1)
    shown = run_cli(*hint.split()[1:])  # the printed command, as pasted
    assert shown.returncode == 0 and "GPU 3: bad: power limit 350 W" in shown.stdout

    out = run_cli("launch", *args, "--allow-unhealthy")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "launched anyway: --allow-unhealthy" in out.stdout + out.stderr
    port = yaml.safe_load(profile.read_text())["port"] + 7
    state = json.loads((fleet.workdir("h1") / "servers" / f"{port}.json").read_text())
    assert state["allowed_unhealthy"] is True
    assert "GPU 3: bad: power limit 350 W, below its default 700 W" in state["gpu_health"]
    assert run_cli("stop", "--hosts", "h1", "--inventory", str(inventory)).returncode == 0


def test_gpu_clean_does_not_use_up_a_fatal_xid_for_the_next_launch(fleet, tmp_path):
    """Issue 35 over sshd: gpu-clean reports XID 48 on GPU 3; the next launch is refused; a
    launch --clean prints the verdict its clean found; a logged --clear-xid (the GPU reset)
    lets the launch go, and the server records the verdict it saw."""
    inventory = _faulty_inventory(fleet, "h1", {3: {"xids": [48]}})
    base = ["--hosts", "h1", "--inventory", str(inventory)]
    cleaned = run_cli("gpu-clean", *base)
    assert cleaned.returncode == 1, cleaned.stdout + cleaned.stderr  # a bad GPU (issue 51)
    assert "h1: GPU 3: bad: XID 48 (double-bit ECC error)" in cleaned.stdout
    [hint] = [ln for ln in cleaned.stdout.splitlines() if "--clear-xid" in ln]
    profile = fleet.profile("hx", tp=2, gpus=[2, 3])
    refused = run_cli("launch", "--profile", str(profile), *base)
    assert refused.returncode == 1
    assert "GPU 3 is unhealthy: XID 48 (double-bit ECC error)" in refused.stdout + refused.stderr
    refused = run_cli("launch", "--profile", str(profile), *base, "--clean")
    assert refused.returncode == 1
    assert "GPU 3: bad: XID 48" in refused.stdout + refused.stderr  # what its clean found

    no_reason = run_cli("gpu-clean", *base, "--clear-xid", "3")
    assert no_reason.returncode == 2 and "--clear-xid needs --reason" in no_reason.stderr
    assert "Traceback" not in no_reason.stderr
    no_gpu = run_cli("gpu-clean", *base, "--clear-xid", "9", "--reason", "reset")
    assert no_gpu.returncode != 0 and "Traceback" not in no_gpu.stderr
    assert "--clear-xid: GPU 9 does not exist (NVML sees 8: 0-7)" in no_gpu.stdout + no_gpu.stderr
    pasted = hint.split(": ", 1)[1].split("clear it: ", 1)[1]
    cleared = run_cli(*shlex.split(pasted)[1:])  # the printed command, as pasted
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert "cleared XID 48" in cleared.stdout
    log = fleet.workdir("h1") / "health" / "xid-clears.log"
    [entry] = [json.loads(x) for x in log.read_text().splitlines()]
    assert entry["gpu"] == 3 and entry["reason"] == "GPU reset"

    launched = run_cli("launch", "--profile", str(profile), *base)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    port = yaml.safe_load(profile.read_text())["port"] + 7
    state = json.loads((fleet.workdir("h1") / "servers" / f"{port}.json").read_text())
    assert "GPU 3: ok" in state["gpu_health"]
    assert run_cli("stop", *base).returncode == 0


def test_compare_flags_a_pair_that_differs_in_one_power_limit(fleet, tmp_path):
    archive = tmp_path / "a"
    profile = fleet.profile("hp", tp=2, gpus=[0, 1], sim={"load-seconds": 0.2})
    runs = []
    for faults in ({}, {1: {"power_limit_w": 500}}):
        inventory = _faulty_inventory(fleet, "h0", faults)
        base = ["--hosts", "h0", "--inventory", str(inventory)]
        launched = run_cli("launch", "--profile", str(profile), *base, "--allow-unhealthy")
        assert launched.returncode == 0, launched.stdout + launched.stderr
        out = run_cli("bench", *base, "-c", "2", "--num-prompts", "4", "--output-len", "8",
                        "--archive", str(archive))  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        assert run_cli("stop", *base).returncode == 0
    runs = sorted(p.name for p in (archive / "h0").iterdir())
    out = run_cli("compare", *runs, "--archive", str(archive), "--no-plots")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "power limits (W) differs: " in out.stdout and "(700, 700)" in out.stdout
    assert "(700, 500)" in out.stdout
    assert "GPU 1: bad: power limit 500 W" in out.stdout  # the B run's launch verdict
    page = next((archive / "compare").iterdir()) / "report.html"
    assert "power limits (W) differs" in page.read_text()
    strict = run_cli("compare", *runs, "--archive", str(archive), "--no-plots", "--strict")
    assert strict.returncode == 2
    assert strict.stderr.strip().startswith(
        "gpufleet: h0: --strict: the runs differ in what changes speed: power limits (W)"
    )


def test_hosts_healthy_skips_a_host_whose_last_clean_found_a_bad_gpu(fleet, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_ARCHIVE", str(tmp_path / "logs"))  # where verdicts are kept
    inventory = _faulty_inventory(fleet, "h0", {5: {"remap_pending": True}})
    base = ["--inventory", str(inventory)]
    out = run_cli("gpu-clean", "--hosts", "h0,h1", *base)
    # issue 51: a bad GPU fails gpu-clean (exit 1), in one line naming it; h1 is clean
    assert out.returncode == 1, out.stdout + out.stderr
    assert "h0: FAILED: GPU 5 is bad: a bad GPU makes the host unfit to measure on" in out.stderr
    assert "h1: verified clean" in out.stdout
    record = json.loads((tmp_path / "logs" / "health" / "h0.json").read_text())
    assert "GPU 5: bad: a row remap is pending: reset the GPU before measuring" in record["gpus"]
    out = run_cli("status", "--hosts", "healthy:h0,h1", *base)
    assert out.returncode == 0, out.stdout + out.stderr
    [skipped] = [ln for ln in out.stdout.splitlines() if ln.startswith("skipped ")]
    assert skipped.startswith("skipped h0 (GPU 5: bad: a row remap is pending")
    hosts = {ln.split()[0] for ln in out.stdout.splitlines() if ln.startswith(("h0 ", "h1 "))}
    assert hosts == {"h1"}


def _clear(tmp_path, monkeypatch, index: int) -> list:
    monkeypatch.chdir(tmp_path)
    simnvml.nvmlInit()
    try:
        return gpuhealth.clear_fatal(simnvml, [index], "nvidia-smi -r", "ops@ctl")
    finally:
        simnvml.nvmlShutdown()


@pytest.mark.faults
def test_the_same_xid_after_a_clear_is_a_new_event(tmp_path, monkeypatch):
    """Issue 51: after XID 79 was cleared, the same XID again (the kernel's lines differ only
    in the timestamp) was taken as already seen: `status` said ok on a GPU that fell off the
    bus twice. Each occurrence is an event (its line with the timestamp), so it gates again."""
    once = {"2": {"xids": [79]}}
    assert _health(tmp_path, monkeypatch, once, remember=False)[2].health.verdict == "bad"
    assert [c.xid for c in _clear(tmp_path, monkeypatch, 2)] == [79]
    assert _health(tmp_path, monkeypatch, once, remember=False)[2].health.verdict == "ok"
    twice = {"2": {"xids": [79, 79]}}  # the kernel logs it again a second later
    again = _health(tmp_path, monkeypatch, twice, remember=False)[2]
    assert again.health.verdict == "bad", again.health.reasons
    assert "XID 79 (GPU has fallen off the bus)" in again.health.reasons[0]


def test_identical_lines_without_timestamps_are_each_an_event():
    line = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python3"
    events = gpuhealth.xid_events([line, "unrelated", line])
    assert [e for e, _ in events] == [line, f"{line} #2"]
    assert [first for _, first in events] == [True, False]


def test_an_xid_on_a_bus_nvml_does_not_list_makes_the_host_bad(tmp_path, monkeypatch):
    """XID 79 means the GPU fell off the bus: NVML no longer lists it, so the XID was recorded
    but shown nowhere. Now every GPU of the host carries it, and the host is bad."""
    gone = {"9": {"xids": [79]}}  # a ninth GPU's bus, on a host whose NVML lists 8
    readings = _health(tmp_path, monkeypatch, gone, remember=False)
    bus = gpuhealth.bus_key(simnvml.bus_id(9))
    for gpu in readings:
        assert gpu.health.verdict == "bad", gpu.health.reasons
        assert any(r.startswith(f"bad: GPU at bus {bus} is missing from NVML: XID 79 (")
                   for r in gpu.health.reasons), gpu.health.reasons  # fmt: skip


@pytest.mark.faults
def test_a_clear_and_readers_side_by_side_never_undo_the_clear(tmp_path, monkeypatch):
    """Two commands at once: a reader that loaded the ledger before a clear merged after it
    and put the cleared XID back. Read, merge and write are one critical section now: in a
    loop of readers racing a clear, the clear always holds and no event is lost."""
    import multiprocessing

    faults = {"2": {"xids": [48]}, "4": {"xids": [13]}}
    state = tmp_path / "gpus"
    gpustate.ensure_topology(state, count=8, host="h", faults=faults)
    monkeypatch.setenv(gpustate.STATE_ENV, str(state))
    monkeypatch.chdir(tmp_path)
    ctx = multiprocessing.get_context("fork")
    for round_no in range(8):
        (tmp_path / "health").mkdir(exist_ok=True)
        for name in ("xids.json",):
            (tmp_path / "health" / name).unlink(missing_ok=True)
        readers = [ctx.Process(target=_read_health, args=(k % 2 == 0,)) for k in range(4)]
        for proc in readers:
            proc.start()
        cleared = _clear(tmp_path, monkeypatch, 2)
        for proc in readers:
            proc.join(30)
            assert proc.exitcode == 0
        assert [c.xid for c in cleared] == [48], round_no
        after = _health(tmp_path, monkeypatch, faults, remember=False)
        assert after[2].health.verdict == "ok", (round_no, after[2].health.reasons)
        ledger = json.loads((tmp_path / gpuhealth.XID_LEDGER).read_text())
        assert any(": 48," in line for line in ledger["seen"])  # the event stays reported


def _read_health(remember: bool) -> None:
    simnvml.nvmlInit()
    try:
        gpuhealth.attach(simnvml, nvmlread.snapshot(simnvml), remember_xids=remember)
    finally:
        simnvml.nvmlShutdown()
