"""When a bench run's job ends at the latest: an upper bound on its wall time, from its plan.

A run_as runner that hangs while it still runs (a stopped client process, a read that never
returns) kept the host "in use" for root's gpu-clean forever (issue 80.5). A run has a
knowable end: each request the runner sends is bounded by the plan's `request_timeout`
(connecting included: host/bench/sender.py; bench_serving keeps its own limit,
host/bench/clients.py), its other calls to the server by their own timeouts, and every
level sends a known number of requests through C slots. Past that bound plus a margin the
runner no longer holds the host (host/agent/ownership.py, host/agent/jobdeadline.py).

The rule, per level, with T the per-request limit (the client's own where longer) and K
the most turns of a session: the warm-up, T x warmup; then C slots split over p processes
send the prompts in order, so closed loop a process drains within (ceil(N/C) + 1) x K x T;
on a schedule (a rate or a trace) within its last arrival (the trace's, or the Poisson
draws replayed with the run's seed) + ceil(N/p) / floor(C/p) x K x T + K x T, p every
process count the plan may use; with --duration, at most the duration + K x T. The server
calls beside the requests count at their timeouts (SERVER_INFO_S, FLUSH_S, METRICS_S per
level, RUN_CALLS_S per run), the GPU sampler's start at its own (TELEMETRY_S). The deadline
is the bound plus MARGIN of it, at least MARGIN_MIN_S: the local work (process starts,
files written) is counted in the margin, not in the bound.
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

from gpufleet.host.agent.protocol import AgentError
from gpufleet.host.bench.clients import CLIENTS
from gpufleet.kinds import Kind
from gpufleet.records import BenchPlan, PromptRow
from gpufleet.wire import WireError

SERVER_INFO_S = 2 * 10.0  # /server_info, then /get_server_info, 10 s each (serverapi)
FLUSH_S = 2 * 30.0  # POST, then GET /flush_cache, 30 s each
METRICS_S = 5.0 + 1.0  # the sampler's last /metrics read, and its pause
TELEMETRY_S = 10.0  # the GPU sampler's start (telemetry.CHILD_READY_TIMEOUT_S)
RUN_CALLS_S = 2 * SERVER_INFO_S  # before and after the run
MARGIN = 0.25
MARGIN_MIN_S = 30.0


def _arrivals(n: int, rate: float | None, seed: int, at: list[float]) -> float:
    """The last arrival of n prompts: the trace's own, else the Poisson draws replayed with
    the runner's seed (host/bench/loadgen.py), else none (all at once)."""
    if at:
        return max(at)
    if not rate or n < 2:
        return 0.0
    rng = random.Random(seed)
    return sum(rng.expovariate(rate) for _ in range(n - 1))


def _scheduled(plan: BenchPlan, n: int, c: int, turns: float, at: list[float]) -> float:
    """A level on a schedule over any process count it may use: the worst of them."""
    from gpufleet.host.bench.spread import MAX_PROCS  # here: it imports asyncio, which
    # root's gpu-clean, logs and stop (through bench_verbs) need not (the trust census)

    wanted = plan.client_procs
    most = min(c, n, MAX_PROCS, max(1, (os.cpu_count() or 2) - 1))  # as spread.auto_procs
    counts = range(1, most + 1) if wanted == "auto" else [int(wanted)]
    worst = 0.0
    for asked in counts:
        p = max(1, min(asked, c, n))
        rate = plan.request_rate / p if plan.request_rate else None
        share = math.ceil(n / p)
        last = max(_arrivals(len(range(k, n, p)), rate, plan.seed + k, at) for k in range(p))
        worst = max(worst, last + math.ceil(share / max(1, c // p)) * turns + turns)
    return worst


def _limit(plan: BenchPlan) -> float:
    """The longest one request may take: the plan's, or the client's own where longer."""
    client = CLIENTS.get(plan.engine)
    return max(plan.request_timeout, client.request_limit_s if client else 0.0)


def level_bound_s(plan: BenchPlan, n: int, c: int, rows: list[PromptRow]) -> float:
    """One level's longest wall time: its requests, its warm-up and its server calls."""
    calls = SERVER_INFO_S + TELEMETRY_S
    calls += (FLUSH_S if plan.flush_cache else 0.0) + (METRICS_S if plan.metrics else 0.0)
    return plan.warmup * _limit(plan) + sending_bound_s(plan, n, c, rows) + calls


def sending_bound_s(plan: BenchPlan, n: int, c: int, rows: list[PromptRow]) -> float:
    """How long a level's n prompts (rows' first n) at C=c take to send at the longest."""
    limit = _limit(plan)
    used = rows[:n]
    turns = max((len(r.turns or []) or 1 for r in used), default=1) * limit
    at = [r.at for r in used if r.at is not None]
    if plan.request_rate or at:
        sending = _scheduled(plan, n, c, turns, at)
    else:
        sending = (math.ceil(n / max(1, c)) + 1) * turns
    if plan.duration:
        sending = min(sending, plan.duration + turns)
    return sending


def bound_s(plan: BenchPlan, rows: list[PromptRow]) -> float:
    """The whole run's longest wall time, by the rule above."""
    levels = sum(level_bound_s(plan, lv.num_prompts, lv.concurrency, rows) for lv in plan.levels)
    return RUN_CALLS_S + levels


def deadline_s(plan: BenchPlan, rows: list[PromptRow]) -> float:
    """Seconds from the run's start to its job's end: the bound and its margin."""
    bound = bound_s(plan, rows)
    return bound + max(MARGIN_MIN_S, MARGIN * bound)


def deadline_of(plan: BenchPlan, prompts: Path) -> float:
    """`deadline_s` of a run whose prompts lie in `prompts` (its prompts.jsonl); a row
    that is not a prompt is one line (BAD_INPUT), as the runner would say it."""
    try:
        with open(prompts, encoding="utf-8") as fh:
            rows = [PromptRow.from_wire(json.loads(line), f"prompts.jsonl:{number}")
                    for number, line in enumerate(fh, 1) if line.strip()]  # fmt: skip
    except (ValueError, WireError) as exc:
        raise AgentError(f"bench-start: {exc}", kind=Kind.BAD_INPUT) from None
    return deadline_s(plan, rows)
