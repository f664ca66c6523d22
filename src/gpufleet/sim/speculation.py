"""Speculative decoding in the rehearsal engine: what a draft depth costs and yields, and
SGLang's adaptive depth (`--speculative-adaptive`, `--speculative-adaptive-config`).

Depth model: each drafted position is accepted with probability a = 0.65 on a prompt that
carries code, 0.56 on chat (DOMAIN_ACCEPT_P, with its sources; +0.005 per extra topk
branch: a tree accepts a little more than a chain), so a step `steps` deep emits on
average 1 + a + a^2 + ... + a^steps tokens per request (diminishing returns). A step costs
the target's decode (15.6 ms + 1.03 ms per running request), plus drafting (per draft step
2.6 ms, and 0.314 ms per request scaled by 0.75 + 0.25 x topk), plus the verify pass
(0.931 ms per request x sqrt(draft tokens): verifying a tree is batched like a small
prefill, so it grows slower than the tokens it checks). Depth 0 without speculation is
plain decoding (an EAGLE server's depth 0 costs more: `zero_step_costs_ms`). The
constants reproduce the seeds' EAGLE-3 (steps 3, topk 4, 16 draft tokens: 2.40 tokens per
29.8 ms step at C=1, ~80 tok/s per request; 6.4 ms per request, ~350 tok/s total at C=64)
and make a topk-1 chain win at low load and lose from about C=8 (docs/REHEARSAL.md).

Adaptive: SGLang 0.5.23's `AdaptiveStepSlot` (speculative/adaptive_spec_params.py), one per
batch-size key; the decode batch is first padded to the next captured CUDA-graph size
(`AdaptiveStepRouter.batch_size_key_for_batch`), then picks the slot with the largest key
not above the padded size; each slot moves between its `candidate_steps` by an EMA of
accepted drafts (ema_alpha, warmup_batches, update_interval, up/down hysteresis as
configured). A slot with a single candidate is a fixed depth: what `inv tune` writes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from gpufleet import engine_facts
from gpufleet.engine_facts import padded

ACCEPT_P = 0.65
TOPK_BONUS = 0.005
DRAFT_BASE_MS = 2.6  # per draft step
DRAFT_PER_REQ_MS = 0.314  # per draft step and running request, x (0.75 + 0.25 x topk)
VERIFY_PER_REQ_MS = 0.931  # per running request, x sqrt(draft tokens)
DEFAULT_CONFIG: dict[str, engine_facts.AdaptiveSlot] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    "8": {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
    "32": {"candidate_steps": [0, 1], "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0], "down_hysteresis": 0.0},
}


# Acceptance by what is asked: EAGLE-3 drafters accept more on code than on open chat.
# SGLang/SpecForge benchmark figures at batch 1 (model cards, accept length per verify step):
# Qwen3.5-397B-A17B-eagle3 (AQ-MedAI) HumanEval 3.47 vs MT-Bench 3.03 (x1.145);
# Qwen3-Coder-30B-A3B-Instruct-FP8-EAGLE3 (a drafter trained on code) humaneval 5.33 vs
# mtbench 3.50 (x1.52). The seeds measured their EAGLE-3 on coding/agentic prompts, so code
# keeps that calibration (a = 0.65: 2.35 tokens a step at depth 3); chat takes the general
# drafter's ratio, 2.35 / 1.145 = 2.05 at depth 3, which is a = 0.56. docs/REHEARSAL.md says
# how a prompt is classed.
DOMAIN_ACCEPT_P = {"chat": 0.56, "code": ACCEPT_P}
CODE_MARKERS = ("```", "<tool_result")


def prompt_domain(text: str | None) -> str:
    """`code` for a prompt that carries code (a fenced block, or a tool's output in an
    agent loop, as every prompt of the bundled coding set does), else `chat`; token-id
    prompts have no text and count as chat."""
    if text and any(marker in text for marker in CODE_MARKERS):
        return "code"
    return "chat"


def parse_accept_rates(text: str | None) -> dict[str, float]:
    """`--sim-accept-rate`: one rate for every prompt (`0.7`) or per domain
    (`chat=0.5,code=0.8`; an unnamed domain keeps its default)."""
    rates = dict(DOMAIN_ACCEPT_P)
    if not text:
        return rates
    form = "expected one rate (0.7) or rates by domain (chat=0.3,code=0.85)"
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.rpartition("=")
        if sep and name not in rates:
            raise ValueError(f"--sim-accept-rate {text!r}: domain {name!r} is not chat or code")
        try:
            rate = float(value)
        except ValueError:
            raise ValueError(
                f"--sim-accept-rate {text!r}: {part!r} is not a rate; {form}"
            ) from None
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"--sim-accept-rate {text!r}: {rate} is not in [0, 1)")
        for key in [name] if sep else list(rates):
            rates[key] = rate
    return rates


def accept_length(steps: int, topk: int = 1, rate: float = ACCEPT_P) -> float:
    """Mean tokens emitted per request per step at this depth, each drafted position
    accepted with probability `rate`."""
    a = rate + TOPK_BONUS * (max(1, topk) - 1)
    return sum(a**i for i in range(steps + 1))


SKIP_ZERO_STEP_ENV = engine_facts.SKIP_ZERO_STEP_ENV


def zero_step_costs_ms(
    topk: int = 1, skip_extend: bool = False, draft_scale: float = 1.0,
    base_scale: float | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(base, per running request) of a depth-0 step on an EAGLE server, in ms.

    SGLang 0.5.23 (speculative/eagle_worker_v2.py) at steps 0 verifies one token, which is
    the target's decode, and still runs `_draft_extend_for_decode` ("keeping draft KV warm
    for when the batch shrinks"): one draft forward over that token, priced like one draft
    step here. With SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 the extend is skipped and the
    step costs what plain decoding does; the price comes at the next upshift (Engine's cold
    step)."""
    base, per_request = step_costs_ms(0)
    if skip_extend:
        return base, per_request
    per_draft = DRAFT_PER_REQ_MS * (0.75 + 0.25 * max(1, topk))
    fixed = draft_scale if base_scale is None else base_scale
    return base + DRAFT_BASE_MS * fixed, per_request + per_draft * draft_scale


