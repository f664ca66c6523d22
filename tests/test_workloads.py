"""Workloads like the seeds' agents send: multi-turn sessions, shared prefixes, traces,
token-exact random prompts, and the rehearsal engine's prefix cache they exercise."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from gpufleet.control.bench.run import BenchRequest, build_plan
from gpufleet.errors import UserError
from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_async, run_level
from helpers import REPO, bench_local_run, run_cli

SAMPLE_TRACE = REPO / "playbooks" / "traces" / "mooncake-sample.jsonl"


def _bench_local(url: str, tmp: Path, *args: str) -> tuple[dict, Path]:
    run_dir = bench_local_run(url, tmp, *args)
    rows = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    return rows[0], run_dir


def _requests(run_dir: Path, c: int) -> list[dict]:
    text = (run_dir / f"requests-c{c}.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines()]


def test_multiturn_sessions_resend_the_conversation_and_hit_the_prefix_cache(sim_server, tmp_path):
    server = sim_server()
    row, run_dir = _bench_local(
        server.url, tmp_path, "--concurrency", "4", "--num-prompts", "6",
        "--output-len", "16", "--workload", "multiturn:turns=3",
    )  # fmt: skip
    assert row["completed"] == 18 and row["failed"] == 0  # 6 sessions x 3 turns
    assert row["dataset_name"] == "coding+multiturn:turns=3"
    turns = row["per_turn"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    # every turn resends the conversation: prompts grow, and the server found the earlier
    # turns (and, from the second session on, the shared system prompt) in its cache
    assert turns[0]["mean_prompt_tokens"] < turns[1]["mean_prompt_tokens"]
    assert turns[1]["mean_prompt_tokens"] < turns[2]["mean_prompt_tokens"]
    assert turns[1]["cache_hit_rate"] > 0.8 and turns[2]["cache_hit_rate"] > 0.8
    assert row["total_cached_tokens"] > 0
    records = _requests(run_dir, 4)
    by_session: dict[int, list[dict]] = {}
    for r in records:
        by_session.setdefault(r["session"], []).append(r)
    assert len(by_session) == 6 and all(len(v) == 3 for v in by_session.values())
    first, second = sorted(by_session[0], key=lambda r: r["turn"])[:2]
    assert second["start"] >= first["start"] + first["e2e"]  # turns run in order
    # the second turn's prompt holds the first turn's prompt and its 16-token answer
    assert second["prompt_tokens"] > first["prompt_tokens"] + 16
    plan = json.loads((run_dir / "plan.json").read_text())
    assert "coding agent" in plan["system_prompt"]


def test_multiturn_is_the_same_for_every_profile_and_chat_sends_messages(sim_server, tmp_path):
    request = BenchRequest([2], num_prompts=3, workload="multiturn:turns=2", seed=5)
    plan_a, body_a = build_plan(request, "a")
    plan_b, body_b = build_plan(
        BenchRequest([2], num_prompts=3, workload="multiturn:turns=2", seed=5), "b"
    )
    assert body_a == body_b and plan_a.prompts_sha256 == plan_b.prompts_sha256
    server = sim_server("--enable-cache-report")  # SGLang reports cached tokens to OpenAI
    # clients only with it
    row, _ = _bench_local(
        server.url, tmp_path, "--concurrency", "2", "--num-prompts", "2",
        "--output-len", "8", "--workload", "multiturn:turns=2", "--backend", "openai-chat",
    )  # fmt: skip
    assert row["completed"] == 4 and row["per_turn"][1]["cache_hit_rate"] > 0.5


def test_cache_flush_empties_the_rehearsal_prefix_cache(sim_server):
    server = sim_server()
    prompt = [Prompt("def f(x): return x * 2\n" * 40, output_len=4)]
    first = run_async(run_level(server.url, prompt, 1, LevelSpec(warmup=0))).records[0]
    again = run_async(run_level(server.url, prompt, 1, LevelSpec(warmup=0))).records[0]
    assert first.cached_tokens == 0 and again.cached_tokens >= again.prompt_tokens - 16
    with urllib.request.urlopen(
        urllib.request.Request(server.url + "/flush_cache", method="POST")
    ) as r:
        assert r.status == 200
    after = run_async(run_level(server.url, prompt, 1, LevelSpec(warmup=0))).records[0]
    assert after.cached_tokens == 0


def test_disable_radix_cache_reports_nothing_cached(sim_server):
    server = sim_server("--disable-radix-cache")
    prompt = [Prompt("same prompt " * 50, output_len=4)] * 2
    run = run_async(run_level(server.url, prompt, 1, LevelSpec(warmup=1)))
    assert all(r.cached_tokens == 0 for r in run.records)


def test_shared_prefix_groups_share_their_prefix(sim_server, tmp_path):
    server = sim_server()
    row, run_dir = _bench_local(
        server.url, tmp_path, "--concurrency", "1", "--num-prompts", "8", "--output-len", "4",
        "--workload", "shared-prefix:groups=2,per_group=4,prefix_len=512,question_len=32",
        "--warmup", "0",
    )  # fmt: skip
    assert row["completed"] == 8
    assert row["dataset_name"] == (
        "shared-prefix:groups=2,per_group=4,prefix_len=512,question_len=32"
    )
    records = _requests(run_dir, 1)
    assert all(r["prompt_tokens"] == 544 for r in records)  # token-exact
    # the first request of each group pays for its prefix; the other six find it cached
    assert sum(1 for r in records if r["cached_tokens"] >= 512) == 6


def test_random_ids_are_token_exact_and_named_for_what_they_are(sim_server, tmp_path):
    server = sim_server()
    row, run_dir = _bench_local(
        server.url, tmp_path, "--concurrency", "2", "--num-prompts", "6",
        "--prompts", "random-ids", "--random-input-len", "300", "--random-output-len", "12",
    )  # fmt: skip
    assert row["dataset_name"] == "random-ids-300-12"
    records = _requests(run_dir, 2)
    assert {r["prompt_tokens"] for r in records} == {300}
    assert {r["completion_tokens"] for r in records} == {12}
    ranged, _ = build_plan(
        BenchRequest([1], num_prompts=50, prompts="random-ids", random_input_len=100,
                     random_range_ratio=0.5), "r",
    )  # fmt: skip
    assert ranged.prompt_set == "random-ids-100-256-r0.5"


def test_trace_replays_at_its_timestamps_with_shared_blocks(sim_server, tmp_path):
    trace = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 1000, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]},
        {"timestamp": 3000, "input_length": 700, "output_length": 4, "hash_ids": [1, 9]},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    server = sim_server()
    row, run_dir = _bench_local(
        server.url, tmp_path, "--concurrency", "8", "--trace", str(trace),
        "--trace-speedup", "2", "--warmup", "0",
    )  # fmt: skip
    assert row["completed"] == 3 and row["dataset_name"] == "trace:trace.jsonl" + "x2"
    records = sorted(_requests(run_dir, 8), key=lambda r: r["index"])
    starts = [r["start"] for r in records]
    assert starts[0] < 0.05 and abs(starts[1] - 0.25) < 0.05 and abs(starts[2] - 1.0) < 0.05
    assert [r["prompt_tokens"] for r in records] == [600, 1024, 700]
    assert [r["completion_tokens"] for r in records] == [4, 8, 4]
    # equal hash_ids are equal token blocks: the second request finds block 1 (and the part
    # of block 2 the first one sent); the third shares only block 1
    assert records[1]["cached_tokens"] >= 512
    assert 512 <= records[2]["cached_tokens"] < 600


def test_bundled_trace_replays(sim_server, tmp_path):
    server = sim_server()
    row, _ = _bench_local(
        server.url, tmp_path, "--concurrency", "64", "--trace", str(SAMPLE_TRACE),
        "--trace-speedup", "20", "--num-prompts", "30",
    )  # fmt: skip
    assert row["completed"] == 30 and row["failed"] == 0
    assert row["cache_hit_rate"] > 0.2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workload": "mutliturn"}, "--workload 'mutliturn': expected one of"),
        ({"workload": "multiturn:turn=3"}, "'turn=3' is not an option of multiturn"),
        ({"workload": "shared-prefix:groups=x"}, "groups must be a whole number"),
        ({"prompts": "random-ids", "backend": "openai-chat"}, "--backend openai-chat:"),
        ({"prompts": "random-ids", "engine": "sglang-bench"}, "needs --engine gpufleet"),
        ({"trace": "/nonexistent/trace.jsonl"}, "--trace /nonexistent/trace.jsonl: cannot read"),
    ],
)
def test_bad_workload_options_are_one_line(kwargs, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("'", "'")):
        build_plan(BenchRequest([1], num_prompts=2, **kwargs), "x")


def test_bad_trace_line_names_file_and_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"oops": 1}\n')
    with pytest.raises(UserError, match=r"t.jsonl:2: expected \{timestamp"):
        build_plan(BenchRequest([1], trace=str(trace)), "x")
    out = run_cli("bench", "--client", "local", "--url", "http://192.0.2.1:30000",
                  "--concurrency", "1", "--trace", str(trace))  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "t.jsonl:2:" in out.stderr


def test_memory_follows_what_is_in_flight(sim_server):
    """Only the requests in flight exist as tasks: 2,000 prompts at C=4 never hold more than
    two tasks per request in flight (its own, and on Python 3.11 the one `asyncio.wait_for`
    wraps its timed wait in) plus the level's own. Idle, the second is rarely seen; on a
    busy machine it is (11 tasks seen), so the bound counts it: what matters is that it
    follows C, not the 2,000 prompts."""
    import asyncio

    server = sim_server("--sim-zero-cost")
    peak = {"tasks": 0}

    async def run() -> None:
        async def watch() -> None:
            while True:
                tasks = asyncio.all_tasks()
                if len(tasks) > peak["tasks"]:
                    peak["tasks"] = len(tasks)
                    peak["names"] = sorted(t.get_coro().__qualname__ for t in tasks)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        prompts = [Prompt("x", output_len=2)] * 2000
        run = await run_level(server.url, prompts, 4, LevelSpec(warmup=0))
        watcher.cancel()
        assert sum(r.ok for r in run.records) == 2000

    asyncio.run(run())
    # the requests (two tasks each at most), the level, the watcher, the loop watch
    assert peak["tasks"] <= 2 * 4 + 3, peak


def test_multiturn_progress_counts_requests_not_sessions(fleet, tmp_path):
    # was: "C=2: 3 requests", then counting up to 6/3 done
    profile = fleet.profile("mt", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    assert fleet.cli("launch", "--profile", str(profile), "--hosts", "h0").returncode == 0
    out = fleet.cli("bench", "--hosts", "h0", "-c", "2", "--num-prompts", "3", "--output-len",
                    "8", "--workload", "multiturn:turns=2", "--archive", str(tmp_path / "a"))  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "h0: C=2: 6 requests (3 sessions)" in out.stdout
    assert "h0: C=2: done, 6 ok, 0 failed" in out.stdout
    assert fleet.cli("stop", "--hosts", "h0").returncode == 0


def test_token_ids_stay_under_the_vocabulary_given_and_the_default_draws_do_not_move(tmp_path):
    """Issue 38: `--prompts random-ids` drew ids 100-29999 whatever the model: against a
    512-token vocabulary every request failed. `--random-vocab 512` keeps every id of
    random-ids, shared-prefix and a trace under 512 (and off the lowest, special ids);
    without it the ids are the ones every earlier run drew."""
    import random as stdlib_random

    from gpufleet.control.bench import workloads

    rows = workloads.random_ids(20, 3, input_len=64, output_len=8, ratio=1.0, vocab=512)
    ids = [i for r in rows for i in r.input_ids]
    assert len(ids) == 20 * 64 and min(ids) >= 100 and max(ids) < 512
    shared = workloads.shared_prefix(8, 3, {"groups": 2, "per_group": 4, "prefix_len": 32,
                                            "question_len": 8}, vocab=512)  # fmt: skip
    assert all(i < 512 for r in shared for i in r.input_ids)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 700, "output_length": 4, '
                     '"hash_ids": [1]}\n')  # fmt: skip
    [row] = workloads.load_trace(str(trace), 1.0, vocab=512)
    assert len(row.input_ids) == 700 and max(row.input_ids) < 512
    rng = stdlib_random.Random(3)
    first = workloads.random_ids(1, 3, input_len=16, output_len=8, ratio=1.0)[0].input_ids
    assert first == [rng.randrange(100, 30_000) for _ in range(16)]
