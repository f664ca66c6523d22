"""Several real GPUs: per-GPU verdicts by UUID, CUDA's device order against NVML's, and a
tensor-parallel server (one process per GPU, NCCL) launched, benchmarked, stopped, and its
orphaned ranks cleaned. Skipped on machines with fewer than two GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from gpuhelpers import gpu_count, record

from helpers import pid_alive, run_cli

pytestmark = pytest.mark.skipif(gpu_count() < 2, reason="needs two or more GPUs")

HOLD = r"""
import os, subprocess, sys, time, torch
gpu, mib, child_gpu = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.cuda.set_device(gpu)  # else synchronize() opens a context on GPU 0 too
x = torch.empty(mib * 2**20, dtype=torch.uint8, device=f"cuda:{gpu}"); torch.cuda.synchronize()
pids = [os.getpid()]
if child_gpu >= 0:  # a parent with a child on another GPU
    child = subprocess.Popen([sys.executable, __file__, str(child_gpu), str(mib), "-1"],
                             stdout=subprocess.PIPE, text=True)
    pids += [int(p) for p in child.stdout.readline().split()[1:]]
print("ready", *pids, flush=True)
time.sleep(3600)
"""

TP_SERVER = r"""
import json, os, socket, subprocess, sys, time
port, world = int(sys.argv[1]), int(sys.argv[2])
if len(sys.argv) == 3:  # the launcher: one rank process per GPU, like SGLang's schedulers
    s = socket.socket(); s.bind(("127.0.0.1", 0)); master = s.getsockname()[1]; s.close()
    ranks = [subprocess.Popen([sys.executable, sys.argv[0], str(port), str(world), str(r),
                               str(master)]) for r in range(world)]
    while True:
        time.sleep(1)
import torch, torch.distributed as dist
rank, master = int(sys.argv[3]), int(sys.argv[4])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{master}", rank=rank,
                        world_size=world)
held = torch.empty(2048 * 2**20, dtype=torch.uint8, device="cuda")  # the rank's "weights"
t = torch.ones(1, device="cuda"); dist.all_reduce(t); assert t.item() == world
print(f"rank {rank}: all_reduce across {world} GPUs ok", flush=True)
if rank:
    while True:
        time.sleep(1)
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path.startswith("/health") else 404); self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = int((body.get("sampling_params") or {}).get("max_new_tokens", 16))
        prompt = len(str(body.get("text", "")).split())
        self.send_response(200); self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            y = w @ w; torch.cuda.synchronize()  # real work on the GPU per token
            meta = {"id": "r", "prompt_tokens": prompt, "completion_tokens": i + 1,
                    "finish_reason": None if i + 1 < n else {"type": "length"}}
            chunk = {"text": " tok" * (i + 1), "meta_info": meta}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n"); self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _gpus() -> list[dict]:
    import pynvml

    pynvml.nvmlInit()
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        out.append(
            {
                "index": i,
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "v2_used_mib": pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used
                // 2**20,
                "pids": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)],
            }
        )
    pynvml.nvmlShutdown()
    return out


def _hold(tmp_path: Path, gpu: int, mib: int, child_gpu: int = -1) -> tuple[subprocess.Popen, list]:
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(gpu), str(mib), str(child_gpu)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    words = proc.stdout.readline().split()
    assert words and words[0] == "ready"
    return proc, [int(p) for p in words[1:]]


def _kind() -> str:
    return f"{gpu_count()} x {_gpus_name()}"


def _gpus_name() -> str:
    import pynvml

    pynvml.nvmlInit()
    name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    pynvml.nvmlShutdown()
    return name.decode() if isinstance(name, bytes) else name


def test_per_gpu_truth_each_gpu_its_own_verdict_by_uuid(gpu_host, tmp_path):
    count = gpu_count()
    last = count - 1
    started = []
    try:
        parent, family = _hold(tmp_path, 0, 1024, child_gpu=last)  # parent 0, child on last
        started.append(parent)
        expected = {0: {family[0]}, last: {family[1]}}
        if count > 3:
            other, pids = _hold(tmp_path, 3, 1024)
            started.append(other)
            expected[3] = set(pids)
        time.sleep(1)
        before = _gpus()
        for gpu, pids in expected.items():
            assert pids <= set(before[gpu]["pids"]), (gpu, before[gpu])
        out = run_cli("gpu-clean", "--inventory", str(gpu_host.inventory), "--grace", "5")
        assert out.returncode == 0, out.stdout + out.stderr
        after = _gpus()
        assert all(g["v2_used_mib"] == 0 and not g["pids"] for g in after), after
        rows = {ln.split()[1]: ln for ln in out.stdout.splitlines() if ln.startswith("local ")}
        for g in before:  # every GPU has its own row, named by its UUID, with its verdict
            row = rows[str(g["index"])]
            assert g["uuid"] in row and row.split()[-2:] == ["clean", "ok"]  # verdict, health
            killed = row.split()[5]
            shown = set() if killed == "-" else {int(p) for p in killed.split(",")}
            assert shown == expected.get(g["index"], set()), (g["index"], row)
            assert shown == set(before[g["index"]]["pids"])  # exactly what NVML listed there
    finally:
        for p in started:
            p.kill()

    # gpu-clean's wall time with one process holding memory on every GPU
    holders = [_hold(tmp_path, g, 1024)[0] for g in range(count)]
    try:
        start = time.perf_counter()
        out = run_cli("gpu-clean", "--inventory", str(gpu_host.inventory))
        wall = time.perf_counter() - start
        assert out.returncode == 0, out.stdout + out.stderr
        assert all(g["v2_used_mib"] == 0 for g in _gpus())
        record("multi_gpu_clean", {"kind": _kind(), "processes": count, "wall_s": round(wall, 2)})
    finally:
        for p in holders:
            p.kill()


