"""Every byte a task prints goes through the archive's scrubbing (host/agent/redact.py)
and the terminal filter (gpufleet/terminal.py).

Tables, JSON, relayed server log lines, crash tails and Invoke's own exit messages all
reach the terminal through sys.stdout and sys.stderr, so the task wrapper replaces both
with a stream that hides secret values (the profile's and inventory's, remembered when
they are loaded) and secret-looking ones (`api_key='...'`, URL passwords) line by line,
and writes every control character out (`\x1b`): a server's log, a process name or an
archived error cannot clear the screen, retitle it or plant a link. gpufleet's own
styling (rich's tables on a terminal) is written beside the stream, its cells filtered.
"""

from __future__ import annotations

import io
import sys
from typing import Any, TextIO

from gpufleet.host.agent.redact import scrub_known
from gpufleet.terminal import shown


def for_terminal(text: str) -> str:
    """`text` as a terminal may show it: secrets hidden, control characters written out."""
    return shown(scrub_known(text))


def raw(stream: TextIO) -> TextIO:
    """The stream a ScrubbingStream wraps (for gpufleet's own styling, its text filtered
    by `for_terminal` first), or `stream` itself."""
    return stream.inner if isinstance(stream, ScrubbingStream) else stream


class ScrubbingStream(io.TextIOBase):
    """A text stream that writes whole lines, each scrubbed, to the stream it wraps."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        if "\n" in self.pending:
            done, _, self.pending = self.pending.rpartition("\n")
            self.inner.write(for_terminal(done + "\n"))
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.inner.write(for_terminal(self.pending))
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
