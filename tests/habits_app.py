"""A fake OpenAI-compatible and SGLang-style streaming server with every stream habit real
engines have, served by uvicorn in tests (tests/test_stream_habits.py) and in
benchmarks/stream_habits.py.

    /h/{habit}/{k}/{period_ms}/v1/completions   (also /v1/chat/completions and /generate)

streams `max_tokens` tokens, one word each (`w0 w1 ...`: one token each for the word-level
tokenizer `word_tokenizer` builds), `k` tokens a chunk, one chunk every `period_ms` ms on
a fixed schedule, and says how many tokens it sent in the habit's way:

- perchunk: usage on every chunk (SGLang with `continuous_usage_stats`; its `/generate`
  always), then a usage-only chunk
- final: usage only in a last usage-only chunk (SGLang's OpenAI server without
  `continuous_usage_stats`, llama.cpp)
- none: no usage at all (a server that ignores `stream_options`, an older engine)
- over: a final usage half as large again as what was sent, above `max_tokens`
- double: per-chunk usage that counts every token twice, and a final usage that agrees
- unadded: the same per-chunk double count, with a final usage that is right

    /e/{ending}/...  (same routes) ends the stream in one of dialects.ENDINGS' ways, after 5
    tokens for the failing ones.

GET /truth answers, for every prompt served, the wall-clock times each chunk was sent and
the tokens each carried: the figures a client should have measured.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

HERE = Path(__file__).parent
HABITS = ("perchunk", "final", "none", "over", "double", "unadded")
TRUTH: dict[str, list[tuple[float, int]]] = {}  # prompt -> (time sent, tokens) per chunk
ERROR = "boom: CUDA error: an illegal memory access"


def word_tokenizer(folder: Path, words: int = 2048) -> Path:
    """A word-level tokenizer.json in `folder` (one token per `wN`), as a model's would be."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def _chunk(kind: str, piece: str, sent: int, usage: int | None, finish: object) -> dict:
    """One chunk in `kind`'s format: `piece` is this chunk's text, `sent` the tokens so far."""
    if kind == "sglang":
        meta: dict = {"id": "r", "prompt_tokens": 7, "finish_reason": finish}
        if usage is not None:
            meta["completion_tokens"] = usage
        return {"text": " ".join(f"w{i}" for i in range(sent)) + " ", "meta_info": meta}
    choice: dict = {"index": 0, "finish_reason": finish}
    if kind == "chat":
        choice["delta"] = {"content": piece}
    else:
        choice["text"] = piece
    out: dict = {"object": "chunk", "choices": [choice]}
    if usage is not None:
        out["usage"] = {"prompt_tokens": 7, "completion_tokens": usage}
    return out


def _data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _usage(habit: str, sent: int, n: int, last: bool) -> int | None:
    """The count the habit reports on a chunk (`last`: the usage-only chunk at the end)."""
    if habit in ("perchunk", "double", "unadded") and not last:
        return sent * (2 if habit != "perchunk" else 1)
    if last:
        return {"perchunk": n, "final": n, "over": n + n // 2, "double": 2 * n,
                "unadded": n}.get(habit)  # fmt: skip
    return None


async def _tokens(kind: str, habit: str, n: int, k: int, period: float, key: str, stop: int):
    """Content chunks on a fixed schedule, recording when each went out; stops after `stop`."""
    sent, start = 0, time.perf_counter()
    truth = TRUTH.setdefault(key, [])
    step = 0
    while sent < min(n, stop):
        wait = start + step * period - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        carried = min(k, n - sent)
        piece = "".join(f"w{i} " for i in range(sent, sent + carried))
        sent += carried
        truth.append((time.time(), carried))
        yield _data(_chunk(kind, piece, sent, _usage(habit, sent, n, False), None))
        step += 1


def _finish(kind: str, n: int, usage: int | None, reason: object = "length") -> dict:
    if kind == "sglang":
        return _chunk(kind, "", n, usage, {"type": reason} if isinstance(reason, str) else reason)
    return _chunk(kind, "", n, None, reason)


async def _habit_stream(kind: str, habit: str, n: int, k: int, period: float, key: str):
    async for data in _tokens(kind, habit, n, k, period, key, n):
        yield data
    final = _usage(habit, n, n, True)
    if kind == "sglang":  # the last chunk's meta_info is its final count
        yield _data(_finish(kind, n, final))
    else:
        yield _data(_finish(kind, n, None))
        if final is not None:
            yield _data({"object": "chunk", "choices": [],
                         "usage": {"prompt_tokens": 7, "completion_tokens": final}})  # fmt: skip
    yield b"data: [DONE]\n\n"