SERVER_ON_ONE_GPU = r"""
import http.server, sys, torch
port = int(sys.argv[1])
x = torch.empty(3072 * 2**20, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _profile(tmp_path: Path, name: str, command: list[str], gpus: list[int], port: int) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engine": "custom",
                "model_path": "/none",
                "check_model_path": False,
                "port": port,
                "command": command,
                "health_timeout": 240,
                "gpus": gpus,
                "tp": len(gpus),
            }
        )
    )
    return path


def test_profile_gpus_are_nvml_gpus_and_preflight_checks_those(gpu_host, tmp_path):
    from gpufleet.sim.sshd import free_port

    last = gpu_count() - 1
    script = tmp_path / "one.py"
    script.write_text(SERVER_ON_ONE_GPU)
    inv = ["--inventory", str(gpu_host.inventory)]
    sysinfo = json.loads(run_cli("sysinfo", *inv).stdout)["local"]
    reported = {g["index"]: g["uuid"] for g in sysinfo["gpus"]}
    on_last = _profile(tmp_path, "onlast", ["{python}", str(script), "{port}"], [last], free_port())
    try:
        out = run_cli("launch", "--profile", str(on_last), *inv)
        assert out.returncode == 0, out.stdout + out.stderr
        gpus = _gpus()
        assert gpus[last]["v2_used_mib"] >= 3072 and gpus[0]["v2_used_mib"] == 0, gpus
        assert gpus[last]["uuid"] == reported[last]  # the GPU gpufleet calls `last`
        # preflight's busy check looks at the GPUs the server will use, by the same numbers
        again = _profile(
            tmp_path, "again", ["{python}", str(script), "{port}"], [last], free_port()
        )
        out = run_cli("launch", "--profile", str(again), *inv)
        assert out.returncode == 1 and f"GPU {last} is in use" in out.stderr, out.stderr
        other = _profile(tmp_path, "other", ["{python}", str(script), "{port}"], [0], free_port())
        out = run_cli("launch", "--profile", str(other), *inv)
        assert out.returncode == 0, out.stdout + out.stderr
        assert _gpus()[0]["v2_used_mib"] >= 3072
        record("device_order", {"kind": _kind(), "gpus_setting": last, "nvml_index": last})
    finally:
        run_cli("stop", *inv)
    assert all(g["v2_used_mib"] == 0 for g in _gpus())


def test_tp_server_across_gpus_launch_bench_stop_then_orphaned_ranks(gpu_host, tmp_path):
    from gpufleet.sim.sshd import free_port

    count = gpu_count()
    script = tmp_path / "tp_server.py"
    script.write_text(TP_SERVER)
    port = free_port()
    command = ["{python}", str(script), "{port}", str(count)]
    profile = _profile(tmp_path, "tpserver", command, list(range(count)), port)
    inv = ["--inventory", str(gpu_host.inventory)]
    start = time.perf_counter()
    out = run_cli("launch", "--profile", str(profile), *inv, timeout=300)
    ready_s = time.perf_counter() - start
    assert out.returncode == 0, out.stdout + out.stderr
    gpus = _gpus()
    assert all(g["v2_used_mib"] >= 2048 for g in gpus), gpus  # one rank on every GPU
    archive = tmp_path / "archive"
    out = run_cli(
        "bench", "--profile", "tpserver", "-c", "1,8", "--num-prompts", "16",
        "--output-len", "32", "--archive", str(archive), *inv, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    [run] = list((archive / "local").iterdir())
    rows = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    assert [r["max_concurrency"] for r in rows] == [1, 8] and all(r["failed"] == 0 for r in rows)
    for r in rows:  # telemetry from every GPU the server used
        samples = [json.loads(x) for x in (run / f"telemetry-c{r['max_concurrency']}.jsonl").open()]
        assert {s["gpu"] for s in samples} == set(range(count)) == set(r["gpus_sampled"])
        assert r["gpu_energy_j"] > 0 and r["joules_per_output_token"] > 0
    start = time.perf_counter()
    out = run_cli("stop", *inv)
    stop_s = time.perf_counter() - start
    assert out.returncode == 0 and "verified clean" in out.stdout, out.stdout + out.stderr
    assert all(g["v2_used_mib"] == 0 for g in _gpus())

    # SIGKILL the launcher: its ranks live on, orphaned, holding every GPU; gpu-clean ends them
    out = run_cli("launch", "--profile", str(profile), *inv, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    state = json.loads((tmp_path / "work" / "servers" / f"{port}.json").read_text())
    ranks = {p for g in _gpus() for p in g["pids"]}
    assert len(ranks) == count and state["pid"] not in ranks
    os.kill(state["pid"], signal.SIGKILL)
    time.sleep(1)
    assert all(pid_alive(p) for p in ranks)
    out = run_cli("gpu-clean", *inv, "--grace", "5")
    assert out.returncode == 0, out.stdout + out.stderr
    assert not any(pid_alive(p) for p in ranks)
    assert all(g["v2_used_mib"] == 0 and not g["pids"] for g in _gpus())
    record(
        "tp_server",
        {
            "kind": _kind(),
            "ranks": count,
            "launch_to_ready_s": round(ready_s, 1),
            "stop_to_clean_s": round(stop_s, 2),
            "bench_output_tok_s": [round(r["output_throughput"], 1) for r in rows],
            "gpus_sampled": rows[0]["gpus_sampled"],
            "joules_per_output_token": [round(r["joules_per_output_token"], 3) for r in rows],
            "avg_power_w_all_gpus": [r["gpu_power_avg_w"] for r in rows],
            "orphaned_ranks_killed": len(ranks),
        },
    )
