"""API keys as SGLang 0.5.23 enforces them (`srt/utils/auth.py`), so gpufleet's client is
tested against a server that refuses it when it forgets the key.

Paths starting with /health, /ready or /metrics are always open (probes, Prometheus). The
admin-optional endpoints (/flush_cache here) take the admin key when one is set, else the
API key, else are open. Every other endpoint needs `Authorization: Bearer <api-key>` when
an API key is set. A refusal is 401 with SGLang's body, `{"error": "Unauthorized"}`.
"""

from __future__ import annotations

import hmac
from typing import Any

OPEN_PREFIXES = ("/health", "/ready", "/metrics")
ADMIN_OPTIONAL = ("/flush_cache",)


def _bearer(request: Any) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _matches(given: str | None, key: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


def allowed(path: str, given: str | None, api_key: str | None, admin_key: str | None) -> bool:
    if path.startswith(OPEN_PREFIXES):
        return True
    if path in ADMIN_OPTIONAL:
        key = admin_key or api_key
        return key is None or _matches(given, key)
    return api_key is None or _matches(given, api_key)


def middleware(api_key: str | None, admin_key: str | None) -> Any:
    """aiohttp middleware answering 401 where SGLang would (aiohttp imported here: the
    shipped modules import only the standard library at import time)."""
    from aiohttp import web

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if not allowed(request.path, _bearer(request), api_key, admin_key):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check
