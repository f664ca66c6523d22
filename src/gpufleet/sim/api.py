"""SGLang's HTTP API, with SGLang's formats, on top of the simulated Engine.

Formats follow sglang 0.5.x `http_server.py` (docs/FACTS.md, "SGLang's HTTP server"):
streaming `data: <json>` chunks ending in `data: [DONE]`, cumulative `text`, `meta_info`
with SGLang's keys, OpenAI `/v1/completions` and `/v1/chat/completions` with `usage` only
when asked for.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from typing import Any

from aiohttp import web

from gpufleet.sim.answers import Choice, Envelope, MetaInfo, Trace, Usage
from gpufleet.sim.prefixcache import id_blocks, text_blocks
from gpufleet.sim.speculation import prompt_domain
from gpufleet.sim.timing import Engine, SimRequest
from gpufleet.wire import JsonObject

WORDS = ("the", "model", "returns", "a", "value", "for", "each", "token", "in", "code")


def count_tokens(text: str) -> int:
    """A stand-in tokenizer: about 4 characters per token, like BPE on English and code."""
    return max(1, (len(text) + 3) // 4)


def token_text(start: int, count: int) -> str:
    return "".join(" " + WORDS[(start + i) % len(WORDS)] for i in range(count))


class ServerState:
    """What the HTTP layer needs: the engine, the args, the readiness phase, traces."""

    def __init__(self, engine: Engine | None, args: Any) -> None:
        self.engine = engine
        self.args = args
        self.phase = "starting"  # starting -> ready -> (shutting_down)
        self.traces: OrderedDict[str, Trace] = OrderedDict()
        self.model_name = args.served_model_name or args.model_path
        self.created = int(time.time())

    def keep_trace(self, req: SimRequest) -> None:
        self.traces[req.rid] = {
            "rid": req.rid,
            "arrived": req.arrived,
            "emit_times": req.emit_times,
            "sent_times": req.sent_times,
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": req.generated,
        }
        while len(self.traces) > self.args.sim_trace_keep:
            self.traces.popitem(last=False)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _json_body_error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


async def _read_json(request: web.Request) -> JsonObject:  # a client's body
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise web.HTTPBadRequest(text='{"error": {"message": "invalid JSON body"}}') from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text='{"error": {"message": "expected a JSON object"}}')
    return body


def _max_tokens(value: Any, default: int = 128) -> int:
    try:
        return max(1, int(value)) if value is not None else default
    except (TypeError, ValueError):
        return default


CHAT_SEP = "\n\n"  # the rehearsal's chat template: message contents joined by a blank line


class _Prompt:
    """A request's prompt as the engine sees it: tokens, prefix-cache blocks, and the text
    (None for input_ids) after which its output is cached."""

    def __init__(self, body: JsonObject, text_key: str, chat: bool = False) -> None:  # OpenAI's
        self.output_sep = ""
        self.text: str | None = None
        ids = body.get("input_ids") if not chat else None
        value = body.get(text_key, "") if not chat else None
        if ids is None and isinstance(value, list) and value and isinstance(value[0], int):
            ids = value  # OpenAI completions accept token ids as the prompt
        if ids is not None:
            ids = ids[0] if ids and isinstance(ids[0], list) else ids
            self.tokens = max(1, len(ids))
            self.blocks = id_blocks(ids)
            return
        if chat:
            messages = body.get("messages") or []
            value = CHAT_SEP.join(
                str(m.get("content", "")) for m in messages if isinstance(m, dict)
            )
            self.output_sep = CHAT_SEP
        elif isinstance(value, list):
            value = value[0] if value and isinstance(value[0], str) else " ".join(map(str, value))
        self.text = str(value)
        self.tokens = count_tokens(self.text)
        self.blocks = text_blocks(self.text)


class Api:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[web.RouteDef]:
        r = [
            web.get("/health", self.health),
            web.get("/health_generate", self.health),
            web.get("/ping", self.ping),
            web.get("/get_model_info", self.model_info),
            web.get("/model_info", self.model_info),
            web.get("/get_server_info", self.server_info),
            web.get("/server_info", self.server_info),
            web.get("/v1/models", self.models),
            web.post("/generate", self.generate),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/flush_cache", self.flush_cache),
            web.get("/flush_cache", self.flush_cache),
            web.get("/sim/trace/{rid}", self.trace),
            web.get("/sim/traces", self.traces),
        ]
        if self.state.args.enable_metrics:
            r.append(web.get("/metrics", self.metrics))
        return r

    # -- readiness ---------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self.state.args.node_rank >= 1:  # SGLang's dummy health server on non-zero ranks
            return web.Response(status=200)
        if self.state.phase != "ready":
            return web.Response(status=503)
        return web.Response(status=200)

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    # -- info --------------------------------------------------------------
    async def model_info(self, request: web.Request) -> web.Response:
        a = self.state.args
        return web.json_response(
            {
                "model_path": a.model_path,
                "tokenizer_path": a.tokenizer_path or a.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        a = self.state.args
        info = {
            k: v
            for k, v in vars(a).items()
            if not k.startswith("sim_") and k != "explicit_max_running"
        }
        engine = self.state.engine
        internal: dict[str, float] = {"last_gen_throughput": engine.throughput() if engine else 0.0}
        if a.speculative_algorithm and engine:
            internal["avg_spec_accept_length"] = engine.avg_accept_length
            if engine.adaptive is not None:  # SGLang reports the live depth
                internal["speculative_num_steps"] = engine.adaptive[0].last_steps
        info.update(
            version="0.5.3+gpufleet.sim",
            internal_states=[internal],
            simulated=True,
        )
        return web.json_response(info)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.state.model_name,
                        "object": "model",
                        "created": self.state.created,
                        "owned_by": "sglang",
                        "root": self.state.model_name,
                        "max_model_len": self.state.args.context_length or 131072,
                    }
                ],
            }
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        """SGLang's answers: 200 when flushed, 400 while requests run (nothing flushed)."""
        engine = self.state.engine
        if engine and (engine.running or engine.waiting):
            return web.Response(status=400, text="Cache not flushed: requests are running.\n")
        if engine and engine.cache is not None:
            engine.cache.flush()
        return web.Response(status=200, text="Cache flushed.\n")

    async def trace(self, request: web.Request) -> web.Response:
        """Ground truth for measurement tests: when each token left the server."""
        trace = self.state.traces.get(request.match_info["rid"])
        if trace is None:
            return _json_body_error("unknown request id", status=404)
        return web.json_response(trace)

    async def traces(self, request: web.Request) -> web.Response:
        """Every kept trace that arrived at or after `?since=<unix time>`: the server's own
        clock for any client's requests (bench_serving's included)."""
        try:
            since = float(request.query.get("since", "0"))
        except ValueError:
            return _json_body_error("since: expected a unix time")
        rows = [t for t in self.state.traces.values() if t["arrived"] >= since]
        return web.json_response(rows)

    async def metrics(self, request: web.Request) -> web.Response:
        e = self.state.engine
        name = self.state.model_name
        lines = []
        gauges = {
            "sglang:num_running_reqs": len(e.running) if e else 0,
            "sglang:num_queue_reqs": len(e.waiting) if e else 0,
            "sglang:gen_throughput": e.throughput() if e else 0.0,
            "sglang:token_usage": min(1.0, (len(e.running) / e.max_running)) if e else 0.0,
            "sglang:spec_accept_length": e.avg_accept_length if e else 0.0,
        }
        for key, value in gauges.items():
            lines += [f"# TYPE {key} gauge", f'{key}{{model_name="{name}"}} {float(value)}']
        counters = {
            "sglang:prompt_tokens_total": e.prompt_total if e else 0,
            "sglang:generation_tokens_total": e.generated_total if e else 0,
        }
        for key, value in counters.items():
            lines += [f"# TYPE {key} counter", f'{key}{{model_name="{name}"}} {float(value)}']
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # -- generation ----------------------------------------------------------
    def _admit(self, prompt: _Prompt, max_new: int) -> SimRequest:
        if self.state.phase != "ready" and not self.state.args.node_rank:
            raise web.HTTPServiceUnavailable(text="server is not ready")
        req = SimRequest(
            uuid.uuid4().hex, prompt.tokens, max_new, blocks=prompt.blocks,
            domain=prompt_domain(prompt.text),
        )  # fmt: skip
        assert self.state.engine is not None
        self.state.engine.submit(req)
        return req

    def _remember_output(self, prompt: _Prompt, output: str, req: SimRequest) -> None:
        """A finished request's prompt and output stay cached, as SGLang's radix tree keeps
        them: the next turn of a conversation, which resends both, finds them there."""
        engine = self.state.engine
        if engine is None or engine.cache is None or prompt.text is None or not req.finished:
            return
        engine.cache.insert(text_blocks(prompt.text + prompt.output_sep + output))

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        return resp

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await _read_json(request)
        params = body.get("sampling_params") or {}
        prompt = _Prompt(body, "text")
        req = self._admit(prompt, _max_tokens(params.get("max_new_tokens")))
        spec = bool(self.state.args.speculative_algorithm)

        def meta(final: bool) -> MetaInfo:
            m: MetaInfo = {
                "id": req.rid,
                "finish_reason": {"type": "length", "length": req.generated} if final else None,
                "prompt_tokens": req.prompt_tokens,
                "completion_tokens": req.generated,
                "cached_tokens": req.cached_tokens,
            }
            if final:
                m["e2e_latency"] = time.time() - req.arrived
                if spec:
                    m["spec_verify_ct"] = req.accepted_steps
            return m

        text = ""
        try:
            if not body.get("stream"):
                while not req.finished:
                    n, _ = await req.queue.get()
                    text += token_text(req.generated - n, n)
                return web.json_response({"text": text, "meta_info": meta(True)})
            resp = await self._stream(request)
            while not req.finished:
                n, _ = await req.queue.get()
                text += token_text(req.generated - n, n)
                await resp.write(_sse({"text": text, "meta_info": meta(req.finished)}))
                req.sent_times.append(time.time())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            req.aborted = not req.finished
            self._remember_output(prompt, text, req)
            self.state.keep_trace(req)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await _read_json(request)
        prompt = _Prompt(body, "prompt", chat=chat)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        req = self._admit(prompt, _max_tokens(limit, default=16))
        reply = _OpenAIReply(
            req,
            chat,
            body.get("model") or self.state.model_name,
            report_cache=bool(getattr(self.state.args, "enable_cache_report", False)),
        )
        try:
            if not body.get("stream"):
                return await reply.whole()
            options = body.get("stream_options") or {}
            return await reply.stream(
                await self._stream(request),
                bool(options.get("include_usage")),
                bool(options.get("continuous_usage_stats")),
            )
        finally:
            req.aborted = not req.finished
            self._remember_output(prompt, reply.text, req)
            self.state.keep_trace(req)


