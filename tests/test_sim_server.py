"""The rehearsal engine's SGLang-compatible server, over real HTTP and real processes."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from gpufleet.control.server import engines
from gpufleet.host.server import probe as healthprobe
from gpufleet.sim import gpustate
from gpufleet.sim.server import READY_LINE
from helpers import REPO, pid_alive


def get(url: str) -> tuple[int, bytes]:
    """GET through gpufleet's probe: polling a port still closed must never self-connect."""
    return healthprobe.get(url, timeout=10)


def post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post_ignoring_disconnect(url: str, body: dict) -> None:
    """For requests to a server that is about to crash: a cut-off stream is expected."""
    import http.client

    try:
        post(url, body)
    except (OSError, http.client.HTTPException):
        pass


def sse(raw: bytes) -> list:
    chunks = [c for c in raw.decode().split("\n\n") if c]
    assert chunks[-1] == "data: [DONE]"
    return [json.loads(c.removeprefix("data: ")) for c in chunks[:-1]]


def schedulers(server) -> list[psutil.Process]:
    kids = psutil.Process(server.proc.pid).children()
    return [p for p in kids if p.cmdline() and p.cmdline()[0].startswith("sglang::")]


def test_startup_phases_like_sglang(sim_server):
    server = sim_server("--tp", "2", load=1.0, ready=False)
    phases = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            phases.append(get(server.url + "/health")[0])
        except OSError:
            phases.append("refused")
        if phases[-1] == 200:
            break
        time.sleep(0.05)
    assert phases[0] == "refused" and phases[-1] == 200
    assert 503 in phases
    assert phases.index(503) > phases.index("refused")
    assert READY_LINE in server.text()
    assert get(server.url + "/ping")[0] == 200


def test_processes_and_memory_like_sglang(sim_server):
    server = sim_server("--tp", "4", "--mem-fraction-static", "0.5")
    names = sorted(p.cmdline()[0] for p in schedulers(server))
    assert names == ["sglang::detokenizer"] + [f"sglang::scheduler_TP{i}" for i in range(4)]
    allocs = gpustate.live_allocations(server.state_dir)
    assert sorted(a["gpu"] for a in allocs) == [0, 1, 2, 3]
    assert all(a["mib"] == int((143771 - 615) * 0.5) for a in allocs)
    assert "sglang.launch_server" in " ".join(psutil.Process(server.proc.pid).cmdline())

    kids = schedulers(server)
    os.killpg(server.proc.pid, signal.SIGTERM)
    server.proc.wait(10)
    psutil.wait_procs(kids, timeout=5)
    assert not any(pid_alive(k.pid) for k in kids)
    assert gpustate.live_allocations(server.state_dir) == []


def test_sigkill_of_launcher_orphans_schedulers_for_gpu_clean(sim_server, tmp_path):
    server = sim_server("--tp", "2")
    kids = schedulers(server)
    server.proc.kill()  # SIGKILL the launcher alone, as `kill -9 <pid>` would
    server.proc.wait()
    time.sleep(0.2)
    assert all(pid_alive(k.pid) for k in kids)
    assert len(gpustate.live_allocations(server.state_dir)) == 2

    from gpufleet.host.proc import gpuprocs as procs

    found = procs.find_pattern_matches(engines.process_patterns(), str(server.state_dir))
    assert {k.pid for k in kids} <= set(found)
    tree, _ = procs.collect_trees(found, procs.KillPolicy(frozenset(procs.protected_pids())))
    procs.kill_trees(tree, grace_s=2)
    assert gpustate.live_allocations(server.state_dir) == []


