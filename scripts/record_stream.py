"""Record a live server's event streams, byte for byte, for the parser's tests (issue 52).

Sends the very request gpufleet's bench sends (host/bench/sender.py's payload, for each
backend the engine speaks), keeps the response body as the wire carried it (chunked
framing removed, nothing else), and beside it what the server itself counted: its
/metrics token counter before and after, where it has one. tests/test_sse_recorded.py
replays each recording through gpufleet's HTTP client and checks the tokens it counts
against that figure.

    python scripts/record_stream.py --url http://127.0.0.1:30000 --engine llamacpp \
        --backend openai,openai-chat --model target --out tests/fixtures/streams
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import urllib.parse
from pathlib import Path

from gpufleet.host.bench.level import Prompt
from gpufleet.host.bench.sender import _payload

# each engine's own count of the tokens it generated (Prometheus counters), where it has one
COUNTERS = {
    "llamacpp": "llamacpp:tokens_predicted_total",
    "sglang": "sglang:generation_tokens_total",
    "sim": "sglang:generation_tokens_total",
    "vllm": "vllm:generation_tokens_total",
}
PROMPT = "Write the alphabet backwards, one letter per line, and say why."


def _connection(url: str) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=300)


def counter(url: str, name: str | None) -> float | None:
    """The server's own token counter, or None where it has no /metrics or not that name."""
    if not name:
        return None
    conn = _connection(url)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        conn.close()
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([\d.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else None


def record(
    url: str, engine: str, backend: str, model: str, tokens: int, out: Path, label: str = ""
) -> Path:
    """One streamed request; the body to NAME.sse, what it was and what the server said
    of it to NAME.json (NAME: engine, label, backend)."""
    prompt = Prompt(text=PROMPT, output_len=tokens)
    path, body = _payload(backend, prompt, model, ignore_eos=True)
    before = counter(url, COUNTERS.get(engine))
    conn = _connection(url)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    raw = response.read()  # http.client removes the chunked framing and nothing else
    conn.close()
    after = counter(url, COUNTERS.get(engine))
    name = "-".join(part for part in (engine, label, backend) if part)
    (out / f"{name}.sse").write_bytes(raw)
    meta = {
        "engine": engine,
        "label": label,
        "backend": backend,
        "path": path,
        "request": body,
        "status": response.status,
        "content_type": response.getheader("content-type"),
        "server_header": response.getheader("server"),
        "server_tokens": None if before is None or after is None else after - before,
        "counter": COUNTERS.get(engine),
    }
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out / f"{name}.sse"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    engines = ", ".join(COUNTERS)
    parser.add_argument("--engine", required=True, help=f"the adapter's name: {engines}")
    parser.add_argument("--backend", default="openai,openai-chat", help="comma-separated")
    parser.add_argument("--model", default="default", help="the model name the server takes")
    parser.add_argument("--tokens", type=int, default=24, help="tokens to generate (ignore_eos)")
    parser.add_argument("--label", default="", help="a word for the server's setup (draft)")
    parser.add_argument("--out", type=Path, required=True, help="folder for NAME.sse/NAME.json")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for backend in args.backend.split(","):
        written = record(
            args.url, args.engine, backend, args.model, args.tokens, args.out, args.label
        )
        print(f"{written}: {written.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
