"""The load generator certifies itself (host/bench/clientcert.py): a client starved of CPU is
marked client-bound with its reason; one that kept up is not. Real processes, real HTTP."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_async, run_level
from gpufleet.host.bench.metrics import summarize
from helpers import REPO, level


@pytest.mark.exclusive  # judges the machine's own load: runs alone
def test_a_client_that_kept_up_is_not_marked(sim_server):
    server = sim_server()
    run = run_async(run_level(server.url, [Prompt("hello " * 20, output_len=48)] * 16, 4))
    row = summarize(run, "sglang")
    assert row["client_bound"] is None, row
    assert 0 < row["client_cpu_cores"] < 0.5
    assert 0 <= row["client_dispatch_lag_p50_ms"] <= row["client_dispatch_lag_p99_ms"] < 5


# A level that lasts a fixed time, not a fixed amount of work: starved, the client gets
# about 1.5% of a core, so 16 requests could take minutes (one hit the 300 s timeout beside
# other work; 39 s alone). Imports first: it says "ready", waits for "go", sends for
# STARVED_S seconds, says "sent" (its starvation can end) and prints its figures.
STARVED_S = 3.0
TIMED_LEVEL = """
import json, sys
from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_async, run_level
from gpufleet.host.bench.metrics import summarize
print("ready", flush=True)
sys.stdin.readline()
spec = LevelSpec(duration=float(sys.argv[2]))
run = run_async(run_level(sys.argv[1], [Prompt("hello " * 20, output_len=48)] * 1_000, 4, spec))
print("sent", flush=True)
print(json.dumps({k: v for k, v in summarize(run, "sglang").items() if k.startswith("client") or k.endswith("throughput")}))
"""


def _timed_level(url: str, prefix: list[str], starve: list[str] | None = None) -> dict:
    """TIMED_LEVEL under `prefix` (taskset, nice), with `starve` (a busy loop) running only
    from "go" to "sent": the client's imports and summary are not starved, its level is."""
    client = subprocess.Popen(
        [*prefix, sys.executable, "-c", TIMED_LEVEL, url, str(STARVED_S)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    hog = None
    try:
        assert client.stdout.readline() == "ready\n", client.stderr.read()
        hog = subprocess.Popen(starve) if starve else None
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline() == "sent\n", client.stderr.read()
        if hog:
            hog.kill()
            hog.wait()
        client.stdin.close()
        out = client.stdout.read()  # not communicate(): it would skip what readline buffered
        client.wait(timeout=120)
    finally:
        if hog and hog.poll() is None:
            hog.kill()
            hog.wait()
        if client.poll() is None:
            client.kill()
            client.wait()
    assert client.returncode == 0, client.stderr.read()
    return json.loads(out)


@pytest.mark.exclusive  # judges the machine's own load: runs alone
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
@pytest.mark.timeout(180)  # a few STARVED_S levels and their drains, whatever shares the core
def test_a_starved_client_is_marked_late_and_one_beside_it_is_judged_by_its_own_lag(sim_server):
    """The mark fires when its condition holds and says nothing it did not measure: a client
    on a core it shares with a busy loop at nice 19 is late; the same level on another
    core, measured in the same test as the reference, has a lower lag and is marked exactly
    when that lag crosses the bound (on a busy machine it may: then it was late too). Each
    level sends for STARVED_S seconds: the test's time is bounded by the starvation it
    measures, not by how much CPU a starved client gets."""
    from gpufleet.host.bench import clientcert

    server = sim_server()
    free = _timed_level(server.url, ["taskset", "-c", "1"])
    assert (free["client_late"] is None) == (
        free["client_loop_lag_p99_ms"] <= clientcert.LOOP_LAG_BOUND_MS
    ), free
    # a busy loop and the client on one core, the client at the lowest priority: it gets
    # about 1.5% of that core while the server, elsewhere, is ready for it
    row = _timed_level(
        server.url, ["taskset", "-c", "0", "nice", "-n", "19"],
        starve=["taskset", "-c", "0", sys.executable, "-c", "while 1: pass"],
    )  # fmt: skip
    assert row["client_late"], row
    assert "event-loop lag p99" in row["client_late"]
    assert row["client_loop_lag_p99_ms"] > max(clientcert.LOOP_LAG_BOUND_MS,
                                               free["client_loop_lag_p99_ms"])  # fmt: skip


def test_the_marks_claim_only_what_the_calibration_separates():
    """The bounds the calibration chose (benchmarks/client_bound_calibration.py): every
    unstarved run's loop lag p99 (at most 1.59 ms) is silent, every starved run's (at least
    3.61 ms) is marked late; a level whose pace the client did not set is not client-bound,
    whatever its timers did (starving moved no throughput in 116 runs)."""
    from gpufleet.host.bench import clientcert

    assert clientcert.late(1.59) is None
    assert "TTFT and ITL may read up to 3.6 ms high" in clientcert.late(3.61)
    assert clientcert.verdict(0.07, 0.0017, 35.8) is None  # C=256 starved, 2 cores
    assert "client CPU 0.95" in clientcert.verdict(0.95, 0.0, 1.0)
    assert "slots idle 3.0%" in clientcert.verdict(0.2, 0.03, 40.0)


@pytest.mark.exclusive  # judges the machine's own load: runs alone
def test_sampling_gpus_does_not_make_the_client_late(sim_server, tmp_path, monkeypatch):
    """Issue 35: with a sampling thread in the client, 6 of 6 unstarved C=64 levels were
    marked (loop lag p99 5.4-6.6 ms), 0 of 4 without it. The sampler (8 simulated GPUs,
    every 0.1 s) now runs in its own process: the loop lag with it stays near the lag
    without it, alternating, in the same test."""

    from gpufleet.host.bench import telemetry
    from gpufleet.host.gpu import nvml as nvmlread
    from gpufleet.sim import gpustate

    server = sim_server("--tp-size", "8")
    monkeypatch.setenv(gpustate.STATE_ENV, str(server.state_dir))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    nvmlread.activate_simulation({"state_dir": str(server.state_dir), "count": 8}, "simserver")
    nvml = nvmlread.load_pynvml()
    prompts = [Prompt("hello " * 20, output_len=32)] * 64
    lags: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(3):
        for sampled in (False, True):
            if sampled:
                with telemetry.Sampler(nvml, list(range(8)), 0.1):
                    run = run_async(run_level(server.url, prompts, 32))
            else:
                run = run_async(run_level(server.url, prompts, 32))
            lags[sampled].append(summarize(run, "sglang")["client_loop_lag_p99_ms"])
    # each side's least-disturbed level: a busy machine's other work lands on either side at
    # random (medians 7.7 on vs 4.0 off once beside a CPU hog, minima 3.4 vs 3.5; minima 3.3
    # vs 1.8 another time), while the thread disturbed every level (5.4-6.6 ms against 2.1
    # off, issue 35: above this bound's 4.2)
    on, off = min(lags[True]), min(lags[False])
    assert on < 1.5 * off + 1.0, lags


def test_open_loop_waits_for_a_slot_are_reported_apart_from_latency(sim_server):
    server = sim_server()
    # 20 arrivals/s against one slot and ~0.5 s requests: most requests queue for the slot
    prompts = [Prompt("hello " * 20, output_len=32)] * 8
    run = run_async(run_level(server.url, prompts, 1, LevelSpec(request_rate=20.0, seed=1)))
    row = summarize(run, "sglang")
    assert row["p99_queue_wait_ms"] > 1000 and row["median_queue_wait_ms"] > 300
    # TTFT counts from when the slot came free, not from the arrival: it stays small
    assert row["p99_ttft_ms"] < 500 < row["p99_queue_wait_ms"]


@pytest.mark.exclusive  # judges the machine's own load: runs alone
def test_an_open_loop_level_that_fell_behind_is_marked_overloaded_and_one_that_kept_up_not(
    sim_server,
):
    """Issue 35: offered 12/s, achieved 3/s, and the table said `TTFT p50 41 ms, ok`. Now
    offered and achieved rates are figures, and a level under 95% of its offered rate is
    overloaded (its note says the queue wait comes before the TTFT); a level that kept up
    with its arrivals is not, whatever its Poisson draw."""
    from gpufleet.report.tables import headers, level_notes, rows

    server = sim_server()
    prompts = [Prompt("hello " * 20, output_len=32)] * 12
    behind = summarize(run_async(run_level(server.url, prompts, 1, LevelSpec(request_rate=20.0, seed=1))),
                       "sglang")  # fmt: skip
    assert behind["overloaded"] is True
    assert behind["achieved_request_rate"] < 0.5 * behind["offered_request_rate"]
    notes = level_notes([behind], steady=False)
    [note] = [n for n in notes if "overloaded" in n]
    # a busy machine may make this client's timers late too: said then, and only then
    late = [n for n in notes if n != note]
    assert late == ([f"C=1: client timers late: {behind['client_late']}"] if behind.get(
        "client_late") else []), notes  # fmt: skip
    assert note.startswith("C=1: overloaded: sent ") and "before being sent" in note
    behind["level_status"] = "ok"  # as the runner sets it
    table = dict(zip(headers([behind]), rows([behind])[0], strict=True))
    assert table["status"] == "ok, overloaded"
    assert {"offered req/s", "sent req/s", "queue wait p50 ms", "queue wait p99 ms"} <= set(table)
    # 4 arrivals/s against 8 slots of ~0.5 s requests: it keeps up, at any draw
    for seed in range(3):
        kept = summarize(
            run_async(run_level(server.url, prompts, 8, LevelSpec(request_rate=4.0, seed=seed))),
            "sglang",
        )
        assert kept["overloaded"] is False, kept
        assert 0.95 <= kept["achieved_request_rate"] / kept["offered_request_rate"] <= 1.05
        late = (
            [f"C=8: client timers late: {kept['client_late']}"] if kept.get("client_late") else []
        )
        assert level_notes([kept], steady=False) == late  # not overloaded; late only if it was


def _level(open_loop: bool):
    from gpufleet.host.bench.level import LevelRun, RequestRecord

    record = RequestRecord(
        index=0, ok=True, start=1.030, ttft=0.100, e2e=0.500, itl=[0.1] * 4,
        completion_tokens=5, due=1.000, dispatch_lag=0.030,
    )  # fmt: skip
    rate = 10.0 if open_loop else float("inf")
    return LevelRun(1, rate, 2.0, [record], 0.0, open_loop=open_loop)


def test_an_open_loop_latency_counts_from_when_the_request_was_due():
    late = summarize(_level(open_loop=True), "sglang")
    assert late["median_ttft_ms"] == pytest.approx(130.0)  # 30 ms of the client's own lag
    assert late["median_e2e_latency_ms"] == pytest.approx(530.0)
    # closed loop: bench_serving's definition, from the send
    assert summarize(_level(open_loop=False), "sglang")["median_ttft_ms"] == pytest.approx(100.0)


def test_steady_window_figures_beside_the_whole_level(sim_server):
    server = sim_server()
    long = summarize(
        run_async(run_level(server.url, [Prompt("hello " * 20, output_len=32)] * 24, 4)),
        "sglang",
    )
    assert "steady_note" not in long
    assert 0 < long["steady_duration"] < long["duration"]
    assert long["steady_requests"] >= 4
    # the drain runs with fewer neighbours: over the steady window throughput is no lower
    assert long["steady_output_throughput"] >= 0.95 * long["output_throughput"]
    short = summarize(
        run_async(run_level(server.url, [Prompt("hello", output_len=8)] * 4, 4)), "sglang"
    )
    assert "too short for a steady window" in short["steady_note"]
    assert "steady_output_throughput" not in short


def test_compare_says_when_a_crossover_rests_on_client_bound_levels():
    from gpufleet.report.answer import sentence
    from gpufleet.report.compare import Arm

    def arm(label, per_request, total, bound_at=()):
        levels = {
            c: level(c, median_per_request_output_tps=p, output_throughput=t,
                     client_bound="client CPU 0.97 of a core (bound 0.9)" if c in bound_at
                     else None)
            for c, p, t in zip((1, 8, 64), per_request, total, strict=True)
        }  # fmt: skip
        return Arm(label, [], levels)

    base = arm("baseline", (60, 50, 12), (60, 400, 780))
    eagle = arm("eagle3", (80, 55, 5), (80, 440, 350), bound_at=(64,))
    said = sentence(base, eagle, [1, 8, 64])
    assert "the client was the bottleneck at C=64" in said
    clean = sentence(base, arm("eagle3", (80, 55, 5), (80, 440, 350)), [1, 8, 64])
    assert "bottleneck" not in clean


def test_a_level_spread_over_client_processes_merges_into_one(fleet, tmp_path):
    profile = fleet.profile("spread", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h0").returncode == 0
    try:
        out = fleet.cli(
            "bench", "--hosts", "h0", "-c", "2,6", "--num-prompts", "18", "--output-len", "16",
            "--client-procs", "3", "--archive", str(tmp_path / "a"),
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        [run] = (tmp_path / "a" / "h0").iterdir()
        rows = [json.loads(ln) for ln in (run / "results.jsonl").read_text().splitlines()]
        # C=2 runs on two processes (never more than C), C=6 on three
        assert [(r["max_concurrency"], r["client_procs"], r["completed"]) for r in rows] == [
            (2, 2, 18), (6, 3, 18),
        ]  # fmt: skip
        requests = [json.loads(ln) for ln in (run / "requests-c6.jsonl").read_text().splitlines()]
        assert [r["index"] for r in requests] == list(range(18))
        assert len({r["rid"] for r in requests}) == 18 and all(r["ok"] for r in requests)
        # every process starts at one instant: the first sends land within a few ms
        firsts = sorted(r["start"] for r in requests)[:6]
        assert firsts[-1] - firsts[0] < 0.5
    finally:
        fleet.cli("stop", "--hosts", "h0")


@pytest.mark.parametrize("value", ["0", "x", "-2"])
def test_bad_client_procs_is_one_line(value):
    from helpers import run_cli

    out = run_cli("bench", "--client", "local", "--url", "http://192.0.2.1:1",
                  "--client-procs", value)  # fmt: skip
    assert out.returncode == 2 and "--client-procs" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_auto_client_procs_follow_the_measured_cpu_per_token():
    import os

    from gpufleet.host.bench.spread import auto_procs

    # 4,000 tok/s at C=8 on 0.08 of a core (20 us a token): C=64 could stream 32,000 tok/s,
    # 0.64 cores of generator, at 0.15 of a core per process 5 processes (this machine allowing)
    assert auto_procs(4_000, 0.08, 64, 8) == max(1, min(5, (os.cpu_count() or 2) - 1))
    # a slow server: one process keeps up
    assert auto_procs(500, 0.001, 64, 8) == 1
    assert auto_procs(None, None, 64, 8) == 1  # nothing measured yet: one


def test_client_procs_with_sglangs_own_bench_serving_is_one_line():
    from helpers import run_cli

    out = run_cli("bench", "--client", "local", "--url", "http://192.0.2.1:1",
                  "-c", "1", "--engine", "sglang-bench", "--client-procs", "2")  # fmt: skip
    assert out.returncode == 2 and "--client-procs needs --engine gpufleet" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