def step_costs_ms(
    steps: int, topk: int = 1, draft_tokens: int | None = None, draft_scale: float = 1.0,
    base_scale: float | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(base, per running request) of one decode step at this depth, in ms (depth 0: a
    server without speculation; an EAGLE server's depth 0 is `zero_step_costs_ms`).
    `draft_scale` multiplies the draft model's share (`--sim-draft-cost`): a heavier or
    lighter drafter against the same target; `base_scale`, where given, its fixed part per
    draft step alone (`--sim-draft-base-cost`: a drafter bound by its kernel launches,
    whose step barely grows with the batch)."""
    if steps <= 0:
        return 15.6, 1.03
    topk = max(1, topk)
    tokens = draft_tokens or (steps + 1 if topk == 1 else min(steps * topk + 1, 64))
    draft = steps * DRAFT_PER_REQ_MS * (0.75 + 0.25 * topk) * draft_scale
    base = 15.6 + DRAFT_BASE_MS * steps * (draft_scale if base_scale is None else base_scale)
    return base, 1.03 + draft + VERIFY_PER_REQ_MS * tokens**0.5


class AdaptiveSlot:
    """SGLang's per-batch-size slot: an EMA of accepted drafts picks the depth."""

    def __init__(self, initial_steps: int, cfg: engine_facts.AdaptiveSlot) -> None:
        self.candidates = sorted(set(cfg["candidate_steps"]))
        self.ema_alpha = cfg.get("ema_alpha", 0.2)
        self.update_interval = cfg.get("update_interval", 5)
        self.warmup_batches = cfg.get("warmup_batches", 10)
        self.down_hysteresis = cfg.get("down_hysteresis", -0.25)
        self.up_hysteresis = cfg.get("up_hysteresis", 0.0)
        self.ceiling_coeff = cfg.get("ceiling_coeff", 0)
        if initial_steps in self.candidates:
            self.steps = initial_steps
        else:
            self.steps = self.candidates[len(self.candidates) // 2]
        self.ema = float(self.steps - 1)
        self.batches = 0

    def observe(self, accepted_drafts: list[int]) -> None:
        if not accepted_drafts:
            return
        if self.steps > 0:
            mean = sum(accepted_drafts) / len(accepted_drafts)
            self.ema = (1 - self.ema_alpha) * self.ema + self.ema_alpha * mean
        self.batches += 1
        if self.batches <= self.warmup_batches:
            return
        if (self.batches - self.warmup_batches) % self.update_interval == 0:
            self._recompute()

    def _recompute(self) -> None:
        index = self.candidates.index(self.steps)
        if self.steps == 0:  # probe the smallest positive depth after a no-draft interval
            index = min(index + 1, len(self.candidates) - 1)
            if self.candidates[index] > 0 and self.ema < 0:
                self.ema = float(self.candidates[index] - 1)
            self.steps = self.candidates[index]
            return
        old = index
        while index > 0:
            prev = self.candidates[index - 1]
            drop = (0.5 if prev == 0 else prev - 0.5) + self.down_hysteresis
            if self.ema > drop:
                break
            index -= 1
        if index == old:
            while index < len(self.candidates) - 1:
                if self.ema <= self.candidates[index] - 0.5 + self.up_hysteresis:
                    break
                index += 1
        # SGLang's EMA ceiling caps a depth that did not rise: never above
        # ceil(ema x ceiling_coeff) (at least 1), so a slot falls straight to what it accepts
        ceiling = max(1, math.ceil(self.ema * self.ceiling_coeff))
        if self.ceiling_coeff > 0 and ceiling < self.candidates[index] <= self.candidates[old]:
            while index > 0 and self.candidates[index] > ceiling:
                index -= 1
        self.steps = self.candidates[index]


def load_config(
    config_path: str | None,
) -> tuple[dict[str, engine_facts.AdaptiveSlot], dict[int, engine_facts.AdaptiveSlot]]:
    """The adaptive config and its batch-size entries, checked as SGLang 0.5.23 checks them
    (`_load_adaptive_config`): a key's value must be an object (a bare list fails on
    `entry.get`, as SGLang's does), its `candidate_steps` a non-empty list of ints >= 0."""
    config = DEFAULT_CONFIG
    if config_path:
        with open(config_path) as fh:
            config = json.load(fh)
    entries: dict[int, engine_facts.AdaptiveSlot] = {}
    for key, entry in config.items():
        if not key.isdigit():
            continue
        if not isinstance(entry, dict):  # SGLang: entry.get("candidate_steps")
            raise AttributeError(f"'{type(entry).__name__}' object has no attribute 'get'")
        steps = entry.get("candidate_steps")
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and s >= 0 for s in steps)
        ):
            raise ValueError(
                f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}"
            )
        entries[int(key)] = entry
    if not entries:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string BS key"
        )
    return config, entries


