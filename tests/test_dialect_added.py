"""Issue 82, bullet 5: a dialect entry is its whole request function (route, body and stream
reader, as vLLM's ASYNC_REQUEST_FUNCS), so an engine with its own stream format is one
module: its body, its reader and one `register` call. Here that module is this file: it
adds a dialect at run time whose stream is neither SGLang's nor OpenAI's, and runs a level
against a real HTTP server speaking it.

Before: the sender switched on `Dialect.events` ("sglang" or "openai"), so a third format
was a new branch in host/bench/sender.py beside the new entry.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpufleet.host.bench import dialects
from gpufleet.host.bench.dialects import Dialect, Messages
from gpufleet.host.bench.httpstream import RequestBody
from gpufleet.host.bench.level import Prompt
from gpufleet.host.bench.loadgen import LevelSpec, run_level
from gpufleet.host.bench.streamend import Finish
from gpufleet.host.bench.streamread import StreamReader

REPO = Path(__file__).resolve().parents[1]
TOKENS, PER_CHUNK = 12, 3


# ---- the new engine's module: its body, its stream reader, its registry entry ----
def _tick_body(prompt: Prompt, model: str, ignore_eos: bool, messages: Messages | None):
    body: RequestBody = {"prompt": prompt.text, "max_tokens": prompt.output_len}
    return body


class TickStream(StreamReader):
    """`data: {"words": "...", "total": N}` per chunk, `{"stop": why}` last, `{"fault": m}`
    for an error: a format no built-in reader knows."""

    @staticmethod
    def finish(chunk: object) -> Finish | None:
        stop = chunk.get("stop") if isinstance(chunk, dict) else None
        return Finish(str(stop)) if stop else None

    def on_event(self, payload: bytes, now: float) -> None:
        if self.stopped:
            return
        chunk = self._parse(payload)
        if not isinstance(chunk, dict) or "fault" in chunk:
            self._error(str(chunk.get("fault") if isinstance(chunk, dict) else chunk)[:300])
            return
        self.last_payload = payload
        if "stop" in chunk:
            self.finish_seen = self.finish(chunk)
            return
        total = int(chunk["total"])
        if self.record.chunks == 0:
            self.record.ttft = now - self.start
        self.seen.arrivals.append(now)
        self.seen.counts.append(total)
        self.seen.usage = total
        assert self.seen.pieces is not None
        self.seen.pieces.append(str(chunk["words"]))
        self.seen_tokens = self.record.completion_tokens = total
        self.record.chunks += 1
        self.last = now


TICK = Dialect("tick", "/tick/stream", _tick_body, TickStream)
# ---- end of the new engine's module ----


class _TickServer(BaseHTTPRequestHandler):
    """Streams the tick format: /<how>/tick/stream, how = ok, fault, abort or cut."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        how = self.path.split("/")[1]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        while sent < asked["max_tokens"]:
            if how == "fault" and sent == 2 * PER_CHUNK:
                self._event({"fault": "the tick engine fell over"})
                break
            words = "".join(f"w{sent + i} " for i in range(PER_CHUNK))
            sent += PER_CHUNK
            self._event({"words": words, "total": sent})
            time.sleep(0.005)
        if how in ("ok", "abort"):
            self._event({"stop": "length" if how == "ok" else "abort"})
        self.wfile.write(b"0\r\n\r\n")

    def _event(self, data: dict) -> None:
        event = f"data: {json.dumps(data)}\n\n".encode()
        self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        self.wfile.flush()


@pytest.fixture(scope="module")
def tick_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TickServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    dialects.register(TICK)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        dialects.DIALECTS.pop(TICK.name, None)
        server.shutdown()
        server.server_close()
        thread.join(10)


def _level(url: str, how: str, requests: int = 3):
    prompts = [Prompt(f"tick {i}", output_len=TOKENS) for i in range(requests)]
    spec = LevelSpec(backend="tick", warmup=1, request_timeout=20)
    return asyncio.run(run_level(f"{url}/{how}", prompts, requests, spec)).records


def test_a_dialect_with_its_own_stream_format_measures_a_level(tick_url):
    records = _level(tick_url, "ok")
    assert [(r.ok, r.error, r.completion_tokens, r.chunks) for r in records] == [
        (True, None, TOKENS, TOKENS // PER_CHUNK)
    ] * 3
    for r in records:  # each later chunk of 3 tokens is 3 gaps (from the server's count)
        assert (r.tokens_source, r.itl_per_chunk, len(r.itl)) == (
            "usage",
            False,
            TOKENS - PER_CHUNK,
        )
        assert 0 < r.ttft <= r.e2e


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("fault", "the tick engine fell over"),
        ("abort", "the server ended the request (abort)"),
        ("cut", "stream ended early after 12 tokens"),
    ],
)
def test_its_endings_are_decided_by_the_rules_every_dialect_shares(tick_url, how, said):
    records = _level(tick_url, how)
    assert [(r.ok, r.error) for r in records] == [(False, said)] * 3


def test_the_sender_asks_the_entry_never_the_dialect_name():
    """No module that sends or reads a request spells a dialect's name or asks for a kind
    of stream: the entry is all it knows."""
    assert "events" not in {f for f in Dialect.__dataclass_fields__}
    names = set(dialects.NAMES)
    spelled = []
    for name in ("sender.py", "streamread.py", "streamend.py", "loadgen.py"):
        path = REPO / "src" / "gpufleet" / "host" / "bench" / name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                spelled.append(f"{name}:{node.lineno}")
    assert spelled == []


def test_the_bench_clients_are_one_registry():
    """`--engine gpufleet|sglang-bench` was spelled in the task, the request's refusals, the
    plan's check and the runner; now each reads host/bench/clients.py's entries (the
    sglang-bench module names its own rows)."""
    from gpufleet.cli.bench_tasks import BENCH
    from gpufleet.host.bench.clients import CLIENTS

    spelled = []
    for path in sorted((REPO / "src" / "gpufleet").rglob("*.py")):
        if path.name in ("clients.py", "sglang_bench.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "sglang-bench":
                spelled.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert spelled == []
    refusal = BENCH.parse
    with pytest.raises(Exception, match="expected gpufleet or sglang-bench"):
        refusal({"engine": "other", "concurrency": ["1"]})
    assert set(CLIENTS) == {"gpufleet", "sglang-bench"}
    for client in CLIENTS.values():  # each entry carries the function the runner calls
        measure = client.level_function()
        assert list(inspect.signature(measure).parameters) == ["run", "level"], client.name
