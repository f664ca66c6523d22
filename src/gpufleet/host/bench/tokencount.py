"""Each request's output token count, and the tokens each chunk carried, from the best
source its stream gave, in one stated order (docs/MEASUREMENT.md, "Counting tokens"):

1. the server's own count (its final usage; SGLang's `completion_tokens`) where it is
   consistent with what streamed: not above `max_tokens`, not below the chunks that carried
   text, and, when it came on every chunk, adding up to the final figure;
2. else the streamed text counted by the model's own tokenizer, where the host can load it
   (`tokenizers`, else `transformers`, imported here only when needed, from the model path;
   never a dependency of the control plane);
3. else the chunks, one token each: an approximation, and said.

The tokens a chunk carried (k, so a chunk of k tokens is k inter-token gaps of gap/k, as
SGLang's bench_serving splits them) come from the per-chunk usage deltas when consistent, else
from the count (a total equal to the chunks means one token each), else the tokenizer's count
of that chunk's text, else 1, and the request's ITL is then per chunk, and marked so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

Counter = Callable[[list[str]], list[int]]  # texts -> the tokens in each (the model's tokenizer)

USAGE, TOKENIZER, CHUNKS = "usage", "tokenizer", "chunks"
SOURCES = (USAGE, TOKENIZER, CHUNKS)  # best first


@dataclass
class Seen:
    """What one request's stream showed: when each chunk carrying tokens arrived, the
    server's running count on each (None where a chunk had none), its last count, and the
    text (each chunk's piece where the dialect sends pieces; else the whole answer)."""

    arrivals: list[float] = field(default_factory=list)
    counts: list[int | None] = field(default_factory=list)
    usage: int | None = None
    pieces: list[str] | None = None
    text: Callable[[], str] | None = None  # the whole answer, read only when needed


@dataclass
class Count:
    tokens: int
    source: str  # USAGE, TOKENIZER or CHUNKS
    per_chunk: list[int]  # k of each chunk, in arrival order
    itl_per_chunk: bool  # no k was knowable: every chunk counted as one token's gap
    note: str | None = None  # where the sources disagreed, both figures


def _usage_deltas(seen: Seen) -> list[int] | None:
    """The tokens of each chunk by the server's running count, when every chunk carried one."""
    counts = seen.counts
    if not counts or None in counts:
        return None
    return [b - a for a, b in zip([0, *counts], counts, strict=False)]  # type: ignore[operator]


def _usage_problem(seen: Seen, max_tokens: int) -> str | None:
    """Why the server's final count cannot be the request's, with both figures; None if it can."""
    usage, chunks = seen.usage, len(seen.arrivals)
    if usage is None:
        return "no usage from the server"
    if max_tokens > 0 and usage > max_tokens:
        return f"server usage {usage} above max_tokens {max_tokens}"
    if usage < chunks:
        return f"server usage {usage} below the {chunks} chunks that carried text"
    return None


def _joined(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None


def decide(seen: Seen, max_tokens: int, counter: Callable[[], Counter | None]) -> Count:
    """The request's count and each chunk's k, from the best consistent source;
    `counter` loads the model's tokenizer and is called only when the server's figures do
    not settle it."""
    chunks = len(seen.arrivals)
    deltas = _usage_deltas(seen)
    problem = _usage_problem(seen, max_tokens)
    usage = seen.usage
    if problem is None and usage is not None:
        odd = None
        if deltas is not None and (min(deltas) < 1 or sum(deltas) != usage):
            odd = (
                f"per-chunk usage does not add up (running counts reach {seen.counts[-1]} "
                f"over {chunks} chunks; final usage {usage}, kept)"
            )
            deltas = None
        if deltas is not None:
            return Count(usage, USAGE, deltas, False)
        if usage == chunks:  # each chunk carried at least one: exactly one each
            return Count(usage, USAGE, [1] * chunks, False, odd)
        k = _per_piece(seen, counter)
        note = _joined(odd, _capacity(usage, seen))
        return Count(usage, USAGE, k or [1] * chunks, k is None, note)
    tokens = _tokenizer_total(seen, counter)
    if tokens is not None:  # text tokenized again may differ a little: held to the bounds
        tokens = max(min(tokens, max_tokens) if max_tokens > 0 else tokens, chunks)
        k = _per_piece(seen, counter)
        if k is None and tokens == chunks:
            k = [1] * chunks
        note = None if usage is None else f"{problem}; counted {tokens} by the model's tokenizer"
        return Count(tokens, TOKENIZER, k or [1] * chunks, k is None, note)
    if usage is None:
        note = f"{chunks} chunks counted as one token each (an approximation): {problem}, "
        note += "no tokenizer on the host"
    else:
        note = f"{problem}; counted the {chunks} chunks instead (an approximation)"
    return Count(chunks, CHUNKS, [1] * chunks, True, note)


def _per_piece(seen: Seen, counter: Callable[[], Counter | None]) -> list[int] | None:
    """Each chunk's k by the tokenizer's count of its text, at least 1; None without."""
    if seen.pieces is None or len(seen.pieces) != len(seen.arrivals):
        return None
    count = counter()
    if count is None:
        return None
    return [max(1, k) for k in count(seen.pieces)]


def _tokenizer_total(seen: Seen, counter: Callable[[], Counter | None]) -> int | None:
    text = "".join(seen.pieces) if seen.pieces is not None else None
    if text is None and seen.text is not None:
        text = seen.text()
    if not text:
        return None
    count = counter()
    return None if count is None else count([text])[0]


def _capacity(usage: int, seen: Seen) -> str | None:
    """A note when the count is above what the streamed text could hold (a token is at
    least one byte of text, unless it is a special token the server does not print)."""
    if seen.pieces is None:
        return None
    size = sum(len(p.encode()) for p in seen.pieces)
    if usage <= size:
        return None
    return f"server usage {usage} above what the {size} bytes streamed could hold (kept)"


def itl(arrivals: list[float], per_chunk: list[int]) -> list[float]:
    """The inter-token gaps: after the first chunk (its tokens are the TTFT's), a chunk of k
    tokens that came `gap` after the one before adds k gaps of gap/k."""
    gaps: list[float] = []
    for before, at, k in zip(arrivals, arrivals[1:], per_chunk[1:], strict=False):
        if k == 1:
            gaps.append(at - before)
        else:
            gaps.extend([(at - before) / k] * k)
    return gaps


_LOADED: dict[str, Counter | None] = {}


def tokenizer(path: str | None) -> Counter | None:
    """The model's tokenizer from `path` (a local directory, or a name already in the
    host's Hugging Face cache: nothing is downloaded), loaded once per process; None where
    neither library is installed or the path holds no tokenizer."""
    if not path:
        return None
    if path not in _LOADED:
        _LOADED[path] = _load(path)
    return _LOADED[path]


def _load(path: str) -> Counter | None:
    single = os.path.join(path, "tokenizer.json")
    if os.path.isfile(single):
        try:
            from tokenizers import Tokenizer  # type: ignore[import-not-found]

            fast = Tokenizer.from_file(single)
            return lambda texts: [
                len(e.ids) for e in fast.encode_batch(texts, add_special_tokens=False)
            ]
        except Exception:  # not installed, or a file it cannot read: try the next
            pass
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]

        auto = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception:  # not installed, no tokenizer there, or remote code it would need
        return None
    return lambda texts: [len(ids) for ids in auto(texts, add_special_tokens=False)["input_ids"]]
