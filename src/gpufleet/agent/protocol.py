"""What the agent writes on stdout: JSON lines only, the last one being the answer.

Arguments arrive as one base64url-encoded JSON argv word, so no user value ever passes
through a shell unquoted.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

MARK = "gpufleet_agent"


class AgentError(Exception):
    """A failure the agent reports as `{"ok": false, "kind": ..., "error": ...}`."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


def encode_args(args: dict[str, Any]) -> str:
    raw = json.dumps(args, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_args(word: str) -> dict[str, Any]:
    padded = word + "=" * (-len(word) % 4)
    return json.loads(base64.urlsafe_b64decode(padded.encode()))


def _write(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def emit_event(event: dict[str, Any]) -> None:
    """A progress line for streaming verbs (wait-ready, bench)."""
    _write({MARK: 1, "event": event})


def emit_result(result: Any) -> None:
    _write({MARK: 1, "ok": True, "result": result})


def emit_error(message: str, kind: str = "error") -> None:
    _write({MARK: 1, "ok": False, "kind": kind, "error": message})
