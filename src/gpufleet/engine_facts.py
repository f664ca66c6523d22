"""SGLang 0.5.23's facts that both the tuner (control/tune/) and the rehearsal engine
(sim/) read, in one shipped module, so the real tuner never imports the rehearsal engine:
which speculative algorithms reset `--max-running-requests`, and the decode batch sizes
SGLang captures CUDA graphs for (a batch runs padded to the next one, which is where an
adaptive table's key starts to apply). Stdlib only: it ships in the agent's zip.
"""

from __future__ import annotations

import bisect
from typing import NotRequired, TypedDict

# speculative algorithms for which SGLang resets an unset --max-running-requests to 48
CAPPED_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})
SPEC_DEFAULT_MAX_RUNNING = 48
# the algorithms SGLang's adaptive speculation supports (others run static, with a log line)
ADAPTIVE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3"})
# SGLang's switch that skips the draft extend after a depth-0 batch (inv tune measures it;
# the rehearsal engine models it)
SKIP_ZERO_STEP_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
# the engine adapters that are SGLang (the rehearsal engine runs SGLang's flags as it does):
# SGLang's slot rule and words apply to their servers
SGLANG_ENGINES = frozenset({"sglang", "sim"})


def is_sglang(engine: str | None) -> bool:
    """Whether a server of this engine is SGLang's (None: a run archived before the engine
    was recorded, when every server was)."""
    return engine is None or engine in SGLANG_ENGINES


def named(algorithms: frozenset[str], joiner: str = " or ") -> str:
    """Algorithm names for a message, from the facts above: `EAGLE or EAGLE3`."""
    names = sorted(algorithms)
    return joiner.join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def default_max_running(algorithm: object) -> int | None:
    """The requests an SGLang server runs at once when --max-running-requests is not set,
    where SGLang decides it by the speculative algorithm (REFERENCE.md); None: no cap."""
    return SPEC_DEFAULT_MAX_RUNNING if algorithm in CAPPED_ALGORITHMS else None


class AdaptiveSlot(TypedDict):
    """One key of SGLang's adaptive speculative config (the batch size its range starts at):
    the depths the server may pick from there, and the tuning of its EMA (SGLang's
    `AdaptiveSpeculativeParams` defaults when absent). `inv tune` writes candidate_steps."""

    candidate_steps: list[int]
    ema_alpha: NotRequired[float]
    update_interval: NotRequired[int]
    warmup_batches: NotRequired[int]
    down_hysteresis: NotRequired[float]
    up_hysteresis: NotRequired[float]


def default_decode_max_bs(tp: int = 1, max_running: int | None = None) -> int:
    """SGLang 0.5.23's decode CUDA-graph max batch when `--cuda-graph-max-bs` is not given,
    on a 60-160 GB GPU (H100, H200): 256 below TP 4, else 512, capped by the server's max
    running requests (48 with speculation unless set)."""
    max_bs = 256 if tp < 4 else 512
    return min(max_bs, max_running) if max_running else max_bs


def capture_sizes(
    cuda_graph_bs: list[int] | None = None,
    max_bs: int | None = None,
    disabled: bool = False,
    *,
    max_running: int | None = None,
    tp: int = 1,
    padding_disabled: bool = False,
) -> list[int] | None:
    """The decode batch sizes SGLang 0.5.23 captures CUDA graphs for with speculative
    decoding (`generate_decode_cuda_graph_batch_sizes`): `--cuda-graph-bs` when given, else
    1-8, 10-32 step 2, 40-64 step 4, 72-256 step 8, then step 16, up to the max batch
    (`max_bs`, else `default_decode_max_bs`), which is itself always captured; every size
    up to it with `--disable-cuda-graph-padding`; None with `--disable-cuda-graph` (no
    padding). tests/fixtures/sglang-0.5.23-decode-capture-sizes.json holds SGLang's own."""
    if disabled:
        return None
    if cuda_graph_bs:
        return sorted(set(cuda_graph_bs))
    top = max_bs or default_decode_max_bs(tp, max_running)
    if padding_disabled:
        return list(range(1, top + 1))
    steps = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8)]
    sizes = [s for s in [*steps, *range(272, top + 1, 16)] if s <= top]
    return sizes if top in sizes else [*sizes, top]


def padded(batch: int, sizes: list[int] | None) -> int:
    """The captured size a decode batch runs as (itself above the largest, or unpadded)."""
    if sizes:
        index = bisect.bisect_left(sizes, batch)
        if index < len(sizes):
            return sizes[index]
    return batch


def first_batch(key: int, sizes: list[int] | None) -> int:
    """The smallest batch whose padded size is at least `key`: where a table key starts
    to apply (batch 15 pads to 16, so a key of 16 applies from batch 15)."""
    if not sizes:
        return key
    below = [s for s in sizes if s < key]
    return below[-1] + 1 if below else 1