def initial_steps(num_steps: int | None, config_path: str | None) -> int:
    """The starting depth SGLang accepts (`_init_adaptive_speculative_params`): one of the
    union of every slot's candidates; unset, the union's middle one."""
    _, entries = load_config(config_path)
    union = sorted({s for entry in entries.values() for s in entry["candidate_steps"]})
    if num_steps is None:
        return union[len(union) // 2]
    if num_steps not in union:
        raise ValueError(
            f"--speculative-num-steps={num_steps} is not in the adaptive config "
            f"candidate_steps {union}. Pass one of those values."
        )
    return num_steps


SWITCH_LINE = "Switch adaptive runtime state: steps {old} -> {new}, draft_tokens {a} -> {b}"


class AdaptiveDepth:
    """Routes a decode batch to its slot; the engine asks the depth before each step and
    reports the accepted drafts after it. A change of depth between steps is a runtime
    switch, which SGLang 0.5.23 logs (eagle_worker_v2.apply_runtime_state) as SWITCH_LINE:
    the count a load step reports (host/bench/ownclient.py)."""

    def __init__(
        self,
        initial_steps: int,
        config_path: str | None = None,
        sizes: list[int] | None = None,
        on_switch: Callable[[int, int], None] | None = None,
    ) -> None:
        self.sizes = sizes  # CUDA-graph capture sizes: a batch is routed by its padded size
        self.on_switch = on_switch  # (old, new): SGLang logs each runtime switch
        config, entries = load_config(config_path)
        shared = {k: v for k, v in config.items() if not k.isdigit()}
        self.slots = {k: AdaptiveSlot(initial_steps, {**shared, **v}) for k, v in entries.items()}
        self.keys = sorted(self.slots)
        self.last_steps = self.slots[self.keys[0]].steps

    def slot(self, batch: int) -> AdaptiveSlot:
        size = padded(batch, self.sizes)
        key = self.keys[0]
        for k in self.keys:
            if k <= size:
                key = k
        return self.slots[key]

    def steps_for(self, batch: int) -> int:
        steps = self.slot(batch).steps
        if steps != self.last_steps and self.on_switch is not None:
            self.on_switch(self.last_steps, steps)
        self.last_steps = steps
        return steps

    def observe(self, batch: int, accepted_drafts: list[int]) -> None:
        self.slot(batch).observe(accepted_drafts)


def adaptive_refusal(args: Any) -> str | None:
    """Why SGLang would run this server with static speculation instead (it logs and falls
    back), or None."""
    if args.speculative_algorithm not in engine_facts.ADAPTIVE_ALGORITHMS:
        only = engine_facts.named(engine_facts.ADAPTIVE_ALGORITHMS, "/")
        return f"speculative_algorithm={args.speculative_algorithm} (only {only})"
    if args.speculative_eagle_topk not in (None, 1):
        return f"speculative_eagle_topk={args.speculative_eagle_topk} (only topk=1)"
    if (args.dp_size or 1) > 1 and getattr(args, "enable_dp_attention", False):
        return "attention DP is not supported"
    for flag in ("enable_multi_layer_eagle", "enable_two_batch_overlap", "enable_pdmux"):
        if getattr(args, flag, False):
            return f"{flag}=True is not supported"
    return None
