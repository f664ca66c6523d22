"""A Starlette app streaming the way SGLang's http_server does, served by uvicorn in tests.

SGLang serves FastAPI (Starlette) under uvicorn and streams `/generate` as
`StreamingResponse(media_type="text/event-stream")` of `b"data: " + json + b"\\n\\n"` chunks,
ending with `data: [DONE]`, errors as `{"error": {"message": ...}}`. A path prefix steers
the cases the load generator must survive (the base URL `http://HOST:PORT/spec3` streams
three tokens per chunk): `specK`, `errK` (an error event after K tokens), `stall`, `crlf`.
"""

from __future__ import annotations

import asyncio
import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route


def _knobs(request: Request) -> dict:
    mode = request.path_params.get("mode", "")
    if mode.startswith("spec"):
        return {"tokens_per_chunk": int(mode[4:])}
    if mode.startswith("err"):
        return {"error_after": int(mode[3:])}
    return {mode: True} if mode else {}


async def generate(request: Request):
    body = await request.json()
    knobs = _knobs(request)
    n = int(body["sampling_params"]["max_new_tokens"])
    if n < 0:
        return JSONResponse({"error": {"message": "max_new_tokens must be >= 0"}}, 400)
    per_chunk = int(knobs.get("tokens_per_chunk", 1))
    port = request.client.port if request.client else 0

    async def stream():
        done = 0
        while done < n:
            if knobs.get("stall"):
                await asyncio.sleep(3600)
            if "error_after" in knobs and done >= knobs["error_after"]:
                yield b'data: {"error": {"message": "CUDA error: an illegal memory access"}}\n\n'
                return
            await asyncio.sleep(float(knobs.get("delay", 0.002)))
            done = min(n, done + per_chunk)
            out = {
                "text": "tok " * done,
                "meta_info": {
                    "id": f"req-{port}-{done}",
                    "prompt_tokens": 7,
                    "completion_tokens": done,
                    "finish_reason": {"type": "length", "length": n} if done == n else None,
                    "client_port": port,
                },
            }
            yield b"data: " + json.dumps(out).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


async def completions(request: Request):
    """OpenAI-style, with CRLF event separators when asked (as sse-starlette writes them)."""
    body = await request.json()
    n = int(body["max_tokens"])
    sep = b"\r\n\r\n" if _knobs(request).get("crlf") else b"\n\n"

    async def stream():
        for i in range(n):
            await asyncio.sleep(0.002)
            chunk = {"choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]}
            yield b"data: " + json.dumps(chunk).encode() + sep
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
        yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + sep
        yield b"data: [DONE]" + sep

    return StreamingResponse(stream(), media_type="text/event-stream")


async def health(request: Request):
    return PlainTextResponse("ok")


app = Starlette(
    routes=[
        Route("/generate", generate, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/{mode}/generate", generate, methods=["POST"]),
        Route("/{mode}/v1/completions", completions, methods=["POST"]),
        Route("/health", health),
    ]
)
