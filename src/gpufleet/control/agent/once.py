"""Per-process values that the fan-out's threads ask for at once (the agent's zip, its
bootstrap, the SSH configuration files): made by the first caller only, the others waiting.

An unlocked cache lets every thread that misses make the value again: the agent's zip cost
0.9 s of CPU for 32 hosts so, and two threads in `ast.parse` at once fail on Python 3.11
("SystemError: AST constructor recursion depth mismatch", CPython gh-106905): a host of a
fan-out failed so when the bootstrap was made lazily (docs/RELIABILITY.md).
tests/test_once.py finds any zero-argument cache of the control plane that is not `once`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache, wraps
from typing import TypeVar

T = TypeVar("T")


def once(make: Callable[[], T]) -> Callable[[], T]:
    """`make`'s value, made by the first caller only; `.cache_clear()` forgets it."""
    lock = threading.Lock()
    cached = lru_cache(maxsize=1)(make)

    @wraps(make)
    def get() -> T:
        with lock:
            return cached()

    get.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return get