def test_generate_streaming_and_not(sim_server):
    server = sim_server()
    status, raw = post(
        server.url + "/generate",
        {
            "text": "def add(a, b):",
            "stream": True,
            "sampling_params": {"max_new_tokens": 12, "ignore_eos": True, "temperature": 0},
        },
    )
    assert status == 200
    chunks = sse(raw)
    assert len(chunks) == 12
    texts = [c["text"] for c in chunks]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(11))  # cumulative
    last = chunks[-1]["meta_info"]
    assert last["completion_tokens"] == 12 and last["prompt_tokens"] == 4
    assert last["finish_reason"] == {"type": "length", "length": 12}
    assert last["e2e_latency"] > 0 and "cached_tokens" in last

    status, raw = post(
        server.url + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 5}}
    )
    body = json.loads(raw)
    assert body["meta_info"]["completion_tokens"] == 5 and len(body["text"].split()) == 5


def test_speculative_chunks_cap_and_accept_length(sim_server):
    server = sim_server(
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-draft-tokens",
        "16",
        "--speculative-draft-model-path",
        "/models/draft",
    )
    assert "Max running requests is reset to 48 for speculative decoding" in server.text()
    _status, raw = post(
        server.url + "/generate",
        {"text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 200}},
    )
    chunks = sse(raw)
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts[-1] == 200
    assert len(chunks) < 150  # several tokens per chunk
    assert max(b - a for a, b in zip([0, *counts], counts, strict=False)) > 1
    assert chunks[-1]["meta_info"]["spec_verify_ct"] == len(chunks)
    info = json.loads(get(server.url + "/get_server_info")[1])
    assert info["max_running_requests"] == 48
    assert 1.5 < info["internal_states"][0]["avg_spec_accept_length"] < 3.5
    assert json.loads(get(server.url + "/server_info")[1])["speculative_algorithm"] == "EAGLE3"

    explicit = sim_server("--speculative-algorithm", "EAGLE3", "--max-running-requests", "64")
    assert "reset to 48" not in explicit.text()


def test_openai_endpoints_usage_only_when_asked(sim_server):
    server = sim_server()
    _, raw = post(
        server.url + "/v1/completions",
        {"model": "m", "prompt": "abc", "max_tokens": 3, "stream": True},
    )
    chunks = sse(raw)
    assert all(c["choices"] for c in chunks)  # bench_serving reads choices[0] on every chunk
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    _, raw = post(
        server.url + "/v1/completions",
        {
            "prompt": "abc",
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = sse(raw)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    _, raw = post(
        server.url + "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = sse(raw)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]).split()
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    _, raw = post(
        server.url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    body = json.loads(raw)
    assert body["usage"]["completion_tokens"] == 2 and body["choices"][0]["message"]["content"]
    models = json.loads(get(server.url + "/v1/models")[1])
    assert models["data"][0]["id"] == "/models/sim"
    assert json.loads(get(server.url + "/get_model_info")[1])["model_path"] == "/models/sim"
    assert get(server.url + "/metrics")[0] == 404
    assert get(server.url + "/flush_cache")[0] == 200


def test_metrics_with_enable_metrics(sim_server):
    server = sim_server("--enable-metrics")
    post(server.url + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 3}})
    status, raw = get(server.url + "/metrics")
    text = raw.decode()
    assert status == 200
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:token_usage",
        "sglang:generation_tokens_total",
    ):
        assert name in text
    assert 'sglang:generation_tokens_total{model_name="/models/sim"} 3.0' in text


def test_trace_gives_ground_truth_emission_times(sim_server):
    server = sim_server()
    start = time.time()
    _, raw = post(
        server.url + "/generate",
        {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 6}},
    )
    rid = sse(raw)[0]["meta_info"]["id"]
    trace = json.loads(get(server.url + f"/sim/trace/{rid}")[1])
    times = trace["emit_times"]
    assert len(times) == 6 and times == sorted(times) and times[0] >= start
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # ~16.6 ms steps at batch 1, paced on an absolute clock (sim/timing.py): never ahead of
    # the schedule, but a step after a stalled one catches up (27.7 then 7.0 ms beside a busy
    # CI run), so the k-th token is judged from the first, and the typical gap
    assert all(times[k] - times[0] > 0.010 * k for k in range(1, len(times))), gaps
    assert 0.010 < statistics.median(gaps) < 0.05, gaps


def test_crash_injection_leaves_orphans_and_the_seeds_error(sim_server):
    server = sim_server("--tp", "2", "--sim-crash-at-batch", "2", "--max-running-requests", "8")
    kids = schedulers(server)
    import threading

    threads = [
        threading.Thread(
            target=post_ignoring_disconnect,
            args=(
                server.url + "/generate",
                {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 50}},
            ),
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    assert server.proc.wait(15) == 1
    for t in threads:
        t.join(10)
    log = server.text()
    assert "The size of tensor a (160) must match the size of tensor b (2)" in log
    assert "Traceback (most recent call last)" in log
    assert all(pid_alive(k.pid) for k in kids)
    for k in kids:
        k.kill()


def test_crash_during_load(sim_server):
    server = sim_server("--sim-crash-during-load", ready=False)
    assert server.proc.wait(15) == 1
    assert "Initialization failed. warmup error" in server.text()


def test_node_rank_one_answers_health_always(sim_server):
    server = sim_server("--nnodes", "2", "--node-rank", "1", "--tp", "4", ready=False, load=0.1)
    deadline = time.monotonic() + 10
    first = None
    while time.monotonic() < deadline and first is None:
        try:
            first = get(server.url + "/health")[0]
        except OSError:
            time.sleep(0.02)
    assert first == 200
    assert sorted(p.cmdline()[0] for p in schedulers(server))[1:] == [
        "sglang::scheduler_TP2",
        "sglang::scheduler_TP3",
    ]


def test_unknown_flag_fails_like_argparse():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet.sim.server",
            "--model-path",
            "m",
            "--cuda-graph-max-bs-x",
            "4",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )
    assert out.returncode == 2
    assert "error: unrecognized arguments: --cuda-graph-max-bs-x 4" in out.stderr


def test_port_taken_fails_with_errno_98(sim_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = sim_server("--port", str(port), ready=False, load=0.1)
        assert server.proc.wait(15) == 1
    assert "[Errno 98]" in server.text() and "address already in use" in server.text()


@pytest.mark.parametrize("concurrency", [1, 8])
def test_timing_model_shape(sim_server, concurrency):
    """Per-request speed at C=1 near the seeds' 60 tok/s; batching slows each request."""
    import concurrent.futures

    server = sim_server()

    def one(_):
        t = time.perf_counter()
        post(server.url + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 60}})
        return 60 / (time.perf_counter() - t)

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        speeds = list(pool.map(one, range(concurrency)))
    mean = sum(speeds) / len(speeds)
    expected = 1 / (0.0156 + 0.00103 * concurrency)
    assert expected * 0.8 < mean < expected * 1.05


