"""The one filter between text that came from elsewhere and a terminal or a page.

A server's log, a host's process names, an archive's error texts: any of them may hold
ESC sequences (a clear-screen, a title change, an OSC 8 link), CR (a line that overwrites
the one before), BEL, or Unicode's direction overrides, and a terminal acts on them. Every
byte a task prints passes `shown` (cli/scrubbing.py's stream), and summary.md and
report.html escape the same characters the same way: `\\x1b`, `\\r`, `\\u202e`, so the
operator sees what was sent and the terminal does nothing with it.
"""

from __future__ import annotations

import re

# C0 but \t and \n, DEL, C1; the bidirectional overrides and isolates (text drawn out of
# order: what a reader sees is not what is there)
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """`text` with every control character written out (`\\x1b`), \\n and \\t kept."""
    return CONTROL.sub(_escaped, text)
