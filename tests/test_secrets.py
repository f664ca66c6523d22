"""Secrets on a shared host (issue 22.2-22.4): a canary in every secret-bearing field, then
every byte gpufleet prints and every file it writes, on both sides, is scanned for them.

Over real sshd on simulated hosts whose rehearsal server enforces the API key as SGLang
0.5.23 does (401 without `Authorization: Bearer`).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from helpers import REPO, run_cli
from test_reliability import record

CANARIES = {
    "api_key": "CANARYapi7f3a9d",
    "admin_key": "CANARYadm51c2e8",
    "url_password": "CANARYurl88d1b0",
    "env_known": "CANARYenv0e7b44",
    "env_declared": "CANARYdec4a21f9",
    "inventory_var": "CANARYinv93bd12",
}
SIM = {"load-seconds": 0.3, "warmup-seconds": 0.1}


def _keyed_profile(fleet, name: str, **extra):
    return fleet.profile(
        name,
        tp=1,
        sim={**SIM, **extra.pop("sim", {})},
        flags={
            "api-key": CANARIES["api_key"],
            "admin-api-key": CANARIES["admin_key"],
            "tokenizer-path": f"https://hf-user:{CANARIES['url_password']}@hub.example/tok",
            "enable-metrics": True,
        },
        env={"HF_TOKEN": CANARIES["env_known"], "MY_ODD_VAR": CANARIES["env_declared"]},
        secret_env=["MY_ODD_VAR"],
        **extra,
    )


def _http(url: str, key: str | None = None, method: str = "GET", body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    if data:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _hits(text: str) -> list[str]:
    return [name for name, value in CANARIES.items() if value in text]


def _scan_files(root: Path, allowed: set[Path]) -> tuple[int, list[str]]:
    """(files scanned, 'path: canary' hits) under root, skipping the allowed files."""
    count, hits = 0, []
    for path in root.rglob("*"):
        if not path.is_file() or path in allowed:
            continue
        count += 1
        text = path.read_bytes().decode(errors="replace")
        hits += [f"{path}: {name}" for name in _hits(text)]
    return count, hits


@pytest.mark.slow(minutes=2)
def test_canaries_never_reach_a_terminal_a_file_or_ps(fleet, tmp_path, monkeypatch):
    data = yaml.safe_load(fleet.inventory.read_text())
    data["defaults"]["vars"] = {"hub_password": CANARIES["inventory_var"]}
    fleet.inventory.write_text(yaml.safe_dump(data))
    archive = tmp_path / "a"
    keyed = _keyed_profile(fleet, "keyed")
    port = yaml.safe_load(keyed.read_text())["port"]
    outputs: list[tuple[str, subprocess.CompletedProcess]] = []

    def cli(*args: str, expect: int = 0, timeout: float = 300, hosts: bool = True):
        out = fleet.cli(*args, timeout=timeout) if hosts else run_cli(*args, timeout=timeout)
        outputs.append((" ".join(args[:3]), out))
        assert out.returncode == expect, (args, out.stdout[-3000:], out.stderr[-3000:])
        return out

    cli("launch", "--profile", str(keyed), "--hosts", "h0", "--dry-run")
    cli("launch", "--profile", str(keyed), "--hosts", "h0")
    state = json.loads((fleet.workdir("h0") / "servers" / f"{port}.json").read_text())

    # 22.3: the keys are not in the server's command line (ps), but in its 0600 key file
    cmdline = Path(f"/proc/{state['pid']}/cmdline").read_bytes().decode()
    assert not _hits(cmdline), cmdline
    assert "--config" in cmdline and state["secrets_in_argv"] is False
    key_file = Path(state["key_file"])
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    # 22.4: the rehearsal server refuses what SGLang refuses
    base = f"http://127.0.0.1:{port}"
    gen = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    assert _http(base + "/generate", None, "POST", gen) == 401
    assert _http(base + "/generate", "wrong-key", "POST", gen) == 401
    assert _http(base + "/generate", CANARIES["api_key"], "POST", gen) == 200
    assert _http(base + "/server_info") == 401
    assert _http(base + "/health") == 200 and _http(base + "/metrics") == 200
    assert _http(base + "/flush_cache", CANARIES["api_key"], "POST") == 401  # admin key set
    assert _http(base + "/flush_cache", CANARIES["admin_key"], "POST") == 200

    # ... and gpufleet's own client sends the key: every request completes
    out = cli("bench", "--hosts", "h0", "--profile", "keyed", "-c", "1,4", "--num-prompts",
              "8", "--output-len", "8", "--archive", str(archive))  # fmt: skip
    [run_dir] = (archive / "h0").iterdir()
    rows = [json.loads(ln) for ln in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r["completed"] for r in rows] == [8, 8] and rows[0]["server_info"]
    # --client local takes the key from the variable the user names
    monkeypatch.setenv("GF_TEST_KEY", CANARIES["api_key"])
    env_run = subprocess.run(
        [sys.executable, "-m", "gpufleet", "bench", "--client", "local", "--url", base,
         "--api-key-env", "GF_TEST_KEY", "-c", "2", "--num-prompts", "4", "--output-len", "8",
         "--archive", str(archive)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    outputs.append(("bench --client local", env_run))
    assert env_run.returncode == 0, env_run.stdout + env_run.stderr
    assert "(done)" in env_run.stdout

    cli("logs", "--hosts", "h0", "--profile", "keyed")
    cli("status", "--hosts", "h0", "--json")
    cli("status", "--hosts", "h0")
    cli("gpu-clean", "--hosts", "h0", "--dry-run", "--json")
    cli("gpu-clean", "--hosts", "h0", "--include-running", "--dry-run")
    cli("stop", "--hosts", "h0")

    # a crash while loading: the tail relays the server's echo of its arguments, scrubbed
    crash = _keyed_profile(fleet, "keyedcrash", sim={"crash-during-load": True})
    out = cli("launch", "--profile", str(crash), "--hosts", "h1", expect=1)
    assert "api_key='***'" in out.stderr and "Initialization failed" in out.stderr

    # a sweep, its compare and report, with keyed servers on both sides
    other = _keyed_profile(fleet, "keyed2")
    cli("sweep", "--profiles", f"{keyed},{other}", "--hosts", "h2", "-c", "1,2",
        "--num-prompts", "4", "--output-len", "8", "--archive", str(archive))  # fmt: skip
    cli("compare", "keyed", "keyed2", "--archive", str(archive), hosts=False)
    cli("report", "--latest", "--archive", str(archive), hosts=False)

    printed = [
        f"{what}: {name}" for what, out in outputs for name in _hits(out.stdout + out.stderr)
    ]
    # allowed to hold them: the server's own log and its key file (the --config it reads)
    allowed = {p for h in fleet.names for p in (fleet.workdir(h) / "servers").glob("*.keys.yaml")}
    logs = {p for h in fleet.names for p in (fleet.workdir(h) / "logs").glob("*.log")}
    for path in allowed | logs:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    scanned, in_files = 0, []
    for root in (archive, *(fleet.workdir(h) for h in fleet.names)):
        count, hits = _scan_files(root, allowed | logs)
        scanned += count
        in_files += hits
    record(
        "secrets_canary_scan",
        {
            "commands": len(outputs),
            "files": scanned,
            "printed_hits": printed,
            "file_hits": in_files,
        },
    )
    assert printed == [] and in_files == []


def test_an_engine_without_config_keeps_the_key_in_argv_and_says_so(fleet, tmp_path):
    keyed = _keyed_profile(fleet, "argvkey")
    port = yaml.safe_load(keyed.read_text())["port"] + 7
    out = fleet.cli("launch", "--profile", str(keyed), "--hosts", "h1", "--skip-flag-check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "takes its API key only on the command line" in out.stdout + out.stderr
    assert CANARIES["api_key"] not in out.stdout + out.stderr
    state = json.loads((fleet.workdir("h1") / "servers" / f"{port}.json").read_text())
    assert state["secrets_in_argv"] is True
    archive = tmp_path / "a"
    bench = fleet.cli("bench", "--hosts", "h1", "-c", "2", "--num-prompts", "4",
                      "--output-len", "8", "--archive", str(archive))  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    [run_dir] = (archive / "h1").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["server"]["secrets_in_argv"] is True
    assert CANARIES["api_key"] not in (run_dir / "manifest.json").read_text()
    assert fleet.cli("stop", "--hosts", "h1").returncode == 0


def test_scrubbing_rules_on_text_gpufleet_relays():
    from gpufleet.host.agent.redact import redact_text

    key = CANARIES["api_key"]
    lines = [
        f"server_args=ServerArgs(api_key='{key}', admin_api_key=None, max_running_requests=48)",
        json.dumps({"line": f"ServerArgs(api_key='{key}')", "token_usage": 0.42}),
        f"env: HF_TOKEN={key} NCCL_DEBUG=WARN",
        f"python -m sglang.launch_server --api-key {key} --port 30000",
        json.dumps(["--api-key", key]),
        f"https://user:{key}@hub.example/x",
    ]
    for text in lines:
        assert key not in redact_text(text), text
    kept = '{"token_usage": 0.42, "max_new_tokens": 12, "admin_api_key": null}'
    assert redact_text(kept) == kept
    assert not os.environ.get("GF_TEST_KEY")
