"""What one benchmark level sends: single prompts, multi-turn sessions, shared-prefix groups,
token-exact random prompts, or a replayed trace. Built here, on the control machine, into
the rows of the plan's prompts.jsonl (see host/bench/loadgen.Prompt), so every host and
every profile gets the very same requests for the same seed.

Rows: {"prompt": text} | {"input_ids": [...], "output_len": n} | {"turns": [...]}, with
"at" (seconds after the level starts) for a trace. Token ids are drawn from 100-29999, which
every current vocabulary (Llama 2's 32,000 and up) holds: no tokenizer is needed, as with
bench_serving's `random-ids`. A smaller model says its vocabulary (`--random-vocab N`): ids
then come from min(100, N/4) up to N - 1 (the lowest ids are a vocabulary's special
tokens).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from gpufleet.control.bench import prompts as prompt_sets
from gpufleet.errors import UserError
from gpufleet.records import PromptRow

ID_LOW, ID_HIGH = 100, 30_000
TRACE_BLOCK_TOKENS = 512  # Mooncake's block size: one hash_id per 512 tokens
MAX_TRACE_ROWS = 100_000
SHARED_PREFIX_DEFAULTS = {"groups": 8, "per_group": 16, "prefix_len": 2048, "question_len": 128}
MULTITURN_DEFAULTS = {"turns": 4}
WORKLOADS = ("single", "multiturn", "shared-prefix")


@dataclass
class Workload:
    """`--workload NAME[:key=value,...]` parsed; `options` holds the shape's numbers."""

    name: str = "single"
    options: dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The workload as the user writes it (`multiturn:turns=4`)."""
        if not self.options:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.options.items())


def parse_workload(spec: str | None) -> Workload:
    """`single`, `multiturn[:turns=N]`, `shared-prefix[:groups=G,per_group=P,prefix_len=L,
    question_len=Q]`; a bad name or key is one line naming what is allowed."""
    name, _, rest = (spec or "single").partition(":")
    defaults = {"multiturn": MULTITURN_DEFAULTS, "shared-prefix": SHARED_PREFIX_DEFAULTS}
    if name not in WORKLOADS:
        raise UserError(f"--workload {spec!r}: expected one of {', '.join(WORKLOADS)}")
    allowed = defaults.get(name, {})
    options = dict(allowed)
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in allowed:
            keys = ", ".join(f"{k}=N" for k in allowed) or "no options"
            raise UserError(f"--workload {spec!r}: {part!r} is not an option of {name} ({keys})")
        if not value.strip().isdigit() or not 1 <= int(value) <= 1_000_000:
            raise UserError(f"--workload {spec!r}: {key} must be a whole number from 1 to 1000000")
        options[key] = int(value)
    return Workload(name, options if name != "single" else {})


def _ids(rng: random.Random, count: int, vocab: int = ID_HIGH) -> list[int]:
    """Random token ids under `vocab` (the default's draws are the same ids as always)."""
    low = min(ID_LOW, vocab // 4)
    return [rng.randrange(low, vocab) for _ in range(count)]


def _length(rng: random.Random, full: int, ratio: float) -> int:
    """bench_serving's random lengths: uniform between full x ratio and full."""
    return rng.randint(max(1, int(full * ratio)), full) if ratio < 1 else full


def random_ids(
    count: int, seed: int, *, input_len: int, output_len: int, ratio: float, vocab: int = ID_HIGH
) -> list[PromptRow]:
    """Token-exact random prompts (bench_serving's `random-ids`)."""
    rng = random.Random(seed)
    return [
        PromptRow(
            input_ids=_ids(rng, _length(rng, input_len, ratio), vocab),
            output_len=_length(rng, output_len, ratio),
        )
        for _ in range(count)
    ]


def shared_prefix(
    count: int, seed: int, options: dict[str, int], vocab: int = ID_HIGH
) -> list[PromptRow]:
    """bench_serving's generated-shared-prefix: `groups` long prefixes, `per_group` questions
    each; the rows go out group after group shuffled, cycled up to `count`."""
    rng = random.Random(seed)
    rows = []
    for _ in range(options["groups"]):
        prefix = _ids(rng, options["prefix_len"], vocab)
        rows += [
            PromptRow(input_ids=prefix + _ids(rng, options["question_len"], vocab))
            for _ in range(options["per_group"])
        ]
    rng.shuffle(rows)
    return [rows[i % len(rows)] for i in range(count)]


def system_prompt() -> str:
    """The coding agent's shared system prompt (tool schemas included), ~1,700 tokens."""
    return (prompt_sets.bundled_dir() / "coding-agent-system.txt").read_text()


def multiturn(texts: list[str], count: int, seed: int, turns: int) -> list[PromptRow]:
    """Sessions: a task from the prompt set, then follow-ups from the bundled coding
    follow-ups (test failures, lint output, review requests, as an agent's user sends)."""
    tasks = prompt_sets.sample(texts, count, seed)
    followups = prompt_sets.load_texts("coding-followups", seed)[1]
    rng = random.Random(seed + 1)
    return [
        PromptRow(turns=[task, *(rng.choice(followups) for _ in range(turns - 1))])
        for task in tasks
    ]


def load_trace(path_text: str, speedup: float, vocab: int = ID_HIGH) -> list[PromptRow]:
    """A Mooncake-format JSONL trace as rows: equal hash_ids give equal 512-token blocks;
    arrival times divided by `speedup`, starting at 0."""
    path = Path(path_text)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--trace {path_text}: cannot read it ({exc.__class__.__name__})") from None
    rows: list[PromptRow] = []
    first = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(rows) >= MAX_TRACE_ROWS:
            raise UserError(f"--trace {path_text}: more than {MAX_TRACE_ROWS} requests")
        entry = _trace_entry(path_text, number, line)
        first = entry["timestamp"] if first is None else first
        ids: list[int] = []
        for block in entry["hash_ids"]:
            ids += _ids(random.Random(f"block-{block}"), TRACE_BLOCK_TOKENS, vocab)
        need = entry["input_length"]
        tail = _ids(random.Random(f"tail-{number}"), max(0, need - len(ids)), vocab)
        ids = ids[:need] + tail
        rows.append(
            PromptRow(
                input_ids=ids,
                output_len=entry["output_length"],
                at=round((entry["timestamp"] - first) / 1000 / speedup, 6),
            )
        )
    if not rows:
        raise UserError(f"--trace {path_text}: no requests in it")
    return rows


class TraceEntry(TypedDict):
    """One request of a Mooncake-format trace: when it came (ms), its lengths, and the
    prefix blocks it shares with others."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int]


def _trace_entry(path: str, number: int, line: str) -> TraceEntry:
    expected = "expected {timestamp, input_length, output_length, hash_ids} (Mooncake format)"
    try:
        entry = json.loads(line)
    except ValueError:
        raise UserError(f"--trace {path}:{number}: not valid JSON; {expected}") from None
    ok = (
        isinstance(entry, dict)
        and isinstance(entry.get("timestamp"), int | float)
        and all(
            isinstance(entry.get(k), int) and 1 <= entry[k] <= 1_000_000
            for k in ("input_length", "output_length")
        )
        and isinstance(entry.get("hash_ids", []), list)
    )
    if not ok:
        raise UserError(f"--trace {path}:{number}: {expected}")
    entry.setdefault("hash_ids", [])
    return entry
