"""Issue 65.3 on a real GPU: two servers on one GPU (each its own port), where stopping and
cleaning one leaves the other's memory and health alone; and CUDA_VISIBLE_DEVICES naming
the GPU by its UUID, as a Slurm step or a login may, read into NVML's numbering. Each
server is a torch process holding real memory behind /health (test_real_gpu.SERVER)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import yaml
from gpuhelpers import nvml_memory, record
from test_real_gpu import SERVER

from helpers import run_cli


def _profile(tmp_path: Path, name: str, mib: int, **fields) -> tuple[Path, int]:
    from gpufleet.sim.sshd import free_port

    port = free_port()
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "engine": "custom", "model_path": "/none", "check_model_path": False, "port": port,
        "command": ["{python}", "-c", SERVER, "{port}", "1", str(mib)],
        "health_timeout": 120, **fields,
    }))  # fmt: skip
    return path, port


def _smi_apps() -> dict[int, int]:
    """nvidia-smi's own view: PID -> MiB on any GPU."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {int(p): int(m) for p, m in (ln.split(", ") for ln in out.splitlines() if ln.strip())}


def _health(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return r.status


def test_two_servers_on_one_gpu_stop_and_clean_one_leave_the_other(gpu_host, tmp_path):
    a, port_a = _profile(tmp_path, "share-a", 3072, gpus=[0], share_gpus=True)
    b, port_b = _profile(tmp_path, "share-b", 2048, gpus=[0], share_gpus=True)
    inv = ("--inventory", str(gpu_host.inventory))
    try:
        for profile in (a, b):
            out = run_cli("launch", "--profile", str(profile), *inv)
            assert out.returncode == 0, out.stdout + out.stderr
        both = nvml_memory()[0]
        assert len(both["pids"]) == 2 and both["v2_used_mib"] >= 5120
        smi_both = _smi_apps()
        start = time.perf_counter()
        stop = run_cli("stop", "--port", str(port_a), *inv)
        stop_s = time.perf_counter() - start
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "verified free of the stopped server" in stop.stdout, stop.stdout
        assert f"left running beside it: server :{port_b} (share-b) on GPU 0" in stop.stdout
        one = nvml_memory()[0]
        smi_one = _smi_apps()
        assert len(one["pids"]) == 1 and _health(port_b) == 200
        assert 2048 <= one["v2_used_mib"] < both["v2_used_mib"]
        clean = run_cli("gpu-clean", *inv)
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "left the live gpufleet server share-b" in clean.stdout
        kept = nvml_memory()[0]
        assert kept["pids"] == one["pids"] and _health(port_b) == 200
    finally:
        last = run_cli("stop", *inv)
    assert "verified clean" in last.stdout, last.stdout
    after = nvml_memory()[0]
    assert after["v2_used_mib"] == 0 and not after["pids"] and _smi_apps() == {}
    record("two_servers_one_gpu", {
        "both_v2_used_mib": both["v2_used_mib"], "both_smi": smi_both,
        "after_stop_a_v2_used_mib": one["v2_used_mib"], "after_stop_a_smi": smi_one,
        "after_gpu_clean_v2_used_mib": kept["v2_used_mib"], "stop_a_wall_s": round(stop_s, 2),
        "after_all_v2_used_mib": after["v2_used_mib"],
    })  # fmt: skip


def test_cuda_visible_devices_by_uuid_is_read_into_nvml_numbers(gpu_host, tmp_path, monkeypatch):
    import pynvml

    pynvml.nvmlInit()
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(gpu_host.count - 1))
    pynvml.nvmlShutdown()
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    inv = ("--inventory", str(gpu_host.inventory))
    # the login names the last GPU by a prefix of its UUID, as CUDA accepts it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid[:12])
    profile, port = _profile(tmp_path, "by-uuid", 1024)
    try:
        out = run_cli("launch", "--profile", str(profile), *inv)
        assert out.returncode == 0, out.stdout + out.stderr
        memory = nvml_memory()
        assert memory[-1]["v2_used_mib"] >= 1024 and memory[-1]["pids"]
        state = yaml.safe_load((tmp_path / "work" / "servers" / f"{port}.json").read_text())
        assert state["gpus"] == [gpu_host.count - 1]
    finally:
        stop = run_cli("stop", *inv)
    assert f"GPUs {gpu_host.count - 1} verified clean" in stop.stdout, stop.stdout
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffffffff")
    refused = run_cli("launch", "--profile", str(profile), *inv)
    assert refused.returncode == 1
    assert "entry 'GPU-ffffffff' matches no GPU by UUID" in refused.stderr, refused.stderr
    record("cuda_visible_devices_uuid", {"gpu": gpu_host.count - 1, "prefix": uuid[:12]})
