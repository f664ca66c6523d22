"""What one level is made of: its prompts, each request's record, how far it is (a tally
that several generator processes add up), and the level as it ran. Shared by the load
generator (loadgen.py), its processes (spread.py) and the figures (metrics.py, steady.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpufleet.host.bench.clientcert import ClientClock

RequestFields = dict[str, int | float | bool | str | list[float] | None]
"""A RequestRecord as JSON (requests-c<N>.jsonl, a generator process's answer): its fields
by name, the answer's text left out."""


@dataclass
class Prompt:
    text: str = ""  # the prompt; for a session, the system prompt all sessions share
    prompt_tokens: int = 0  # our estimate; the server's count wins when it reports one
    output_len: int = 128
    input_ids: list[int] | None = None  # token-exact prompt (random-ids, shared-prefix, trace)
    at: float | None = None  # trace replay: seconds after the level starts
    turns: list[str] | None = None  # a multi-turn session's user messages

    @property
    def requests(self) -> int:
        return len(self.turns) if self.turns else 1


@dataclass
class RequestRecord:
    index: int
    ok: bool = False
    error: str | None = None
    start: float = 0.0  # seconds since the level started (perf_counter based)
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks: int = 0
    rid: str | None = None
    skipped: bool = False  # not sent: the level's --duration had passed
    start_wall: float = 0.0  # time.time() at send, to compare with server-side clocks
    cached_tokens: int = 0  # prompt tokens the server found in its prefix cache
    session: int | None = None  # multi-turn: the session and the turn (0-based)
    turn: int | None = None
    text: str = field(default="", repr=False)  # the answer, kept only for the next turn
    # self-certification (host/bench/clientcert.py), seconds since the level started:
    due: float = 0.0  # when it could go: its arrival, or the moment a slot came free
    dispatch_lag: float = 0.0  # from `due` to the send: the client's own delay
    queue_wait: float = 0.0  # open loop under a concurrency cap: arrival to a free slot
    spec_verify_ct: int | None = None  # speculative verify steps, as SGLang reports them
    # where completion_tokens came from (host/bench/tokencount.py): usage, tokenizer, chunks
    tokens_source: str | None = None
    itl_per_chunk: bool = False  # no chunk's token count was knowable: ITL gaps per chunk
    tokens_note: str | None = None  # the sources disagreed: both figures

    @property
    def accept_length(self) -> float | None:
        """Tokens per verify step: this request's own speculative acceptance."""
        if not self.spec_verify_ct:
            return None
        return self.completion_tokens / self.spec_verify_ct

    def to_json(self) -> RequestFields:
        row = asdict(self)
        del row["text"]
        if self.session is None:
            del row["session"], row["turn"]
        return row


@dataclass
class Tally:
    """How far a level is: what a progress line needs, summed over generator processes."""

    done: int = 0
    errors: int = 0
    tokens: int = 0  # streamed so far, in-flight requests too

    @classmethod
    def of(cls, records: list[RequestRecord]) -> Tally:
        return cls(
            done=sum(1 for r in records if r.ok or r.error),
            errors=sum(1 for r in records if r.error and not r.skipped),
            tokens=sum(r.completion_tokens for r in records),
        )

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.done + other.done, self.errors + other.errors, self.tokens + other.tokens)


@dataclass(repr=False)
class LevelRun:
    concurrency: int
    request_rate: float
    duration: float
    records: list[RequestRecord]
    started_at: float  # wall clock, for slicing server logs
    warmup_errors: list[str] = field(default_factory=list)
    after_warmup: Any = None  # what after_warmup returned (e.g. whether the cache was flushed)
    client: ClientClock | None = None  # the generator's own CPU and loop lag over the level
    open_loop: bool = False  # arrivals on a schedule (--request-rate or a trace)

    def __repr__(self) -> str:
        """Short on purpose: Python 3.11's asyncio.run formats the main task, result included,
        when it puts the SIGINT handler back, and the generated repr of every record and ITL
        gap cost ~1 us per streamed token (0.38 s for 1024 requests of 256 tokens)."""
        return (
            f"LevelRun(concurrency={self.concurrency}, request_rate={self.request_rate}, "
            f"{len(self.records)} records)"
        )


def salted(prompts: list[Prompt], tag: str) -> list[Prompt]:
    """Every text prompt of a level begun with the level's own tag: a prefix cache the
    server could not empty cannot serve one level's prompts from another's, while the
    level's prompts still share what they share (a shared prefix stays shared). Token-id
    prompts are left as they are."""
    return [replace(p, text=tag + p.text) if p.text and p.input_ids is None else p
            for p in prompts]  # fmt: skip
