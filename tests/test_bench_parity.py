"""results.jsonl speaks bench_serving's schema (valid JSON), SLO goodput, cache hygiene."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_async, run_level
from gpufleet.host.bench.metrics import summarize
from gpufleet.host.bench.slo import parse_slo
from helpers import bench_local_run, run_cli

FIXTURE = (
    Path(__file__).resolve().parents[2] / "shared/fixtures/sglang-0.5.23-bench_serving-result.json"
)
LOCAL_FIXTURE = Path(__file__).parent / "fixtures" / "bench_serving-0.5.23-result-keys.json"
# bench_serving keys gpufleet does not write, and why: it has no tokenizer to re-count
# outputs with, and it does not keep the generated texts.
NOT_WRITTEN = {"total_output_tokens_retokenized", "generated_texts"}


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def _bench(url: str, tmp: Path, *args: str) -> list[dict]:
    text = (bench_local_run(url, tmp, *args) / "results.jsonl").read_text()
    return [json.loads(line, parse_constant=_no_constants) for line in text.splitlines()]


def test_results_have_bench_serving_keys_and_are_valid_json(sim_server, tmp_path):
    server = sim_server("--enable-metrics")
    [row] = _bench(
        server.url, tmp_path, "--concurrency", "4", "--num-prompts", "8",
        "--prompts", "random-ids", "--random-input-len", "64", "--output-len", "16",
        "--output-details",
    )  # fmt: skip
    expected = set(json.loads(LOCAL_FIXTURE.read_text())["keys"])
    missing = expected - set(row) - NOT_WRITTEN
    assert missing == set(), f"bench_serving keys not written: {sorted(missing)}"
    assert row["request_rate"] == "inf"
    assert (row["random_input_len"], row["random_output_len"], row["random_range_ratio"]) == (
        64, 16, 1.0,
    )  # fmt: skip
    assert row["total_input_text_tokens"] == row["total_input_tokens"] == 8 * 64
    assert len(row["ttfts"]) == len(row["itls"]) == len(row["input_lens"]) == 8
    assert row["server_info"]["model_path"] == "/models/sim"
    assert row["max_concurrent_requests"] > 0 and row["max_output_tokens_per_s"] > 0
    assert row["cache_flushed"] is True


def test_the_key_list_matches_the_captured_bench_serving_output():
    """The key list in tests/fixtures came from bench_serving 0.5.23's own output file."""
    if not FIXTURE.exists():
        pytest.skip("the shared fixture is not on this machine")
    captured = json.loads(FIXTURE.read_text())
    assert sorted(captured) == json.loads(LOCAL_FIXTURE.read_text())["keys"]


def test_flush_before_each_level_keeps_one_level_from_warming_the_next(sim_server, tmp_path):
    server = sim_server()
    args = ["--concurrency", "1,2", "--num-prompts", "4", "--prompts", "random-ids",
            "--random-input-len", "256", "--output-len", "4", "--warmup", "0"]  # fmt: skip
    flushed = _bench(server.url, tmp_path / "a", *args)
    kept = _bench(server.url, tmp_path / "b", *args, "--no-flush")
    assert [r["cache_flushed"] for r in flushed] == [True, True]
    assert flushed[1]["cache_hit_rate"] == 0.0  # level 2 resends level 1's prompts
    assert kept[1]["cache_flushed"] is None and kept[1]["cache_hit_rate"] > 0.9