class _OpenAIReply:
    """One OpenAI-format answer (completion or chat), whole or streamed as SGLang sends it."""

    def __init__(self, req: SimRequest, chat: bool, model: str, report_cache: bool) -> None:
        self.req = req
        self.report_cache = report_cache  # SGLang's --enable-cache-report
        self.text = ""  # the output so far
        self.chat = chat
        self.model = model
        self.kind = "chat.completion" if chat else "text_completion"
        self.rid = ("chatcmpl-" if chat else "cmpl-") + req.rid
        self.created = int(time.time())

    def usage(self) -> Usage:
        req = self.req
        usage: Usage = {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": req.generated,
            "total_tokens": req.prompt_tokens + req.generated,
        }
        if self.report_cache:
            usage["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens}
        return usage

    def envelope(self, obj: str, choices: list[Choice], **extra: Usage) -> Envelope:
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def choice(self, piece: str, finish: str | None) -> Choice:
        if self.chat:
            return {
                "index": 0,
                "delta": {"content": piece},
                "finish_reason": finish,
                "logprobs": None,
            }
        return {"index": 0, "text": piece, "finish_reason": finish, "logprobs": None}

    async def whole(self) -> web.Response:
        req = self.req
        while not req.finished:
            n, _ = await req.queue.get()
            self.text += token_text(req.generated - n, n)
        text = self.text
        message = (
            {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        )
        only: Choice = {"index": 0, **message, "finish_reason": "length", "logprobs": None}
        return web.json_response(self.envelope(self.kind, [only], usage=self.usage()))

    async def stream(
        self, resp: web.StreamResponse, include_usage: bool, every_chunk: bool = False
    ) -> web.StreamResponse:
        """`every_chunk` (SGLang's `continuous_usage_stats`): usage in each chunk too."""
        req = self.req
        obj = self.kind + ".chunk" if self.chat else self.kind
        if self.chat:
            first: Choice = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
                "logprobs": None,
            }
            await resp.write(_sse(self.envelope(obj, [first])))
        while not req.finished:
            n, _ = await req.queue.get()
            piece = token_text(req.generated - n, n)
            self.text += piece
            finish = "length" if req.finished else None
            extra = {"usage": self.usage()} if include_usage and every_chunk else {}
            await resp.write(_sse(self.envelope(obj, [self.choice(piece, finish)], **extra)))
            req.sent_times.append(time.time())  # the server's clock, for /sim/trace
        if include_usage:
            await resp.write(_sse(self.envelope(obj, [], usage=self.usage())))
        await resp.write(b"data: [DONE]\n\n")
        return resp
