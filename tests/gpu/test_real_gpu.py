"""gpu-clean and launch against real NVML and real GPU memory (run on the lent H200)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from gpuhelpers import nvml_memory, record

from helpers import REPO, pid_alive, run_cli


def _other_user() -> int | None:
    """A second Unix user for the --all-users case (created if we are root)."""
    try:
        return pwd.getpwnam("gpufleet-other").pw_uid
    except KeyError:
        pass
    if os.geteuid() != 0:
        return None
    made = subprocess.run(["useradd", "--no-create-home", "gpufleet-other"], capture_output=True)
    return pwd.getpwnam("gpufleet-other").pw_uid if made.returncode == 0 else None


def test_idle_gpu_is_clean_by_v2_although_v1_is_not_zero(gpu_host):
    before = nvml_memory()
    record("idle_nvml", before)
    assert all(g["v2_used_mib"] == 0 for g in before), "GPU not idle at test start"
    assert all(g["v1_used_mib"] > 100 for g in before)  # the driver's reservation
    out = run_cli("gpu-clean", "--inventory", str(gpu_host.inventory))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "local: verified clean" in out.stdout


def test_gpu_clean_kills_real_gpu_processes(gpu_host):
    _parent, parent_pids = gpu_host.hold("parent", 2048)  # parent + child, both on the GPU
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen([sys.executable, sys.argv[1], 'leaf', '1024'],"
            " stdout=subprocess.PIPE, text=True, start_new_session=True);"
            " print(p.stdout.readline().strip(), flush=True)",
            str(gpu_host.script),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    orphan_pids = [int(p) for p in launcher.stdout.readline().split()[1:]]
    launcher.wait()
    assert psutil.Process(orphan_pids[0]).ppid() != launcher.pid  # re-parented away
    _freed, freed_pids = gpu_host.hold("freed", 1024)  # tensors freed, CUDA context kept
    time.sleep(1)
    held = nvml_memory()
    record("held_before_clean", held)
    ctx_only = [g for g in held]  # the freed process still shows in NVML's list
    assert any(freed_pids[0] in g["pids"] for g in ctx_only)

    other_uid = _other_user()
    other_pids: list[int] = []
    if other_uid is not None:
        _, other_pids = gpu_host.hold("leaf", 512, user=other_uid)
    record("other_user_process", bool(other_pids))

    dry = run_cli("gpu-clean", "--inventory", str(gpu_host.inventory), "--dry-run")
    assert dry.returncode == 0
    assert all(pid_alive(p) for p in parent_pids + orphan_pids + freed_pids + other_pids)

    n = len(parent_pids + orphan_pids + freed_pids)
    start = time.perf_counter()
    out = run_cli("gpu-clean", "--inventory", str(gpu_host.inventory), "--grace", "5")
    wall = time.perf_counter() - start
    for pid in parent_pids + orphan_pids + freed_pids:
        assert not pid_alive(pid), out.stdout + out.stderr
    if other_pids:
        assert out.returncode == 1 and all(pid_alive(p) for p in other_pids)
        assert "owned by gpufleet-other (use --all-users)" in out.stdout
        start = time.perf_counter()
        out = run_cli("gpu-clean", "--inventory", str(gpu_host.inventory), "--all-users")
        wall_all = time.perf_counter() - start
        assert not any(pid_alive(p) for p in other_pids)
        record("clean_all_users_wall_s", round(wall_all, 2))
    assert out.returncode == 0, out.stdout + out.stderr
    after = nvml_memory()
    record("after_clean", after)
    record("clean_wall_s", {"processes": n, "seconds": round(wall, 2)})
    assert all(g["v2_used_mib"] == 0 and not g["pids"] for g in after)


SERVER = r"""
import http.server, sys, time, torch
port, delay, mib = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
x = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("allocated", mib, "MiB", flush=True)
ready_at = time.time() + delay
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if time.time() >= ready_at else 503); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_launch_real_gpu_server_then_stop_clean(gpu_host, tmp_path):
    from gpufleet.sim.sshd import free_port

    port = free_port()
    profile = tmp_path / "gpuserver.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "engine": "custom",
                "model_path": "/none",
                "check_model_path": False,
                "port": port,
                "command": ["{python}", "-c", SERVER, "{port}", "3", "4096"],
                "health_timeout": 120,
                "gpus": [0],
            }
        )
    )
    start = time.perf_counter()
    out = run_cli("launch", "--profile", str(profile), "--inventory", str(gpu_host.inventory))
    launch_wall = time.perf_counter() - start
    assert out.returncode == 0, out.stdout + out.stderr
    assert "local: starting" in out.stdout and "local: READY gpuserver" in out.stdout
    held = nvml_memory()[0]
    assert held["v2_used_mib"] >= 4096 and held["pids"]
    # the server sees the GPUs in NVML's (PCI bus) order: `gpus: [0]` is NVML's GPU 0
    environ = Path(f"/proc/{held['pids'][0]}/environ").read_bytes().split(b"\0")
    assert b"CUDA_DEVICE_ORDER=PCI_BUS_ID" in environ and b"CUDA_VISIBLE_DEVICES=0" in environ
    start = time.perf_counter()
    out = run_cli("stop", "--inventory", str(gpu_host.inventory))
    stop_wall = time.perf_counter() - start
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verified clean" in out.stdout
    assert nvml_memory()[0]["v2_used_mib"] == 0
    record(
        "launch_stop",
        {
            "launch_wall_s": round(launch_wall, 2),
            "server_delay_s": 3,
            "stop_to_clean_wall_s": round(stop_wall, 2),
            "held_mib": held["v2_used_mib"],
        },
    )


