"""Per-request speculative acceptance: SGLang's `spec_verify_ct` per request, archived as
tokens per verify step, its p10/p50/p90 per level, and said beside compare's crossover."""

from __future__ import annotations

import pytest

from gpufleet.host.bench.loadgen import Prompt, run_async, run_level
from gpufleet.host.bench.metrics import summarize
from gpufleet.report.answer import sentence
from gpufleet.report.compare import Arm
from helpers import level


def test_each_requests_acceptance_comes_from_the_servers_verify_count(sim_server):
    server = sim_server("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                        "--max-running-requests", "8")  # fmt: skip
    run = run_async(run_level(server.url, [Prompt("def f(x):\n" * 8, output_len=48)] * 8, 4))
    for record in run.records:
        assert record.spec_verify_ct and record.completion_tokens == 48
        # one verify step yields 1 to steps + 1 tokens
        assert 1.0 <= record.accept_length <= 4.0
    row = summarize(run, "sglang")
    assert 1.0 <= row["p10_request_accept_length"] <= row["median_request_accept_length"]
    assert row["median_request_accept_length"] <= row["p90_request_accept_length"] <= 4.0


def test_a_server_without_speculation_reports_no_acceptance(sim_server):
    server = sim_server()
    run = run_async(run_level(server.url, [Prompt("hello", output_len=8)] * 2, 2))
    assert all(r.spec_verify_ct is None for r in run.records)
    assert "median_request_accept_length" not in summarize(run, "sglang")


def test_compare_says_the_acceptance_beside_the_crossover():
    def arm(label, per_request, accept=None):
        levels = {}
        for c, p in zip((1, 8, 64), per_request, strict=True):
            spread = {}
            if accept:
                spread = dict(median_request_accept_length=accept[0],
                              p10_request_accept_length=accept[1],
                              p90_request_accept_length=accept[2])  # fmt: skip
            levels[c] = level(c, median_per_request_output_tps=p, output_throughput=p * c,
                              **spread)  # fmt: skip
        return Arm(label, [], levels)

    said = sentence(arm("baseline", (60, 50, 12)), arm("eagle3", (80, 55, 5), (2.9, 2.1, 3.6)),
                    [1, 8, 64])  # fmt: skip
    assert (
        "eagle3's per-request acceptance at C=8: p50 2.90 tokens a step, p10-p90 2.10-3.60" in said
    )


def test_decode_speed_per_request_leaves_ttft_out():
    """Issue 38: two requests of 5 tokens in 1 s each, one waiting 0.8 s for its first
    token: end to end both read 5 tok/s, decoding 20 and 5 tok/s (median 12.5)."""
    from gpufleet.host.bench.level import LevelRun, RequestRecord

    records = [RequestRecord(0, ok=True, ttft=0.8, e2e=1.0, completion_tokens=5),
               RequestRecord(1, ok=True, ttft=0.2, e2e=1.0, completion_tokens=5),
               RequestRecord(2, ok=True, ttft=0.5, e2e=0.5, completion_tokens=1)]  # fmt: skip
    row = summarize(LevelRun(2, float("inf"), 1.0, records, 0.0), "openai")
    assert row["median_per_request_output_tps"] == 5.0
    assert row["median_per_request_decode_tps"] == pytest.approx(12.5)  # 1-token: none
