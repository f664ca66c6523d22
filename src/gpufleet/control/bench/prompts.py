"""Prompt sets for `inv bench`: bundled sets, random prompts, or the user's JSONL / ShareGPT.

The same seed gives the same prompts in the same order for every profile, so baseline and
EAGLE-3 see identical traffic. The set's sha256 goes into the manifest.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from gpufleet.errors import UserError

BUNDLED = Path(__file__).resolve().parents[4] / "playbooks" / "prompts"
WORDS = (
    "cache",
    "kernel",
    "tensor",
    "request",
    "batch",
    "token",
    "server",
    "model",
    "latency",
    "queue",
    "thread",
    "socket",
    "buffer",
    "schedule",
    "decode",
    "prefill",
    "memory",
    "shard",
    "rank",
    "node",
)


def bundled_dir() -> Path:
    """The bundled prompt sets: the checkout's playbooks/prompts, else the installed package's."""
    for candidate in (Path("playbooks/prompts"), BUNDLED):
        if candidate.is_dir():
            return candidate
    raise UserError("bundled prompt sets not found (expected playbooks/prompts/)")


def _from_jsonl(path: Path) -> list[str]:
    texts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{number}: not valid JSON") from None
        text = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
        if not isinstance(text, str) or not text:
            raise UserError(f"{path}:{number}: expected an object with a 'prompt' or 'text' string")
        texts.append(text)
    return texts


def _from_sharegpt(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text())
    except ValueError:
        raise UserError(f"{path}: not valid JSON (expected a ShareGPT list)") from None
    texts = []
    for item in data if isinstance(data, list) else []:
        turns = item.get("conversations") or item.get("conversation") or []
        first = next((t.get("value") for t in turns if t.get("from") in ("human", "user")), None)
        if isinstance(first, str) and first:
            texts.append(first)
    if not texts:
        raise UserError(f"{path}: no human turns found (expected ShareGPT conversations)")
    return texts


def load_texts(name: str, seed: int, random_input_len: int = 256) -> tuple[str, list[str]]:
    """`coding`, `chat`, `random` (words), or a path; returns (label, texts).

    `random` is that many *words*, not tokens (a word is one to three tokens): the label says
    so. Token-exact random prompts are `random-ids` (control/bench/workloads.py)."""
    if name in ("random", "random-words"):
        rng = random.Random(seed)
        texts = [" ".join(rng.choice(WORDS) for _ in range(random_input_len)) for _ in range(1000)]
        return f"random-words-{random_input_len}", texts
    path = Path(name)
    if not path.exists():
        bundled = bundled_dir() / f"{name}.jsonl"
        if not bundled.exists():
            known = ", ".join(sorted(p.stem for p in bundled_dir().glob("*.jsonl")))
            raise UserError(
                f"--prompts {name!r}: no such file or bundled set ({known}, random, random-ids)"
            )
        path = bundled
    texts = _from_sharegpt(path) if path.suffix == ".json" else _from_jsonl(path)
    return path.stem, texts


def sample(texts: list[str], count: int, seed: int) -> list[str]:
    """The first `count` prompts of a seeded shuffle, cycled if the set is smaller."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    return [texts[order[i % len(order)]] for i in range(count)]


def digest(texts: list[str]) -> str:
    """The prompt set's identity (SHA-256 over the texts, NUL-separated): what compare checks is
    the same."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode())
        h.update(b"\0")
    return h.hexdigest()
