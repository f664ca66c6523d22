"""Issue 65.3: which GPUs a server really holds, and two servers on one GPU.

A login (or a Slurm step) with CUDA_VISIBLE_DEVICES makes CUDA's GPU 0 another card than
NVML's GPU 0; every check gpufleet makes (busy, telemetry, stop, gpu-clean) reads NVML.
Two servers launched to share a GPU: stopping one verifies its own memory freed and
leaves the other's memory and health alone. Real sshd, real processes, the rehearsal's
NVML (tests/gpu/ runs the same on a real GPU)."""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml

from gpufleet.host.gpu import visible
from gpufleet.sim import gpustate
from test_reliability import record

UUIDS = ["GPU-aaaa1111", "GPU-aaaa2222", "GPU-bbbb3333", "GPU-cccc4444"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("wanted", "pinned", "seen", "nvml", "variable"),
    [
        ([0, 1], False, None, [0, 1], None),  # nothing set: CUDA's numbers are NVML's
        ([1], True, None, [1], "1"),  # the profile names GPU 1: the server sees only it
        ([0, 1], False, "2,3", [2, 3], None),  # a Slurm step's variable, left as it is
        ([1], True, "3,2", [2], "2"),  # pinned inside what the server would see
        ([0], False, "GPU-bbbb", [2], None),  # a unique UUID prefix, as CUDA takes it
        ([0, 1], True, " 3 , GPU-aaaa1111 ", [3, 0], "3,GPU-aaaa1111"),
    ],
)
def test_cuda_numbers_become_nvml_numbers(wanted, pinned, seen, nvml, variable):
    place = visible.place(wanted, pinned, seen, "the login environment", UUIDS)
    assert place.nvml == nvml and place.variable == variable


@pytest.mark.unit
@pytest.mark.parametrize(
    ("wanted", "seen", "words"),
    [
        (
            [0, 1],
            "2",
            "asks for GPU 1, but CUDA_VISIBLE_DEVICES=2 (the login environment) "
            "shows the server 1 GPU(s) (0-0)",
        ),
        ([0], "-1", "shows the server 0 GPU(s)"),  # CUDA's way to hide every GPU
        ([0], "0,-1,2", None),  # CUDA stops at -1: GPU 0 only, fine for one
        ([0, 1], "0,-1,2", "asks for GPU 1"),
        ([0], "GPU-aaaa", "matches 2 GPUs by UUID"),
        ([0], "GPU-dddd", "matches no GPU by UUID"),
        ([0], "MIG-1234", "names a MIG instance"),
        ([0], "7", "names GPU 7, but NVML sees 4 GPU(s)"),
        ([0, 1], "2,GPU-bbbb", "lists one GPU twice"),
        ([4], None, "asks for GPU 4, but NVML sees 4 GPU(s) (0-3)"),
    ],
)
def test_gpus_that_cannot_be_found_are_one_line(wanted, seen, words):
    if words is None:
        assert visible.place(wanted, False, seen, "the login environment", UUIDS).nvml == [0]
        return
    with pytest.raises(visible.PlacementError) as exc:
        visible.place(wanted, False, seen, "the login environment", UUIDS)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def _state(fleet, host: str, port: int) -> dict:
    return json.loads((fleet.workdir(host) / "servers" / f"{port}.json").read_text())


def _holders(fleet, host: str) -> dict[int, set[int]]:
    """GPU index -> the PIDs the rehearsal's NVML lists on it."""
    out: dict[int, set[int]] = {}
    for a in gpustate.live_allocations(fleet.state_dir(host)):
        out.setdefault(a["gpu"], set()).add(a["pid"])
    return out


def _host_with_login_variable(fleet, fresh_sshd, name: str, offset: int, value) -> str:
    fleet.env(name)  # the host's simulated GPUs exist (their UUIDs) before its login does
    uuids = gpustate.read_topology(fleet.state_dir(name))["uuids"]
    text = value(uuids) if callable(value) else value
    sshd = fresh_sshd(extra_options=[f"SetEnv=CUDA_VISIBLE_DEVICES={text}"])
    fleet.add_sshd_host(name, sshd, offset)
    return text


