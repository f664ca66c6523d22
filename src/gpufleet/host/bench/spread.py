"""One level over several generator processes on the host (`--client-procs N|auto`).

One Python process streams at most a core's worth of tokens. Each share of N sends a part
of the level's prompts in their seeded order (`assign`), with its share of the concurrency
(C // N, the first C % N one more) or of the request rate (rate / N: N Poisson streams of
rate r/N are one of rate r), and every share starts at one agreed instant on the host's
monotonic clock. Each request's record comes back under its
index in the whole level, so the merged level has the same per-request records, and the
same metrics, as one process would write.

A share runs as `python -I -c CHILD`: its job on stdin (the server's key never in argv),
JSON lines back: progress, `ready` after its warm-up, then its records.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import gpufleet
from gpufleet.host.agent import childenv
from gpufleet.host.bench.clientcert import ClientClock
from gpufleet.host.bench.level import LevelRun, Prompt, RequestFields, RequestRecord, Tally
from gpufleet.host.bench.loadgen import (
    DEFAULT_SPEC,
    NO_HOOKS,
    LevelHooks,
    LevelSpec,
    run_async,
    run_level,
)
from gpufleet.wire import JsonDict

ROOT = str(Path(gpufleet.__file__).resolve().parent.parent)  # the zipapp, or src/
CHILD = (
    f"import sys; sys.path.insert(0, {ROOT!r}); "
    "from gpufleet.host.bench.spread import child_main; child_main()"
)
START_LEAD_S = 0.05  # from "all ready" to the agreed start: time to hand out the instant
# auto: plan each process at most this share of a core. Measured on 16 cores against a
# zero-cost server (benchmarks/client_ceiling.py): a process's dispatch lag p99 stays under
# 1 ms only below ~0.15 of a core (bursts of completions queue behind each other).
CORE_SHARE = 0.15
MAX_PROCS = 64


def share_concurrency(concurrency: int, procs: int, k: int) -> int:
    return concurrency // procs + (1 if k < concurrency % procs else 0)


def auto_procs(
    tokens_per_s: float | None, cpu_cores: float | None, concurrency: int, previous_c: int
) -> int:
    """Processes for the next level, from the last level's measured CPU per token and its
    token rate grown with the concurrency (an upper bound: rates grow sublinearly)."""
    if not tokens_per_s or not cpu_cores or previous_c <= 0:
        return 1
    cpu_per_token = cpu_cores / tokens_per_s
    expected = tokens_per_s * concurrency / previous_c
    wanted = math.ceil(expected * cpu_per_token / CORE_SHARE)
    return max(1, min(wanted, concurrency, (os.cpu_count() or 2) - 1, MAX_PROCS))


def _first_indices(prompts: list[Prompt]) -> list[int]:
    out, index = [], 0
    for prompt in prompts:
        out.append(index)
        index += prompt.requests
    return out


def assign(prompts: list[Prompt], concurrency: int, procs: int, scheduled: bool) -> list[list[int]]:
    """Which prompts (their indices, in order) each share sends. On a schedule (a rate or
    a trace) every share gets every N-th; closed loop, prompt j goes to the share holding
    slot j mod C, so each share's work matches its slots and none drains alone at the end."""
    if scheduled:
        return [list(range(k, len(prompts), procs)) for k in range(procs)]
    return [
        [j for j in range(len(prompts)) if (j % concurrency) % procs == k] for k in range(procs)
    ]


def _to_whole_level(records: list[RequestRecord], share: list[Prompt], ids: list[int],
                    whole_first: list[int]) -> list[RequestRecord]:  # fmt: skip
    """A share's records under their request index (and session) in the whole level."""
    local_first = _first_indices(share)
    for record in records:
        local = bisect.bisect_right(local_first, record.index) - 1
        prompt = ids[local]
        record.index = whole_first[prompt] + (record.index - local_first[local])
        if record.session is not None:
            record.session = prompt
    return records


class ShareResult(TypedDict):
    """What a generator process answers once its share of the level ran."""

    records: list[RequestFields]
    duration: float
    warmup_errors: list[str]
    cpu_s: float
    wall_s: float
    loop_lags: list[float]


class ShareJob(TypedDict):
    """What a generator process is handed on stdin: its share of the prompts, its share of
    the cap, the level's spec (LevelSpec's fields, an infinite rate as null) and the URL."""

    prompts: list[JsonDict]  # host/bench/level.Prompt's fields
    concurrency: int
    spec: JsonDict
    base_url: NotRequired[str]


class _Share:
    """One child process and what it said."""

    def __init__(self, job: ShareJob) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=childenv.child_env(),
        )
        self.tally = Tally()
        self.ready = threading.Event()
        self.result: ShareResult | None = None
        self.done = threading.Event()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # not ours (a library printing): the records still come
                if "progress" in message:
                    self.tally = Tally(**message["progress"])
                elif "ready" in message:
                    self.ready.set()
                elif "records" in message:
                    self.result = message
        finally:
            self.ready.set()  # a child that died before ready must not hang the start
            self.done.set()

    def go(self, t0: float) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"t0": t0}) + "\n")
            self.proc.stdin.close()
        except OSError:
            pass  # said below: it has no records

    def records(self) -> ShareResult:
        self.done.wait()
        code = self.proc.wait()
        if self.result is None:
            raise RuntimeError(f"a client process exited with code {code} without its records")
        return self.result