def test_expected_gpu_count_mismatch(gpu_host):
    gpu_host.write(expected=8)
    out = run_cli("gpu-clean", "--inventory", str(gpu_host.inventory))
    assert out.returncode == 1
    if gpu_host.count != 8:
        assert f"local: FAILED: expected 8 GPUs, NVML sees {gpu_host.count}" in out.stderr
    else:
        pytest.fail("this machine has 8 GPUs: the mismatch case needs another count")


def test_shipped_local_inventory_works_here():
    out = run_cli("status", "--inventory", str(REPO / "hosts/local.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NVIDIA" in out.stdout


def test_a_real_gpu_process_in_another_pid_namespace_is_another_tenants(gpu_host):
    """A torch process in its own PID namespace (as a container's): NVML names it by its host
    PID; gpu-clean leaves it alone unless --all-tenants, then SIGKILL (a namespace's init
    ignores SIGTERM from outside) and the GPU reads 0 MiB again."""
    tenant = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
         "import time, torch; x = torch.empty(2**31, dtype=torch.uint8, device='cuda');"
         " torch.cuda.synchronize(); print('ready', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert tenant.stdout.readline().strip() == "ready"
        [holder] = nvml_memory()[0]["pids"]
        assert Path(f"/proc/{holder}/ns/pid").resolve() != Path("/proc/self/ns/pid").resolve()
        out = run_cli(
            "gpu-clean", "--inventory", str(gpu_host.inventory), "--grace", "2", "--timeout", "5"
        )
        assert out.returncode == 1, out.stdout + out.stderr
        assert f"left {holder} alone: in another PID namespace" in out.stdout
        assert pid_alive(holder) and nvml_memory()[0]["v2_used_mib"] >= 2048
        start = time.perf_counter()
        out = run_cli(
            "gpu-clean", "--inventory", str(gpu_host.inventory), "--grace", "2", "--all-tenants"
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"{holder} (SIGKILL after 2s)" in out.stdout
        assert nvml_memory()[0]["v2_used_mib"] == 0
        record(
            "other_tenant",
            {"refused": 1, "killed_with_all_tenants": 1,
             "clean_wall_s": round(time.perf_counter() - start, 2)},
        )  # fmt: skip
    finally:
        tenant.kill()
        tenant.wait()


def test_telemetry_on_a_real_gpu_load_counter_agrees_with_power(gpu_host, tmp_path):
    """A custom-engine server doing a real 8192^2 fp16 matmul per token: GPU telemetry during
    `inv bench`, the energy counter against the integral of sampled power, J/token."""
    import json

    import pynvml
    from test_multi_gpu import TP_SERVER

    from gpufleet.host.bench import telemetry
    from gpufleet.sim.sshd import free_port

    pynvml.nvmlInit()
    with telemetry.Sampler(pynvml, [0], 0.25) as idle:
        time.sleep(3)
    idle_w = telemetry.summarize(idle.rows, 1)["gpu_power_avg_w"]
    script = tmp_path / "server.py"
    script.write_text(TP_SERVER.replace("4096, 4096", "8192, 8192"))
    port = free_port()
    profile = tmp_path / "watts.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "engine": "custom", "model_path": "/none", "check_model_path": False,
                "port": port, "command": ["{python}", str(script), "{port}", "1"],
                "health_timeout": 240, "gpus": [0],
            }
        )
    )  # fmt: skip
    inv = ["--inventory", str(gpu_host.inventory)]
    assert run_cli("launch", "--profile", str(profile), *inv, timeout=300).returncode == 0
    try:
        out = run_cli(
            "bench", "--profile", "watts", "-c", "1,8", "--num-prompts", "16",
            "--output-len", "1024", "--telemetry-interval", "0.2",
            "--archive", str(tmp_path / "a"), *inv, timeout=500,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        run_cli("stop", *inv)
    [run] = list((tmp_path / "a" / "local").iterdir())
    rows = {r["max_concurrency"]: r for r in map(json.loads, (run / "results.jsonl").open())}
    figures = {"idle_w": idle_w}
    keys = ("gpu_energy_j", "gpu_energy_integrated_j", "gpu_power_avg_w", "gpu_power_peak_w",
            "gpu_util_avg", "joules_per_output_token", "output_throughput", "duration")  # fmt: skip
    for c, row in rows.items():
        figures[f"c{c}"] = {k: row[k] for k in keys}
        record("telemetry", figures)
        agreement = row["gpu_energy_j"] / row["gpu_energy_integrated_j"] - 1
        assert abs(agreement) < 0.05, (c, figures)
        assert 0 < row["joules_per_output_token"] < 10, row
        assert row["gpu_power_avg_w"] > idle_w
        figures[f"c{c}"]["counter_vs_integral"] = round(agreement, 4)
    assert rows[8]["gpu_util_avg"] >= rows[1]["gpu_util_avg"]
    record("telemetry", figures)