def test_a_login_cuda_visible_devices_moves_every_check_to_the_gpus_the_server_holds(
    fleet, fresh_sshd
):
    """Before: the state, the busy check and the stop's verification named GPUs 0,1 while
    the server held 5,6 (a login with CUDA_VISIBLE_DEVICES=5,6)."""
    _host_with_login_variable(fleet, fresh_sshd, "h6", 61, "5,6")
    profile = fleet.profile("visible", tp=2)
    port = yaml.safe_load(profile.read_text())["port"] + 61
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h6")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        state = _state(fleet, "h6", port)
        assert state["gpus"] == [5, 6]
        assert set(_holders(fleet, "h6")) == {5, 6}
        assert state["env"].get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
        # a second server asking for the same cards is refused by the busy check
        other = fleet.profile("other", tp=1)
        busy = fleet.cli("launch", "--profile", str(other), "--hosts", "h6")
        assert busy.returncode == 1 and "GPU 5 is in use" in busy.stderr, busy.stderr
        assert "by gpufleet's server" in busy.stderr and "share_gpus: true" in busy.stderr
    finally:
        stop = fleet.cli("stop", "--hosts", "h6", "--grace", "2")
    assert "GPUs 5,6 verified clean" in stop.stdout, stop.stdout
    assert _holders(fleet, "h6") == {}
    record("placement_login_variable", {"state_gpus": state["gpus"], "held": [5, 6]})


def test_a_pinned_profile_counts_inside_the_login_variable_and_uuids_work(fleet, fresh_sshd):
    """`gpus: [1]` under a login's CUDA_VISIBLE_DEVICES=<uuid of 3>,<uuid of 6> is NVML's
    GPU 6; the server is given only that one (by the login's own word, its UUID)."""
    value = _host_with_login_variable(
        fleet, fresh_sshd, "h5", 57, lambda u: f"GPU-{u[3][:8]},GPU-{u[6]}"
    )
    profile = fleet.profile("pinned", tp=1, gpus=[1])
    port = yaml.safe_load(profile.read_text())["port"] + 57
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h5")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        state = _state(fleet, "h5", port)
        assert state["gpus"] == [6] and set(_holders(fleet, "h5")) == {6}
        assert state["env"]["CUDA_VISIBLE_DEVICES"] == value.split(",")[1]
    finally:
        fleet.cli("stop", "--hosts", "h5", "--grace", "2")
    too_many = fleet.profile("wide", tp=4)
    refused = fleet.cli("launch", "--profile", str(too_many), "--hosts", "h5")
    assert refused.returncode == 1
    assert f"the profile asks for GPU 2, but CUDA_VISIBLE_DEVICES={value} (the login " \
           "environment) shows the server 2 GPU(s) (0-1)" in refused.stderr, refused.stderr  # fmt: skip
    assert "Traceback" not in refused.stderr


def _health(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return r.status


def test_two_servers_share_one_gpu_and_stopping_one_leaves_the_other(fleet):
    flags = {"mem-fraction-static": 0.4}
    a = fleet.profile("share-a", tp=1, gpus=[0], share_gpus=True, flags=flags)
    b = fleet.profile("share-b", tp=1, gpus=[0], share_gpus=True, flags=flags)
    alone = fleet.profile("alone", tp=1, gpus=[0], flags=flags)
    port_a, port_b = (yaml.safe_load(p.read_text())["port"] for p in (a, b))
    try:
        for profile in (a, b):
            out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
            assert out.returncode == 0, out.stdout + out.stderr
        pid_b = _state(fleet, "h0", port_b)["pid"]
        held = _holders(fleet, "h0")
        assert list(held) == [0] and len(held[0]) == 2
        # a profile that does not say it shares is refused, naming both and the key
        refused = fleet.cli("launch", "--profile", str(alone), "--hosts", "h0")
        assert refused.returncode == 1
        assert f"server :{port_a} (share-a)" in refused.stderr
        assert f"server :{port_b} (share-b)" in refused.stderr
        assert "set `share_gpus: true` in both profiles" in refused.stderr

        stop = fleet.cli("stop", "--hosts", "h0", "--port", str(port_a), "--grace", "2")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "GPUs 0 verified free of the stopped server" in stop.stdout, stop.stdout
        assert f"left running beside it: server :{port_b} (share-b) on GPU 0" in stop.stdout
        assert _health(port_b) == 200
        after_stop = _holders(fleet, "h0")
        assert len(after_stop[0]) == 1

        clean = fleet.cli("gpu-clean", "--hosts", "h0", "--grace", "2")
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert f"gpufleet server share-b (pid {pid_b})" in clean.stdout
        assert _holders(fleet, "h0") == after_stop and _health(port_b) == 200
    finally:
        last = fleet.cli("stop", "--hosts", "h0", "--grace", "2")
    assert "GPUs 0 verified clean" in last.stdout, last.stdout
    assert _holders(fleet, "h0") == {}
    record("two_servers_one_gpu", {"held_by_b_after_a_stopped": len(after_stop[0])})


LLAMA_GPU = {"n-gpu-layers": 99}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("flags", "gpus", "every"),
    [
        ({}, [], False),  # on the CPU: no GPU to check, nor to verify after
        (LLAMA_GPU, [], True),  # llama.cpp's default, layer split: every GPU it sees
        ({**LLAMA_GPU, "split-mode": "row"}, [], True),
        ({**LLAMA_GPU, "sm": "layer", "tensor-split": "3,1"}, [], True),  # a 0 share opens it too
        ({**LLAMA_GPU, "split-mode": "none"}, [0], False),  # main-gpu's, 0 unless said
        ({**LLAMA_GPU, "sm": "none", "main-gpu": 2}, [2], False),
        ({**LLAMA_GPU, "sm": "none", "mg": -1}, [], False),  # llama.cpp: no GPU at all
        ({**LLAMA_GPU, "device": "CUDA1,CUDA3"}, [1, 3], False),
        ({**LLAMA_GPU, "dev": "CUDA1,CUDA3", "sm": "none", "mg": 1}, [3], False),
        ({**LLAMA_GPU, "device": "none"}, [], False),
        ({**LLAMA_GPU, "device": "Vulkan0"}, [], True),  # not NVML's to number: all of them
    ],
)
def test_a_llama_cpp_profile_claims_the_gpus_its_split_puts_work_on(tmp_path, flags, gpus, every):
    """Issue 65.1: a llama.cpp profile's spec said GPU 0 (its tp) while the server spread
    over every GPU it saw, so gpu-clean, the health gate and telemetry missed the others."""
    from gpufleet.control.inventory.model import Host
    from gpufleet.control.server.profiles import build_specs, load_profile

    (tmp_path / "l.yaml").write_text(
        yaml.safe_dump({"engine": "llamacpp", "model_path": "/m.gguf", "flags": flags})
    )
    host = Host(name="h", address="192.0.2.10", python="/usr/bin/python3")
    [(_, spec)] = build_specs(load_profile("l", tmp_path), [host])
    assert (spec.gpus, spec.gpus_every, spec.needs_gpu) == (gpus, every, flags != {})