def _job(prompts: list[Prompt], concurrency: int, spec: LevelSpec) -> ShareJob:
    """A share's job as one JSON object (an infinite rate as null: JSON has no infinity)."""
    fields = dataclasses.asdict(spec)
    fields["request_rate"] = None if math.isinf(spec.request_rate) else spec.request_rate
    return {
        "prompts": [dataclasses.asdict(p) for p in prompts],
        "concurrency": concurrency,
        "spec": fields,
    }


async def run_spread(
    procs: int,
    base_url: str,
    prompts: list[Prompt],
    concurrency: int,
    *,
    spec: LevelSpec = DEFAULT_SPEC,
    hooks: LevelHooks = NO_HOOKS,
) -> LevelRun:
    """`run_level` over `procs` processes (this one runs share 0), merged."""
    request_rate, seed = spec.request_rate, spec.seed
    on_progress, after_warmup = hooks.on_progress, hooks.after_warmup
    procs = max(1, min(procs, concurrency, len(prompts)))
    whole_first = _first_indices(prompts)
    scheduled = not math.isinf(request_rate) or any(p.at is not None for p in prompts)
    ids = assign(prompts, concurrency, procs, scheduled)
    shares = [[prompts[j] for j in share] for share in ids]
    rates = request_rate / procs
    children = []
    for k in range(1, procs):
        share_spec = dataclasses.replace(spec, request_rate=rates, seed=seed + k)
        job = _job(shares[k], share_concurrency(concurrency, procs, k), share_spec)
        children.append(_Share({**job, "base_url": base_url}))
    after: list[Any] = []

    async def start_at() -> float:
        await asyncio.to_thread(lambda: [c.ready.wait() for c in children])
        if after_warmup is not None:  # after every share's warm-up, as one process does
            after.append(await asyncio.to_thread(after_warmup))
        t0 = time.perf_counter() + START_LEAD_S
        for child in children:
            child.go(t0)
        return t0

    def progress(tally: Tally, elapsed: float) -> None:
        if on_progress is not None:
            on_progress(sum((c.tally for c in children), tally), elapsed)

    try:
        own = await run_level(
            base_url, shares[0], share_concurrency(concurrency, procs, 0),
            dataclasses.replace(spec, request_rate=rates),
            dataclasses.replace(hooks, on_progress=progress, after_warmup=None, start_at=start_at),
        )  # fmt: skip
        results = await asyncio.to_thread(lambda: [c.records() for c in children])
    finally:
        for child in children:
            if child.proc.poll() is None:
                child.proc.kill()
    records, warm, clocks, duration = _merged(own, results, shares, ids, whole_first)
    return LevelRun(
        concurrency, request_rate, duration, records, own.started_at, warm,
        after[0] if after else None, ClientClock.merged(clocks), own.open_loop,
    )  # fmt: skip


def _merged(
    own: LevelRun, results: list[ShareResult], shares: list[list[Prompt]], ids: list[list[int]],
    whole_first: list[int],
) -> tuple[list[RequestRecord], list[Any], list[ClientClock], float]:  # fmt: skip
    """The shares' records back in the whole level's order, their warm-up errors, clocks
    and the longest share's duration."""
    records = _to_whole_level(own.records, shares[0], ids[0], whole_first)
    clocks = [own.client] if own.client else []
    warm = list(own.warmup_errors)
    for k, result in enumerate(results, start=1):
        rows = [RequestRecord(**row) for row in result["records"]]
        records += _to_whole_level(rows, shares[k], ids[k], whole_first)
        clocks.append(ClientClock(cpu_s=result["cpu_s"], wall_s=result["wall_s"],
                                  loop_lags=result["loop_lags"]))  # fmt: skip
        warm += result["warmup_errors"]
    records.sort(key=lambda r: r.index)
    return records, warm, clocks, max([own.duration, *(r["duration"] for r in results)])


def child_main() -> None:
    """A share: its job on stdin, JSON lines on stdout."""
    job = json.loads(sys.stdin.readline())

    def say(message: JsonDict) -> None:  # one JSON line: ready, progress, records
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    async def start_at() -> float:
        say({"ready": True})
        line = await asyncio.to_thread(sys.stdin.readline)
        return float(json.loads(line)["t0"]) if line.strip() else time.perf_counter()

    fields = job["spec"]
    if fields["request_rate"] is None:
        fields["request_rate"] = float("inf")
    hooks = LevelHooks(
        on_progress=lambda tally, _elapsed: say({"progress": dataclasses.asdict(tally)}),
        start_at=start_at,
    )
    run = run_async(
        run_level(
            job["base_url"],
            [Prompt(**p) for p in job["prompts"]],
            job["concurrency"],
            LevelSpec(**fields),
            hooks,
        )
    )
    clock = run.client or ClientClock()
    say({
        "records": [dataclasses.asdict(r) for r in run.records],
        "duration": run.duration, "warmup_errors": run.warmup_errors,
        "cpu_s": clock.cpu_s, "wall_s": clock.wall_s, "loop_lags": clock.loop_lags,
    })  # fmt: skip