# exclusive: it judges each request's TPOT, which a client descheduled at its first token
# reads low (beside a CPU hog and ten workers, one C=16 request read 6.7 ms against the
# model's 32): the client's own timing, so it runs alone like the client-lag tests
@pytest.mark.exclusive
def test_slo_goodput_follows_the_timing_model(sim_server):
    """Baseline rehearsal steps cost 15.6 + 1.03 x batch ms: TPOT ~16.6 ms at C=1 and ~32 ms
    at C=16. A TPOT bound between the two levels' measured worst and best holds for every
    request at C=1 and for none at C=16. The bound is placed from this run's own figures,
    not fixed in ms: on a busy machine every step is slower (a fixed 20 ms failed there)."""
    server = sim_server()
    prompts = [Prompt("def f(x): return x\n" * 4, output_len=40)] * 16
    one_records = run_async(run_level(server.url, prompts[:3], 1))
    many_records = run_async(run_level(server.url, prompts, 16))
    one, many = summarize(one_records, "sglang"), summarize(many_records, "sglang")
    worst_one, best_many = max(_tpots_ms(one_records)), min(_tpots_ms(many_records))
    assert worst_one < best_many, (one["mean_tpot_ms"], many["mean_tpot_ms"])
    bound = round((worst_one + best_many) / 2, 3)
    slo = parse_slo(f"tpot_ms={bound}")
    one = summarize(one_records, "sglang", slo=slo)
    many = summarize(many_records, "sglang", slo=slo)
    assert one["slo_attainment"] == 1.0 and one["good_requests"] == 3
    assert one["goodput_output_throughput"] == pytest.approx(one["output_throughput"])
    assert many["slo_attainment"] == 0.0 and many["goodput_output_throughput"] == 0.0
    assert one["slo"] == {"tpot_ms": bound}


def _tpots_ms(run) -> list[float]:
    return [(r.e2e - r.ttft) / (r.completion_tokens - 1) * 1000
            for r in run.records if r.ok and r.completion_tokens > 1]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttft=500", "expected KEY=MILLISECONDS with KEY one of ttft_ms, tpot_ms, e2e_ms"),
        ("ttft_ms=fast", "'fast' is not a number"),
        ("tpot_ms=0", "expected more than 0"),
    ],
)
def test_bad_slo_is_one_line(text, message):
    out = run_cli("bench", "--client", "local", "--url", "http://192.0.2.1:30000",
                  "--concurrency", "1", "--slo", text)  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"gpufleet: --slo {text}: ") and message in out.stderr
    with pytest.raises(ValueError, match=r"KEY|number|more than"):
        parse_slo(text)


def test_all_three_backends_agree_on_itl_on_a_speculative_server(sim_server):
    """EAGLE-3 sends several tokens per chunk: every backend counts a chunk of k tokens as k
    gaps (OpenAI ones from the usage SGLang sends in every chunk when asked), so their ITLs
    agree, and agree with the server's own emission times; one gap per chunk would read
    about 2.4x longer."""
    server = sim_server(
        "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16",
    )  # fmt: skip
    itl = {}
    chunks = {}
    for backend in ("sglang", "openai", "openai-chat"):
        # a prompt with code: the calibrated acceptance (2.4 tokens a step). On chat (2.1)
        # the median gap sits on the edge between 2- and 3-token chunks and flips by run
        prompts = [Prompt("```\n" + "def f(x): return x\n" * 8 + "```", output_len=96)] * 3
        run = run_async(run_level(server.url, prompts, 1, LevelSpec(backend=backend)))
        s = summarize(run, backend)
        itl[backend] = s["median_itl_ms"]
        chunks[backend] = sum(r.chunks for r in run.records) / sum(
            r.completion_tokens for r in run.records
        )
    # On an otherwise idle machine they agree within 5%; on 2 cores with a CPU hog and a second
    # suite beside it they drifted to 6.8% apart (10.57 vs 9.89 ms), and beside a CPU hog
    # with three other workers to 12.3% (11.12 vs 9.90 ms, the backends run one after the
    # other). The fault this guards against, one gap per chunk, reads 2.4x: 1.3 tells them
    # apart on any of those machines.
    assert max(itl.values()) / min(itl.values()) < 1.3, itl
    # the server's step is ~29.8 ms for ~2.4 tokens: ~12.4 ms per token, not per chunk
    assert 9 < itl["openai"] < 16 and all(c < 0.6 for c in chunks.values()), (itl, chunks)
