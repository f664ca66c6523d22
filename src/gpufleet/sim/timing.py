"""Continuous batching with a timing model: what makes the rehearsal numbers look like SGLang's.

Each step, waiting requests join the running batch up to max-running-requests; the step
costs `decode_base + decode_per_req * batch` (+ prefill of newly joined prompt tokens not
already in the prefix cache, sim/prefixcache.py) and
every running request receives one token, or with speculation a draw of accepted tokens.
Defaults reproduce the seeds: baseline ~60 tok/s per request at C=1 and ~780 tok/s total
at C=64; EAGLE-3 ~80 tok/s at C=1 and ~350 tok/s total at C=64.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.sim.prefixcache import PrefixCache
from gpufleet.sim.speculation import (
    DOMAIN_ACCEPT_P,
    AdaptiveDepth,
    accept_length,
    step_costs_ms,
)


@dataclass
class TimingModel:
    decode_base_s: float
    decode_per_req_s: float
    prefill_per_token_s: float
    accept_length: float = 1.0  # mean tokens per step per request (1 = no speculation)
    max_accept: int = 1
    skips_draft_extend: bool = False  # an EAGLE server's depth 0 with the skip variable
    # mean tokens per step by what a prompt asks (speculation.prompt_domain); a domain
    # not here takes `accept_length`
    accept_by_domain: dict[str, float] = field(default_factory=dict)
    # batch -> how much longer a step takes on this host's GPUs (sim/power.gpu_slowdown:
    # lowered clocks or power limit); None: stock GPUs
    slowdown: Callable[[int], float] | None = None

    def accept_for(self, domain: str) -> float:
        return self.accept_by_domain.get(domain, self.accept_length)

    @classmethod
    def baseline(cls) -> TimingModel:
        # 1/(15.6 + 1.03) ms ~ 60 tok/s at C=1; 64/(15.6 + 64*1.03) ms ~ 790 tok/s at C=64.
        return cls(decode_base_s=0.0156, decode_per_req_s=0.00103, prefill_per_token_s=20e-6)

    @classmethod
    def speculative(
        cls,
        num_steps: int | None = None,
        topk: int | None = None,
        draft_tokens: int | None = None,
        rates: dict[str, float] | None = None,
        *,
        draft_scale: float = 1.0,
        base_scale: float | None = None,
    ) -> TimingModel:
        """Drafting `num_steps` deep (sim/speculation.py); 0 is plain decoding. Steps 3,
        topk 4, 16 draft tokens: 2.4 tokens per 29.8 ms step ~ 80 tok/s at C=1, ~350 tok/s
        at C=64 (coding prompts, as the seeds measured). `rates`: acceptance per drafted
        position by what the prompt asks (speculation.DOMAIN_ACCEPT_P)."""
        steps = 3 if num_steps is None else max(0, num_steps)
        if steps == 0:
            return cls.baseline()
        rates = rates or DOMAIN_ACCEPT_P
        base_ms, per_req_ms = step_costs_ms(steps, topk or 1, draft_tokens, draft_scale, base_scale)
        by_domain = {name: accept_length(steps, topk or 1, rate) for name, rate in rates.items()}
        return cls(
            decode_base_s=base_ms / 1000,
            decode_per_req_s=per_req_ms / 1000,
            prefill_per_token_s=20e-6,
            accept_length=by_domain.get("code", accept_length(steps, topk or 1)),
            max_accept=steps + 1,
            accept_by_domain=by_domain,
        )

    def step_seconds(self, batch: int, new_prompt_tokens: int) -> float:
        seconds = (
            self.decode_base_s
            + self.decode_per_req_s * batch
            + (self.prefill_per_token_s * new_prompt_tokens)
        )
        return seconds * self.slowdown(batch) if self.slowdown else seconds


@dataclass
class SimRequest:
    rid: str
    prompt_tokens: int
    max_new_tokens: int
    arrived: float = field(default_factory=time.time)
    generated: int = 0
    emit_times: list[float] = field(default_factory=list)  # engine step that made tokens
    sent_times: list[float] = field(default_factory=list)  # chunk written to the socket
    accepted_steps: int = 0
    domain: str = "chat"  # what the prompt asks (speculation.prompt_domain): its acceptance
    cold_draft: bool = False  # its draft state was stubbed (skipped extend): next draft misses
    blocks: list[bytes] = field(default_factory=list)  # prefix-cache block hashes of the prompt
    cached_tokens: int = 0  # prompt tokens found in the prefix cache: no prefill for them
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False
    aborted: bool = False


class Engine:
    """The scheduler loop. Tokens go to each request's queue as (count, wall_time) pairs."""

    hold_while: str | None = None  # a file: while it exists, no step runs (--sim-hold-while)

    def __init__(
        self,
        model: TimingModel,
        max_running: int,
        zero_cost: bool = False,
        seed: int = 0,
        *,
        on_batch: Callable[[int], None] | None = None,
        on_step: Callable[[float, int, bool], None] | None = None,
        cache: PrefixCache | None = None,
        adaptive: tuple[AdaptiveDepth, Callable[[int], TimingModel]] | None = None,
    ) -> None:
        self.model = model
        self.max_running = max_running
        self.zero_cost = zero_cost
        self.rng = random.Random(seed)
        self.on_batch = on_batch
        self.on_step = on_step  # (GPU seconds, batch, drafted?): for the simulated power
        self.cache = cache
        self.adaptive = adaptive  # SGLang's adaptive depth and the model of each depth
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.wakeup = asyncio.Event()
        self.generated_total = 0
        self.prompt_total = 0
        self.steps = 0
        self.accepted_total = 0
        self.spec_steps = 0
        self._recent: deque[tuple[float, int]] = deque(maxlen=256)

    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)
        self.wakeup.set()

    def _accepted(self, remaining: int, domain: str) -> int:
        m = self.model
        if m.max_accept <= 1:
            return 1
        # A draw around the mean, between 1 and max_accept (EAGLE verifies a draft tree).
        p = (m.accept_for(domain) - 1) / (m.max_accept - 1)
        n = 1 + sum(1 for _ in range(m.max_accept - 1) if self.rng.random() < p)
        return min(n, remaining)

    @property
    def avg_accept_length(self) -> float:
        return self.accepted_total / self.spec_steps if self.spec_steps else 0.0

    def throughput(self) -> float:
        if len(self._recent) < 2:
            return 0.0
        (t0, _), (t1, _) = self._recent[0], self._recent[-1]
        tokens = sum(n for _, n in list(self._recent)[1:])
        return tokens / (t1 - t0) if t1 > t0 else 0.0

    def _admit(self) -> int:
        """Move waiting requests into the batch up to the cap; the prompt tokens to prefill
        (less what the prefix cache holds)."""
        new_tokens = 0
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting.popleft()
            if req.aborted:
                continue
            self.running.append(req)
            if self.cache is not None:
                req.cached_tokens = self.cache.match(req.blocks, req.prompt_tokens)
                self.cache.insert(req.blocks)
            new_tokens += req.prompt_tokens - req.cached_tokens
            self.prompt_total += req.prompt_tokens
        return new_tokens

    def _emit(self, now: float) -> tuple[int, list[int]]:
        """One decode step's tokens to every running request: how many each accepted (a
        speculative step several), what it emitted in all and each request's drafts kept."""
        emitted = 0
        drafts: list[int] = []
        for req in self.running:
            if req.aborted:
                continue
            n = self._accepted(req.max_new_tokens - req.generated, req.domain)
            if self.model.skips_draft_extend:
                req.cold_draft = True
            elif req.cold_draft and self.model.max_accept > 1:
                # SGLang drafts from the zeroed stub after an upshift: nothing accepted
                # on that first step (`_stub_skipped_draft_extend`), warm again after
                n, req.cold_draft = 1, False
            drafts.append(n - 1)
            req.generated += n
            req.emit_times.append(now)
            if self.model.max_accept > 1:
                self.accepted_total += n
                self.spec_steps += 1
            if self.model.max_accept > 1 or self.adaptive is not None:
                req.accepted_steps += 1  # SGLang's spec_verify_ct: every step, depth 0 too
            req.finished = req.generated >= req.max_new_tokens
            req.queue.put_nowait((n, now))
            emitted += n
        return emitted, drafts

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            self.running = [r for r in self.running if not (r.finished or r.aborted)]
            if not self.running and not self.waiting:
                self.wakeup.clear()
                await self.wakeup.wait()
                next_at = loop.time()
            new_tokens = self._admit()
            if not self.running:
                continue
            while self.hold_while is not None and os.path.exists(self.hold_while):
                await asyncio.sleep(0.05)
                next_at = loop.time()
            if self.on_batch:
                self.on_batch(len(self.running))
            if self.adaptive is not None:
                depth, model_for = self.adaptive
                self.model = model_for(depth.steps_for(len(self.running)))
            step = 0.0
            if self.zero_cost:
                await asyncio.sleep(0)
            else:
                # Schedule on an absolute clock so sleep overshoot does not accumulate;
                # after a stall (more than one step late) restart from now.
                now_loop = loop.time()
                step = self.model.step_seconds(len(self.running), new_tokens)
                next_at = next_at + step if next_at > now_loop - step else now_loop + step
                delay = next_at - now_loop
                if delay > 0:
                    await asyncio.sleep(delay)
            now = time.time()
            emitted, drafts = self._emit(now)
            self.generated_total += emitted
            self.steps += 1
            if self.adaptive is not None and self.model.max_accept > 1:
                self.adaptive[0].observe(len(self.running), drafts)
            elif self.adaptive is not None:
                self.adaptive[0].observe(len(self.running), [0])  # counts a no-draft batch
            if self.on_step is not None:
                self.on_step(step, len(self.running), self.model.max_accept > 1)
            self._recent.append((now, emitted))