def _accept_per_request(server, text: str, n: int = 12) -> float:
    """Mean tokens per verify step over n streamed requests with this prompt."""
    tokens = verifies = 0
    for _ in range(n):
        _status, raw = post(
            server.url + "/generate",
            {"text": text, "stream": True, "sampling_params": {"max_new_tokens": 64}},
        )
        meta = sse(raw)[-1]["meta_info"]
        tokens += meta["completion_tokens"]
        verifies += meta["spec_verify_ct"]
    return tokens / verifies


def test_acceptance_follows_what_the_prompt_asks(sim_server):
    """Code (a fenced block) accepts more drafts than chat, as EAGLE-3 drafters measure;
    --sim-accept-rate moves either."""
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
            "--sim-decode-base-ms", "1", "--sim-decode-per-req-ms", "0"]  # fmt: skip
    server = sim_server(*spec)
    chat = _accept_per_request(server, "What is a thread?")
    code = _accept_per_request(server, "Fix this:\n```\ndef f(x):\n    return x\n```")
    assert 1.8 < chat < 2.25 and 2.15 < code < 2.6 and code > chat + 0.15  # 2.05 vs 2.35
    low = sim_server(*spec, "--sim-accept-rate", "chat=0.2")
    assert _accept_per_request(low, "What is a thread?") < 1.45  # 1 + .2 + .04 + .008
    bad = subprocess.run(
        [sys.executable, "-m", "gpufleet.sim.server", "--model-path", "m",
         "--sim-accept-rate", "prose=0.5"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode != 0 and "domain 'prose' is not chat or code" in bad.stderr
    assert "Traceback" not in bad.stderr


def _adaptive_server(sim_server, tmp_path, depths: dict[str, list[int]], *extra: str):
    """An EAGLE3 server (steps 3, topk 1) with SGLang's adaptive table `{key: depths}`,
    written in the form SGLang reads."""
    table = tmp_path / "table.json"
    table.write_text(json.dumps({k: {"candidate_steps": v} for k, v in depths.items()}))
    return sim_server(
        "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
        "--speculative-adaptive", "--speculative-adaptive-config", str(table), *extra,
    )  # fmt: skip


def test_adaptive_depth_switches_are_logged_as_sglang_logs_them(sim_server, tmp_path):
    """A table with depth 3 at batch 1 and depth 0 from batch 4: a load that moves between
    the two ranges switches depth, one SGLang log line per switch."""
    server = _adaptive_server(sim_server, tmp_path, {"1": [3], "4": [0]},
                              "--cuda-graph-bs", "1", "2", "4", "8")  # fmt: skip
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 20}}
    post(server.url + "/generate", body)  # batch 1: depth 3, no switch
    assert "Switch adaptive runtime state" not in server.text()
    with ThreadPoolExecutor(6) as pool:  # batch up to 6: depth 0, then back down to 3
        list(pool.map(lambda _: post(server.url + "/generate", body), range(6)))
    post(server.url + "/generate", body)
    lines = [ln for ln in server.text().splitlines() if "Switch adaptive runtime state" in ln]
    assert lines and "steps 3 -> 0, draft_tokens 4 -> 1" in lines[0]
    assert "steps 0 -> 3, draft_tokens 1 -> 4" in lines[-1]


