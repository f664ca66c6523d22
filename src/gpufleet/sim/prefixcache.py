"""The rehearsal engine's prefix cache: SGLang's radix cache, reduced to what timing needs.

SGLang keeps the KV of every prompt (and, once a request finishes, of its output) in a radix
tree; a new request whose tokens begin like a cached sequence skips prefill for that
prefix and reports it as `cached_tokens` in meta_info. Here a sequence is cut into blocks
of BLOCK_TOKENS tokens, each identified by a hash chained over all blocks before it, so a
match is a run of leading blocks and two sequences share exactly their common prefix
(rounded down to a block, like a paged radix cache). Capacity is in tokens; the least
recently used blocks go first. `/flush_cache` empties it.

Tokens: `input_ids` are tokens; text is cut at the rehearsal tokenizer's 4 characters per
token (sim/api.count_tokens), so text that repeats a prefix repeats its blocks.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16
CHARS_PER_TOKEN = 4


def text_blocks(text: str) -> list[bytes]:
    """Chained block hashes of a text (whole blocks only: a partial tail is never cached)."""
    step = BLOCK_TOKENS * CHARS_PER_TOKEN
    data = text.encode()
    return _chain(data[i : i + step] for i in range(0, len(data) - step + 1, step))


def id_blocks(ids: Sequence[int]) -> list[bytes]:
    """Chained block hashes of token ids."""
    n = BLOCK_TOKENS
    return _chain(
        ",".join(map(str, ids[i : i + n])).encode() for i in range(0, len(ids) - n + 1, n)
    )


def _chain(pieces) -> list[bytes]:  # type: ignore[no-untyped-def]
    out: list[bytes] = []
    last = b""
    for piece in pieces:
        last = hashlib.blake2b(last + piece, digest_size=12).digest()
        out.append(last)
    return out


class PrefixCache:
    """LRU set of block hashes with a capacity in tokens; capacity 0 disables it."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_blocks = max(0, capacity_tokens) // BLOCK_TOKENS
        self.blocks: OrderedDict[bytes, None] = OrderedDict()
        self.hit_tokens = 0
        self.lookup_tokens = 0

    def match(self, blocks: list[bytes], prompt_tokens: int) -> int:
        """Tokens of this prompt already cached (at most prompt_tokens - 1: SGLang always
        computes the last prompt token to produce the first output token)."""
        hit = 0
        for block in blocks:
            if block not in self.blocks:
                break
            self.blocks.move_to_end(block)
            hit += 1
        cached = min(hit * BLOCK_TOKENS, max(0, prompt_tokens - 1))
        self.hit_tokens += cached
        self.lookup_tokens += prompt_tokens
        return cached

    def insert(self, blocks: list[bytes]) -> None:
        if not self.capacity_blocks:
            return
        for block in blocks:
            self.blocks[block] = None
            self.blocks.move_to_end(block)
        while len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)

    def flush(self) -> None:
        self.blocks.clear()

    @property
    def tokens(self) -> int:
        return len(self.blocks) * BLOCK_TOKENS
