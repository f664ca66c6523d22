"""Every byte a task prints goes through the archive's scrubbing (host/agent/redact.py).

Tables, JSON, relayed server log lines, crash tails and Invoke's own exit messages all
reach the terminal through sys.stdout and sys.stderr, so the task wrapper replaces both
with a stream that hides secret values (the profile's and inventory's, remembered when
they are loaded) and secret-looking ones (`api_key='...'`, URL passwords) line by line.
"""

from __future__ import annotations

import io
import sys
from typing import Any, TextIO

from gpufleet.host.agent.redact import scrub_known


class ScrubbingStream(io.TextIOBase):
    """A text stream that writes whole lines, each scrubbed, to the stream it wraps."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        if "\n" in self.pending:
            done, _, self.pending = self.pending.rpartition("\n")
            self.inner.write(scrub_known(done + "\n"))
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.inner.write(scrub_known(self.pending))
            self.pending = ""
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def install() -> None:
    """Wrap sys.stdout and sys.stderr (once) so nothing printed escapes the scrubbing."""
    if not isinstance(sys.stdout, ScrubbingStream):
        sys.stdout = ScrubbingStream(sys.stdout)
    if not isinstance(sys.stderr, ScrubbingStream):
        sys.stderr = ScrubbingStream(sys.stderr)