@pytest.mark.parametrize("text", ["chat:0.3,code:0.85", "chat=high", "seventy"])
def test_a_bad_accept_rate_names_the_form_it_wants(text):
    """Issue 37.6: `chat:0.3,code:0.85` said only "could not convert string to float"."""
    from gpufleet.sim.speculation import parse_accept_rates

    with pytest.raises(ValueError) as caught:
        parse_accept_rates(text)
    assert str(caught.value).endswith(
        "expected one rate (0.7) or rates by domain (chat=0.3,code=0.85)"
    ), caught.value
    assert repr(text) in str(caught.value)


def test_per_request_acceptance_counts_every_verify_step_as_sglang_does(sim_server, tmp_path):
    """Issue 37.6: a request that ran at depth 0 (the adaptive table's choice at its batch
    size) counted no verify steps, so one deep step read as 32 tokens a step. SGLang counts
    every step of a speculative server: at depth 0, one token per step."""
    server = _adaptive_server(sim_server, tmp_path, {"1": [0], "16": [3]},
                              "--sim-decode-base-ms", "1", "--sim-decode-per-req-ms", "0")  # fmt: skip
    assert 0.95 < _accept_per_request(server, "What is a thread?", n=3) < 1.1


def test_hold_while_keeps_every_request_waiting_until_the_file_goes(sim_server, tmp_path):
    """`--sim-hold-while FILE`: the level a test interrupts is held open at a known state
    (no token while FILE exists), not raced; removing FILE lets it finish."""
    hold = tmp_path / "hold"
    hold.touch()
    server = sim_server("--sim-hold-while", str(hold))
    body = {"text": "x", "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(post, server.url + "/generate", body)
        time.sleep(1.0)  # 200 decode steps' worth at the rehearsal's pace
        assert not reply.done()
        assert server.proc.poll() is None
        hold.unlink()
        status, raw = reply.result(timeout=30)
    assert status == 200 and json.loads(raw)["meta_info"]["completion_tokens"] == 5