@pytest.mark.unit
@pytest.mark.parametrize(
    ("variable", "nvml"),
    [(None, [0, 1, 2, 3]), ("3,1", [3, 1]), ("GPU-cccc,0", [3, 0])],
)
def test_every_gpu_the_server_sees_is_listed_in_nvmls_numbering(tmp_path, monkeypatch, variable,
                                                                 nvml):  # fmt: skip
    """Issue 65.1: the host lists what `every GPU` means there, from the server's own
    CUDA_VISIBLE_DEVICES (a Slurm step's, the login's, the profile's) or NVML's count."""
    spec = _placed_every(tmp_path, monkeypatch, variable)
    assert spec.gpus == nvml


@pytest.mark.unit
def test_every_gpu_of_none_seen_is_one_line(tmp_path, monkeypatch):
    from gpufleet.host.agent.protocol import AgentError

    with pytest.raises(AgentError) as exc:
        _placed_every(tmp_path, monkeypatch, "-1")
    assert "would see no GPU (CUDA_VISIBLE_DEVICES=-1" in str(exc.value)


def _placed_every(tmp_path, monkeypatch, variable):
    """A spec whose server holds every GPU it sees, placed on four rehearsal GPUs."""
    from gpufleet.host.agent import childenv
    from gpufleet.host.gpu import nvml as nvmlread
    from gpufleet.host.server import placement
    from gpufleet.records import LaunchSpec
    from helpers import simulated_nvml

    monkeypatch.setattr(childenv, "login_env", lambda: ({}, []))
    uuids = nvmlread.uuids(simulated_nvml(tmp_path, monkeypatch, 4))
    monkeypatch.setattr(nvmlread, "uuids", lambda nvml: UUIDS)  # known prefixes
    assert len(uuids) == len(UUIDS)
    env = {} if variable is None else {visible.VARIABLE: variable}
    spec = LaunchSpec(profile="l", engine="llamacpp", argv=["llama-server"], env=env,
                      host="127.0.0.1", port=1, health_host="127.0.0.1", health_path="/health",
                      model_path="/m", check_model_path=False, gpus=[], log="l.log",
                      gpus_every=True)  # fmt: skip
    return placement.placed(spec)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("engine", "flags", "slots"),
    [("llamacpp", {"parallel": 1}, 1), ("sglang", {"max-running-requests": 1}, 1),
     ("vllm", {"max-num-seqs": 1}, 1), ("llamacpp", {"parallel": True}, None)],
)  # fmt: skip
def test_a_flag_of_value_one_is_a_number_not_a_bare_flag(engine, flags, slots):
    """`parallel: 1` read as a bare flag (1 == True in Python): one slot said unknown, and
    `main-gpu: 1` as GPU 0."""
    from gpufleet.control.server import engines

    assert engines.engine(engine).slots(flags) == slots