def _ending_tail(kind: str, ending: str, n: int) -> list[bytes]:
    """What follows the tokens for each ending (dialects.ENDINGS)."""
    done = b"data: [DONE]\n\n"
    usage = n if kind == "sglang" else None
    if ending == "done":
        return [_data(_finish(kind, n, usage)), done]
    if ending == "finish_reason":
        return [_data(_finish(kind, n, usage))]
    if ending == "error_event":
        return [b"event: error\ndata: " + json.dumps({"message": ERROR}).encode() + b"\n\n", done]
    if ending == "error_object":
        return [_data({"error": {"message": ERROR}}), done]
    if ending == "error_response":
        return [_data({"object": "error", "message": ERROR, "type": "BadRequestError",
                       "param": None, "code": 400}), done]  # fmt: skip
    if ending == "abort":
        abort = {"type": "abort", "message": ERROR} if kind == "sglang" else "abort"
        return [_data(_finish(kind, 5, 5 if kind == "sglang" else None, abort)), done]
    if ending == "cut":
        return []
    if ending == "not_json":
        return [b"data: <html>" + ERROR.encode() + b"</html>\n\n", done]
    raise KeyError(ending)


ENDINGS = ("done", "finish_reason", "error_event", "error_object", "error_response", "abort",
           "cut", "not_json")  # fmt: skip
OK_ENDINGS = ("done", "finish_reason")


async def _ending_stream(kind: str, ending: str, n: int, key: str) -> AsyncIterator[bytes]:
    stop = n if ending in OK_ENDINGS else 5
    async for data in _tokens(kind, "perchunk", n, 1, 0.001, key, stop):
        yield data
    for data in _ending_tail(kind, ending, n):
        yield data


def _kind(request: Request) -> str:
    path = request.url.path
    return "sglang" if path.endswith("/generate") else "chat" if "chat" in path else "openai"


async def serve(request: Request):
    body = await request.json()
    kind = _kind(request)
    if kind == "sglang":
        n, key = int(body["sampling_params"]["max_new_tokens"]), str(body.get("text"))
    else:
        n = int(body["max_tokens"])
        key = str(body.get("prompt") or body["messages"][-1]["content"])
    p = request.path_params
    if "ending" in p:
        stream = _ending_stream(kind, p["ending"], n, key)
    else:
        stream = _habit_stream(kind, p["habit"], n, p["k"], p["period"] / 1000, key)
    return StreamingResponse(stream, media_type="text/event-stream")


async def truth(request: Request):
    return JSONResponse(TRUTH)


async def health(request: Request):
    return PlainTextResponse("ok")


async def model_list(request: Request):
    """The model list SGLang's bench_serving waits for before it sends (benchmarks/)."""
    return JSONResponse({"object": "list", "data": [{"id": "habits", "object": "model"}]})


ROUTES = ("/v1/completions", "/v1/chat/completions", "/generate")
app = Starlette(
    routes=[
        *(Route("/h/{habit}/{k:int}/{period:int}" + r, serve, methods=["POST"]) for r in ROUTES),
        *(Route("/e/{ending}" + r, serve, methods=["POST"]) for r in ROUTES),
        Route("/h/{habit}/{k:int}/{period:int}/v1/models", model_list),
        Route("/truth", truth),
        Route("/health", health),
    ]
)


def start(port: int, timeout: float = 20.0) -> subprocess.Popen[bytes]:
    """This app under uvicorn on loopback `port`, once it answers /health (the caller stops it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "habits_app:app", "--app-dir", str(HERE),
         "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out = proc.communicate()[0].decode(errors="replace")
                raise RuntimeError(f"the habits server did not start: {out[-500:]}") from None
            time.sleep(0.05)


def measured_truth(url: str) -> dict[str, list[tuple[float, int]]]:
    """GET /truth: each prompt's chunks as the server sent them (time, tokens)."""
    with urllib.request.urlopen(url + "/truth", timeout=10) as answer:
        return {k: [(t, n) for t, n in v] for k, v in json.loads(answer.read()).items()}


def true_figures(chunks: list[list[tuple[float, int]]]) -> dict[str, float]:
    """The level's figures from when the server sent each chunk (SGLang's definitions, a
    chunk of k tokens k gaps of gap/k): output tokens, TPOT p50 and ITL p50 in ms."""
    tpots, gaps = [], []
    for sent in chunks:
        tokens = sum(k for _, k in sent)
        tpots.append((sent[-1][0] - sent[0][0]) / (tokens - 1) * 1000)
        for (before, _), (at, k) in itertools.pairwise(sent):
            gaps.extend([(at - before) / k * 1000] * k)
    return {
        "total_output_tokens": sum(k for sent in chunks for _, k in sent),
        "median_tpot_ms": statistics.median(tpots),
        "median_itl_ms": statistics.median(gaps),
    }
